"""NVIDIA's published token-signing keys (a JWKS), fetched, cached and pinned.

The key set is fetched through the one HTTP layer (size cap, timeouts, typed
errors) and kept in memory for :data:`DEFAULT_JWKS_TTL`. A token names its key
by ``kid``; when the ``kid`` is not in a cached set, the set is fetched once more
(NVIDIA rotates keys), and a ``kid`` still absent is refused.

Keys are usable only when they are EC P-384 public keys (``kty`` EC, ``crv``
P-384), with ``use`` absent or ``sig`` and ``alg`` absent or ES384. Anything
else in the set is kept aside with the reason, so that a token naming it is
refused with that reason rather than "unknown key".

``x5c`` (RFC 7517 §4.7, standard base64 DER, leaf first): when present, its
first certificate must hold exactly the JWK's key. When the client has pinned
roots, every key must carry an ``x5c`` chain that validates (signatures, CA
constraints, validity at the verification time) to one of them; the root may be
omitted from ``x5c``. Without pinned roots the key is trusted because it came
over TLS from the configured host; a JWKS URL over plain http to anything but a
loopback address is then refused.

The set is fetched from the configured origin only: a redirect to another scheme,
host or port is refused (:class:`~gpuattest._internal.origins.RedirectRefusedError`,
exit 3) unless that origin was named (``allowed_origins``), so a redirect cannot move
the anchor silently. The set, and every key in it, records the origin that served it.

With pinned roots, a :class:`JwksDiskCache` keeps the set between runs until it
expires; every key read from it is chain-checked again before use.

A key set that cannot be fetched or parsed is :class:`RemoteServiceError`
(exit 3): the service failed, nothing was learnt about the evidence.
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
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.core.errors import (
    CollateralUnavailableError,
    MalformedCertificateError,
    MalformedInputError,
)
from gpucc.core.files import write_atomic
from gpucc.core.jsonio import loads_untrusted
from gpucc.core.origins import OriginGuard, origin_of, parse_origin
from gpucc.core.transport import Fetcher, plain_http_to_remote, safe_url

from .jws import TokenCheckError, b64url_decode
from .x509chain import ChainProfile, load_certificate, validate_chain

__all__ = [
    "DEFAULT_JWKS_TTL",
    "MAX_JWKS_BYTES",
    "X5C_CHAIN",
    "JwksClient",
    "JwksDiskCache",
    "KeySet",
    "RemoteServiceError",
    "SigningKey",
    "check_key_chain",
    "parse_jwks",
]

MAX_JWKS_BYTES = 256 * 1024
MAX_KEYS = 64
#: A key's ``x5c`` chain to a pinned root: any length up to the cap, any verifiable algorithm.
X5C_CHAIN = ChainProfile("JWKS x5c")
MAX_X5C = 10
DEFAULT_JWKS_TTL = 3600.0  # seconds
_P384_BYTES = 48
_CACHE_FORMAT = "gpucc-cache"
_MAX_CACHE_ENTRY = (MAX_JWKS_BYTES * 4) // 3 + 4096

_log = logging.getLogger(__name__)


class RemoteServiceError(CollateralUnavailableError):
    """A verification service answered something unusable (not JSON, wrong shape, too big)."""

    hint = "the attestation service failed; retry later or check --nras-url"


@dataclass(frozen=True)
class SigningKey:
    """One usable key of the set.

    Attributes:
        kid: the key id tokens name.
        public_key: the P-384 public key.
        chain: the ``x5c`` certificates, leaf first (empty when the JWK has none).
        origin: the origin that served the key set (``https://host[:port]``).
    """

    kid: str
    public_key: ec.EllipticCurvePublicKey = field(repr=False)
    chain: tuple[x509.Certificate, ...] = field(default=(), repr=False)
    origin: str = ""


@dataclass(frozen=True)
class KeySet:
    """A parsed JWKS: usable keys by ``kid``, why the others are unusable, who served it."""

    keys: Mapping[str, SigningKey]
    unusable: Mapping[str, str]
    origin: str = ""


def _b64_certs(value: object) -> tuple[x509.Certificate, ...]:
    if not isinstance(value, list) or not value or len(value) > MAX_X5C:
        raise ValueError("x5c is not a list of 1 to 10 certificates")
    certs: list[x509.Certificate] = []
    for item in value:
        if not isinstance(item, str):
            raise ValueError("x5c entry is not text")
        try:
            der = base64.b64decode(item, validate=True)
            certs.append(load_certificate(der, what="the x5c entry"))
        except (binascii.Error, ValueError, MalformedCertificateError) as exc:
            raise ValueError(f"x5c entry is not a DER certificate: {exc}") from None
    return tuple(certs)


def _parse_key(jwk: Mapping[str, object], kid: str, origin: str) -> SigningKey:
    """One JWK to a :class:`SigningKey`; ValueError says why it is unusable."""
    if jwk.get("kty") != "EC" or jwk.get("crv") != "P-384":
        raise ValueError("not an EC P-384 key")
    if jwk.get("use", "sig") != "sig":
        raise ValueError("not a signature key")
    if jwk.get("alg", "ES384") != "ES384":
        raise ValueError(f"declared for {jwk.get('alg')!r}, not ES384")
    x, y = jwk.get("x"), jwk.get("y")
    if not isinstance(x, str) or not isinstance(y, str):
        raise ValueError("x or y is missing")
    try:
        xb, yb = b64url_decode(x, "x"), b64url_decode(y, "y")
    except Exception:
        raise ValueError("x or y is not base64url") from None
    if len(xb) != _P384_BYTES or len(yb) != _P384_BYTES:
        raise ValueError("x or y is not 48 bytes")
    numbers = ec.EllipticCurvePublicNumbers(
        int.from_bytes(xb, "big"), int.from_bytes(yb, "big"), ec.SECP384R1()
    )
    public_key = numbers.public_key()  # ValueError when the point is not on the curve
    chain: tuple[x509.Certificate, ...] = ()
    if "x5c" in jwk:
        chain = _b64_certs(jwk["x5c"])
        if _spki(chain[0].public_key()) != _spki(public_key):
            raise ValueError("x5c[0] does not hold the key given by x and y")
    return SigningKey(kid=kid, public_key=public_key, chain=chain, origin=origin)


def _spki(key: object) -> bytes:
    if not isinstance(key, ec.EllipticCurvePublicKey):
        return b""
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def parse_jwks(data: bytes, source: str = "key set", origin: str = "") -> KeySet:
    """Parse a JWKS document that ``origin`` served.

    Raises:
        RemoteServiceError: not JSON, no ``keys`` list, too many keys, a key
            without a ``kid`` or a ``kid`` given twice.
    """
    if len(data) > MAX_JWKS_BYTES:
        raise RemoteServiceError(f"{source} is larger than {MAX_JWKS_BYTES} bytes")
    doc = loads_untrusted(data, what=source, error=RemoteServiceError)
    entries = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise RemoteServiceError(f"{source} has no 'keys' list")
    if len(entries) > MAX_KEYS:
        raise RemoteServiceError(f"{source} holds more than {MAX_KEYS} keys")
    keys: dict[str, SigningKey] = {}
    unusable: dict[str, str] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise RemoteServiceError(f"{source} holds a key that is not an object")
        kid = entry.get("kid")
        if not isinstance(kid, str) or not kid:
            raise RemoteServiceError(f"{source} holds a key without a 'kid'")
        if kid in keys or kid in unusable:
            raise RemoteServiceError(f"{source} holds kid {kid[:64]!r} twice")
        try:
            keys[kid] = _parse_key(entry, kid, origin)
        except ValueError as exc:
            unusable[kid] = " ".join(str(exc).split())[:160]
    return KeySet(keys=keys, unusable=unusable, origin=origin)


def check_key_chain(key: SigningKey, roots: Sequence[x509.Certificate], now: dt.datetime) -> None:
    """With pinned ``roots``, the key's ``x5c`` chain must validate to one of them at ``now``.

    Without roots nothing is checked here (``x5c[0]`` was matched to the key when parsed).

    Raises:
        TokenCheckError: check ``x5c``.
    """
    if not roots:
        return
    if not key.chain:
        raise TokenCheckError("x5c", f"key {key.kid!r} has no x5c chain to check")
    chain = list(key.chain)
    root_der = {_der(r): r for r in roots}
    if _der(chain[-1]) in root_der:
        anchor = root_der[_der(chain[-1])]
    else:
        issuers = [r for r in roots if r.subject == chain[-1].issuer]
        if not issuers:
            raise TokenCheckError(
                "x5c", f"the x5c chain of key {key.kid!r} does not end in a pinned root"
            )
        anchor = issuers[0]
        chain.append(anchor)
    result = validate_chain(chain, anchor, now, X5C_CHAIN)
    if not result.ok:
        raise TokenCheckError("x5c", f"the x5c chain of key {key.kid!r}: {result.reason}")
    try:
        usage = chain[0].extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return
    if not usage.digital_signature:
        raise TokenCheckError("x5c", f"the certificate of key {key.kid!r} may not sign")


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


class JwksDiskCache:
    """Key sets on disk, ``<directory>/jwks/<sha256 of the URL>.json``, self-checking.

    An entry holds the raw JWKS bytes, their SHA-256, the URL, the origin that served
    them and an expiry; one that is corrupt, for another URL, without an origin or
    expired is deleted and reported as a miss.
    What is read is parsed again and, since :class:`JwksClient` uses this cache
    only with pinned roots, every key is chain-checked again before use: the
    cache is an optimisation, never a source of trust. Writes are atomic, 0600,
    in a 0700 directory; a failed write is ignored.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def __repr__(self) -> str:
        return f"JwksDiskCache({str(self.directory)!r})"

    def _path(self, url: str) -> Path:
        return self.directory / "jwks" / f"{hashlib.sha256(url.encode()).hexdigest()}.json"

    def get(self, url: str, *, wall: float) -> tuple[bytes, float, str] | None:
        """(JWKS bytes, expiry as Unix seconds, origin) when an intact entry for ``url``
        is fresh."""
        path = self._path(url)
        try:
            with path.open("rb") as fh:
                raw = fh.read(_MAX_CACHE_ENTRY + 1)
        except OSError:
            return None
        entry = self._decode(raw, url)
        if entry is None or not wall < entry[1]:
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        return entry

    @staticmethod
    def _decode(raw: bytes, url: str) -> tuple[bytes, float, str] | None:
        if len(raw) > _MAX_CACHE_ENTRY:
            return None
        try:
            doc = loads_untrusted(raw, what="cache entry", error=MalformedInputError)
        except MalformedInputError:
            return None
        if not isinstance(doc, dict) or (doc.get("format"), doc.get("kind"), doc.get("url")) != (
            _CACHE_FORMAT,
            "jwks",
            url,
        ):
            return None
        data, digest, expires = doc.get("data"), doc.get("sha256"), doc.get("expires")
        origin = doc.get("origin")
        if not (isinstance(data, str) and isinstance(digest, str) and isinstance(origin, str)):
            return None
        if isinstance(expires, bool) or not isinstance(expires, int | float):
            return None
        try:
            payload = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            return None
        if hashlib.sha256(payload).hexdigest() != digest:
            return None
        return payload, float(expires), origin

    def put(self, url: str, data: bytes, *, expires: float, origin: str | None = None) -> None:
        """Store ``data`` for ``url``, served by ``origin`` (default: the URL's), until
        ``expires`` (Unix seconds); best effort."""
        if not 0 < len(data) <= MAX_JWKS_BYTES:
            return
        doc = {
            "format": _CACHE_FORMAT,
            "kind": "jwks",
            "version": 1,
            "url": url,
            "origin": origin if origin is not None else origin_of(url),
            "expires": expires,
            "sha256": hashlib.sha256(data).hexdigest(),
            "data": base64.b64encode(data).decode("ascii"),
        }
        path = self._path(url)
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.parent.mkdir(mode=0o700, exist_ok=True)
            os.chmod(path.parent, 0o700)
            write_atomic(path, json.dumps(doc, sort_keys=True).encode("ascii"), mode=0o600)
        except OSError as exc:
            _log.debug("cannot write key-set cache entry %s: %s", path, exc.strerror)


class JwksClient:
    """Fetches and caches one key set; see the module docstring.

    Args:
        fetcher: the HTTP layer.
        url: the JWKS URL.
        roots: pinned anchors for ``x5c`` chains; empty trusts the TLS channel (https only).
        ttl: seconds a fetched set is used before it is fetched again.
        service_key: sent as a bearer token when given.
        clock: a monotonic clock in seconds (tests inject one).
        disk: an on-disk cache shared between runs; used only with pinned roots.
        wall_clock: Unix time in seconds, for the disk cache's expiry.
        allowed_origins: origins (``https://host[:port]``) besides the URL's own that
            the set may be redirected to.

    Raises:
        RemoteServiceError: (at construction) no roots and a plain-http URL, or allowed
            origin, to a remote host.
        UsageError: (at construction) an allowed origin that is not an origin.
    """

    def __init__(
        self,
        *,
        fetcher: Fetcher,
        url: str,
        roots: Sequence[x509.Certificate] = (),
        ttl: float = DEFAULT_JWKS_TTL,
        service_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        disk: JwksDiskCache | None = None,
        wall_clock: Callable[[], float] = time.time,
        allowed_origins: Iterable[str] = (),
    ) -> None:
        self.allowed_origins = tuple(parse_origin(o) for o in allowed_origins)
        for where in (url, *self.allowed_origins):
            if not roots and plain_http_to_remote(where):
                raise RemoteServiceError(
                    f"refusing key set from {safe_url(where)} over plain http without pinned roots"
                )
        self.url = url
        self.roots = tuple(roots)
        self.ttl = ttl
        self._fetcher = fetcher
        self._service_key = service_key
        self._clock = clock
        self._lock = threading.Lock()
        self._disk = disk if self.roots else None
        self._wall = wall_clock
        # (monotonic expiry, key set)
        self._cached: tuple[float, KeySet] | None = None

    def __repr__(self) -> str:
        return f"JwksClient({safe_url(self.url)!r}, roots={len(self.roots)})"

    def fetch(self) -> KeySet:
        """Fetch and parse the set now, replacing the cached one.

        Raises:
            NetworkError: the service could not be reached, answered an error status, or
                redirected to an origin not allowed (RedirectRefusedError).
            RemoteServiceError: the answer is not a usable JWKS.
        """
        guard = OriginGuard(self.url, self.allowed_origins)
        body = self._fetcher.get(
            self.url,
            max_bytes=MAX_JWKS_BYTES,
            headers={"Accept": "application/json"},
            bearer=self._service_key,
            guard=guard,
        )
        origin = guard.final_origin
        keys = parse_jwks(body, f"key set {safe_url(self.url)}", origin)
        with self._lock:
            self._cached = (self._clock() + self.ttl, keys)
        if self._disk is not None:
            self._disk.put(self.url, body, expires=self._wall() + self.ttl, origin=origin)
        return keys

    def _from_disk(self) -> KeySet | None:
        if self._disk is None:
            return None
        wall = self._wall()
        entry = self._disk.get(self.url, wall=wall)
        if entry is None:
            return None
        body, expires, origin = entry
        try:
            keys = parse_jwks(body, "cached key set", origin)
        except RemoteServiceError:
            return None
        with self._lock:
            self._cached = (self._clock() + min(expires - wall, self.ttl), keys)
        return keys

    def _current(self) -> tuple[KeySet, bool]:
        with self._lock:
            cached = self._cached
        if cached is not None and self._clock() < cached[0]:
            return cached[1], False
        stored = self._from_disk()
        if stored is not None:
            return stored, False
        return self.fetch(), True

    def key_for(self, kid: str, *, now: dt.datetime) -> SigningKey:
        """The usable, chain-checked key named ``kid``.

        Raises:
            TokenCheckError: check ``kid`` (not in the set, or unusable) or ``x5c``.
            NetworkError, RemoteServiceError: the set could not be obtained.
        """
        keys, fresh = self._current()
        if kid not in keys.keys and not fresh:
            keys = self.fetch()
        shown = kid[:64]
        if kid in keys.unusable:
            raise TokenCheckError("kid", f"key {shown!r} is unusable: {keys.unusable[kid]}")
        key = keys.keys.get(kid)
        if key is None:
            raise TokenCheckError("kid", f"no key {shown!r} in the key set {safe_url(self.url)}")
        check_key_chain(key, self.roots, now)
        return key
