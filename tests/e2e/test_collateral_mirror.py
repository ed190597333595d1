"""``gpucc collateral serve``: the fleet's collateral mirror as a real process on 127.0.0.1, in
front of loopback stand-ins for NVIDIA's RIM service and OCSP responder, Intel's PCS and AMD's
KDS; clients verify through it exactly as from the vendors."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from cryptography.hazmat.primitives import serialization

from gpucc.core.transport import RequestsFetcher
from gpucc.gpuattest.cvm.pcs import fetch_tdx_collateral
from gpucc.gpuattest.cvm.snp_kds import fetch_vcek
from gpucc.gpuattest.evidence import EvidenceSet, GpuEvidence
from gpucc.gpuattest.netconfig import NetworkSettings, build_collateral
from gpucc.gpuattest.report import AttestationReport
from gpucc.gpuattest.result import AttestationResult, Verdict
from gpucc.gpuattest.simulate import build_report
from gpucc.gpuattest.verifier import verify
from tests.e2e.test_e2e_network import _as_rimpki, _set_a_opaque
from tests.support import netfixtures as nf
from tests.support.cli import run_cli
from tests.support.mirror import RunningMirror, mirror
from tests.support.rimpki import sign_rim
from tests.support.samples import (
    SET_A_CHAIN,
    SET_A_DRIVER_RIM,
    SET_A_REPORT,
    SET_A_VBIOS_RIM,
    report_bytes,
)
from tests.unit.gpuattest.test_cvm_pcs import AT as TDX_AT
from tests.unit.gpuattest.test_cvm_pcs import QUOTE, SAMPLE, pccs
from tests.unit.gpuattest.test_cvm_snp_kds import MILAN_PATH, REPORT, VCEK, Kds

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
FAST = ("--timeout", "1", "--deadline", "3", "--retries", "0", "--refresh-s", "3600")


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


class Upstream:
    """NVIDIA's services for the test PKI, each request counted by item."""

    def __init__(self, pki: nf.NetPki, delay: float = 0.0) -> None:
        rim_pki = _as_rimpki(pki)
        self.rims = nf.RimService(
            {
                nf.DRIVER_RIM_ID: sign_rim(SET_A_DRIVER_RIM.read_bytes(), pki=rim_pki),
                nf.VBIOS_RIM_ID: sign_rim(SET_A_VBIOS_RIM.read_bytes(), pki=rim_pki),
            }
        )
        self.ocsp = nf.OcspResponder(pki)
        self.delay = delay
        self.asked: Counter[str] = Counter()
        self.down = False
        self._lock = threading.Lock()

    def rim(self, seen: nf.Seen) -> nf.Reply:
        with self._lock:
            self.asked[seen.path] += 1
        if self.down:
            return nf.Reply(503, b"down")
        time.sleep(self.delay)
        return self.rims(seen)

    def responder(self, seen: nf.Seen) -> nf.Reply:
        from cryptography.x509 import ocsp

        with self._lock:
            self.asked[f"ocsp:{ocsp.load_der_ocsp_request(seen.body).serial_number:x}"] += 1
        if self.down:
            return nf.Reply(503, b"down")
        time.sleep(self.delay)
        return self.ocsp(seen)


@pytest.fixture(scope="module")
def pki() -> nf.NetPki:
    return nf.build_pki()


@pytest.fixture
def evidence(pki: nf.NetPki) -> tuple[EvidenceSet, bytes]:
    nonce = os.urandom(32)
    runtime = AttestationReport.parse(report_bytes(SET_A_REPORT)).runtime_measurements()
    raw = build_report(nonce=nonce, measurements=runtime, opaque=_set_a_opaque(), key=pki.leaf.key)
    chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in pki.device_chain)
    return EvidenceSet(gpus=(GpuEvidence(report=raw, cert_chain_pem=chain),)), nonce


@pytest.fixture
def vendor(pki: nf.NetPki) -> Iterator[tuple[Upstream, str, str]]:
    up = Upstream(pki)
    with nf.serve(up.rim) as rim, nf.serve(up.responder) as responder:
        yield up, rim.url, responder.url


def attest(
    pki: nf.NetPki, evidence: tuple[EvidenceSet, bytes], rim_url: str, ocsp_url: str
) -> AttestationResult:
    """One verification, as gpucc does it, from the services at these URLs (no local cache)."""
    settings = NetworkSettings(
        rim_url=rim_url, ocsp_url=ocsp_url, ocsp_nonce=False, use_cache=False, timeout=5,
        deadline=10, retries=0,
    )  # fmt: skip
    rims, ocsp = build_collateral(settings)
    ev, nonce = evidence
    return verify(ev, expected_nonce=nonce, roots=pki.roots, now=nf.NOW, rims=rims, ocsp=ocsp)


