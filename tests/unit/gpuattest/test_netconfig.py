"""From NetworkSettings to collateral sources: composition, order and fallbacks, offline."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pytest

from gpucc.core.errors import OfflineError, UsageError
from gpucc.core.transport import DEFAULT_CONNECT_TIMEOUT, RequestsFetcher
from gpucc.gpuattest.bundle import Bundle, write_bundle
from gpucc.gpuattest.cache import CachingRimSource, CollateralCache
from gpucc.gpuattest.chain import load_pem_chain
from gpucc.gpuattest.collateral import (
    ChainKind,
    NoOcsp,
    OcspOutcome,
    OcspStatus,
    OcspTarget,
    ocsp_targets,
)
from gpucc.gpuattest.netconfig import (
    FallbackOcspChecker,
    NetworkSettings,
    build_collateral,
    build_fetcher,
    network_sources,
)
from gpucc.gpuattest.ocsp import DEFAULT_OCSP_URL, OcspClient
from gpucc.gpuattest.rim_service import DEFAULT_RIM_URL, RimServiceSource
from gpucc.gpuattest.trust import TrustRoots
from tests.support.samples import IN_WINDOW, SET_A_CHAIN, SET_A_DRIVER_RIM

DRIVER_ID = "NV_GPU_DRIVER_GH100_545.00"
VBIOS_ID = "NV_GPU_VBIOS_1010_0200_882_96005E0001"
ROOTS = TrustRoots.nvidia()
TARGET = ocsp_targets(
    load_pem_chain(SET_A_CHAIN.read_bytes()),
    kind=ChainKind.DEVICE,
    anchor=ROOTS.device_root,
    now=IN_WINDOW,
)[0]


class Answer:
    """A checker that always gives one outcome and counts the questions."""

    def __init__(self, outcome: OcspOutcome) -> None:
        self.outcome = outcome
        self.asked: list[OcspTarget] = []

    def check(self, target: OcspTarget) -> OcspOutcome:
        self.asked.append(target)
        return self.outcome


GOOD = OcspOutcome(OcspStatus.GOOD, response_valid=True)
INVALID = OcspOutcome(OcspStatus.UNKNOWN, response_valid=False, reason="invalid OCSP response: x")


def missing(reason: str) -> OcspOutcome:
    return OcspOutcome(OcspStatus.NOT_CHECKED, reason=reason, collateral_missing=True)


# --- settings -----------------------------------------------------------------------------------


def test_fetcher_follows_the_settings() -> None:
    fetcher = build_fetcher(NetworkSettings(timeout=2.0, retries=1, offline=True))
    assert fetcher.timeout == (2.0, 2.0) and fetcher.retries == 1 and fetcher.offline
    slow = build_fetcher(NetworkSettings(timeout=60.0))
    assert slow.timeout == (DEFAULT_CONNECT_TIMEOUT, 60.0) and not slow.offline


@pytest.mark.parametrize(("timeout", "retries"), [(0.0, 3), (-1.0, 3), (5.0, -1)])
def test_nonsense_timeouts_are_usage_errors(timeout: float, retries: int) -> None:
    with pytest.raises(UsageError):
        build_fetcher(NetworkSettings(timeout=timeout, retries=retries))


def test_cache_from_settings(tmp_path: Path) -> None:
    cache = NetworkSettings(cache_dir=tmp_path).cache()
    assert isinstance(cache, CollateralCache) and cache.directory == tmp_path
    assert NetworkSettings(cache_dir=tmp_path, use_cache=False).cache() is None


# --- the network sources ------------------------------------------------------------------------


def test_network_sources_default_to_nvidia_through_the_cache(tmp_path: Path) -> None:
    fetcher = RequestsFetcher(offline=True)
    rims, ocsp = network_sources(NetworkSettings(cache_dir=tmp_path), fetcher)
    assert isinstance(rims, CachingRimSource)
    assert isinstance(rims.inner, RimServiceSource) and rims.inner.base_url == DEFAULT_RIM_URL
    assert isinstance(ocsp, OcspClient)
    assert ocsp.url == DEFAULT_OCSP_URL and ocsp.use_nonce and ocsp.cache is not None
    assert ocsp.fetcher is fetcher and rims.inner.fetcher is fetcher


def test_network_sources_follow_urls_nonce_and_no_cache() -> None:
    settings = NetworkSettings(
        rim_url="https://rim.example/",
        ocsp_url="https://ocsp.example",
        ocsp_nonce=False,
        use_cache=False,
        clock_skew=dt.timedelta(seconds=30),
    )
    rims, ocsp = network_sources(settings, RequestsFetcher(offline=True))
    assert isinstance(rims, RimServiceSource) and rims.base_url == "https://rim.example"
    assert ocsp.url == "https://ocsp.example" and not ocsp.use_nonce and ocsp.cache is None
    assert ocsp.rules.clock_skew == dt.timedelta(seconds=30)


def test_a_service_key_is_never_sent_over_plain_http_to_a_remote_host() -> None:
    settings = NetworkSettings(
        ocsp_url="http://ocsp.example", service_key="nvapi-SECRET", use_cache=False
    )
    with pytest.raises(UsageError, match="plain http"):
        network_sources(settings, RequestsFetcher(offline=True))


# --- build_collateral ---------------------------------------------------------------------------


def test_offline_without_a_bundle_obtains_nothing() -> None:
    rims, ocsp = build_collateral(NetworkSettings(offline=True, use_cache=False))
    with pytest.raises(OfflineError):
        rims.get_rim(DRIVER_ID)
    out = ocsp.check(TARGET)
    assert out.status is OcspStatus.NOT_CHECKED and out.collateral_missing
    assert "offline" in out.reason


def test_a_bundle_answers_rims_first_then_the_service(tmp_path: Path) -> None:
    path = tmp_path / "bundle.json"
    write_bundle(Bundle(created=IN_WINDOW, rims={DRIVER_ID: SET_A_DRIVER_RIM.read_bytes()}), path)
    rims, ocsp = build_collateral(NetworkSettings(bundle=path, offline=True, use_cache=False))
    assert rims.get_rim(DRIVER_ID) == SET_A_DRIVER_RIM.read_bytes()
    # Not in the bundle: the service is asked next, and offline it refuses.
    with pytest.raises(OfflineError):
        rims.get_rim(VBIOS_ID)
    assert isinstance(ocsp, FallbackOcspChecker)
    out = ocsp.check(TARGET)
    assert out.status is OcspStatus.NOT_CHECKED and out.collateral_missing
    assert "the collateral bundle has no OCSP response for 'GH100 A01 GSP BROM'" in out.reason
    assert "offline" in out.reason


def test_disabled_ocsp_is_not_collateral_missing() -> None:
    _, ocsp = build_collateral(NetworkSettings(check_ocsp=False, offline=True, use_cache=False))
    assert isinstance(ocsp, NoOcsp)
    out = ocsp.check(TARGET)
    assert out.status is OcspStatus.NOT_CHECKED and out.collateral_missing is False


# --- the fallback checker -------------------------------------------------------------------------


def test_the_first_real_answer_wins_and_later_checkers_are_not_asked() -> None:
    first, second, third = Answer(missing("stale")), Answer(GOOD), Answer(GOOD)
    assert FallbackOcspChecker([first, second, third]).check(TARGET) is GOOD
    assert first.asked == [TARGET] and second.asked == [TARGET] and third.asked == []


def test_an_invalid_answer_is_not_hidden_by_a_later_good_one() -> None:
    later = Answer(GOOD)
    assert FallbackOcspChecker([Answer(INVALID), later]).check(TARGET) is INVALID
    assert later.asked == []


def test_when_nobody_answers_every_reason_is_kept_once() -> None:
    checkers = [Answer(missing("a")), Answer(missing("b")), Answer(missing("a"))]
    out = FallbackOcspChecker(checkers).check(TARGET)
    assert out == dataclasses.replace(missing("a"), reason="a; b")


def test_a_fallback_needs_a_checker() -> None:
    with pytest.raises(ValueError, match="at least one"):
        FallbackOcspChecker([])
