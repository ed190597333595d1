"""A read-through caching mirror of the vendors' collateral services (``gpucc collateral serve``).

One base URL answers what gpucc (and other clients of the same services) ask of:

* NVIDIA's RIM service: ``GET /v1/rim/{RIM_ID}``;
* NVIDIA's OCSP responder: ``POST /ocsp`` (DER ``OCSPRequest``, one certificate);
* Intel's PCS, in a PCCS's URL shapes: ``/sgx/certification/v4/pckcrl?ca=...``,
  ``/tdx/certification/v4/tcb?fmspc=...``, ``/tdx/certification/v4/qe/identity``,
  ``/sgx/certification/v4/rootcacrl`` (and the SGX ``tcb`` and ``qe/identity``);
* AMD's KDS: ``/vcek/v1/{product}/{hwid}?...SPL=..``, ``/{vcek,vlek}/v1/{product}/cert_chain``
  and ``/{vcek,vlek}/v1/{product}/crl``.

The mirror never vouches for anything. It stores the vendor's bytes as they came (and the
headers that carry issuer chains) and clients verify every answer exactly as if the vendor
had sent it: signatures, chains, validity windows. It reads an answer only to learn how long
the vendor says it is current (:func:`fresh_until`): an OCSP answer until its ``nextUpdate``
(24 h at most), TCB info, QE identity and CRLs until their ``nextUpdate``, RIMs and
certificates until the earliest end of validity of the certificates they carry, each at most
``max_age``. An answer whose lifetime cannot be read is passed on once and not kept.

OCSP nonces: a nonce binds an answer to one request, so a shared answer cannot carry one. The
mirror asks the vendor about the request's CertID *without* a nonce and answers every client
from that one response; a client that sent a nonce sees it missing (``nonce_match: false``),
so clients of a mirror run with ``--no-ocsp-nonce`` and replay is bounded by ``nextUpdate``,
as with gpucc's own cache.

What the mirror does when the vendor cannot answer: a held entry is served while fresh; past
its lifetime it is fetched again, and only when that fails is it served *stale*, within
``grace``, marked with the ``Gpucc-Mirror-Stale`` header and counted (clients still judge
``nextUpdate`` themselves, so a stale OCSP answer is "not checked" for them, never "good").
An item not held is answered 503 (:class:`MirrorUnavailableError`): at once while the vendor
is known to be down (``outage_hold``), otherwise after the transport's timeouts, retries and
deadline. One upstream request per missing item, however many clients wait for it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, quote

from cryptography import x509
from cryptography.x509 import ocsp

from gpucc.core.errors import (
    CollateralUnavailableError,
    FileAccessError,
    HttpStatusError,
    MalformedInputError,
    NetworkError,
    UsageError,
)
from gpucc.core.files import read_capped, write_atomic
from gpucc.core.jsonio import loads_untrusted
from gpucc.core.origins import OriginGuard

__all__ = [
    "EXPORT_FORMAT",
    "VENDORS",
    "Entry",
    "Item",
    "Mirror",
    "MirrorNotFoundError",
    "MirrorRequestError",
    "MirrorStore",
    "MirrorUnavailableError",
    "Served",
    "Upstreams",
    "fresh_until",
    "item_for",
]

_log = logging.getLogger("gpucc.mirror")

VENDORS = ("nvidia-rim", "nvidia-ocsp", "intel-pcs", "amd-kds")
ENTRY_FORMAT = "gpucc-mirror-entry"
EXPORT_FORMAT = "gpucc-mirror-export"
MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_OCSP_REQUEST_BYTES = 16 * 1024
MAX_EXPORT_BYTES = 512 * 1024 * 1024
OCSP_MAX_AGE = dt.timedelta(hours=24)
# Headers kept with an entry: Intel's issuer chains, and the content type.
KEPT_HEADERS = (
    "content-type",
    "sgx-pck-crl-issuer-chain",
    "tcb-info-issuer-chain",
    "sgx-tcb-info-issuer-chain",
    "sgx-enclave-identity-issuer-chain",
)
INTEL_PCS_URL = "https://api.trustedservices.intel.com"
INTEL_ROOT_CA_CRL_URL = "https://certificates.trustedservices.intel.com/IntelSGXRootCA.der"

_RIM_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}$")
_FMSPC = re.compile(r"^[0-9A-Fa-f]{12}$")
_HWID = re.compile(r"^(?:[0-9a-f]{16}|[0-9a-f]{128})$")
_PRODUCT = re.compile(r"^(?:Milan|Genoa|Turin|Bergamo|Siena)$")
_SPL = re.compile(r"^[0-9]{1,3}$")
_KDS_PARAMS = ("fmcSPL", "blSPL", "teeSPL", "snpSPL", "ucodeSPL")


class MirrorRequestError(MalformedInputError):
    """A client asked the mirror something it does not serve or cannot parse (HTTP 400)."""


class MirrorNotFoundError(CollateralUnavailableError):
    """No such item: an unknown path, or the vendor answered 404 (HTTP 404)."""


class MirrorUnavailableError(CollateralUnavailableError):
    """The item is not held and the vendor cannot give it now, or running offline (HTTP 503)."""


# --- what is asked ---------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """One thing the mirror serves.

    Attributes:
        vendor: one of :data:`VENDORS`.
        kind: what the bytes are: ``rim``, ``ocsp``, ``tcb``, ``qe``, ``crl``, ``cert``,
            ``chain`` (decides how freshness is read).
        key: the store key (canonical path and query, or the OCSP CertID).
        path: the upstream path and query, appended to the vendor's base URL (OCSP: empty).
        body: the upstream request body (OCSP: a nonceless request), else None.
    """

    vendor: str
    kind: str
    key: str
    path: str
    body: bytes | None = None

    @property
    def digest(self) -> str:
        """SHA-256 of the key: the entry's file name and its name in logs."""
        return hashlib.sha256(self.key.encode()).hexdigest()


