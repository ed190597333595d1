"""NVIDIA's RIM service as a :class:`~gpuattest.collateral.RimSource`.

``GET {base}/v1/rim/{RIM_ID}`` answers::

    {"id": "<RIM_ID>", "rim": "<base64 of the RIM XML>", "sha256": "...", ...}

What this module checks, and what it raises (all collateral errors: none of
this is a verdict on the GPU):

* HTTP 404 → :class:`~gpuattest.errors.RimNotFoundError` ("not published by the
  RIM service"): NVIDIA has not published reference values for this driver or
  VBIOS yet, the most common production failure (nvtrust #66, #101, #144, #151).
* HTTP 401/403 → :class:`~gpuattest._internal.transport.ServiceAccessDeniedError`
  (a :class:`~gpuattest.errors.NetworkError`) whose hint names the service-key option.
* Other statuses, timeouts, connection/TLS/DNS failures, oversized answers →
  :class:`~gpuattest.errors.NetworkError` from the transport.
* An answer that is not a JSON object, whose ``id`` differs from the ID asked
  for, whose ``rim`` is not valid base64 or decodes to more than
  :data:`~gpuattest.collateral.MAX_RIM_BYTES`, or whose ``sha256`` (when present)
  is not the SHA-256 of the decoded bytes → :class:`RimServiceError`.

The bytes returned are unverified; the caller verifies them exactly like a RIM
read from a file (schema, XML-DSig, chain to the pinned RIM root, OCSP).

Note: NVIDIA does not document ``sha256``, so its meaning is inferred. It is
checked against the decoded RIM by default; should the live service ever
disagree, ``verify_sha256=False`` turns the check off without
weakening anything that matters (the RIM's own signature is what is trusted).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from urllib.parse import quote

from gpucc.core.errors import NetworkError, RimNotFoundError, UsageError
from gpucc.core.jsonio import loads_untrusted
from gpucc.core.transport import (
    Fetcher,
    HttpStatusError,
    ServiceAccessDeniedError,
    plain_http_to_remote,
    safe_url,
)

from .collateral import MAX_RIM_BYTES

__all__ = [
    "DEFAULT_RIM_URL",
    "RimServiceError",
    "RimServiceSource",
    "valid_rim_id",
]

DEFAULT_RIM_URL = "https://rim.attestation.nvidia.com"

# IDs look like NV_GPU_DRIVER_GH100_550.90.07 or NV_GPU_VBIOS_1010_0200_882_96009F0001 (§6.4).
_RIM_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}$")
_HEX64_RE = re.compile(r"^[0-9a-fA-F]{64}$")


class RimServiceError(NetworkError):
    """The RIM service answered, but the answer is unusable (not a verdict on the GPU)."""

    hint = "the RIM service misbehaved; try again later, or supply the RIM from a file"


def valid_rim_id(rim_id: str) -> bool:
    """Whether ``rim_id`` is safe to put in a URL path or a file name."""
    return bool(_RIM_ID_RE.match(rim_id))


def _json_cap(max_rim_bytes: int) -> int:
    # base64 grows 4/3; leave room for the other JSON fields.
    return (max_rim_bytes * 4) // 3 + 64 * 1024


class RimServiceSource:
    """Fetches RIMs from NVIDIA's RIM service (or a compatible mirror).

    Args:
        fetcher: the HTTP layer (offline fetchers raise OfflineError).
        base_url: service base; requests go to ``{base_url}/v1/rim/{RIM_ID}``.
        service_key: optional NVIDIA service key, sent as a bearer token only.
        verify_sha256: check the ``sha256`` field against the decoded RIM.
        max_rim_bytes: the largest RIM accepted.

    Raises:
        UsageError: a service key with a plain-http URL to a remote host.
    """

    def __init__(
        self,
        *,
        fetcher: Fetcher,
        base_url: str = DEFAULT_RIM_URL,
        service_key: str | None = None,
        verify_sha256: bool = True,
        max_rim_bytes: int = MAX_RIM_BYTES,
    ) -> None:
        if service_key and plain_http_to_remote(base_url):
            raise UsageError(
                "refusing to send the service key to a RIM service over plain http; "
                "use an https URL"
            )
        self.fetcher = fetcher
        self.base_url = base_url.rstrip("/")
        self._service_key = service_key or None
        self.verify_sha256 = verify_sha256
        self.max_rim_bytes = max_rim_bytes

    def __repr__(self) -> str:
        key = "set" if self._service_key else "none"
        return f"RimServiceSource(base_url={safe_url(self.base_url)!r}, service_key={key})"

    def url_for(self, rim_id: str) -> str:
        """The URL a RIM ID is fetched from."""
        return f"{self.base_url}/v1/rim/{quote(rim_id, safe='')}"

    def get_rim(self, rim_id: str) -> bytes:
        """Fetch and unwrap the RIM document for ``rim_id``.

        Raises:
            RimNotFoundError: the ID is malformed, or the service answered 404.
            ServiceAccessDeniedError: the service answered 401 or 403.
            RimServiceError: the answer is not a well-formed RIM response for this ID.
            NetworkError: any other transport failure or HTTP status.
            OfflineError: the fetcher is offline.
        """
        if not valid_rim_id(rim_id):
            raise RimNotFoundError(rim_id, "not a valid RIM ID")
        url = self.url_for(rim_id)
        try:
            body = self.fetcher.get(
                url,
                max_bytes=_json_cap(self.max_rim_bytes),
                headers={"Accept": "application/json"},
                bearer=self._service_key,
            )
        except ServiceAccessDeniedError:
            raise
        except HttpStatusError as exc:
            if exc.status == 404:
                raise RimNotFoundError(rim_id, "not published by the RIM service") from None
            if exc.status in (401, 403):
                raise ServiceAccessDeniedError(
                    f"the RIM service refused access to {rim_id} (HTTP {exc.status})",
                    status=exc.status,
                ) from None
            raise
        return self._unwrap(rim_id, body)

    def _unwrap(self, rim_id: str, body: bytes) -> bytes:
        def bad(problem: str) -> RimServiceError:
            return RimServiceError(f"the RIM service's answer for {rim_id} {problem}")

        doc = loads_untrusted(body, what="answer", error=lambda text: bad(f"is refused: {text}"))
        if not isinstance(doc, dict):
            raise bad("is not a JSON object")
        got_id = doc.get("id")
        if got_id != rim_id:
            shown = got_id[:80] if isinstance(got_id, str) else repr(type(got_id).__name__)
            raise bad(f"is for a different RIM ({shown!r})")
        encoded = doc.get("rim")
        if not isinstance(encoded, str) or not encoded:
            raise bad("has no 'rim' text")
        if len(encoded) > _json_cap(self.max_rim_bytes):
            raise bad(f"carries a RIM larger than {self.max_rim_bytes} bytes")
        try:
            rim = base64.b64decode("".join(encoded.split()), validate=True)
        except (binascii.Error, ValueError):
            raise bad("has a 'rim' field that is not valid base64") from None
        if not rim:
            raise bad("carries an empty RIM")
        if len(rim) > self.max_rim_bytes:
            raise bad(f"carries a RIM larger than {self.max_rim_bytes} bytes")
        digest = doc.get("sha256")
        if self.verify_sha256 and digest is not None:
            if not isinstance(digest, str) or not _HEX64_RE.match(digest):
                raise bad("has a malformed 'sha256' field")
            if hashlib.sha256(rim).hexdigest() != digest.lower():
                raise bad("does not match its own 'sha256' digest")
        return rim
