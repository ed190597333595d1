"""An OCSP (RFC 6960) client for NVIDIA's device and RIM chains.

:class:`OcspClient` implements :class:`~gpuattest.collateral.OcspChecker`: it asks
an OCSP responder about one :class:`~gpuattest.collateral.OcspTarget` and judges
the answer with :func:`gpuattest.ocsp_response.evaluate_response`, which does all
the verification and documents what each answer means.

Request
    One unsigned ``OCSPRequest`` per certificate, POSTed as DER with
    ``Content-Type: application/ocsp-request``. A 32-byte random nonce goes in a
    **non-critical** ``id-pkix-ocsp-nonce`` extension (RFC 8954's recommendation)
    unless ``use_nonce=False``.

Failures
    Network failure, offline, an HTTP error: not-checked, ``response_valid=None``,
    collateral missing. :meth:`OcspClient.check` never raises for network or
    response problems. After a connection-level failure the rest of the client's
    checks report it at once instead of paying timeouts for every certificate.

Cache (``cache=``)
    A response is cached only when it verified completely and its nonce did not
    mismatch (a replayed answer must not be laundered into the cache). It is
    served until ``min(nextUpdate, thisUpdate + max_age_without_next_update when
    there is no nextUpdate, now + max_cache_ttl)`` and never after, and re-verified
    on every use. A cached answer was obtained with another request's nonce, so
    it is reported with ``nonce_match=None`` ("no nonce for this use") and a reason
    that says it came from the cache: replay is then bounded by ``nextUpdate``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from dataclasses import dataclass

from gpucc.core.errors import CollateralUnavailableError, UsageError
from gpucc.core.transport import Fetcher, HttpStatusError, plain_http_to_remote, safe_url

from .cache import CollateralCache
from .collateral import OcspOutcome, OcspTarget
from .ocsp_response import (
    DEFAULT_CLOCK_SKEW,
    DEFAULT_MAX_AGE_WITHOUT_NEXT_UPDATE,
    HASH_ALGORITHMS,
    NONCE_BYTES,
    CertId,
    OcspRules,
    build_request,
    evaluate_response,
    unavailable,
    usable,
)

__all__ = [
    "DEFAULT_MAX_CACHE_TTL",
    "DEFAULT_OCSP_URL",
    "MAX_OCSP_RESPONSE_BYTES",
    "OcspClient",
    "OcspFetch",
]

DEFAULT_OCSP_URL = "https://ocsp.ndis.nvidia.com"
# Real responses are one or two KiB (a signature and at most a couple of certificates).
MAX_OCSP_RESPONSE_BYTES = 64 * 1024
DEFAULT_MAX_CACHE_TTL = dt.timedelta(hours=24)


def _iso(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class OcspFetch:
    """An outcome together with the response it was derived from.

    Attributes:
        outcome: what the response means.
        response: the DER response evaluated, or None when there was none.
        from_cache: the response came from the local cache.
    """

    outcome: OcspOutcome
    response: bytes | None
    from_cache: bool = False


class OcspClient:
    """Asks an OCSP responder about one certificate at a time; see the module docstring.

    Args:
        fetcher: the HTTP layer (an offline fetcher gives "not checked, offline").
        url: the responder URL (NVIDIA: ``https://ocsp.ndis.nvidia.com``).
        use_nonce: send a 32-byte nonce and report whether it is echoed.
        clock_skew: tolerance on thisUpdate/nextUpdate.
        max_age_without_next_update: freshness bound for responses without nextUpdate.
        service_key: optional NVIDIA service key (bearer token; https or loopback only).
        cache: where verified responses are kept and reused; None disables caching.
        max_cache_ttl: the longest a cached response is served, whatever its nextUpdate.
        hash_algorithm: the CertID hash ("sha1" by default).

    Raises:
        UsageError: a service key with a plain-http URL to a remote host.
    """

    def __init__(
        self,
        *,
        fetcher: Fetcher,
        url: str = DEFAULT_OCSP_URL,
        use_nonce: bool = True,
        clock_skew: dt.timedelta = DEFAULT_CLOCK_SKEW,
        max_age_without_next_update: dt.timedelta = DEFAULT_MAX_AGE_WITHOUT_NEXT_UPDATE,
        service_key: str | None = None,
        cache: CollateralCache | None = None,
        max_cache_ttl: dt.timedelta = DEFAULT_MAX_CACHE_TTL,
        hash_algorithm: str = "sha1",
    ) -> None:
        if hash_algorithm not in HASH_ALGORITHMS:
            raise ValueError(f"unsupported CertID hash algorithm {hash_algorithm!r}")
        if service_key and plain_http_to_remote(url):
            raise UsageError(
                "refusing to send the service key to an OCSP responder over plain http; "
                "use an https URL"
            )
        self.fetcher = fetcher
        self.url = url
        self.use_nonce = use_nonce
        self.rules = OcspRules(clock_skew, max_age_without_next_update)
        self._service_key = service_key or None
        self.cache = cache
        self.max_cache_ttl = max_cache_ttl
        self.hash_algorithm = hash_algorithm
        # Set after a connection-level failure: the rest of this client's checks report
        # it at once instead of paying timeouts and retries for every certificate.
        self._unreachable: str | None = None

    def __repr__(self) -> str:
        key = "set" if self._service_key else "none"
        return (
            f"OcspClient(url={safe_url(self.url)!r}, use_nonce={self.use_nonce}, "
            f"service_key={key}, cache={self.cache!r})"
        )

    def check(self, target: OcspTarget) -> OcspOutcome:
        """The revocation status of ``target.cert``; never raises for network or bad answers."""
        return self.fetch(target).outcome

    def fetch(self, target: OcspTarget) -> OcspFetch:
        """Like :meth:`check`, also returning the response bytes (for bundles)."""
        cert_id = CertId.for_certificate(target.cert, target.issuer, self.hash_algorithm)
        now = target.now

        def evaluate(der: bytes, nonce: bytes | None) -> OcspOutcome:
            return evaluate_response(
                der, target, rules=self.rules, nonce=nonce, hash_algorithm=self.hash_algorithm
            )

        if self.cache is not None:
            cached = self.cache.get_ocsp(cert_id.key, now=now)
            if cached is not None:
                outcome = evaluate(cached, None)
                if usable(outcome):
                    note = "answered from the local cache (no nonce for this use"
                    if outcome.next_update is not None:
                        note += f"; fresh until {_iso(outcome.next_update)}"
                    note += ")"
                    reason = f"{outcome.reason}; {note}" if outcome.reason else note
                    return OcspFetch(dataclasses.replace(outcome, reason=reason), cached, True)
                self.cache.discard_ocsp(cert_id.key)

        if self._unreachable is not None:
            return OcspFetch(
                unavailable(
                    f"OCSP responder unavailable (not retried this run): {self._unreachable}"
                ),
                None,
            )
        nonce = os.urandom(NONCE_BYTES) if self.use_nonce else None
        request = build_request(
            target.cert, target.issuer, nonce=nonce, hash_algorithm=self.hash_algorithm
        )
        try:
            der = self.fetcher.post(
                self.url,
                request,
                content_type="application/ocsp-request",
                max_bytes=MAX_OCSP_RESPONSE_BYTES,
                headers={"Accept": "application/ocsp-response"},
                bearer=self._service_key,
            )
        except CollateralUnavailableError as exc:
            if not isinstance(exc, HttpStatusError):
                self._unreachable = str(exc)
            return OcspFetch(unavailable(f"OCSP responder unavailable: {exc}"), None)
        outcome = evaluate(der, nonce)
        if self.cache is not None and usable(outcome) and outcome.nonce_match is not False:
            expires = self._cache_expiry(outcome, now)
            if expires is not None:
                self.cache.put_ocsp(cert_id.key, der, expires=expires)
        return OcspFetch(outcome, der)

    def _cache_expiry(self, outcome: OcspOutcome, now: dt.datetime) -> dt.datetime | None:
        if outcome.next_update is not None:
            limit = outcome.next_update
        elif outcome.this_update is not None:
            limit = outcome.this_update + self.rules.max_age_without_next_update
        else:
            return None
        expires = min(limit, now + self.max_cache_ttl)
        return expires if expires > now else None