def _query(query: str, allowed: Mapping[str, re.Pattern[str]]) -> dict[str, str]:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise MirrorRequestError("malformed query string") from None
    found: dict[str, str] = {}
    for name, value in pairs:
        pattern = allowed.get(name)
        if pattern is None or name in found or not pattern.match(value):
            raise MirrorRequestError(f"unexpected query parameter {name[:40]!r}")
        found[name] = value
    return found


def _ocsp_item(body: bytes) -> Item:
    if len(body) > MAX_OCSP_REQUEST_BYTES:
        raise MirrorRequestError("the OCSP request is too large")
    try:
        request = ocsp.load_der_ocsp_request(body)
        algorithm = request.hash_algorithm
        name_hash, key_hash = request.issuer_name_hash, request.issuer_key_hash
        serial = request.serial_number
        upstream = (
            ocsp.OCSPRequestBuilder()
            .add_certificate_by_hash(name_hash, key_hash, serial, algorithm)
            .build()
            .public_bytes(_der())
        )
    except (ValueError, TypeError, NotImplementedError):
        raise MirrorRequestError("the body is not a DER OCSP request for one certificate") from None
    key = f"ocsp:{algorithm.name}:{name_hash.hex()}:{key_hash.hex()}:{serial:x}"
    return Item("nvidia-ocsp", "ocsp", key, "", upstream)


def _der() -> Any:
    from cryptography.hazmat.primitives import serialization

    return serialization.Encoding.DER


