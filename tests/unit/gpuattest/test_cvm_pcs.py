"""TDX collateral from a PCCS: a real HTTP server on 127.0.0.1 serving Intel's collateral for the
sample quote the way Intel's PCS API does (issuer chains in headers), through gpucc's transport
and cache; and ``gpucc attest --cvm-pccs-url`` as a real process."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote as urlquote

import pytest

from gpucc.core.errors import CollateralUnavailableError, NetworkError, OfflineError
from gpucc.core.transport import RequestsFetcher
from gpucc.gpuattest.cache import CollateralCache
from gpucc.gpuattest.cvm.pcs import fetch_tdx_collateral, tdx_collateral_for
from gpucc.gpuattest.cvm.tdx import verify_tdx_quote
from tests.support.cli import run_cli
from tests.support.netfixtures import LocalServer, Reply, Seen, serve
from tests.support.paths import DATA

TDX = DATA / "cpu-tee" / "tdx"
QUOTE = (TDX / "quote.bin").read_bytes()
SAMPLE = json.loads((TDX / "collateral.json").read_bytes())
AT = dt.datetime(2025, 6, 19, 11, 16, 3, tzinfo=dt.UTC)
REPORT_DATA = (
    "9a9d48e7f6799642d3d1b34e1e5e1742d4bb02dd6ddd551862c1211d35c304f9"
    "eca3efdbb481601c163cf52493d6e44aed55d51ec39b7e518fadb92c2b523f20"
)


def pccs(seen: Seen) -> Reply:
    """Intel's PCS v4 API shapes, for the sample's platform (FMSPC B0C06F000000)."""
    path = seen.path
    if path == "/sgx/certification/v4/pckcrl?ca=platform&encoding=der":
        chain = urlquote(SAMPLE["pck_crl_issuer_chain"])
        return Reply(
            body=bytes.fromhex(SAMPLE["pck_crl"]), headers={"SGX-PCK-CRL-Issuer-Chain": chain}
        )
    if path == "/tdx/certification/v4/tcb?fmspc=B0C06F000000":
        body = f'{{"tcbInfo":{SAMPLE["tcb_info"]},"signature":"{SAMPLE["tcb_info_signature"]}"}}'
        chain = urlquote(SAMPLE["tcb_info_issuer_chain"])
        return Reply(body=body.encode(), headers={"TCB-Info-Issuer-Chain": chain})
    if path == "/tdx/certification/v4/qe/identity":
        body = (
            f'{{"enclaveIdentity": {SAMPLE["qe_identity"]}, '
            f'"signature": "{SAMPLE["qe_identity_signature"]}"}}'
        )
        chain = urlquote(SAMPLE["qe_identity_issuer_chain"])
        return Reply(body=body.encode(), headers={"SGX-Enclave-Identity-Issuer-Chain": chain})
    if path == "/sgx/certification/v4/rootcacrl":
        return Reply(body=SAMPLE["root_ca_crl"].encode())  # PCCS serves it as hex
    return Reply(status=404)


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with serve(pccs) as running:
        yield running


def test_fetched_collateral_is_intels_and_verifies(server: LocalServer) -> None:
    collateral = fetch_tdx_collateral(QUOTE, RequestsFetcher(), base_url=server.url)
    assert collateral.fields == SAMPLE
    assert verify_tdx_quote(QUOTE, collateral, now=AT).evidence_ok
    assert server.count == 4


def test_the_cache_serves_until_the_next_update(server: LocalServer, tmp_path: Path) -> None:
    cache = CollateralCache(tmp_path)
    first = tdx_collateral_for(QUOTE, RequestsFetcher(), now=AT, cache=cache, base_url=server.url)
    offline = RequestsFetcher(offline=True)
    again = tdx_collateral_for(QUOTE, offline, now=AT, cache=cache, base_url=server.url)
    assert again.fields == first.fields == SAMPLE and server.count == 4
    later = AT + dt.timedelta(days=40)  # past the TCB info's next update: not served
    with pytest.raises(OfflineError):
        tdx_collateral_for(QUOTE, offline, now=later, cache=cache, base_url=server.url)


def _broken(change: Callable[[Seen, Reply], Reply]) -> Callable[[Seen], Reply]:
    return lambda seen: change(seen, pccs(seen))


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda s, r: Reply(status=404) if "qe/identity" in s.path else r, "HTTP 404"),
        (
            lambda s, r: Reply(body=b"{}", headers=r.headers) if "tcb?" in s.path else r,
            "no tcbInfo",
        ),
        (lambda s, r: Reply(body=r.body) if "pckcrl" in s.path else r, "issuer chain"),
        (lambda s, r: Reply(body=b"not a crl") if "rootcacrl" in s.path else r, "not a CRL"),
        (lambda s, r: Reply(body=b"x" * (5 * 1024 * 1024)) if "pckcrl" in s.path else r, "exceeds"),
    ],
)
def test_a_service_that_answers_badly_is_a_collateral_problem(
    change: Callable[[Seen, Reply], Reply], words: str
) -> None:
    with serve(_broken(change)) as broken, pytest.raises(CollateralUnavailableError, match=words):
        fetch_tdx_collateral(QUOTE, RequestsFetcher(retries=0), base_url=broken.url)


def test_nothing_listening_is_a_network_error() -> None:
    with pytest.raises(NetworkError):
        fetch_tdx_collateral(QUOTE, RequestsFetcher(retries=0), base_url="http://127.0.0.1:9")


def test_attest_fetches_through_the_cache_and_works_offline_from_it(
    server: LocalServer, tmp_path: Path
) -> None:
    args: list[str | Path] = [
        "attest", "--cvm-only", "--cvm-evidence", TDX / "quote.bin", "--at", AT.isoformat(),
        "--cvm-report-data", REPORT_DATA, "--cache-dir", tmp_path / "cache",
    ]  # fmt: skip
    fetched = run_cli(*args, "--cvm-pccs-url", server.url)
    assert fetched.returncode == 0, fetched.stderr + fetched.stdout
    offline = run_cli(*args, "--offline")  # the same platform's collateral, from the cache
    assert offline.returncode == 0, offline.stderr + offline.stdout
    empty = run_cli(*args[:-1], tmp_path / "empty", "--offline")
    assert empty.returncode == 3
    assert "--cvm-collateral" in empty.stderr


def test_a_holder_fetches_collateral_an_offer_came_without(
    server: LocalServer, tmp_path: Path
) -> None:
    from gpucc.assembly import PlatformEvidence, PlatformVerifier, Settings
    from gpucc.gpuattest.netconfig import NetworkSettings
    from gpucc.gpuattest.policy import parse_policy

    # The real quote's collateral is of its day: verified as of then (key release itself is
    # always decided now; this checks where the collateral comes from).
    policy = parse_policy({"cvm": {"allow_unpinned": True}})
    network = NetworkSettings(cache_dir=tmp_path)
    offer = PlatformEvidence(cvm=QUOTE, source="offer")  # no collateral came with it
    data = bytes.fromhex(REPORT_DATA)
    verifier = PlatformVerifier(
        Settings(policy=policy, network=network, pccs_url=server.url, at=AT)
    )
    assert verifier.verify(offer, cvm_report_data=data).trusted
    offline = PlatformVerifier(
        Settings(policy=policy, network=NetworkSettings(cache_dir=tmp_path, offline=True), at=AT)
    )
    assert offline.verify(offer, cvm_report_data=data).trusted  # from the cache


def _tcb_body(prefix: str) -> Callable[[Seen, Reply], Reply]:
    """TCB info answers with ``prefix`` members before Intel's own."""

    def change(seen: Seen, reply: Reply) -> Reply:
        if "tcb?" not in seen.path:
            return reply
        return Reply(body=b"{" + prefix.encode() + reply.body[1:], headers=reply.headers)

    return change


def test_a_tcb_info_answer_that_names_tcb_info_twice_is_refused() -> None:
    change = _tcb_body('"tcbInfo": {"version": 3}, ')
    with serve(_broken(change)) as broken, pytest.raises(NetworkError, match="appears twice"):
        fetch_tdx_collateral(QUOTE, RequestsFetcher(retries=0), base_url=broken.url)


def test_the_signed_tcb_info_text_is_the_documents_own_not_a_nested_decoy() -> None:
    change = _tcb_body('"note": {"tcbInfo": {"version": 3}}, ')
    with serve(_broken(change)) as broken, pytest.raises(NetworkError, match="no tcbInfo"):
        fetch_tdx_collateral(QUOTE, RequestsFetcher(retries=0), base_url=broken.url)
