"""The collateral cache: hits avoid the network, corrupt entries are refetched, expiry is strict."""

from __future__ import annotations

import datetime as dt
import json
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucc.core.transport import RequestsFetcher
from gpucc.gpuattest.cache import CachingRimSource, CollateralCache, default_cache_dir
from gpucc.gpuattest.collateral import ChainKind, OcspOutcome, OcspStatus
from gpucc.gpuattest.ocsp import OcspClient
from gpucc.gpuattest.ocsp_response import CertId
from gpucc.gpuattest.rim_service import RimServiceSource
from tests.support.netfixtures import (
    DRIVER_RIM,
    DRIVER_RIM_ID,
    NOW,
    LocalServer,
    NetPki,
    OcspResponder,
    RimService,
    build_pki,
    ocsp_target,
    serve,
)


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def cache(tmp_path: Path) -> CollateralCache:
    return CollateralCache(tmp_path / "cache")


@pytest.fixture
def fetcher() -> Iterator[RequestsFetcher]:
    with RequestsFetcher(timeout=(0.5, 0.5), retries=0) as f:
        yield f


def rim_entry(cache: CollateralCache, rim_id: str = DRIVER_RIM_ID) -> Path:
    return cache.directory / "rim" / f"{rim_id}.json"


# --- the store itself ------------------------------------------------------------------