def item_for(method: str, path: str, query: str = "", body: bytes = b"") -> Item:
    """The item a client's request names.

    Raises:
        MirrorRequestError: a known path with a malformed query or body.
        MirrorNotFoundError: a path the mirror does not serve.
    """
    if method == "POST" and path == "/ocsp":
        return _ocsp_item(body)
    if method != "GET":
        raise MirrorNotFoundError(f"{method} {path[:80]} is not served here")
    parts = path.split("/")
    if path.startswith("/v1/rim/") and len(parts) == 4 and _RIM_ID.match(parts[3]):
        if query:
            raise MirrorRequestError("the RIM service takes no query")
        return Item("nvidia-rim", "rim", path, f"/v1/rim/{quote(parts[3], safe='')}")
    for tee in ("sgx", "tdx"):
        base = f"/{tee}/certification/v4"
        if path == f"{base}/tcb":
            q = _query(query, {"fmspc": _FMSPC})
            if "fmspc" not in q:
                raise MirrorRequestError("tcb needs fmspc")
            p = f"{base}/tcb?fmspc={q['fmspc'].upper()}"
            return Item("intel-pcs", "tcb", p, p)
        if path == f"{base}/qe/identity":
            _query(query, {})
            return Item("intel-pcs", "qe", path, path)
    if path == "/sgx/certification/v4/pckcrl":
        q = _query(
            query, {"ca": re.compile("^(?:processor|platform)$"), "encoding": re.compile("^der$")}
        )
        if "ca" not in q:
            raise MirrorRequestError("pckcrl needs ca")
        p = f"{path}?ca={q['ca']}" + ("&encoding=der" if "encoding" in q else "")
        return Item("intel-pcs", "crl", p, p)
    if path == "/sgx/certification/v4/rootcacrl":
        _query(query, {})
        return Item("intel-pcs", "crl", path, path)
    if len(parts) == 5 and parts[1] in ("vcek", "vlek") and parts[2] == "v1":
        if not _PRODUCT.match(parts[3]):
            raise MirrorNotFoundError(f"unknown AMD product {parts[3][:20]!r}")
        if parts[4] in ("cert_chain", "crl"):
            _query(query, {})
            return Item("amd-kds", "chain" if parts[4] == "cert_chain" else "crl", path, path)
        if parts[1] == "vcek" and _HWID.match(parts[4]):
            q = _query(query, dict.fromkeys(_KDS_PARAMS, _SPL))
            if any(name not in q for name in _KDS_PARAMS[1:]):
                raise MirrorRequestError("a VCEK request needs blSPL, teeSPL, snpSPL and ucodeSPL")
            p = path + "?" + "&".join(f"{n}={int(q[n]):02d}" for n in _KDS_PARAMS if n in q)
            return Item("amd-kds", "cert", p, p)
    raise MirrorNotFoundError(f"{path[:80]} is not served here")


# --- freshness: what the vendor signed ------------------------------------------------


def _crl(data: bytes) -> x509.CertificateRevocationList:
    text = data.strip()
    if text.startswith(b"-----BEGIN"):
        return x509.load_pem_x509_crl(text)
    if text[:1] != b"\x30":
        text = bytes.fromhex(text.decode("ascii"))
    return x509.load_der_x509_crl(text)


def _certs(data: bytes) -> list[x509.Certificate]:
    if data.lstrip().startswith(b"-----BEGIN"):
        return x509.load_pem_x509_certificates(data)
    return [x509.load_der_x509_certificate(data)]


def _iso(text: object) -> dt.datetime:
    if not isinstance(text, str):
        raise ValueError("no date")
    when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        raise ValueError("no time zone")
    return when


def fresh_until(kind: str, body: bytes) -> dt.datetime:
    """Until when the vendor says ``body`` (an answer of ``kind``) is current.

    The mirror's own limits (``max_age``, 24 h for OCSP) are applied by the caller.

    Raises:
        ValueError: the answer does not have the shape of ``kind``, so its lifetime is unknown.
    """
    try:
        if kind == "ocsp":
            response = ocsp.load_der_ocsp_response(body)
            if response.response_status is not ocsp.OCSPResponseStatus.SUCCESSFUL:
                raise ValueError("an unsuccessful OCSP answer")
            nxt = response.next_update_utc
            return nxt if nxt is not None else response.this_update_utc + OCSP_MAX_AGE
        if kind == "rim":
            doc = loads_untrusted(body, what="RIM answer", error=MalformedInputError)
            if not isinstance(doc, dict) or not isinstance(doc.get("rim"), str):
                raise ValueError("not a RIM service answer")
            xml = base64.b64decode("".join(doc["rim"].split()), validate=True)
            return _rim_certs_end(xml)
        if kind in ("tcb", "qe"):
            doc = loads_untrusted(body, what="PCS answer", error=MalformedInputError)
            field = "tcbInfo" if kind == "tcb" else "enclaveIdentity"
            inner = doc.get(field) if isinstance(doc, dict) else None
            if not isinstance(inner, dict):
                raise ValueError(f"no {field}")
            return _iso(inner.get("nextUpdate"))
        if kind == "crl":
            nxt = _crl(body).next_update_utc
            if nxt is None:
                raise ValueError("a CRL without nextUpdate")
            return nxt
        if kind in ("cert", "chain"):
            certs = _certs(body)
            if not certs:
                raise ValueError("no certificate")
            return min(c.not_valid_after_utc for c in certs)
    except (ValueError, TypeError, UnicodeDecodeError, binascii.Error, MalformedInputError) as exc:
        raise ValueError(str(exc) or type(exc).__name__) from None
    raise ValueError(f"unknown kind {kind}")


