"""Fetching VCEKs from a KDS on 127.0.0.1: URLs, the cache, and hostile or absent services."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucc.cli.exitcodes import exit_code_for
from gpucc.core.errors import (
    CollateralUnavailableError,
    NetworkError,
    OfflineError,
    UsageError,
)
from gpucc.core.transport import RequestsFetcher
from gpucc.gpuattest.cache import CollateralCache
from gpucc.gpuattest.cvm.snp import verify_snp_report
from gpucc.gpuattest.cvm.snp_kds import KdsError, fetch_vcek, vcek_url
from gpucc.gpuattest.cvm.snp_report import (
    MalformedSnpReportError,
    SnpProduct,
    SnpTcb,
    parse_snp_report,
)
from gpucc.gpuattest.cvm.snp_simulate import SimulatedSnp
from tests.support.netfixtures import Reply, Seen, free_port, serve
from tests.support.paths import DATA

SNP = DATA / "cpu-tee" / "snp"
REPORT = (SNP / "report.bin").read_bytes()
VCEK = (SNP / "vcek.der").read_bytes()
WHEN = dt.datetime(2025, 6, 19, 12, 0, tzinfo=dt.UTC)
MILAN_PATH = (
    "/vcek/v1/Milan/d49554ec717f4e5b0fe6b143bcf0405bd7ae304727edf46603f2a76aef6a3abc"
    "15d7af38db757039029f0efacfd08e244324884738c72b082e2f87a44d541eb6"
    "?blSPL=03&teeSPL=00&snpSPL=08&ucodeSPL=115"
)


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def fetcher() -> Iterator[RequestsFetcher]:
    with RequestsFetcher(timeout=(0.5, 0.5), retries=0, total_timeout=2.0) as f:
        yield f


class Kds:
    """Serves ``certs`` by path and query; ``reply`` overrides every answer when set."""

    def __init__(self, certs: dict[str, bytes]) -> None:
        self.certs = certs
        self.reply: Reply | None = None

    def __call__(self, seen: Seen) -> Reply:
        if self.reply is not None:
            return self.reply
        body = self.certs.get(seen.path)
        if body is None:
            return Reply(404, b"Not Found")
        return Reply(200, body, {"Content-Type": "application/x-x509-ca-cert"})


def test_the_url_is_amds_for_milan_and_genoa_and_takes_8_bytes_and_fmc_on_turin() -> None:
    r = parse_snp_report(REPORT)
    url = vcek_url(r.chip_id, r.tcb("reported", SnpProduct.MILAN), SnpProduct.MILAN)
    assert url == "https://kdsintf.amd.com" + MILAN_PATH
    tcb = SnpTcb(bootloader=1, tee=2, snp=3, microcode=213, fmc=4)
    turin = vcek_url(bytes(range(64)), tcb, SnpProduct.TURIN, base_url="http://k/")
    assert turin == (
        "http://k/vcek/v1/Turin/0001020304050607?fmcSPL=04&blSPL=01&teeSPL=02&snpSPL=03&ucodeSPL=213"
    )
    with pytest.raises(ValueError, match="64 bytes"):
        vcek_url(b"short", tcb, SnpProduct.MILAN)


def test_the_real_vcek_is_fetched_verified_and_cached(
    fetcher: RequestsFetcher, tmp_path: Path
) -> None:
    kds = Kds({MILAN_PATH: VCEK})
    cache = CollateralCache(tmp_path / "cache")
    with serve(kds) as server:
        got = fetch_vcek(REPORT, fetcher=fetcher, cache=cache, base_url=server.url)
        assert got == VCEK
        assert [s.path for s in server.seen] == [MILAN_PATH]  # v2: Milan is asked first
        assert verify_snp_report(REPORT, vcek=got, now=WHEN).evidence_ok
        # The second time it comes from the cache, also offline.
        offline = RequestsFetcher(offline=True)
        assert fetch_vcek(REPORT, fetcher=offline, cache=cache, base_url=server.url) == VCEK
        assert server.count == 1
    entries = list((tmp_path / "cache" / "snp-vcek").iterdir())
    assert len(entries) == 1 and entries[0].stat().st_mode & 0o777 == 0o600


def test_a_corrupt_cache_entry_is_discarded_and_fetched_again(
    fetcher: RequestsFetcher, tmp_path: Path
) -> None:
    cache = CollateralCache(tmp_path)
    with serve(Kds({MILAN_PATH: VCEK})) as server:
        fetch_vcek(REPORT, fetcher=fetcher, cache=cache, base_url=server.url)
        (entry,) = (tmp_path / "snp-vcek").iterdir()
        entry.write_text('{"not": "ours"}')
        assert fetch_vcek(REPORT, fetcher=fetcher, cache=cache, base_url=server.url) == VCEK
        assert server.count == 2


def test_offline_without_a_cached_vcek_is_collateral_unavailable() -> None:
    with pytest.raises(OfflineError) as info:
        fetch_vcek(REPORT, fetcher=RequestsFetcher(offline=True), base_url="http://127.0.0.1:9")
    assert exit_code_for(info.value) == 3


def test_a_version_2_report_of_another_line_is_found_after_milan(fetcher: RequestsFetcher) -> None:
    chip = SimulatedSnp.create(product=SnpProduct.GENOA, seed=b"kds")
    report = chip.report(version=2)
    r = parse_snp_report(report)
    path = vcek_url(r.chip_id, chip.tcb, SnpProduct.GENOA, base_url="")
    with serve(Kds({path: chip.vcek})) as server:
        assert fetch_vcek(report, fetcher=fetcher, base_url=server.url) == chip.vcek
        assert [s.path.split("/")[3] for s in server.seen] == ["Milan", "Genoa"]


def test_a_version_3_report_asks_only_its_own_line(fetcher: RequestsFetcher) -> None:
    chip = SimulatedSnp.create(product=SnpProduct.TURIN, seed=b"kds")
    report = chip.report(version=3)
    path = vcek_url(parse_snp_report(report).chip_id, chip.tcb, SnpProduct.TURIN, base_url="")
    with serve(Kds({path: chip.vcek})) as server:
        assert fetch_vcek(report, fetcher=fetcher, base_url=server.url) == chip.vcek
        assert server.count == 1
    with pytest.raises(UsageError, match="comes from a Turin CPU, not Milan"):
        fetch_vcek(report, fetcher=fetcher, product=SnpProduct.MILAN, base_url=server.url)


def test_a_vcek_amd_does_not_have_is_collateral_unavailable(fetcher: RequestsFetcher) -> None:
    with serve(Kds({})) as server:
        with pytest.raises(KdsError, match="no VCEK for this chip") as info:
            fetch_vcek(REPORT, fetcher=fetcher, base_url=server.url)
        assert server.count == 2  # Milan, then Genoa
    assert isinstance(info.value, CollateralUnavailableError)
    assert exit_code_for(info.value) == 3


@pytest.mark.parametrize(
    ("reply", "words"),
    [
        (Reply(200, b"x" * 100_000), "exceeds"),
        (Reply(200, b"x" * 100_000, no_length=True), "exceeds"),
        (Reply(200, VCEK, delay=1.5), "read timeout"),
        (Reply(500, b"busy"), "HTTP 500"),
        (Reply(429, b"slow down"), "HTTP 429"),
        (Reply(200, b"<html>captive portal</html>"), "not usable"),
    ],
    ids=["oversized", "oversized-no-length", "slow", "server-error", "rate-limited", "not-der"],
)
def test_a_hostile_or_broken_kds_is_collateral_unavailable_never_a_verdict(
    fetcher: RequestsFetcher, tmp_path: Path, reply: Reply, words: str
) -> None:
    kds = Kds({})
    kds.reply = reply
    cache = CollateralCache(tmp_path)
    with serve(kds) as server, pytest.raises(NetworkError) as info:
        fetch_vcek(REPORT, fetcher=fetcher, cache=cache, base_url=server.url)
    assert words in str(info.value)
    assert exit_code_for(info.value) == 3
    assert not (tmp_path / "snp-vcek").exists()  # nothing unusable is remembered


def test_an_answer_for_another_chip_or_tcb_is_refused_and_not_cached(
    fetcher: RequestsFetcher, tmp_path: Path
) -> None:
    other = SimulatedSnp.create(seed=b"another chip")
    cache = CollateralCache(tmp_path)
    with serve(Kds({MILAN_PATH: other.vcek})) as server:
        with pytest.raises(KdsError, match="not issued by SEV-Milan|another chip"):
            fetch_vcek(REPORT, fetcher=fetcher, cache=cache, base_url=server.url)
    assert not (tmp_path / "snp-vcek").exists()
    chip = SimulatedSnp.create(
        seed=b"kds", vcek_tcb=SnpTcb(bootloader=1, tee=0, snp=1, microcode=1)
    )
    report = chip.report()
    path = vcek_url(chip.chip_id, chip.tcb, SnpProduct.MILAN, base_url="")
    with serve(Kds({path: chip.vcek})) as server:
        with pytest.raises(KdsError, match="another TCB"):
            fetch_vcek(report, fetcher=fetcher, base_url=server.url)


def test_an_unreachable_kds_is_collateral_unavailable(fetcher: RequestsFetcher) -> None:
    with pytest.raises(NetworkError, match="connection refused") as info:
        fetch_vcek(REPORT, fetcher=fetcher, base_url=f"http://127.0.0.1:{free_port()}")
    assert exit_code_for(info.value) == 3


def test_a_masked_chip_id_cannot_be_looked_up(fetcher: RequestsFetcher) -> None:
    chip = SimulatedSnp.create(seed=b"kds", chip_id=bytes(64))
    with pytest.raises(CollateralUnavailableError, match="masks its chip ID"):
        fetch_vcek(chip.report(), fetcher=fetcher, base_url="http://127.0.0.1:9")


def test_a_malformed_report_is_malformed_before_any_request(fetcher: RequestsFetcher) -> None:
    with pytest.raises(MalformedSnpReportError):
        fetch_vcek(REPORT[:100], fetcher=fetcher, base_url="http://127.0.0.1:9")
