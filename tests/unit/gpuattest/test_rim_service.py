"""RimServiceSource against a real local RIM service serving NVIDIA's sample RIMs."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from gpucc.cli.exitcodes import describe, exit_code_for
from gpucc.core.errors import (
    CollateralUnavailableError,
    GpuccError,
    NetworkError,
    OfflineError,
    RimNotFoundError,
    UsageError,
)
from gpucc.core.transport import (
    HttpStatusError,
    RequestsFetcher,
    ServiceAccessDeniedError,
)
from gpucc.gpuattest.rim_service import RimServiceError, RimServiceSource, valid_rim_id
from tests.support.netfixtures import (
    DRIVER_RIM,
    DRIVER_RIM_ID,
    VBIOS_RIM,
    VBIOS_RIM_ID,
    LocalServer,
    RimService,
    free_port,
    serve,
)

KEY = "nvapi-rim-SECRET-key-42"


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def service() -> RimService:
    return RimService.with_samples()


@pytest.fixture
def server(service: RimService) -> Iterator[LocalServer]:
    with serve(service) as srv:
        yield srv


@pytest.fixture
def source(server: LocalServer) -> Iterator[RimServiceSource]:
    with RequestsFetcher(timeout=(0.5, 0.5), retries=2, backoff=0.01) as fetcher:
        yield RimServiceSource(fetcher=fetcher, base_url=server.url + "/", service_key=KEY)


def assert_collateral_error(exc: GpuccError) -> None:
    assert isinstance(exc, CollateralUnavailableError)
    assert exit_code_for(exc) == 3
    text = exc.diagnostics()
    assert "\n" not in text and KEY not in text


def test_serves_the_real_sample_rims_by_id(source: RimServiceSource, server: LocalServer) -> None:
    assert source.get_rim(DRIVER_RIM_ID) == DRIVER_RIM.read_bytes()
    assert source.get_rim(VBIOS_RIM_ID) == VBIOS_RIM.read_bytes()
    paths = [s.path for s in server.seen]
    assert paths == [f"/v1/rim/{DRIVER_RIM_ID}", f"/v1/rim/{VBIOS_RIM_ID}"]
    assert server.seen[0].headers["Authorization"] == f"Bearer {KEY}"


def test_missing_sha256_is_tolerated(source: RimServiceSource, service: RimService) -> None:
    service.modes[DRIVER_RIM_ID] = "no-sha"
    assert source.get_rim(DRIVER_RIM_ID) == DRIVER_RIM.read_bytes()


def test_404_is_rim_not_published(source: RimServiceSource) -> None:
    with pytest.raises(RimNotFoundError) as info:
        source.get_rim("NV_GPU_DRIVER_GH100_550.90.07")
    assert info.value.rim_id == "NV_GPU_DRIVER_GH100_550.90.07"
    assert "not published by the RIM service" in str(info.value)
    assert_collateral_error(info.value)


@pytest.mark.parametrize("status", ["401", "403"])
def test_forbidden_names_the_service_key_option(
    source: RimServiceSource, service: RimService, status: str
) -> None:
    service.modes[DRIVER_RIM_ID] = status
    with pytest.raises(ServiceAccessDeniedError) as info:
        source.get_rim(DRIVER_RIM_ID)
    assert info.value.status == int(status)
    assert "service key" in info.value.diagnostics()
    assert "--service-key" in describe(info.value)[1]
    assert_collateral_error(info.value)


def test_500_then_success_is_retried(
    source: RimServiceSource, service: RimService, server: LocalServer
) -> None:
    service.modes[VBIOS_RIM_ID] = "flaky"
    assert source.get_rim(VBIOS_RIM_ID) == VBIOS_RIM.read_bytes()
    assert server.count == 3


def test_persistent_500_is_a_network_error(source: RimServiceSource, service: RimService) -> None:
    service.modes[VBIOS_RIM_ID] = "500"
    with pytest.raises(HttpStatusError) as info:
        source.get_rim(VBIOS_RIM_ID)
    assert info.value.status == 500
    assert_collateral_error(info.value)


def test_slow_answer_beyond_the_read_timeout(
    source: RimServiceSource, service: RimService, server: LocalServer
) -> None:
    service.modes[DRIVER_RIM_ID] = "slow"
    start = time.monotonic()
    with pytest.raises(NetworkError) as info:
        source.get_rim(DRIVER_RIM_ID)
    assert time.monotonic() - start < 1.0
    assert "read timeout" in str(info.value)
    assert_collateral_error(info.value)


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("wrong-id", "different RIM"),
        ("wrong-sha", "sha256"),
        ("non-json", "not JSON"),
        ("json-list", "not a JSON object"),
        ("bad-base64", "not valid base64"),
    ],
)
def test_misbehaving_service_is_a_typed_collateral_error(
    source: RimServiceSource, service: RimService, mode: str, words: str
) -> None:
    service.modes[DRIVER_RIM_ID] = mode
    with pytest.raises(RimServiceError) as info:
        source.get_rim(DRIVER_RIM_ID)
    assert words in str(info.value)
    assert DRIVER_RIM_ID in str(info.value)
    assert_collateral_error(info.value)


@pytest.mark.parametrize("mode", ["oversized", "oversized-nolength"])
def test_oversized_answer(server: LocalServer, service: RimService, mode: str) -> None:
    service.modes[DRIVER_RIM_ID] = mode
    service.oversized_bytes = 200_000
    with RequestsFetcher(timeout=(0.5, 0.5), retries=0) as fetcher:
        small = RimServiceSource(fetcher=fetcher, base_url=server.url, max_rim_bytes=100_000)
        with pytest.raises(NetworkError) as info:
            small.get_rim(DRIVER_RIM_ID)
    assert "exceeds" in str(info.value)
    assert_collateral_error(info.value)


def test_decoded_rim_over_the_cap(server: LocalServer) -> None:
    with RequestsFetcher(timeout=(0.5, 0.5), retries=0) as fetcher:
        tiny = RimServiceSource(fetcher=fetcher, base_url=server.url, max_rim_bytes=15_000)
        with pytest.raises(NetworkError):
            tiny.get_rim(DRIVER_RIM_ID)  # 20 KiB RIM, JSON under the JSON cap or not: refused


def test_redirect_loop(source: RimServiceSource, service: RimService) -> None:
    service.modes[DRIVER_RIM_ID] = "loop"
    with pytest.raises(NetworkError) as info:
        source.get_rim(DRIVER_RIM_ID)
    assert "redirects" in str(info.value)
    assert_collateral_error(info.value)


def test_connection_refused() -> None:
    with RequestsFetcher(timeout=(0.5, 0.5), retries=1, backoff=0.01) as fetcher:
        dead = RimServiceSource(fetcher=fetcher, base_url=f"http://127.0.0.1:{free_port()}")
        with pytest.raises(NetworkError) as info:
            dead.get_rim(DRIVER_RIM_ID)
    assert "connection refused" in str(info.value)
    assert_collateral_error(info.value)


def test_offline_fetcher_is_an_offline_error(server: LocalServer) -> None:
    source = RimServiceSource(fetcher=RequestsFetcher(offline=True), base_url=server.url)
    with pytest.raises(OfflineError) as info:
        source.get_rim(DRIVER_RIM_ID)
    assert server.count == 0
    assert_collateral_error(info.value)


@pytest.mark.parametrize("rim_id", ["", "..", "../etc/passwd", "a/b", "x" * 300, "NV?x=1"])
def test_malformed_ids_never_reach_the_network(
    source: RimServiceSource, server: LocalServer, rim_id: str
) -> None:
    assert not valid_rim_id(rim_id)
    with pytest.raises(RimNotFoundError):
        source.get_rim(rim_id)
    assert server.count == 0


def test_service_key_refused_for_plain_http_remote() -> None:
    with pytest.raises(UsageError):
        RimServiceSource(fetcher=RequestsFetcher(), base_url="http://rim.example", service_key=KEY)


def test_repr_hides_the_service_key(source: RimServiceSource) -> None:
    assert KEY not in repr(source)
    assert "service_key=set" in repr(source)