def _rim_certs_end(xml: bytes) -> dt.datetime:
    from .rim import ReferenceManifest

    try:
        certs = ReferenceManifest.parse(xml).certificates
    except MalformedInputError as exc:
        raise ValueError(str(exc)) from None
    if not certs:
        raise ValueError("a RIM without certificates")
    return min(c.not_valid_after_utc for c in certs)


# --- the store ------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One held answer: the vendor's bytes and when they stop being current."""

    vendor: str
    kind: str
    key: str
    body: bytes = dataclasses.field(repr=False)
    headers: tuple[tuple[str, str], ...]
    fetched: dt.datetime
    fresh_until: dt.datetime

    def to_json(self) -> dict[str, Any]:
        """The entry as a JSON object (store files and exports)."""
        return {
            "format": ENTRY_FORMAT,
            "version": 1,
            "vendor": self.vendor,
            "kind": self.kind,
            "key": self.key,
            "headers": dict(self.headers),
            "fetched": self.fetched.isoformat(),
            "fresh_until": self.fresh_until.isoformat(),
            "sha256": hashlib.sha256(self.body).hexdigest(),
            "body": base64.b64encode(self.body).decode(),
        }

    @classmethod
    def from_json(cls, doc: object, *, max_age: dt.timedelta) -> Entry:
        """An entry read back; its lifetime is read again from its bytes, not believed.

        Raises:
            ValueError: not an entry, or its bytes are damaged or not of its kind.
        """
        if (
            not isinstance(doc, dict)
            or doc.get("format") != ENTRY_FORMAT
            or doc.get("version") != 1
        ):
            raise ValueError("not a mirror entry")
        vendor, kind, key = doc.get("vendor"), doc.get("kind"), doc.get("key")
        headers, body_text, digest = doc.get("headers"), doc.get("body"), doc.get("sha256")
        if vendor not in VENDORS or not isinstance(kind, str) or not isinstance(key, str):
            raise ValueError("an entry without vendor, kind or key")
        if not isinstance(headers, dict) or not all(
            k in KEPT_HEADERS and isinstance(v, str) for k, v in headers.items()
        ):
            raise ValueError("bad headers")
        if not isinstance(body_text, str) or not isinstance(digest, str):
            raise ValueError("no body")
        body = base64.b64decode(body_text, validate=True)
        if len(body) > MAX_BODY_BYTES or hashlib.sha256(body).hexdigest() != digest:
            raise ValueError("the body does not match its digest")
        fetched = _iso(doc.get("fetched"))
        return cls(
            vendor,
            kind,
            key,
            body,
            tuple(sorted(headers.items())),
            fetched,
            _bounded(kind, body, fetched, max_age),
        )


def _bounded(kind: str, body: bytes, fetched: dt.datetime, max_age: dt.timedelta) -> dt.datetime:
    limit = OCSP_MAX_AGE if kind == "ocsp" else max_age
    return min(fresh_until(kind, body), fetched + limit)


