"""Where sealed datasets are read from: local files, ``s3://``, ``https://`` and ``-``.

:func:`open_source` turns a name into an :class:`~.base.ObjectSource`; :func:`is_remote`
tells the names that are not local paths; :func:`is_prefix` the names that stand for the
sealed datasets under a bucket prefix, which :func:`list_datasets` lists. See
docs/REMOTE-DATA.md.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from gpucc.core.errors import UsageError

from .base import ObjectSource, SourceSettings
from .errors import (
    ObjectChangedError,
    ObjectNotFoundError,
    StoreAccessDeniedError,
    StoreDeadlineError,
    StoreProtocolError,
    StoreUnavailableError,
)

__all__ = [
    "ObjectChangedError",
    "Opener",
    "ObjectNotFoundError",
    "ObjectSource",
    "SourceSettings",
    "StoreAccessDeniedError",
    "StoreDeadlineError",
    "StoreProtocolError",
    "StoreUnavailableError",
    "is_prefix",
    "is_remote",
    "list_datasets",
    "open_source",
]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_remote(name: object) -> bool:
    """Whether ``name`` is a URL or ``-`` (standard input) rather than a local path."""
    return isinstance(name, str) and (name == "-" or bool(_URL.match(name)))


def open_source(name: str, settings: SourceSettings | None = None) -> ObjectSource:
    """Open ``-``, ``s3://bucket/key`` or ``https://...``, learning its length and pin.

    Raises:
        UsageError: a scheme that is not read (``http://``, ``gs://``, ``az://``, others).
        The errors of :mod:`.errors`.
    """
    settings = settings or SourceSettings()
    if name == "-":
        from .stream import StdinSource

        return StdinSource()
    scheme = name.split("://", 1)[0].lower()
    if scheme == "s3":
        from .s3 import S3Source

        return S3Source(name, settings)
    if scheme == "https":
        from .http import HttpsSource

        return HttpsSource(name, settings)
    if scheme == "http":
        raise UsageError("plain http:// is not read: use https://")
    raise UsageError(f"{scheme}:// is not supported (s3://, https:// and - are)")


def is_prefix(name: object) -> bool:
    """Whether ``name`` is a URL that names a folder rather than an object: it ends in
    ``/`` (``s3://bucket/shards/``), or it is a bare bucket (``s3://bucket``)."""
    if not isinstance(name, str) or not _URL.match(name):
        return False
    rest = name.split("://", 1)[1]
    return rest.endswith("/") or "/" not in rest


def list_datasets(
    url: str, settings: SourceSettings | None = None, *, opener: Opener | None = None
) -> list[str]:
    """The sealed datasets (``*.gcc``) directly under a prefix, as URLs in name order (the
    order ``gpucc seal --shards`` names shards in), as a local directory is listed.

    Only ``s3://`` prefixes are listed: an ``https://`` server has no standard listing, so
    its shards are named one by one.

    Raises:
        UsageError: a scheme that is not listed, or a prefix holding no ``*.gcc`` object.
        The errors of :mod:`.errors` (a missing bucket is :class:`ObjectNotFoundError`).
    """
    settings = settings or SourceSettings()
    scheme = url.split("://", 1)[0].lower()
    if scheme not in ("s3", "https"):
        raise UsageError(f"{scheme}:// is not supported (s3:// prefixes are listed)")
    if scheme != "s3":
        raise UsageError(
            f"{url}: only s3:// prefixes are listed ({scheme}:// has no listing): name "
            "each shard's URL"
        )
    from .s3 import list_prefix

    if "/" not in url[len("s3://") :]:
        url += "/"
    found = list_prefix(url, settings, client=(opener or Opener()).client(settings))
    if not found:
        raise UsageError(f"{url} holds no sealed dataset (*.gcc)")
    return found


class Opener:
    """Opens many sources, sharing what they can share: one S3 client per settings (making
    a botocore client costs about 0.15 s, a shard set may have hundreds of objects).
    Thread-safe; a process opens its own (a forked child must not share the connections)."""

    def __init__(self) -> None:
        self._clients: dict[SourceSettings, Any] = {}
        self._lock = threading.Lock()

    def open(self, name: str, settings: SourceSettings | None = None) -> ObjectSource:
        """:func:`open_source`, with the S3 client shared."""
        settings = settings or SourceSettings()
        if name.split("://", 1)[0].lower() != "s3":
            return open_source(name, settings)
        from .s3 import S3Source

        return S3Source(name, settings, client=self.client(settings))

    def client(self, settings: SourceSettings) -> Any:
        """The S3 client for ``settings``, made on first use."""
        from . import s3

        with self._lock:
            client = self._clients.get(settings)
            if client is None:
                client = self._clients[settings] = s3.s3_client(settings)
        return client
