"""The collateral mirror's engine against a loopback vendor, with the clock in the test's hands:
lifetimes read from what the vendor signed, stale answers within the grace only, the outage
hold, offline mode, background refresh, and the store's checks on what it reads back."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucc.core.errors import MalformedInputError
from gpucc.core.transport import RequestsFetcher
from gpucc.gpuattest.mirror import (
    Mirror,
    MirrorNotFoundError,
    MirrorRequestError,
    MirrorStore,
    MirrorUnavailableError,
    Upstreams,
    item_for,
    read_export,
)
from tests.support import netfixtures as nf

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
# the sample driver RIM's signing certificate's end of validity
SIGNER_END = dt.datetime(2025, 6, 26, 6, 10, 12, tzinfo=dt.UTC)
MAX_AGE = dt.timedelta(days=7)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def service() -> Iterator[tuple[nf.RimService, nf.LocalServer]]:
    rims = nf.RimService.with_samples()
    with nf.serve(rims) as server:
        yield rims, server


def engine(url: str, clock: Clock, store: Path | None = None, **kw: object) -> Mirror:
    return Mirror(
        store=MirrorStore(store, max_age=MAX_AGE),
        upstreams=Upstreams(rim_url=url, ocsp_url=url, pcs_url=url, kds_url=url),
        fetcher=RequestsFetcher(timeout=(1, 1), retries=0, total_timeout=3),
        clock=clock,
        **kw,  # type: ignore[arg-type]
    )


RIM = item_for("GET", f"/v1/rim/{nf.DRIVER_RIM_ID}")


def test_an_entry_is_fresh_until_the_rim_signers_validity_or_max_age(
    service: tuple[nf.RimService, nf.LocalServer],
) -> None:
    _, server = service
    clock = Clock()
    m = engine(server.url, clock)
    first = m.get(RIM)
    assert first.source == "miss" and first.fresh_until == T0 + MAX_AGE
    assert m.get(RIM).source == "hit" and server.count == 1
    clock.now = T0 + MAX_AGE  # due: fetched again
    assert m.get(RIM).source == "miss" and server.count == 2
    clock.now = SIGNER_END - dt.timedelta(days=1)  # the signer ends before max_age does
    assert m.get(RIM).fresh_until == SIGNER_END


def test_stale_within_the_grace_only_and_counted(
    service: tuple[nf.RimService, nf.LocalServer],
) -> None:
    rims, server = service
    clock = Clock()
    m = engine(server.url, clock, grace=dt.timedelta(hours=1), outage_hold=0)
    m.get(RIM)
    rims.modes[nf.DRIVER_RIM_ID] = "500"
    clock.now = T0 + MAX_AGE + dt.timedelta(minutes=30)
    assert m.get(RIM).source == "stale" and m.stats["nvidia-rim"].stale == 1
    clock.now = T0 + MAX_AGE + dt.timedelta(hours=2)
    with pytest.raises(MirrorUnavailableError, match="HTTP 500"):
        m.get(RIM)


def test_an_unreachable_vendor_is_not_asked_again_during_the_outage_hold() -> None:
    clock = Clock()
    m = engine(f"http://127.0.0.1:{nf.free_port()}", clock, outage_hold=60)
    with pytest.raises(MirrorUnavailableError, match="unavailable"):
        m.get(RIM)
    with pytest.raises(MirrorUnavailableError, match="not retried"):
        m.get(item_for("GET", "/v1/rim/NV_GPU_DRIVER_GH100_1.0"))
    assert m.stats["nvidia-rim"].upstream_requests == 1


def test_a_rim_the_vendor_lacks_is_not_found_and_offline_serves_only_what_it_holds(
    service: tuple[nf.RimService, nf.LocalServer], tmp_path: Path
) -> None:
    _, server = service
    clock = Clock()
    with pytest.raises(MirrorNotFoundError, match="404"):
        engine(server.url, clock).get(item_for("GET", "/v1/rim/NV_GPU_DRIVER_GH100_0.1"))
    engine(server.url, clock, tmp_path / "s").get(RIM)
    offline = engine(server.url, clock, tmp_path / "s", offline=True)
    assert offline.get(RIM).source == "hit"
    with pytest.raises(MirrorUnavailableError, match="offline"):
        offline.get(item_for("GET", f"/v1/rim/{nf.VBIOS_RIM_ID}"))
    assert server.count == 2


def test_background_refresh_renews_entries_near_their_end(
    service: tuple[nf.RimService, nf.LocalServer],
) -> None:
    _, server = service
    clock = Clock()
    m = engine(server.url, clock)
    m.get(RIM)
    assert m.refresh() == 0
    clock.now = T0 + MAX_AGE * 0.9  # less than a fifth of its life left
    assert m.refresh() == 1 and server.count == 2
    assert m.get(RIM).fresh_until == clock.now + MAX_AGE
    assert m.stats["nvidia-rim"].misses == 1 and m.stats["nvidia-rim"].refreshes == 1


def test_an_entry_nobody_asks_for_is_not_renewed(
    service: tuple[nf.RimService, nf.LocalServer],
) -> None:
    _, server = service
    clock = Clock()
    m = engine(server.url, clock, forget_s=0.0)
    m.get(RIM)
    clock.now = T0 + MAX_AGE * 0.9
    assert m.refresh() == 0 and server.count == 1


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("/v1/rim/../../etc", ""),
        ("/sgx/certification/v4/pckcrl", "ca=processor&ca=platform"),
        ("/vcek/v1/Milan/" + "ab" * 64, "blSPL=1"),
        ("/tdx/certification/v4/qe/identity", "x=1"),
    ],
)
def test_requests_the_mirror_does_not_serve_are_refused(path: str, query: str) -> None:
    with pytest.raises((MirrorRequestError, MirrorNotFoundError)):
        item_for("GET", path, query)
    with pytest.raises(MirrorRequestError):
        item_for("POST", "/ocsp", "", b"not an OCSP request")


def test_an_export_entry_whose_key_is_not_its_kind_is_refused(
    service: tuple[nf.RimService, nf.LocalServer],
) -> None:
    _, server = service
    m = engine(server.url, Clock())
    m.get(RIM)
    doc = json.loads(m.store.export(T0))
    assert len(read_export(json.dumps(doc).encode(), max_age=MAX_AGE)) == 1
    doc["entries"][0]["key"] = "/sgx/certification/v4/rootcacrl"
    with pytest.raises(MalformedInputError, match="entry 0"):
        read_export(json.dumps(doc).encode(), max_age=MAX_AGE)