class MirrorStore:
    """The mirror's entries, in memory and (unless ``directory`` is None) one file each on disk.

    Files are written atomically (mode 0600) and read back with their digest checked and
    their lifetime read again from the bytes; a damaged file is removed and counted as absent.
    """

    def __init__(self, directory: Path | None, *, max_age: dt.timedelta) -> None:
        self.directory = directory
        self.max_age = max_age
        self._entries: dict[str, Entry] = {}
        self._lock = threading.Lock()
        if directory is not None:
            try:
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise FileAccessError(
                    f"cannot create the store {directory}: {exc.strerror or exc}"
                ) from None
            for path in sorted(directory.glob("*.json")):
                entry = self._load(path)
                if entry is not None:
                    self._entries[entry.key] = entry

    def _load(self, path: Path) -> Entry | None:
        try:
            doc = loads_untrusted(
                read_capped(path, 2 * MAX_BODY_BYTES, what="store entry"),
                what="store entry",
                error=MalformedInputError,
            )
            entry = Entry.from_json(doc, max_age=self.max_age)
            _check_key(entry)
            return entry
        except (
            ValueError,
            MalformedInputError,
            FileAccessError,
            CollateralUnavailableError,
        ) as exc:
            _log.warning(
                json.dumps(
                    {"event": "store-entry-dropped", "file": path.name, "why": str(exc)[:120]}
                )
            )
            with contextlib.suppress(OSError):
                path.unlink()
            return None

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def get(self, key: str) -> Entry | None:
        """The entry held for ``key``, fresh or not."""
        with self._lock:
            return self._entries.get(key)

    def entries(self) -> list[Entry]:
        """Every entry held."""
        with self._lock:
            return list(self._entries.values())

    def put(self, entry: Entry) -> None:
        """Hold ``entry`` (replacing any for its key), on disk first.

        Raises:
            FileAccessError: the store cannot be written (the entry is not held).
        """
        if self.directory is not None:
            name = hashlib.sha256(entry.key.encode()).hexdigest() + ".json"
            write_atomic(
                self.directory / name,
                json.dumps(entry.to_json(), sort_keys=True).encode(),
                mode=0o600,
                force=True,
                what="store entry",
            )
        with self._lock:
            self._entries[entry.key] = entry

    def export(self, now: dt.datetime) -> bytes:
        """Every entry as one export document (``gpucc collateral export``)."""
        doc = {
            "format": EXPORT_FORMAT,
            "version": 1,
            "created": now.isoformat(),
            "entries": [e.to_json() for e in sorted(self.entries(), key=lambda e: e.key)],
        }
        return json.dumps(doc, sort_keys=True, indent=1).encode()


def read_export(data: bytes, *, max_age: dt.timedelta) -> list[Entry]:
    """The entries of an export document, each checked like a store file.

    Raises:
        MalformedInputError: not an export, or an entry that is damaged or not what its key names.
    """
    doc = loads_untrusted(data, what="mirror export", error=MalformedInputError)
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT or doc.get("version") != 1:
        raise MalformedInputError(
            "not a gpucc mirror export (format gpucc-mirror-export, version 1)"
        )
    items = doc.get("entries")
    if not isinstance(items, list):
        raise MalformedInputError("the mirror export has no entries list")
    entries: list[Entry] = []
    for n, item in enumerate(items):
        try:
            entry = Entry.from_json(item, max_age=max_age)
            _check_key(entry)
        except (ValueError, MalformedInputError, CollateralUnavailableError) as exc:
            raise MalformedInputError(f"mirror export entry {n}: {exc}") from None
        entries.append(entry)
    return entries


def _check_key(entry: Entry) -> None:
    """The entry's key is one the mirror would serve, for its vendor and kind."""
    if entry.vendor == "nvidia-ocsp" or entry.kind == "ocsp":
        if entry.vendor != "nvidia-ocsp" or entry.kind != "ocsp" or _item_of(entry) is None:
            raise ValueError("a malformed OCSP key")
        return
    path, _, query = entry.key.partition("?")
    item = item_for("GET", path, query)
    if (item.vendor, item.kind, item.key) != (entry.vendor, entry.kind, entry.key):
        raise ValueError("the key does not name its vendor and kind")


def entries_from_bundle(data: bytes, *, now: dt.datetime, max_age: dt.timedelta) -> list[Entry]:
    """Entries for the RIMs and OCSP answers of a ``gpucc collateral fetch`` bundle.

    RIMs are wrapped as the RIM service answers them; OCSP answers are keyed by their CertID.
    An OCSP answer past its lifetime is left out.

    Raises:
        MalformedBundleError: the bundle cannot be read.
    """
    from .bundle import Bundle

    bundle = Bundle.from_json(data)
    out: list[Entry] = []
    for rim_id, xml in bundle.rims.items():
        body = json.dumps(
            {
                "id": rim_id,
                "rim": base64.b64encode(xml).decode(),
                "sha256": hashlib.sha256(xml).hexdigest(),
            }
        ).encode()
        with contextlib.suppress(ValueError):
            until = _bounded("rim", body, now, max_age)
            headers = (("content-type", "application/json"),)
            out.append(Entry("nvidia-rim", "rim", f"/v1/rim/{rim_id}", body, headers, now, until))
    for entry in bundle.ocsp:
        cid = entry.cert_id
        key = (
            f"ocsp:{cid.hash_algorithm}:{cid.issuer_name_hash.hex()}:"
            f"{cid.issuer_key_hash.hex()}:{cid.serial_number:x}"
        )
        with contextlib.suppress(ValueError):
            until = _bounded("ocsp", entry.response, now, max_age)
            if until > now:
                headers = (("content-type", "application/ocsp-response"),)
                out.append(Entry("nvidia-ocsp", "ocsp", key, entry.response, headers, now, until))
    return out


