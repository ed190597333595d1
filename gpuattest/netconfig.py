"""From network settings to a RimSource and an OcspChecker: where the pieces compose.

A front end reads its options into a frozen :class:`NetworkSettings` and calls
:func:`build_collateral` (to verify) or :func:`network_sources` (to collect a
bundle); this module never reads ``os.environ``.

What is consulted, in order:

RIMs
    1. the collateral bundle (``bundle``), if given;
    2. the on-disk cache (unless ``use_cache`` is False);
    3. the RIM service (``rim_url``). With ``offline`` the fetcher refuses every
       request, so a cache miss becomes :class:`~gpuattest.errors.OfflineError`.

OCSP
    1. the bundle's stored responses, re-verified at the verification time;
    2. the OCSP responder (``ocsp_url``), through the cache. Offline, only cached
       responses can answer; anything else is "not checked, collateral missing".

The first checker that gives a verified answer wins. A stale or absent bundle
answer falls through to the next; an *invalid* bundle answer (bad signature,
wrong certificate) is returned as is, so tampering is never papered over by a
later source.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpucc.core.errors import UsageError
from gpucc.core.transport import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_RETRIES,
    DEFAULT_TOTAL_TIMEOUT,
    Fetcher,
    RequestsFetcher,
)

from .cache import CachingRimSource, CollateralCache
from .collateral import (
    CompositeRimSource,
    NoOcsp,
    OcspChecker,
    OcspOutcome,
    OcspStatus,
    OcspTarget,
    RimSource,
)
from .ocsp import DEFAULT_OCSP_URL, OcspClient
from .ocsp_response import DEFAULT_CLOCK_SKEW
from .rim_service import DEFAULT_RIM_URL, RimServiceSource
from .trust import TrustRoots

__all__ = [
    "FallbackOcspChecker",
    "NetworkSettings",
    "build_collateral",
    "build_fetcher",
    "network_sources",
]


@dataclass(frozen=True)
class NetworkSettings:
    """How collateral is obtained.

    Attributes:
        rim_url: RIM service base URL (None: NVIDIA's).
        ocsp_url: OCSP responder URL (None: NVIDIA's).
        service_key: NVIDIA service key, sent as a bearer token; never shown in reprs.
        ocsp_nonce: send OCSP nonces (turn off behind caching proxies that drop them).
        check_ocsp: ask OCSP at all (False: every certificate is "not checked").
        cache_dir: cache directory (None: the per-user cache directory).
        use_cache: read and write the cache.
        bundle: a collateral bundle to answer from first.
        offline: never touch the network.
        timeout: read timeout per request, seconds (connect: at most 5 s).
        deadline: the longest one request may take, seconds: connect, headers and
            body, retries and redirects together.
        retries: retries on connection errors and 5xx answers.
        clock_skew: tolerance on OCSP thisUpdate/nextUpdate.
        kds_url: AMD's KDS base URL, or a mirror serving its paths (None: AMD's).
    """

    rim_url: str | None = None
    ocsp_url: str | None = None
    service_key: str | None = field(default=None, repr=False)
    ocsp_nonce: bool = True
    check_ocsp: bool = True
    cache_dir: Path | None = None
    use_cache: bool = True
    bundle: Path | None = None
    offline: bool = False
    timeout: float = DEFAULT_READ_TIMEOUT
    deadline: float = DEFAULT_TOTAL_TIMEOUT
    retries: int = DEFAULT_RETRIES
    clock_skew: dt.timedelta = DEFAULT_CLOCK_SKEW
    kds_url: str | None = None

    def cache(self) -> CollateralCache | None:
        """The cache these settings use, or None when caching is off."""
        if not self.use_cache:
            return None
        if self.cache_dir:
            return CollateralCache(self.cache_dir, offline=self.offline)
        return CollateralCache.default(offline=self.offline)


def build_fetcher(settings: NetworkSettings) -> RequestsFetcher:
    """The HTTP layer for ``settings`` (offline when asked).

    Raises:
        UsageError: a timeout, deadline or retry count that makes no sense.
    """
    if not settings.timeout > 0 or not settings.deadline > 0 or settings.retries < 0:
        raise UsageError(
            "the network timeout and deadline must be positive and retries not negative"
        )
    connect = min(DEFAULT_CONNECT_TIMEOUT, settings.timeout)
    return RequestsFetcher(
        timeout=(connect, settings.timeout),
        retries=settings.retries,
        offline=settings.offline,
        total_timeout=settings.deadline,
    )


class FallbackOcspChecker:
    """Asks several checkers in turn; the first one with an answer wins.

    "An answer" is anything but ``not-checked``: a verified status, or an invalid
    response (which must not be hidden by asking elsewhere). When every checker
    says ``not-checked``, the first one's outcome is returned with all reasons.
    """

    def __init__(self, checkers: Sequence[OcspChecker]) -> None:
        if not checkers:
            raise ValueError("at least one OCSP checker is needed")
        self.checkers = tuple(checkers)

    def check(self, target: OcspTarget) -> OcspOutcome:
        """The first real answer; see the class docstring."""
        outcomes: list[OcspOutcome] = []
        for checker in self.checkers:
            outcome = checker.check(target)
            if outcome.status is not OcspStatus.NOT_CHECKED:
                return outcome
            outcomes.append(outcome)
        reasons = "; ".join(dict.fromkeys(o.reason for o in outcomes if o.reason))
        return dataclasses.replace(outcomes[0], reason=reasons)


def network_sources(settings: NetworkSettings, fetcher: Fetcher) -> tuple[RimSource, OcspClient]:
    """The RIM service and the OCSP responder for ``settings``, each through the cache.

    This is what collecting a bundle asks, and what :func:`build_collateral` falls
    back to after local files and a bundle.

    Raises:
        UsageError: a service key would be sent over plain http to a remote host.
    """
    cache = settings.cache()
    rims: RimSource = RimServiceSource(
        fetcher=fetcher,
        base_url=settings.rim_url or DEFAULT_RIM_URL,
        service_key=settings.service_key,
    )
    if cache is not None:
        rims = CachingRimSource(rims, cache)
    ocsp = OcspClient(
        fetcher=fetcher,
        url=settings.ocsp_url or DEFAULT_OCSP_URL,
        use_nonce=settings.ocsp_nonce,
        clock_skew=settings.clock_skew,
        service_key=settings.service_key,
        cache=cache,
    )
    return rims, ocsp


def build_collateral(
    settings: NetworkSettings,
    *,
    roots: TrustRoots | None = None,
    fetcher: Fetcher | None = None,
) -> tuple[RimSource, OcspChecker]:
    """Compose bundle, cache, services and offline mode into the two verifier seams.

    Args:
        settings: what the user asked for.
        roots: accepted for symmetry with the verifier; trust anchors are passed to
            every OCSP check, so nothing here depends on them.
        fetcher: the HTTP layer (tests inject one); built from ``settings`` otherwise.

    Returns:
        (RimSource, OcspChecker).

    Raises:
        MalformedBundleError: the bundle cannot be read.
        UsageError: a service key would be sent over plain http to a remote host, or
            the timeout is not positive.
    """
    del roots  # see the docstring
    fetch = fetcher if fetcher is not None else build_fetcher(settings)
    service, client = network_sources(settings, fetch)
    rims: RimSource = service
    checkers: list[OcspChecker] = [client]
    if settings.bundle is not None:
        from .bundle import BundleOcspChecker, BundleRimSource, load_bundle  # lxml: only here

        bundle = load_bundle(settings.bundle)
        rims = CompositeRimSource([BundleRimSource(bundle), service])
        checkers.insert(0, BundleOcspChecker(bundle, clock_skew=settings.clock_skew))
    if not settings.check_ocsp:
        return rims, NoOcsp("OCSP checking is disabled", collateral_missing=False)
    return rims, FallbackOcspChecker(checkers)