def test_rim_round_trip_with_digest_and_private_permissions(cache: CollateralCache) -> None:
    data = DRIVER_RIM.read_bytes()
    cache.put_rim(DRIVER_RIM_ID, data)
    assert cache.get_rim(DRIVER_RIM_ID) == data
    entry = json.loads(rim_entry(cache).read_text())
    assert entry["format"] == "gpucc-cache" and entry["kind"] == "rim"
    assert len(entry["sha256"]) == 64
    assert stat.S_IMODE(cache.directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((cache.directory / "rim").stat().st_mode) == 0o700
    assert stat.S_IMODE(rim_entry(cache).stat().st_mode) == 0o600
    # No temporary files are left behind.
    assert [p.name for p in (cache.directory / "rim").iterdir()] == [f"{DRIVER_RIM_ID}.json"]


def corrupt_variants(original: str) -> list[str]:
    doc = json.loads(original)
    wrong_digest = dict(doc, sha256="0" * 64)
    tampered = dict(doc, data=doc["data"][:-8] + "AAAAAAA=")
    wrong_key = dict(doc, key="NV_OTHER")
    return [
        "{not json",
        original[: len(original) // 2],  # truncated
        json.dumps(wrong_digest),
        json.dumps(tampered),
        json.dumps(wrong_key),
        json.dumps([doc]),
        json.dumps(dict(doc, data="***")),
        json.dumps(dict(doc, version=2)),
        "",
    ]


@pytest.mark.parametrize("variant", range(9))
def test_corrupt_rim_entry_is_discarded(cache: CollateralCache, variant: int) -> None:
    cache.put_rim(DRIVER_RIM_ID, DRIVER_RIM.read_bytes())
    path = rim_entry(cache)
    path.write_text(corrupt_variants(path.read_text())[variant])
    assert cache.get_rim(DRIVER_RIM_ID) is None
    assert not path.exists()


def test_oversized_entry_is_discarded(cache: CollateralCache) -> None:
    cache.put_ocsp("k" * 64, b"resp", expires=NOW + dt.timedelta(hours=1))
    path = cache.directory / "ocsp" / f"{'k' * 64}.json"
    path.write_bytes(b" " * (300 * 1024))
    assert cache.get_ocsp("k" * 64, now=NOW) is None
    assert not path.exists()


def test_ocsp_entry_served_until_expiry_and_never_after(cache: CollateralCache) -> None:
    expires = NOW + dt.timedelta(hours=1)
    cache.put_ocsp("a" * 64, b"DER", expires=expires)
    assert cache.get_ocsp("a" * 64, now=NOW) == b"DER"
    assert cache.get_ocsp("a" * 64, now=expires - dt.timedelta(seconds=1)) == b"DER"
    assert cache.get_ocsp("a" * 64, now=expires) is None
    assert cache.get_ocsp("a" * 64, now=NOW) is None  # removed once expired


def test_unusable_keys_and_unwritable_directories_are_harmless(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    broken = CollateralCache(blocker / "cache")
    broken.put_rim(DRIVER_RIM_ID, b"<x/>")  # cannot create the directory: ignored
    assert broken.get_rim(DRIVER_RIM_ID) is None
    ok = CollateralCache(tmp_path / "c")
    ok.put_rim("../escape", b"<x/>")
    assert ok.get_rim("../escape") is None
    assert not (tmp_path / "escape.json").exists()
    with pytest.raises(ValueError):
        ok.put_ocsp("a" * 64, b"x", expires=NOW.replace(tzinfo=None))


def test_default_directory_is_per_user() -> None:
    assert default_cache_dir().name == "gpucc"
    assert CollateralCache.default().directory == default_cache_dir()


# --- RIMs through the cache -------------------------------------------------------------


@pytest.fixture
def rim_server() -> Iterator[LocalServer]:
    with serve(RimService.with_samples()) as srv:
        yield srv


def test_rim_cache_hit_avoids_the_network(
    rim_server: LocalServer, fetcher: RequestsFetcher, cache: CollateralCache
) -> None:
    source = CachingRimSource(RimServiceSource(fetcher=fetcher, base_url=rim_server.url), cache)
    assert source.get_rim(DRIVER_RIM_ID) == DRIVER_RIM.read_bytes()
    assert source.get_rim(DRIVER_RIM_ID) == DRIVER_RIM.read_bytes()
    assert rim_server.count == 1
    # A second process sharing the directory also hits.
    again = CachingRimSource(RimServiceSource(fetcher=fetcher, base_url=rim_server.url), cache)
    assert again.get_rim(DRIVER_RIM_ID) == DRIVER_RIM.read_bytes()
    assert rim_server.count == 1


def test_corrupt_rim_entry_is_refetched(
    rim_server: LocalServer, fetcher: RequestsFetcher, cache: CollateralCache
) -> None:
    source = CachingRimSource(RimServiceSource(fetcher=fetcher, base_url=rim_server.url), cache)
    source.get_rim(DRIVER_RIM_ID)
    path = rim_entry(cache)
    doc = json.loads(path.read_text())
    doc["data"] = doc["data"].replace("A", "B", 1)  # bytes changed, digest now wrong
    path.write_text(json.dumps(doc))
    assert source.get_rim(DRIVER_RIM_ID) == DRIVER_RIM.read_bytes()
    assert rim_server.count == 2
    assert cache.get_rim(DRIVER_RIM_ID) == DRIVER_RIM.read_bytes()  # repaired


def test_forget_drops_a_rim(
    rim_server: LocalServer, fetcher: RequestsFetcher, cache: CollateralCache
) -> None:
    source = CachingRimSource(RimServiceSource(fetcher=fetcher, base_url=rim_server.url), cache)
    source.get_rim(DRIVER_RIM_ID)
    source.forget(DRIVER_RIM_ID)
    source.get_rim(DRIVER_RIM_ID)
    assert rim_server.count == 2


# --- OCSP through the cache --------------------------------------------------------------


@pytest.fixture(scope="module")
def pki() -> NetPki:
    return build_pki()


@pytest.fixture
def responder(pki: NetPki) -> OcspResponder:
    return OcspResponder(pki)


@pytest.fixture
def ocsp_server(responder: OcspResponder) -> Iterator[LocalServer]:
    with serve(responder) as srv:
        yield srv


@pytest.fixture
def client(
    ocsp_server: LocalServer, fetcher: RequestsFetcher, cache: CollateralCache
) -> OcspClient:
    return OcspClient(fetcher=fetcher, url=ocsp_server.url, cache=cache)


def check_ica(client: OcspClient, pki: NetPki, now: dt.datetime = NOW) -> OcspOutcome:
    chain = pki.device_chain
    return client.check(
        ocsp_target(
            chain[2],
            chain[3],
            kind=ChainKind.DEVICE,
            anchor=pki.device_root.cert,
            now=now,
            issuer_chain=chain[4:],
        )
    )


def ica_key(pki: NetPki) -> str:
    return CertId.for_certificate(pki.device_chain[2], pki.device_chain[3]).key


def test_ocsp_cache_hit_avoids_the_network(
    client: OcspClient, pki: NetPki, ocsp_server: LocalServer
) -> None:
    fresh = check_ica(client, pki)
    assert fresh.status is OcspStatus.GOOD and fresh.nonce_match is True
    cached = check_ica(client, pki, NOW + dt.timedelta(hours=2))
    assert ocsp_server.count == 1
    assert cached.status is OcspStatus.GOOD
    # The stored answer carries another request's nonce: not sent for this use.
    assert cached.nonce_match is None
    assert "local cache" in cached.reason


def test_expired_ocsp_entry_is_not_served(
    client: OcspClient, pki: NetPki, ocsp_server: LocalServer, responder: OcspResponder
) -> None:
    check_ica(client, pki)  # nextUpdate = NOW + 1 day
    later = NOW + dt.timedelta(days=1, minutes=1)
    responder.now = later
    out = check_ica(client, pki, later)
    assert ocsp_server.count == 2
    assert out.status is OcspStatus.GOOD and out.nonce_match is True


def test_cache_ttl_is_capped(
    ocsp_server: LocalServer, fetcher: RequestsFetcher, cache: CollateralCache, pki: NetPki
) -> None:
    client = OcspClient(
        fetcher=fetcher, url=ocsp_server.url, cache=cache, max_cache_ttl=dt.timedelta(hours=1)
    )
    check_ica(client, pki)
    assert cache.get_ocsp(ica_key(pki), now=NOW + dt.timedelta(minutes=59)) is not None
    assert cache.get_ocsp(ica_key(pki), now=NOW + dt.timedelta(minutes=61)) is None


def test_corrupt_ocsp_entry_is_refetched(
    client: OcspClient, pki: NetPki, ocsp_server: LocalServer, cache: CollateralCache
) -> None:
    check_ica(client, pki)
    path = cache.directory / "ocsp" / f"{ica_key(pki)}.json"
    path.write_text(path.read_text()[:40])
    assert check_ica(client, pki).status is OcspStatus.GOOD
    assert ocsp_server.count == 2


def test_cached_response_is_reverified_on_use(
    client: OcspClient, pki: NetPki, ocsp_server: LocalServer, cache: CollateralCache
) -> None:
    check_ica(client, pki)
    # A syntactically valid entry whose response is about another certificate.
    other = CertId.for_certificate(pki.device_chain[3], pki.device_chain[4]).key
    stored = cache.get_ocsp(ica_key(pki), now=NOW)
    assert stored is not None
    cache.put_ocsp(other, stored, expires=NOW + dt.timedelta(hours=1))
    chain = pki.device_chain
    out = client.check(
        ocsp_target(chain[3], chain[4], kind=ChainKind.DEVICE, anchor=pki.device_root.cert, now=NOW)
    )
    assert out.status is OcspStatus.GOOD and out.nonce_match is True  # fetched, not trusted
    assert ocsp_server.count == 2


@pytest.mark.parametrize(
    "change",
    [{"nonce": "wrong"}, {"signer": "rogue"}, {"status": "good", "answer_for": "other"}],
)
def test_unverified_or_replayed_answers_are_not_cached(
    client: OcspClient,
    pki: NetPki,
    responder: OcspResponder,
    cache: CollateralCache,
    change: dict[str, object],
) -> None:
    responder.set(**change)
    check_ica(client, pki)
    assert cache.get_ocsp(ica_key(pki), now=NOW) is None