# --- upstreams and the engine ------------------------------------------------------------


class UpstreamFetcher(Protocol):
    """What the mirror needs of the transport (``RequestsFetcher`` fits)."""

    def get_with_headers(
        self,
        url: str,
        *,
        max_bytes: int,
        accept: Collection[int] = (200,),
        guard: OriginGuard | None = None,
        bearer: str | None = None,
    ) -> tuple[bytes, dict[str, str]]:
        """The body and the response headers."""
        ...

    def post(
        self,
        url: str,
        body: bytes,
        *,
        content_type: str,
        max_bytes: int,
        accept: Collection[int] = (200,),
        headers: Mapping[str, str] | None = None,
        bearer: str | None = None,
        guard: OriginGuard | None = None,
    ) -> bytes:
        """The answer to a POST."""
        ...


@dataclass(frozen=True)
class Upstreams:
    """The vendors' base URLs (a PCCS may stand for Intel's PCS)."""

    rim_url: str = "https://rim.attestation.nvidia.com"
    ocsp_url: str = "https://ocsp.ndis.nvidia.com"
    pcs_url: str = INTEL_PCS_URL
    kds_url: str = "https://kdsintf.amd.com"

    def url(self, item: Item) -> str:
        """The vendor URL ``item`` is fetched from."""
        if item.vendor == "nvidia-ocsp":
            return self.ocsp_url
        if item.vendor == "nvidia-rim":
            return self.rim_url.rstrip("/") + item.path
        if item.vendor == "amd-kds":
            return self.kds_url.rstrip("/") + item.path
        base = self.pcs_url.rstrip("/")
        if item.path == "/sgx/certification/v4/rootcacrl" and base == INTEL_PCS_URL:
            return INTEL_ROOT_CA_CRL_URL
        return base + item.path


@dataclass(frozen=True)
class Served:
    """An answer for a client: the vendor's bytes and how the mirror came by them.

    Attributes:
        body, headers: what the vendor sent (headers: those kept).
        source: ``hit`` (held and fresh), ``miss`` (fetched now), ``stale`` (held past its
            lifetime, within the grace, because the vendor could not be asked), ``pass``
            (fetched now and not kept: its lifetime could not be read or is over).
        fresh_until: when it stops being current (None for ``pass``).
    """

    body: bytes = dataclasses.field(repr=False)
    headers: tuple[tuple[str, str], ...]
    source: str
    fresh_until: dt.datetime | None


class _Flight:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Served | None = None
        self.error: Exception | None = None


@dataclass
class VendorStats:
    """Counters for one vendor (``/metrics``)."""

    hits: int = 0
    misses: int = 0
    coalesced: int = 0
    stale: int = 0
    upstream_requests: int = 0
    upstream_errors: int = 0
    upstream_seconds: float = 0.0
    refreshes: int = 0