def serve_for(
    tmp: Path, rim_url: str, ocsp_url: str, *extra: str
) -> contextlib.AbstractContextManager[RunningMirror]:
    return mirror(
        tmp, "--rim-upstream", rim_url, "--ocsp-upstream", ocsp_url, "--at", nf.NOW.isoformat(),
        *FAST, *extra,
    )  # fmt: skip


def metrics(url: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"{url}/metrics", timeout=5).text
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, sample.labels.get("vendor", ""))] = sample.value
    return found


def test_fifty_clients_through_one_mirror_cause_one_upstream_request_per_item(
    pki: nf.NetPki, evidence: tuple[EvidenceSet, bytes], tmp_path: Path
) -> None:
    up = Upstream(pki, delay=0.3)  # slow enough that the clients' requests overlap
    with (
        nf.serve(up.rim) as rim,
        nf.serve(up.responder) as responder,
        serve_for(tmp_path, rim.url, responder.url) as m,
    ):
        direct = attest(pki, evidence, rim.url, responder.url)
        assert direct.verdict is Verdict.TRUSTED, direct.reasons
        up.asked.clear()
        start = threading.Barrier(50)
        verdicts: list[Verdict] = []

        def client() -> None:
            start.wait(30)
            verdicts.append(attest(pki, evidence, m.url, f"{m.url}/ocsp").verdict)

        threads = [threading.Thread(target=client) for _ in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert verdicts == [Verdict.TRUSTED] * 50
        assert up.asked and set(up.asked.values()) == {1}, up.asked  # one request per item
        items = len(up.asked)
        seen = metrics(m.url)
        vendors = ("nvidia-rim", "nvidia-ocsp")
        assert sum(seen[("gpucc_mirror_upstream_requests_total", v)] for v in vendors) == items
        assert sum(seen[("gpucc_mirror_misses_total", v)] for v in vendors) == items
        assert seen[("gpucc_mirror_entries", "")] == items
        answered = (
            ("gpucc_mirror_hits_total", "nvidia-rim"),
            ("gpucc_mirror_coalesced_total", "nvidia-rim"),
        )
        assert sum(seen[k] for k in answered) == 50 * 2 - 2  # two RIMs each, fetched once
    log = m.logged()
    upstream = [json.loads(x) for x in log.splitlines() if '"event": "upstream"' in x]
    assert len(upstream) == items and all(x["status"] == 200 for x in upstream)
    assert any('"event": "access"' in x for x in log.splitlines())


def test_a_vendor_outage_leaves_warm_verdicts_and_makes_cold_ones_undecided_quickly(
    pki: nf.NetPki,
    evidence: tuple[EvidenceSet, bytes],
    vendor: tuple[Upstream, str, str],
    tmp_path: Path,
) -> None:
    up, rim_url, ocsp_url = vendor
    with serve_for(tmp_path, rim_url, ocsp_url) as warm:
        assert attest(pki, evidence, warm.url, f"{warm.url}/ocsp").verdict is Verdict.TRUSTED
        up.down = True
        assert attest(pki, evidence, warm.url, f"{warm.url}/ocsp").verdict is Verdict.TRUSTED
        started = time.monotonic()
        cold = requests.get(f"{warm.url}/v1/rim/NV_GPU_DRIVER_GH100_999.1", timeout=10)
        assert cold.status_code == 503 and cold.json()["error"] == "collateral-unavailable"
        assert time.monotonic() - started < 5
    with serve_for(tmp_path / "cold", rim_url, ocsp_url) as empty:
        started = time.monotonic()
        result = attest(pki, evidence, empty.url, f"{empty.url}/ocsp")
        assert result.verdict is Verdict.UNDECIDED  # exit 3, never a verdict on the GPU
        assert time.monotonic() - started < 30
        seen = metrics(empty.url)
        assert seen[("gpucc_mirror_upstream_errors_total", "nvidia-rim")] >= 1


def test_a_tampered_mirror_answer_is_refused_exactly_like_a_tampered_vendor_answer(
    pki: nf.NetPki,
    evidence: tuple[EvidenceSet, bytes],
    vendor: tuple[Upstream, str, str],
    tmp_path: Path,
) -> None:
    up, rim_url, ocsp_url = vendor
    rim = up.rims.rims[nf.DRIVER_RIM_ID]
    up.rims.rims[nf.DRIVER_RIM_ID] = rim.replace(b"545.00", b"545.01", 1)  # a changed byte
    up.ocsp.set(signer="forged")
    from_vendor = attest(pki, evidence, rim_url, ocsp_url)
    with serve_for(tmp_path, rim_url, ocsp_url) as m:
        through = attest(pki, evidence, m.url, f"{m.url}/ocsp")
        # the mirror's own store altered on disk: refused on reading, never served
        for entry in m.store.glob("*.json"):
            doc = json.loads(entry.read_text())
            doc["body"] = doc["body"][:-8] + "AAAAAAA="
            entry.write_text(json.dumps(doc))
    assert from_vendor.verdict is through.verdict is Verdict.NOT_TRUSTED

    def failed(r: AttestationResult) -> list[tuple[str, str]]:
        return sorted((c.id, c.reason) for c in r.gpus[0].checks if c.status.value == "fail")

    assert failed(from_vendor) == failed(through) and failed(through)
    with serve_for(tmp_path, rim_url, ocsp_url, "--offline") as restarted:
        assert "store-entry-dropped" in restarted.logged()
        assert requests.get(f"{restarted.url}/healthz", timeout=5).json()["entries"] == 0


def test_restart_air_gap_export_and_import_serve_the_same_verdicts(
    pki: nf.NetPki,
    evidence: tuple[EvidenceSet, bytes],
    vendor: tuple[Upstream, str, str],
    tmp_path: Path,
) -> None:
    up, rim_url, ocsp_url = vendor
    with serve_for(tmp_path, rim_url, ocsp_url) as m:
        first = attest(pki, evidence, m.url, f"{m.url}/ocsp")
        assert first.verdict is Verdict.TRUSTED
    asked = sum(up.asked.values())
    with serve_for(tmp_path, rim_url, ocsp_url) as again:  # the same store after a restart
        assert attest(pki, evidence, again.url, f"{again.url}/ocsp").verdict is Verdict.TRUSTED
    assert sum(up.asked.values()) == asked  # nothing asked again
    export = tmp_path / "export.json"
    at = ("--at", nf.NOW.isoformat())
    made = run_cli("collateral", "export", "--store", tmp_path / "store", "-o", export, *at)
    assert made.returncode == 0, made.stderr
    gap = tmp_path / "gap"
    imported = run_cli("collateral", "import", export, "--store", gap / "store", *at)
    assert imported.returncode == 0 and "imported" in imported.stderr, imported.stderr
    dead = f"http://127.0.0.1:{nf.free_port()}"
    with serve_for(gap, dead, dead, "--offline") as offline:
        again_result = attest(pki, evidence, offline.url, f"{offline.url}/ocsp")
        assert again_result.verdict is first.verdict is Verdict.TRUSTED
        assert again_result.gpus[0].claims["measres"] == first.gpus[0].claims["measres"]
        cold = requests.get(f"{offline.url}/v1/rim/NV_GPU_DRIVER_GH100_1.0", timeout=5)
        assert cold.status_code == 503 and "offline" in cold.json()["message"]
    broken = tmp_path / "broken.json"
    broken.write_text(export.read_text().replace('"nvidia-rim"', '"nvidia-ocsp"', 1))
    refused = run_cli("collateral", "import", broken, "--store", tmp_path / "other", *at)
    assert refused.returncode == 4 and not (tmp_path / "other").exists(), refused.stderr


@pytest.mark.parametrize("mode", ["oversized", "slow", "non-json", "redirect"])
def test_hostile_upstream_answers_are_503_and_not_kept(
    pki: nf.NetPki, vendor: tuple[Upstream, str, str], tmp_path: Path, mode: str
) -> None:
    up, _, ocsp_url = vendor
    up.rims.oversized_bytes = 5 * 1024 * 1024
    up.rims.slow_delay = 6.0

    with nf.serve(lambda s: nf.Reply(200, b"{}")) as elsewhere:

        def hostile(seen: nf.Seen) -> nf.Reply:
            if mode == "redirect":
                return nf.Reply(302, headers={"Location": f"{elsewhere.url}{seen.path}"})
            up.rims.modes[nf.DRIVER_RIM_ID] = mode
            return up.rims(seen)

        with nf.serve(hostile) as rim, serve_for(tmp_path, rim.url, ocsp_url) as m:
            started = time.monotonic()
            answer = requests.get(f"{m.url}/v1/rim/{nf.DRIVER_RIM_ID}", timeout=15)
            assert answer.status_code == 503, answer.text
            assert time.monotonic() - started < 8  # the mirror's deadline, never a hang
            assert elsewhere.count == 0
            assert requests.get(f"{m.url}/healthz", timeout=5).json()["entries"] == 0


def test_intel_pcs_and_amd_kds_through_the_mirror(tmp_path: Path) -> None:
    kds = Kds({MILAN_PATH: VCEK})
    with (
        nf.serve(pccs) as pcs,
        nf.serve(kds) as amd,
        mirror(
            tmp_path, "--pcs-upstream", pcs.url, "--kds-upstream", amd.url,
            "--at", TDX_AT.isoformat(), *FAST,
        ) as m,
    ):  # fmt: skip
        fetcher = RequestsFetcher(retries=0)
        for _ in range(2):
            assert fetch_tdx_collateral(QUOTE, fetcher, base_url=m.url).fields == SAMPLE
            assert fetch_vcek(REPORT, fetcher=fetcher, base_url=m.url) == VCEK
        assert pcs.count == 4 and amd.count == 1  # the second round came from the store
        seen = metrics(m.url)
        assert seen[("gpucc_mirror_hits_total", "intel-pcs")] == 4
        assert seen[("gpucc_mirror_hits_total", "amd-kds")] == 1
        bad = requests.get(f"{m.url}/tdx/certification/v4/tcb?fmspc=zz", timeout=5)
        assert bad.status_code == 400
        assert requests.get(f"{m.url}/etc/passwd", timeout=5).status_code == 404


def test_check_says_not_published_through_the_mirror_and_exits_3(
    vendor: tuple[Upstream, str, str], tmp_path: Path
) -> None:
    up, rim_url, ocsp_url = vendor
    with serve_for(tmp_path, rim_url, ocsp_url) as m:
        proc = run_cli(
            "collateral", "check", "--driver", "999.99", "--rim-url", m.url,
            "--ocsp-url", f"{m.url}/ocsp", "--no-ocsp-nonce", "--at", nf.NOW.isoformat(),
            "--format", "json",
        )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["decision"] == "undecided"
    assert doc["items"][0]["status"] == "not-published"
    assert doc["items"][0]["name"] == "NV_GPU_DRIVER_GH100_999.99"


def test_check_reports_published_rims_ready_and_exits_0(tmp_path: Path) -> None:
    service = nf.RimService.with_samples()
    evidence = tmp_path / "evidence.json"
    from gpucc.gpuattest.evidence import dump_evidence_json, load_raw_evidence

    evidence.write_bytes(dump_evidence_json(load_raw_evidence(SET_A_REPORT, SET_A_CHAIN)))
    with nf.serve(service) as rims:
        proc = run_cli(
            "collateral", "check", "--evidence", evidence, "--rim-url", rims.url,
            "--ocsp-url", f"http://127.0.0.1:{nf.free_port()}", "--timeout", "1",
            "--deadline", "2", "--at", "2024-01-01T00:00:00Z",
        )  # fmt: skip
    lines = proc.stdout.splitlines()
    assert any(x.startswith("ok") and nf.DRIVER_RIM_ID in x for x in lines), proc.stdout
    assert any(x.startswith("unavailable") and " ocsp " in x for x in lines), proc.stdout
    assert proc.returncode == 3 and lines[-1] == "decision: undecided"  # OCSP unreachable


def test_the_systemd_unit_verifies_and_its_configuration_serves(tmp_path: Path) -> None:
    config = (DEPLOY / "collateral-mirror.yaml").read_text()
    local = tmp_path / "mirror.yaml"
    local.write_text(config.replace("/var/lib/gpucc/collateral-mirror", str(tmp_path / "s")))
    with mirror(tmp_path, "--config", str(local), "--offline") as m:
        assert requests.get(f"{m.url}/healthz", timeout=5).json()["status"] == "ok"
        assert '"service": "collateral-mirror"' in m.logged()
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: 127.0.0.1:0\nno_such_key: 1\n")
    proc = run_cli("collateral", "serve", "--config", bad)
    assert proc.returncode == 4 and "no_such_key" in proc.stderr, proc.stderr
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is absent")
    gpucc = tmp_path / "gpucc"
    gpucc.write_text("#!/bin/sh\n")
    gpucc.chmod(0o755)
    unit = tmp_path / "gpucc-collateral.service"
    text = (DEPLOY / "gpucc-collateral.service").read_text()
    unit.write_text(text.replace("/opt/gpucc/bin/gpucc", str(gpucc)))
    run = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert run.returncode == 0 and "gpucc-collateral.service" not in run.stderr, run.stderr


def test_bundles_import_into_a_mirror(
    pki: nf.NetPki,
    evidence: tuple[EvidenceSet, bytes],
    vendor: tuple[Upstream, str, str],
    tmp_path: Path,
) -> None:
    from gpucc.gpuattest.bundle import collect_collateral, evidence_rim_ids
    from gpucc.gpuattest.chain import load_pem_chain
    from gpucc.gpuattest.netconfig import build_fetcher, network_sources

    _, rim_url, ocsp_url = vendor
    settings = NetworkSettings(rim_url=rim_url, ocsp_url=ocsp_url, use_cache=False)
    ev, _ = evidence
    with build_fetcher(settings) as fetcher:
        rims, ocsp = network_sources(settings, fetcher)
        got = collect_collateral(
            device_chains=[load_pem_chain(g.cert_chain_pem) for g in ev.gpus],
            rim_ids=evidence_rim_ids(ev.gpus), rim_source=rims, ocsp=ocsp, roots=pki.roots,
            now=nf.NOW,
        )  # fmt: skip
    bundle = tmp_path / "bundle.json"
    bundle.write_bytes(got.bundle.to_json())
    at = ("--at", (nf.NOW + dt.timedelta(minutes=1)).isoformat())
    imported = run_cli("collateral", "import", bundle, "--store", tmp_path / "store", *at)
    assert imported.returncode == 0, imported.stderr
    dead = f"http://127.0.0.1:{nf.free_port()}"
    with serve_for(tmp_path, dead, dead, "--offline") as m:
        assert attest(pki, evidence, m.url, f"{m.url}/ocsp").verdict is Verdict.TRUSTED


def test_gpucc_attest_takes_its_cvm_collateral_from_the_mirror(tmp_path: Path) -> None:
    from tests.e2e.test_cli_cvm_snp import AT as SNP_AT
    from tests.e2e.test_cli_cvm_snp import REPORT_DATA as SNP_DATA
    from tests.unit.gpuattest.test_cvm_pcs import REPORT_DATA as TDX_DATA
    from tests.unit.gpuattest.test_cvm_pcs import TDX
    from tests.unit.gpuattest.test_cvm_snp_kds import SNP

    kds = Kds({MILAN_PATH: VCEK})
    with (
        nf.serve(pccs) as pcs,
        nf.serve(kds) as amd,
        mirror(
            tmp_path, "--pcs-upstream", pcs.url, "--kds-upstream", amd.url,
            "--at", TDX_AT.isoformat(), *FAST,
        ) as m,
    ):  # fmt: skip
        snp = run_cli(
            "attest", "--cvm-only", "--cvm-evidence", SNP / "report.bin", "--at", SNP_AT,
            "--cvm-report-data", SNP_DATA, "--no-cache", "--cvm-kds-url", m.url,
        )  # fmt: skip
        assert snp.returncode == 0, snp.stdout + snp.stderr
        tdx = run_cli(
            "attest", "--cvm-only", "--cvm-evidence", TDX / "quote.bin", "--at",
            TDX_AT.isoformat(), "--cvm-report-data", TDX_DATA, "--no-cache",
            env={"GPUCC_PCCS_URL": m.url},
        )  # fmt: skip
        assert tdx.returncode == 0, tdx.stdout + tdx.stderr
        assert amd.count == 1 and pcs.count == 4


def test_past_its_next_update_an_answer_is_served_stale_within_the_grace_marked_and_counted(
    pki: nf.NetPki, vendor: tuple[Upstream, str, str], tmp_path: Path
) -> None:
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509 import ocsp

    up, rim_url, ocsp_url = vendor
    cert, issuer = pki.device_chain[1], pki.device_chain[2]
    request = (
        ocsp.OCSPRequestBuilder()
        .add_certificate(cert, issuer, hashes.SHA1())  # noqa: S303 - the CertID's hash
        .build()
        .public_bytes(serialization.Encoding.DER)
    )

    def ask(url: str) -> requests.Response:
        headers = {"Content-Type": "application/ocsp-request"}
        return requests.post(f"{url}/ocsp", data=request, headers=headers, timeout=10)

    almost = nf.NOW + dt.timedelta(days=1) - dt.timedelta(seconds=2)  # nextUpdate is NOW + 1 day
    for grace, want in (("1", 200), ("0", 503)):
        up.down = False
        where = tmp_path / grace
        with mirror(
            where, "--rim-upstream", rim_url, "--ocsp-upstream", ocsp_url, "--at",
            almost.isoformat(), "--grace-hours", grace, *FAST,
        ) as m:  # fmt: skip
            first = ask(m.url)
            assert first.status_code == 200 and first.headers["gpucc-mirror"] == "miss"
            assert "gpucc-mirror-stale" not in first.headers
            up.down = True
            time.sleep(3)  # past nextUpdate on the mirror's clock
            later = ask(m.url)
            assert later.status_code == want, later.text
            if want == 200:
                assert later.content == first.content
                assert later.headers["gpucc-mirror-stale"] == "1"
                assert later.headers["warning"].startswith("110")
                assert metrics(m.url)[("gpucc_mirror_stale_total", "nvidia-ocsp")] == 1
                assert '"event": "stale"' in m.logged()


def test_tls_and_the_loopback_default(tmp_path: Path) -> None:
    from tests.e2e.test_travel_e2e import _self_signed

    cert, key = _self_signed(tmp_path)
    key.chmod(0o600)
    args = ("--offline", "--tls-cert", str(cert), "--tls-key", str(key))
    with mirror(tmp_path, *args, scheme="https") as m:
        answer = requests.get(f"{m.url}/healthz", timeout=5, verify=str(cert))
        assert answer.json()["status"] == "ok"
        assert '"tls": true' in m.logged()
    plain = run_cli("collateral", "serve", "--listen", "0.0.0.0:0", "--store", tmp_path / "s")
    assert plain.returncode == 2 and "not a loopback address" in plain.stderr, plain.stderr


def test_check_says_whether_cvm_collateral_is_current(tmp_path: Path) -> None:
    from tests.unit.gpuattest.test_cvm_pcs import TDX

    with nf.serve(pccs) as pcs:
        args = ("collateral", "check", "--cvm-evidence", TDX / "quote.bin", "--cvm-pccs-url")
        now = run_cli(*args, pcs.url, "--at", TDX_AT.isoformat(), "-f", "json")
        later = run_cli(*args, pcs.url, "--at", (TDX_AT + dt.timedelta(days=40)).isoformat())
    assert now.returncode == 0, now.stdout + now.stderr
    assert json.loads(now.stdout)["items"][0]["status"] == "ok"
    assert later.returncode == 3 and later.stdout.startswith("stale"), later.stdout


def test_the_mirrors_service_key_goes_to_nvidia_only_and_never_into_a_log(
    pki: nf.NetPki,
    evidence: tuple[EvidenceSet, bytes],
    vendor: tuple[Upstream, str, str],
    tmp_path: Path,
) -> None:
    up, rim_url, ocsp_url = vendor
    seen: list[str] = []
    original = up.rims.__call__

    def rims(s: nf.Seen) -> nf.Reply:
        seen.append(s.headers.get("Authorization", ""))
        return original(s)

    up.rims = rims  # type: ignore[assignment]
    key = {"NV_ATTESTATION_SERVICE_KEY": "sk-test-0123456789"}
    with serve_for(tmp_path, rim_url, ocsp_url) as plain:
        assert attest(pki, evidence, plain.url, f"{plain.url}/ocsp").verdict is Verdict.TRUSTED
    assert seen and not any(seen)
    seen.clear()
    with mirror(
        tmp_path / "keyed", "--rim-upstream", rim_url, "--ocsp-upstream", ocsp_url,
        "--at", nf.NOW.isoformat(), *FAST, env=key,
    ) as m:  # fmt: skip
        assert attest(pki, evidence, m.url, f"{m.url}/ocsp").verdict is Verdict.TRUSTED
        assert (
            "sk-test" not in m.logged()
            and "sk-test" not in requests.get(f"{m.url}/metrics", timeout=5).text
        )
    assert seen and all(h == "Bearer sk-test-0123456789" for h in seen)
    remote = run_cli(
        "collateral", "serve", "--rim-upstream", "http://rim.example", "--store", tmp_path / "s",
        env=key,
    )  # fmt: skip
    assert remote.returncode == 2 and "plain http" in remote.stderr
    assert "sk-test" not in remote.stderr + remote.stdout
