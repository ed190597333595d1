"""End to end: the verifier and the CLI against loopback RIM and OCSP services.

The evidence here is NVIDIA's set A re-signed by a test PKI of NVIDIA's shape
(tests/support/netfixtures.py), so OCSP can be answered by a responder we control; the test
roots go in through the same ``roots`` argument production uses.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gpucc.cli.render import verdict_exit_code
from gpucc.gpuattest.evidence import EvidenceSet, GpuEvidence
from gpucc.gpuattest.netconfig import NetworkSettings, build_collateral
from gpucc.gpuattest.policy import Policy, parse_policy
from gpucc.gpuattest.report import AttestationReport
from gpucc.gpuattest.result import AttestationResult, Verdict
from gpucc.gpuattest.simulate import build_report
from gpucc.gpuattest.verifier import verify
from tests.e2e.test_cli_attest import no_traceback
from tests.support import netfixtures as nf
from tests.support.cli import gpucc
from tests.support.rimpki import RimPki, sign_rim
from tests.support.samples import (
    SET_A_CHAIN,
    SET_A_DRIVER_RIM,
    SET_A_NONCE,
    SET_A_PROD_VBIOS_RIM,
    SET_A_REPORT,
    SET_A_VBIOS_RIM,
    report_bytes,
)


@dataclass
class World:
    pki: nf.NetPki
    evidence: EvidenceSet
    nonce: bytes
    rims: nf.RimService
    rim_url: str
    ocsp: nf.OcspResponder
    ocsp_url: str


def _set_a_opaque() -> list[tuple[int, bytes]]:
    raw = report_bytes(SET_A_REPORT)
    report = AttestationReport.parse(raw)
    return [(t, v) for t, v in report.opaque.items()]


@pytest.fixture(scope="module")
def pki() -> nf.NetPki:
    return nf.build_pki()


@pytest.fixture
def world(pki: nf.NetPki) -> Iterator[World]:
    nonce = os.urandom(32)
    runtime = AttestationReport.parse(report_bytes(SET_A_REPORT)).runtime_measurements()
    raw = build_report(nonce=nonce, measurements=runtime, opaque=_set_a_opaque(), key=pki.leaf.key)
    chain_pem = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in pki.device_chain)
    evidence = EvidenceSet(gpus=(GpuEvidence(report=raw, cert_chain_pem=chain_pem),))
    rim_pki = _as_rimpki(pki)
    rims = nf.RimService(
        {
            nf.DRIVER_RIM_ID: sign_rim(SET_A_DRIVER_RIM.read_bytes(), pki=rim_pki),
            nf.VBIOS_RIM_ID: sign_rim(SET_A_VBIOS_RIM.read_bytes(), pki=rim_pki),
        }
    )
    responder = nf.OcspResponder(pki)
    with nf.serve(rims) as rim_server, nf.serve(responder) as ocsp_server:
        yield World(pki, evidence, nonce, rims, rim_server.url, responder, ocsp_server.url)


def _as_rimpki(pki: nf.NetPki) -> RimPki:
    """The network PKI's RIM chain, in the shape tests.support.rimpki's signer takes."""
    return RimPki(
        root_key=pki.rim_root.key,
        root=pki.rim_root.cert,
        ca_key=pki.rim_ca.key,
        ca=pki.rim_ca.cert,
        l3_key=pki.rim_l3.key,
        l3=pki.rim_l3.cert,
        l4_key=pki.rim_l4.key,
        l4=pki.rim_l4.cert,
    )


def run(world: World, policy: Policy | None = None, **settings: object) -> AttestationResult:
    net = NetworkSettings(
        rim_url=world.rim_url,
        ocsp_url=world.ocsp_url,
        use_cache=False,
        timeout=2.0,
        retries=1,
        **settings,  # type: ignore[arg-type]
    )
    rims, ocsp = build_collateral(net)
    return verify(
        world.evidence,
        expected_nonce=world.nonce,
        roots=world.pki.roots,
        now=nf.NOW,
        rims=rims,
        ocsp=ocsp,
        policy=policy,
    )


def chain_claim(result: AttestationResult, which: str) -> dict[str, object]:
    claims = result.gpus[0].claims
    key = {
        "device": "x-nvidia-gpu-attestation-report-cert-chain",
        "driver": "x-nvidia-gpu-driver-rim-cert-chain",
        "vbios": "x-nvidia-gpu-vbios-rim-cert-chain",
    }[which]
    value = claims[key]
    assert isinstance(value, dict)
    return value


def test_all_good_is_trusted_under_the_strict_default(world: World) -> None:
    result = run(world)
    assert result.verdict is Verdict.TRUSTED, result.reasons
    for which in ("device", "driver", "vbios"):
        claim = chain_claim(result, which)
        assert claim["x-nvidia-cert-ocsp-status"] == "good"
        assert claim["x-nvidia-cert-ocsp-nonce-matches"] is True
        assert claim["x-nvidia-cert-ocsp-response-valid"] is True
    # device certs 1..3 and both RIM chains' certs 0..2 were asked about
    assert len(world.ocsp.requests) == 3 + 3 + 3


@pytest.mark.parametrize(
    "reason",
    [x509.ReasonFlags.key_compromise, x509.ReasonFlags.superseded, None],
)
def test_revoked_device_certificate_is_not_trusted(
    world: World, reason: x509.ReasonFlags | None
) -> None:
    world.ocsp.by_serial[world.pki.ica.cert.serial_number] = nf.OcspBehaviour(
        status="revoked", reason=reason
    )
    result = run(world)
    assert result.verdict is Verdict.NOT_TRUSTED and verdict_exit_code(result.verdict) == 1
    claim = chain_claim(result, "device")
    assert claim["x-nvidia-cert-status"] == "revoked"
    expected = reason.name if reason else "unspecified"
    assert claim["x-nvidia-cert-revocation-reason"] == expected


def test_certificate_hold_passes_only_for_the_chain_the_policy_names(world: World) -> None:
    world.ocsp.by_serial[world.pki.rim_l4.cert.serial_number] = nf.OcspBehaviour(
        status="revoked", reason=x509.ReasonFlags.certificate_hold
    )
    assert run(world).verdict is Verdict.NOT_TRUSTED
    allow_rims = parse_policy({"ocsp": {"allow_hold": ["driver-rim", "vbios-rim"]}})
    result = run(world, allow_rims)
    assert result.verdict is Verdict.TRUSTED, result.reasons
    assert chain_claim(result, "vbios")["x-nvidia-cert-revocation-reason"] == "certificate_hold"
    # a hold on the device chain is not covered by a RIM-chain allowance
    world.ocsp.by_serial[world.pki.brom.cert.serial_number] = nf.OcspBehaviour(
        status="revoked", reason=x509.ReasonFlags.certificate_hold
    )
    assert run(world, allow_rims).verdict is Verdict.NOT_TRUSTED


@pytest.mark.parametrize(
    ("behaviour", "verdict", "claim_key", "claim_value"),
    [
        (nf.OcspBehaviour(status="unknown"), Verdict.NOT_TRUSTED, "x-nvidia-cert-ocsp-status", "unknown"),
        (nf.OcspBehaviour(nonce="wrong"), Verdict.NOT_TRUSTED, "x-nvidia-cert-ocsp-nonce-matches", False),
        (nf.OcspBehaviour(nonce="omit"), Verdict.NOT_TRUSTED, "x-nvidia-cert-ocsp-nonce-matches", False),
        (nf.OcspBehaviour(signer="rogue"), Verdict.NOT_TRUSTED, "x-nvidia-cert-ocsp-response-valid", False),
        (nf.OcspBehaviour(signer="delegated-no-eku"), Verdict.NOT_TRUSTED, "x-nvidia-cert-ocsp-response-valid", False),
        (nf.OcspBehaviour(answer_for="other"), Verdict.NOT_TRUSTED, "x-nvidia-cert-ocsp-response-valid", False),
        (nf.OcspBehaviour(signer="delegated"), Verdict.TRUSTED, "x-nvidia-cert-ocsp-status", "good"),
        (nf.OcspBehaviour(this_update=dt.timedelta(days=-3), next_update=dt.timedelta(days=-2)),
         Verdict.UNDECIDED, "x-nvidia-cert-ocsp-status", "not-checked"),
        (nf.OcspBehaviour(this_update=dt.timedelta(hours=2)), Verdict.UNDECIDED,
         "x-nvidia-cert-ocsp-status", "not-checked"),
        (nf.OcspBehaviour(http_status=500), Verdict.UNDECIDED, "x-nvidia-cert-ocsp-status", "not-checked"),
        (nf.OcspBehaviour(body="garbage"), Verdict.UNDECIDED, "x-nvidia-cert-ocsp-status", "not-checked"),
    ],
)  # fmt: skip
def test_ocsp_fault_matrix_through_the_verifier(
    world: World, behaviour: nf.OcspBehaviour, verdict: Verdict, claim_key: str, claim_value: object
) -> None:
    world.ocsp.behaviour = behaviour
    result = run(world)
    assert result.verdict is verdict, result.reasons
    assert chain_claim(result, "device")[claim_key] == claim_value


def test_nonce_mismatch_allowed_by_policy_for_caching_proxies(world: World) -> None:
    world.ocsp.behaviour = nf.OcspBehaviour(nonce="omit")
    relaxed = parse_policy({"ocsp": {"allow_nonce_mismatch": True}})
    assert run(world, relaxed).verdict is Verdict.TRUSTED
    assert run(world, ocsp_nonce=False).verdict is Verdict.TRUSTED


def test_unreachable_responder_is_undecided_never_0_or_1(world: World) -> None:
    world.ocsp_url = f"http://127.0.0.1:{nf.free_port()}"
    result = run(world)
    assert result.verdict is Verdict.UNDECIDED and verdict_exit_code(result.verdict) == 3


@pytest.mark.parametrize(
    "mode", ["404", "500", "wrong-id", "wrong-sha", "non-json", "bad-base64", "loop"]
)
def test_rim_service_faults_are_exit_3(world: World, mode: str) -> None:
    world.rims.modes[nf.VBIOS_RIM_ID] = mode
    result = run(world)
    assert result.verdict is Verdict.UNDECIDED and verdict_exit_code(result.verdict) == 3
    assert result.gpus[0].claims["measres"] == "not-run"


# --- the real samples through a loopback RIM service, by the CLI ---------------------


@pytest.fixture
def sample_rim_service() -> Iterator[tuple[nf.RimService, str]]:
    service = nf.RimService.with_samples()
    with nf.serve(service) as server:
        yield service, server.url


@pytest.fixture
def ocsp_optional(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text("ocsp:\n  require: false\n")
    return path


def cli_args(url: str, policy: Path, *extra: str) -> list[str]:
    return [
        "attest", "--evidence", str(SET_A_REPORT), "--cert-chain", str(SET_A_CHAIN),
        "--nonce", SET_A_NONCE, "--rim-url", url, "--ocsp-url", f"http://127.0.0.1:{nf.free_port()}",
        "--no-cache", "--policy", str(policy), "--timeout", "2", *extra,
    ]  # fmt: skip


def test_real_samples_via_loopback_service_match_files(
    sample_rim_service: tuple[nf.RimService, str], ocsp_optional: Path
) -> None:
    _, url = sample_rim_service
    via_service = gpucc(
        *cli_args(url, ocsp_optional, "--at", "2024-01-01T00:00:00Z", "--format", "json")
    )
    no_traceback(via_service)
    files = gpucc(
        "attest", "--evidence", str(SET_A_REPORT), "--cert-chain", str(SET_A_CHAIN),
        "--nonce", SET_A_NONCE, "--driver-rim", str(SET_A_DRIVER_RIM), "--vbios-rim",
        str(SET_A_VBIOS_RIM), "--offline", "--policy", str(ocsp_optional),
        "--at", "2024-01-01T00:00:00Z", "--format", "json",
    )  # fmt: skip
    assert via_service.returncode == files.returncode == 0, via_service.stderr
    a, b = json.loads(via_service.stdout), json.loads(files.stdout)
    assert a["verdict"] == b["verdict"] == "trusted"
    assert a["gpus"][0]["claims"]["measres"] == b["gpus"][0]["claims"]["measres"]
    now = gpucc(*cli_args(url, ocsp_optional))
    assert now.returncode == 1 and "HCC RIM L4 Signer" in now.stdout


def test_prod_rim_from_service_is_a_mismatch(
    sample_rim_service: tuple[nf.RimService, str], ocsp_optional: Path
) -> None:
    service, url = sample_rim_service
    service.rims[nf.VBIOS_RIM_ID] = SET_A_PROD_VBIOS_RIM.read_bytes()
    proc = gpucc(*cli_args(url, ocsp_optional, "--at", "2024-01-01T00:00:00Z", "--format", "json"))
    assert proc.returncode == 1
    assert sorted(m["index"] for m in json.loads(proc.stdout)["gpus"][0]["mismatches"]) == [
        1,
        2,
        3,
        9,
    ]


@pytest.mark.parametrize("mode", ["404", "500", "slow", "oversized"])
def test_cli_rim_faults_exit_3_with_the_rim_id(
    sample_rim_service: tuple[nf.RimService, str], ocsp_optional: Path, mode: str
) -> None:
    service, url = sample_rim_service
    service.modes[nf.DRIVER_RIM_ID] = mode
    service.slow_delay = 3.0
    proc = gpucc(*cli_args(url, ocsp_optional, "--at", "2024-01-01T00:00:00Z"))
    no_traceback(proc)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "NV_GPU_DRIVER_GH100_545.00" in proc.stdout


def test_bundle_made_online_verifies_offline(
    sample_rim_service: tuple[nf.RimService, str], ocsp_optional: Path, tmp_path: Path
) -> None:
    _, url = sample_rim_service
    evidence = tmp_path / "evidence.json"
    from gpucc.gpuattest.evidence import dump_evidence_json, load_raw_evidence

    evidence.write_bytes(dump_evidence_json(load_raw_evidence(SET_A_REPORT, SET_A_CHAIN)))
    bundle = tmp_path / "bundle.json"
    fetch = gpucc(
        "collateral", "fetch", "--evidence", str(evidence), "-o", str(bundle), "--rim-url", url,
        "--ocsp-url", f"http://127.0.0.1:{nf.free_port()}", "--no-cache", "--timeout", "2",
    )  # fmt: skip
    no_traceback(fetch)
    assert bundle.exists()  # RIMs fetched; NVIDIA's real OCSP is unreachable here (exit 3)
    assert fetch.returncode == 3
    offline = gpucc(
        "attest", "--evidence", str(evidence), "--nonce", SET_A_NONCE, "--collateral", str(bundle),
        "--offline", "--policy", str(ocsp_optional), "--at", "2024-01-01T00:00:00Z",
    )  # fmt: skip
    no_traceback(offline)
    assert offline.returncode == 0, offline.stdout + offline.stderr


def test_debug_log_shows_each_request_cache_decisions_and_sources(
    sample_rim_service: tuple[nf.RimService, str], ocsp_optional: Path, tmp_path: Path
) -> None:
    """-vv (and GPUCC_LOG_LEVEL=debug) says what went over the network (URL without its
    credentials, status, bytes, time, retries), what the cache held and where each RIM came
    from; the second run is served from the cache."""
    _, url = sample_rim_service
    with_user = url.replace("http://", "http://user:hunter2@")
    cache = {"GPUCC_CACHE_DIR": str(tmp_path / "cache")}
    args = cli_args(with_user, ocsp_optional, "--at", "2024-01-01T00:00:00Z")
    args.remove("--no-cache")
    first = gpucc(*args, "-vv", env=cache)
    assert first.returncode == 0, first.stderr
    err = first.stderr
    assert "hunter2" not in err
    assert f"cache miss: rim {nf.DRIVER_RIM_ID}" in err
    requests = [line for line in err.splitlines() if line.startswith("gpucc: DEBUG: GET http")]
    assert len(requests) == 2, err
    for line in requests:
        assert "user:" not in line and "HTTP 200, " in line and " bytes in " in line, line
        assert line.endswith(", 0 retries"), line
    assert f"RIM {nf.DRIVER_RIM_ID}: from " in err
    second = gpucc(*args, env=cache | {"GPUCC_LOG_LEVEL": "debug"})
    assert second.returncode == 0, second.stderr
    assert f"cache hit: rim {nf.DRIVER_RIM_ID}" in second.stderr
    assert "GET http" not in second.stderr  # nothing fetched the second time


def test_offline_debug_log_says_a_missing_entry_is_not_fetched(tmp_path: Path) -> None:
    """-vv with --offline: what the cache lacks is said to stay missing, never a miss that
    reads as if a fetch followed."""
    cache = {"GPUCC_CACHE_DIR": str(tmp_path / "cache")}
    done = gpucc(
        "attest", "--sample", "--offline", "--at", "2024-01-01T00:00:00Z", "-vv", env=cache
    )
    assert done.returncode in (0, 3), done.stderr
    assert "(offline: not fetched)" in done.stderr, done.stderr
    assert "cache miss" not in done.stderr