class Mirror:
    """The engine: answers items from the store or the vendor; see the module docstring.

    Args:
        store: where entries are held.
        upstreams: the vendors' URLs.
        fetcher: the HTTP layer (timeouts, retries with backoff, a deadline per request).
        clock: the current time (timezone-aware); ``now`` is always asked of it.
        grace: how long past its lifetime an entry may be served stale when the vendor fails.
        offline: never ask a vendor; serve only what is held.
        outage_hold: after a vendor could not be reached, new items for it are answered 503 at
            once for this many seconds.
        wait_s: the longest a client waits for an item another client's request is fetching.
        service_key: NVIDIA service key for the RIM service and OCSP (never logged).
        refresh_ahead: an entry is fetched again in the background when less than this
            fraction of its lifetime is left.
        forget_s: an entry no client has asked for in this many seconds (counted from the
            start for entries read from the store) is no longer renewed; it ages out.
    """

    def __init__(
        self,
        *,
        store: MirrorStore,
        upstreams: Upstreams,
        fetcher: UpstreamFetcher | None,
        clock: Callable[[], dt.datetime],
        grace: dt.timedelta = dt.timedelta(hours=6),
        offline: bool = False,
        outage_hold: float = 10.0,
        wait_s: float = 30.0,
        service_key: str | None = None,
        refresh_ahead: float = 0.2,
        forget_s: float = 30 * 86400.0,
    ) -> None:
        self.store = store
        self.upstreams = upstreams
        self.fetcher = fetcher
        self.clock = clock
        self.grace = grace
        self.offline = offline or fetcher is None
        self.outage_hold = outage_hold
        self.wait_s = wait_s
        self._service_key = service_key
        self.refresh_ahead = refresh_ahead
        self.forget_s = forget_s
        self._asked: dict[str, float] = {}
        self._started = time.monotonic()
        self.stats = {v: VendorStats() for v in VENDORS}
        self._flights: dict[str, _Flight] = {}
        self._lock = threading.Lock()
        self._down_until: dict[str, float] = {}
        self._down_why: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"Mirror(entries={len(self.store)}, offline={self.offline})"

    # -- answering ----------------------------------------------------------------------

    def get(self, item: Item) -> Served:
        """The answer for ``item``.

        Raises:
            MirrorNotFoundError: the vendor answered 404 (e.g. a RIM not published yet).
            MirrorUnavailableError: not held (or held past the grace) and not obtainable now.
        """
        now = self.clock()
        stats = self.stats[item.vendor]
        with self._lock:
            self._asked[item.key] = time.monotonic()
        entry = self.store.get(item.key)
        if entry is not None and now < entry.fresh_until:
            with self._lock:
                stats.hits += 1
            return Served(entry.body, entry.headers, "hit", entry.fresh_until)
        try:
            served = self._single_flight(item)
        except MirrorUnavailableError:
            entry = self.store.get(item.key)
            if entry is not None and now < entry.fresh_until + self.grace:
                with self._lock:
                    stats.stale += 1
                _log.info(
                    json.dumps(
                        {"event": "stale", "vendor": item.vendor, "item": item.digest[:16]},
                        sort_keys=True,
                    )
                )
                return Served(entry.body, entry.headers, "stale", entry.fresh_until)
            raise
        return served

    def _single_flight(self, item: Item, *, for_client: bool = True) -> Served:
        with self._lock:
            flight = self._flights.get(item.key)
            leader = flight is None
            if flight is None:
                flight = self._flights[item.key] = _Flight()
            if for_client and leader:
                self.stats[item.vendor].misses += 1
            elif for_client:
                self.stats[item.vendor].coalesced += 1
        if leader:
            try:
                flight.result = self._fetch(item)
            except Exception as exc:  # handed to every waiter, then raised here
                flight.error = exc
            finally:
                with self._lock:
                    self._flights.pop(item.key, None)
                flight.done.set()
        elif not flight.done.wait(self.wait_s):
            raise MirrorUnavailableError(
                f"the {item.vendor} answer did not arrive within {self.wait_s:g} s"
            )
        if flight.error is not None:
            raise flight.error
        assert flight.result is not None
        return flight.result

    def _fetch(self, item: Item) -> Served:
        """Ask the vendor (never more than one request at a time per item)."""
        if self.offline or self.fetcher is None:
            raise MirrorUnavailableError("offline: the mirror serves only what it holds")
        down = self._down_until.get(item.vendor, 0.0)
        if time.monotonic() < down:
            raise MirrorUnavailableError(
                f"{item.vendor} is unreachable ({self._down_why.get(item.vendor, '')}); "
                "not retried for a few seconds"
            )
        url = self.upstreams.url(item)
        stats = self.stats[item.vendor]
        started = time.monotonic()
        status = 200
        error = ""
        try:
            if item.body is not None:
                body = self.fetcher.post(
                    url,
                    item.body,
                    content_type="application/ocsp-request",
                    max_bytes=MAX_BODY_BYTES,
                    headers={"Accept": "application/ocsp-response"},
                    bearer=self._service_key,
                )
                headers: dict[str, str] = {"content-type": "application/ocsp-response"}
            else:
                body, headers = self._get(url, item)
        except HttpStatusError as exc:
            status, error = exc.status, str(exc)
            if exc.status == 404:
                raise MirrorNotFoundError(f"{item.vendor} has no such item (HTTP 404)") from None
            raise MirrorUnavailableError(f"{item.vendor} answered HTTP {exc.status}") from None
        except UsageError as exc:  # a configuration the transport refuses (checked at start)
            status, error = 0, str(exc)
            raise MirrorUnavailableError(f"{item.vendor} cannot be asked: {exc}") from None
        except NetworkError as exc:
            status, error = 0, str(exc)
            with self._lock:
                self._down_until[item.vendor] = time.monotonic() + self.outage_hold
                self._down_why[item.vendor] = str(exc)[:160]
            raise MirrorUnavailableError(f"{item.vendor} is unavailable: {exc}") from None
        finally:
            elapsed = time.monotonic() - started
            with self._lock:
                stats.upstream_requests += 1
                stats.upstream_seconds += elapsed
                if status != 200:
                    stats.upstream_errors += 1
            _log.info(
                json.dumps(
                    {
                        "event": "upstream",
                        "vendor": item.vendor,
                        "item": item.digest[:16],
                        "status": status,
                        "ms": round(elapsed * 1000, 1),
                        **({"error": error[:200]} if error else {}),
                    },
                    sort_keys=True,
                )
            )
        with self._lock:
            self._down_until.pop(item.vendor, None)
        kept = tuple(sorted((k, v) for k, v in headers.items() if k in KEPT_HEADERS))
        now = self.clock()
        try:
            until = _bounded(item.kind, body, now, self.store.max_age)
        except ValueError as exc:
            with self._lock:
                stats.upstream_errors += 1
            raise MirrorUnavailableError(
                f"{item.vendor} answered something that is not a {item.kind} answer: {exc}"
            ) from None
        if until <= now:
            return Served(body, kept, "pass", None)
        entry = Entry(item.vendor, item.kind, item.key, body, kept, now, until)
        try:
            self.store.put(entry)
        except FileAccessError as exc:
            _log.warning(json.dumps({"event": "store-write-failed", "why": str(exc)[:200]}))
            return Served(body, kept, "pass", None)
        return Served(body, kept, "miss", until)

    def _get(self, url: str, item: Item) -> tuple[bytes, dict[str, str]]:
        assert self.fetcher is not None
        return self.fetcher.get_with_headers(
            url,
            max_bytes=MAX_BODY_BYTES,
            guard=OriginGuard(url),  # a redirect may not lead away from the vendor's origin
            bearer=self._service_key if item.vendor == "nvidia-rim" else None,
        )

    # -- background refresh ---------------------------------------------------------------

    def due(self) -> list[Entry]:
        """Entries asked for lately with less than ``refresh_ahead`` of their lifetime left."""
        now = self.clock()
        recent = time.monotonic() - self.forget_s
        out = []
        for entry in self.store.entries():
            if self._asked.get(entry.key, self._started) < recent:
                continue
            life = (entry.fresh_until - entry.fetched).total_seconds()
            if (entry.fresh_until - now).total_seconds() <= life * self.refresh_ahead:
                out.append(entry)
        return out

    def refresh(self) -> int:
        """Fetch every due entry again; how many were renewed (failures leave them as they are)."""
        if self.offline:
            return 0
        renewed = 0
        for entry in self.due():
            item = _item_of(entry)
            if item is None:
                continue
            try:
                served = self._single_flight(item, for_client=False)
            except (MirrorUnavailableError, MirrorNotFoundError):
                continue
            if served.source == "miss":
                renewed += 1
                with self._lock:
                    self.stats[item.vendor].refreshes += 1
        return renewed


def _item_of(entry: Entry) -> Item | None:
    """The item an entry answers (to fetch it again)."""
    try:
        if entry.vendor == "nvidia-ocsp":
            _, alg, name_hash, key_hash, serial = entry.key.split(":")
            from cryptography.hazmat.primitives import hashes

            algorithms: dict[str, hashes.HashAlgorithm] = {
                "sha1": hashes.SHA1(),  # noqa: S303 - a CertID names its hash; it signs nothing
                "sha256": hashes.SHA256(),
                "sha384": hashes.SHA384(),
                "sha512": hashes.SHA512(),
            }
            algorithm = algorithms[alg]
            body = (
                ocsp.OCSPRequestBuilder()
                .add_certificate_by_hash(
                    bytes.fromhex(name_hash), bytes.fromhex(key_hash), int(serial, 16), algorithm
                )
                .build()
                .public_bytes(_der())
            )
            return Item("nvidia-ocsp", "ocsp", entry.key, "", body)
        path, _, query = entry.key.partition("?")
        return item_for("GET", path, query)
    except (ValueError, KeyError, MalformedInputError, CollateralUnavailableError):
        return None
