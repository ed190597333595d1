"""``s3://bucket/key`` through botocore: its credential chain, endpoint and signing.

Credentials come only from the AWS SDK's standard chain (environment variables, the shared
``~/.aws/credentials`` and ``~/.aws/config`` files and their profiles, web identity, the
container and instance metadata services), the endpoint from the same place
(``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3`` or ``endpoint_url`` in the config file, for
S3-compatible stores). Nothing secret is passed on a command line or shown: messages name
``s3://bucket/key``.

``HEAD`` pins the object (length, ETag, and version where the bucket keeps versions); its
bytes are then read as ranged GETs of a presigned URL (signed anew for every request) by
:mod:`.http`, which checks every answer against the pin. botocore's own body reader is
about a third as fast as reading the presigned GET into place (measured: docs/REMOTE-DATA.md).
"""

from __future__ import annotations

import os
from typing import Any

from gpucc.core.extras import require

from .base import ObjectSource, SourceSettings, Span
from .errors import (
    ObjectNotFoundError,
    StoreAccessDeniedError,
    StoreProtocolError,
    StoreUnavailableError,
)
from .http import HttpObject, HttpSpan, pool_for

__all__ = ["S3Source", "list_prefix", "s3_client", "split_url"]


def split_url(url: str) -> tuple[str, str]:
    """(bucket, key) of ``s3://bucket/key``.

    Raises:
        StoreProtocolError: no bucket.
    """
    rest = url[len("s3://") :]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise StoreProtocolError(f"{url}: an s3:// URL names a bucket: s3://bucket/key")
    return bucket, key


def _exceptions() -> Any:
    """botocore's exceptions module (MissingExtraError without the s3 extra)."""
    return require("botocore.exceptions", "s3://")


def s3_client(settings: SourceSettings) -> Any:
    """A botocore S3 client from the standard chain, its retries and timeouts set."""
    boto3 = require("boto3", "s3://")
    config = require("botocore.config", "s3://").Config(
        signature_version="s3v4",
        retries={"max_attempts": settings.retries + 1, "mode": "standard"},
        connect_timeout=min(5.0, settings.timeout),
        read_timeout=settings.timeout,
        max_pool_connections=settings.parallelism + 1,
    )
    return boto3.session.Session().client("s3", config=config)


def client_error(exc: Exception, name: str) -> Exception:
    """The error of :mod:`.errors` for a botocore exception."""
    botocore = _exceptions()
    ClientError, NoCredentialsError, PartialCredentialsError = (
        botocore.ClientError,
        botocore.NoCredentialsError,
        botocore.PartialCredentialsError,
    )
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return StoreAccessDeniedError(
            f"{name}: no AWS credentials found (environment, ~/.aws/credentials or config, "
            "instance metadata)"
        )
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("404", "NoSuchKey", "NoSuchBucket", "NotFound") or status == 404:
            return ObjectNotFoundError(f"{name} does not exist")
        if code in ("403", "AccessDenied", "Forbidden") or status in (401, 403):
            return StoreAccessDeniedError(f"{name}: access refused ({code or status})")
        return StoreUnavailableError(f"{name}: the store answered {code or status}")
    return StoreUnavailableError(f"{name}: {type(exc).__name__}")


class S3Source(ObjectSource):
    """One S3 object, pinned by ETag (and version) at open."""

    def __init__(self, url: str, settings: SourceSettings, *, client: Any = None) -> None:
        botocore = _exceptions()
        BotoCoreError, ClientError = botocore.BotoCoreError, botocore.ClientError

        self.bucket, self.key = split_url(url)
        if not self.key or self.key.endswith("/"):
            raise StoreProtocolError(f"{url} names a prefix, not an object")
        self.name = f"s3://{self.bucket}/{self.key}"
        self.client = client if client is not None else s3_client(settings)
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.key)
        except (BotoCoreError, ClientError) as exc:
            raise client_error(exc, self.name) from None
        self.version: str | None = head.get("VersionId")
        if self.version == "null":
            self.version = None
        params = {"Bucket": self.bucket, "Key": self.key}
        if self.version:
            params["VersionId"] = self.version

        def presign() -> str:
            url: str = self.client.generate_presigned_url(
                "get_object", Params=params, ExpiresIn=900
            )
            return url

        self._pool = pool_for(settings, ca_file=os.environ.get("AWS_CA_BUNDLE"))
        self.obj = HttpObject(self.name, presign, self._pool, settings)
        self.obj.pin_to(int(head["ContentLength"]), head.get("ETag"), None)
        self.size = int(head["ContentLength"])
        self.settings = settings
        self.pin = self.obj.pin + (f", version {self.version}" if self.version else "")

    def open_span(self, offset: int, length: int) -> Span:
        return HttpSpan(self.obj, offset, length)

    def close(self) -> None:
        self._pool.clear()


def list_prefix(
    url: str, settings: SourceSettings, *, suffix: str = ".gcc", client: Any = None
) -> list[str]:
    """The ``s3://`` URLs of the objects directly under a prefix whose names end in
    ``suffix``, in name order (the order ``seal --shards`` names shards in).

    Raises:
        ObjectNotFoundError: no such bucket.
        StoreAccessDeniedError, StoreUnavailableError: see :func:`client_error`.
    """
    botocore = _exceptions()
    BotoCoreError, ClientError = botocore.BotoCoreError, botocore.ClientError

    bucket, prefix = split_url(url)
    client = client if client is not None else s3_client(settings)
    keys: list[str] = []
    try:
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, Delimiter="/"
        )
        for page in pages:
            keys += [o["Key"] for o in page.get("Contents", []) if o["Key"].endswith(suffix)]
    except (BotoCoreError, ClientError) as exc:
        raise client_error(exc, f"s3://{bucket}/{prefix}") from None
    return [f"s3://{bucket}/{k}" for k in sorted(keys)]
