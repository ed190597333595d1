"""A persistent, self-checking cache for RIMs and OCSP responses.

Layout under the cache directory (default ``platformdirs.user_cache_dir("gpucc")``,
created with mode 0700)::

    rim/<RIM_ID>.json      {"format": "gpucc-cache", "kind": "rim", "version": 1,
                            "key": "<RIM_ID>", "sha256": "<hex>", "data": "<base64>"}
    ocsp/<key>.json        {"format": "gpucc-cache", "kind": "ocsp", "version": 1,
                            "key": "<key>", "expires": "<ISO 8601>", "sha256": "<hex>",
                            "data": "<base64 DER OCSPResponse>"}

The OCSP key is the SHA-256 of the DER ``CertID`` (:meth:`gpuattest.ocsp.CertId.key`).

Rules:

* Nothing read from the cache is trusted: the cache stores raw RIM bytes and raw
  OCSP response bytes, and callers verify them on every use exactly as if they
  had just been fetched (RIM signature and chain; OCSP signature, responder,
  CertID, validity window).
* An entry is checked against its SHA-256 digest on every read. A corrupt entry
  (not JSON, wrong shape, digest mismatch, truncated, oversized) is deleted and
  reported as a miss; it is never fatal.
* An OCSP entry is served only while ``now < expires``; ``expires`` is never
  later than the response's ``nextUpdate`` (see :class:`gpuattest.ocsp.OcspClient`).
* Writes are atomic (temporary file in the same directory, fsync, rename); a
  failed write is ignored (the cache is an optimisation, never a requirement).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import platformdirs

from gpucc.core.errors import FileAccessError, MalformedInputError
from gpucc.core.files import read_capped, write_atomic
from gpucc.core.jsonio import loads_untrusted

from .collateral import MAX_RIM_BYTES, RimSource

__all__ = [
    "CACHE_FORMAT",
    "CachingRimSource",
    "CollateralCache",
    "default_cache_dir",
]

_log = logging.getLogger(__name__)

CACHE_FORMAT = "gpucc-cache"
_VERSION = 1
_KEY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}$")
_KIND_RE = re.compile(r"^[a-z][a-z0-9\-]{0,31}$")
# An OCSP response is a few KiB; anything bigger in the cache is not ours.
_MAX_OCSP_ENTRY = 256 * 1024
_MAX_RIM_ENTRY = (MAX_RIM_BYTES * 4) // 3 + 4096
_MAX_TDX_ENTRY = 16 * 1024 * 1024  # PCCS JSON of a TDX platform's collateral, base64


def default_cache_dir() -> Path:
    """The per-user cache directory (``platformdirs.user_cache_dir("gpucc")``)."""
    return Path(platformdirs.user_cache_dir("gpucc"))


class CollateralCache:
    """RIMs and OCSP responses on disk; see the module docstring for the rules.

    Args:
        directory: where entries live; created (mode 0700) on first write.
    """

    def __init__(self, directory: Path, *, offline: bool = False) -> None:
        self.directory = Path(directory)
        #: Nothing missing is fetched (--offline): a miss is final, and its log line says so.
        self.offline = offline

    @classmethod
    def default(cls, *, offline: bool = False) -> CollateralCache:
        """The cache in the per-user cache directory."""
        return cls(default_cache_dir(), offline=offline)

    def __repr__(self) -> str:
        return f"CollateralCache({str(self.directory)!r})"

    # -- RIMs --------------------------------------------------------------

    def get_rim(self, rim_id: str) -> bytes | None:
        """The cached RIM for ``rim_id`` if present and intact, else None."""
        if not _KEY_RE.match(rim_id):
            return None
        return self._read("rim", rim_id, _MAX_RIM_ENTRY, now=None)

    def put_rim(self, rim_id: str, data: bytes) -> None:
        """Store a RIM (best effort)."""
        if _KEY_RE.match(rim_id) and 0 < len(data) <= MAX_RIM_BYTES:
            self._write("rim", rim_id, data, expires=None)

    def discard_rim(self, rim_id: str) -> None:
        """Forget a cached RIM (e.g. after it failed verification)."""
        if _KEY_RE.match(rim_id):
            self._discard(self._path("rim", rim_id))

    # -- OCSP --------------------------------------------------------------

    def get_ocsp(self, key: str, *, now: dt.datetime) -> bytes | None:
        """The cached OCSP response for ``key`` if intact and ``now < expires``, else None."""
        if not _KEY_RE.match(key):
            return None
        return self._read("ocsp", key, _MAX_OCSP_ENTRY, now=now)

    def put_ocsp(self, key: str, response: bytes, *, expires: dt.datetime) -> None:
        """Store an OCSP response to be served until ``expires`` (best effort)."""
        if expires.tzinfo is None:
            raise ValueError("expires must be timezone-aware")
        if _KEY_RE.match(key) and 0 < len(response) <= _MAX_OCSP_ENTRY // 2:
            self._write("ocsp", key, response, expires=expires)

    def discard_ocsp(self, key: str) -> None:
        """Forget a cached OCSP response."""
        if _KEY_RE.match(key):
            self._discard(self._path("ocsp", key))

    # -- other collateral (VCEKs, TDX collateral) -----------------------------

    def get_blob(self, kind: str, key: str, *, cap: int) -> bytes | None:
        """The cached ``kind`` entry for ``key`` if present, intact and under ``cap``, else None.

        For collateral whose validity the verifier judges itself (certificates, signed
        documents), so entries carry no expiry of their own.
        """
        if not (_KIND_RE.match(kind) and _KEY_RE.match(key)) or kind in ("rim", "ocsp"):
            return None
        return self._read(kind, key, (cap * 4) // 3 + 4096, now=None)

    def put_blob(self, kind: str, key: str, data: bytes, *, cap: int) -> None:
        """Store a ``kind`` entry (best effort; nothing over ``cap`` bytes)."""
        if _KIND_RE.match(kind) and _KEY_RE.match(key) and kind not in ("rim", "ocsp"):
            if 0 < len(data) <= cap:
                self._write(kind, key, data, expires=None)

    def discard_blob(self, kind: str, key: str) -> None:
        """Forget a ``kind`` entry (e.g. after it proved unusable)."""
        if _KIND_RE.match(kind) and _KEY_RE.match(key):
            self._discard(self._path(kind, key))

    # -- TDX collateral ------------------------------------------------------

    def get_tdx(self, key: str, *, now: dt.datetime) -> bytes | None:
        """Cached TDX collateral (PCCS JSON) for ``key`` if intact and ``now < expires``."""
        if not _KEY_RE.match(key):
            return None
        return self._read("tdx", key, _MAX_TDX_ENTRY, now=now)

    def put_tdx(self, key: str, collateral: bytes, *, expires: dt.datetime) -> None:
        """Store TDX collateral until ``expires`` (its earliest next update; best effort)."""
        if expires.tzinfo is None:
            raise ValueError("expires must be timezone-aware")
        if _KEY_RE.match(key) and 0 < len(collateral) <= _MAX_TDX_ENTRY // 2:
            self._write("tdx", key, collateral, expires=expires)

    # -- internals ---------------------------------------------------------

    def _path(self, kind: str, key: str) -> Path:
        return self.directory / kind / f"{key}.json"

    def _discard(self, path: Path) -> None:
        with contextlib.suppress(OSError):
            path.unlink()

    def _read(self, kind: str, key: str, cap: int, *, now: dt.datetime | None) -> bytes | None:
        path = self._path(kind, key)
        if not path.exists():
            if self.offline:
                _log.debug("not in the cache: %s %s (offline: not fetched)", kind, key)
            else:
                _log.debug("cache miss: %s %s (to be fetched)", kind, key)
            return None
        try:
            raw = read_capped(path, cap, what="cache entry")
        except FileAccessError as exc:
            _log.debug("cache entry unreadable: %s", exc)
            return None
        data = self._decode(raw, kind, key, cap)
        if data is None:
            _log.debug("discarding corrupt cache entry %s", path)
            self._discard(path)
            return None
        payload, expires = data
        if now is not None and (expires is None or not now < expires):
            # Expired (or an OCSP entry without an expiry, which we never write): not served.
            _log.debug("cache entry expired: %s %s", kind, key)
            self._discard(path)
            return None
        _log.debug("cache hit: %s %s (%d bytes)", kind, key, len(payload))
        return payload

    @staticmethod
    def _decode(
        raw: bytes, kind: str, key: str, cap: int
    ) -> tuple[bytes, dt.datetime | None] | None:
        if len(raw) > cap:
            return None
        try:
            doc: Any = loads_untrusted(raw, what="cache entry", error=MalformedInputError)
        except MalformedInputError:
            return None
        if not isinstance(doc, dict):
            return None
        if (
            doc.get("format") != CACHE_FORMAT
            or doc.get("version") != _VERSION
            or doc.get("kind") != kind
            or doc.get("key") != key
        ):
            return None
        encoded, digest = doc.get("data"), doc.get("sha256")
        if not isinstance(encoded, str) or not isinstance(digest, str):
            return None
        try:
            payload = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            return None
        if not payload or hashlib.sha256(payload).hexdigest() != digest:
            return None
        expires: dt.datetime | None = None
        if kind in ("ocsp", "tdx"):
            text = doc.get("expires")
            if not isinstance(text, str):
                return None
            try:
                expires = dt.datetime.fromisoformat(text)
            except ValueError:
                return None
            if expires.tzinfo is None:
                return None
        return payload, expires

    def _write(self, kind: str, key: str, payload: bytes, *, expires: dt.datetime | None) -> None:
        doc: dict[str, Any] = {
            "format": CACHE_FORMAT,
            "kind": kind,
            "version": _VERSION,
            "key": key,
        }
        if expires is not None:
            doc["expires"] = expires.astimezone(dt.UTC).isoformat()
        doc["sha256"] = hashlib.sha256(payload).hexdigest()
        doc["data"] = base64.b64encode(payload).decode("ascii")
        path = self._path(kind, key)
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.parent.mkdir(mode=0o700, exist_ok=True)
            os.chmod(path.parent, 0o700)
            write_atomic(
                path, json.dumps(doc, sort_keys=True).encode("ascii"), mode=0o600, force=True
            )
        except OSError as exc:
            _log.debug("cannot write cache entry %s: %s", path, exc.strerror)
        except FileAccessError as exc:
            _log.debug("cannot write cache entry %s: %s", path, exc)


class CachingRimSource:
    """A :class:`~gpuattest.collateral.RimSource` that remembers what ``inner`` returned.

    A cached RIM is returned without asking ``inner``; the caller verifies it like
    any other RIM. Call :meth:`forget` when a RIM fails verification so that the
    next run asks the service again instead of failing on the same bytes.
    """

    def __init__(self, inner: RimSource, cache: CollateralCache) -> None:
        self.inner = inner
        self.cache = cache

    def __repr__(self) -> str:
        return f"CachingRimSource({self.inner!r}, {self.cache!r})"

    def get_rim(self, rim_id: str) -> bytes:
        """The cached RIM, or the one ``inner`` returns (then cached).

        Raises:
            whatever ``inner.get_rim`` raises on a cache miss.
        """
        cached = self.cache.get_rim(rim_id)
        if cached is not None:
            return cached
        data = self.inner.get_rim(rim_id)
        self.cache.put_rim(rim_id, data)
        return data

    def forget(self, rim_id: str) -> None:
        """Drop ``rim_id`` from the cache."""
        self.cache.discard_rim(rim_id)
