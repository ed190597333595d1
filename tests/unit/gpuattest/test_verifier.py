"""The verification outline on NVIDIA's real samples and on generated mutations."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gpucc.assembly import PlatformResult
from gpucc.cli.render import attest_document, verdict_exit_code
from gpucc.core.errors import (
    MalformedCertificateError,
    MalformedPolicyError,
    MalformedReportError,
)
from gpucc.gpuattest.collateral import FileRimSource, NoOcsp, NoRimSource, rim_sources_from_mapping
from gpucc.gpuattest.evidence import EvidenceSet, GpuEvidence, load_raw_evidence
from gpucc.gpuattest.policy import Policy, parse_policy
from gpucc.gpuattest.result import AttestationResult, CheckStatus, Decision, Verdict
from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.gpuattest.trust import TrustRoots
from gpucc.gpuattest.verifier import verify
from tests.support.samples import (
    HEAD_CHAIN,
    HEAD_NONCE,
    HEAD_REPORT,
    IN_WINDOW,
    SET_A_CHAIN,
    SET_A_DRIVER_RIM,
    SET_A_NONCE,
    SET_A_PROD_VBIOS_RIM,
    SET_A_REPORT,
    SET_A_VBIOS_RIM,
    report_bytes,
)

ROOTS = TrustRoots.nvidia()
NO_OCSP_REQUIRED = parse_policy({"ocsp": {"require": False}})
NOW = dt.datetime.now(dt.UTC)


def set_a(report: bytes | None = None, chain: bytes | None = None) -> EvidenceSet:
    return EvidenceSet(
        gpus=(
            GpuEvidence(
                report=report if report is not None else report_bytes(SET_A_REPORT),
                cert_chain_pem=chain if chain is not None else SET_A_CHAIN.read_bytes(),
            ),
        )
    )


def run_set_a(
    *,
    evidence: EvidenceSet | None = None,
    nonce: str | None = SET_A_NONCE,
    now: dt.datetime = IN_WINDOW,
    vbios_rim: Path = SET_A_VBIOS_RIM,
    policy: Policy = NO_OCSP_REQUIRED,
) -> AttestationResult:
    return verify(
        evidence or set_a(),
        expected_nonce=bytes.fromhex(nonce) if nonce else None,
        roots=ROOTS,
        now=now,
        rims=FileRimSource(SET_A_DRIVER_RIM, vbios_rim),
        ocsp=NoOcsp(),
        policy=policy,
    )


def failed(result: AttestationResult) -> set[str]:
    return {c.id for c in result.gpus[0].checks if c.status is CheckStatus.FAIL}


def test_set_a_is_trusted_as_of_2024_with_unchecked_ocsp_accepted() -> None:
    result = run_set_a()
    assert result.verdict is Verdict.TRUSTED and verdict_exit_code(result.verdict) == 0
    gpu = result.gpus[0]
    assert gpu.check("fwid").status is CheckStatus.NOT_PRESENT
    assert gpu.check("device-ocsp").status is CheckStatus.NOT_CHECKED
    assert gpu.check("device-ocsp").decision is Decision.ACCEPT
    claims = gpu.claims
    assert claims["measres"] == "success"
    assert claims["hwmodel"] == "GH100 A01 GSP BROM"
    assert claims["ueid"] == "460032006552296075780760406069494258829212062021"
    assert claims["x-nvidia-gpu-driver-rim-signature-verified"] is True
    assert claims["x-nvidia-gpu-attestation-report-cert-chain"]["x-nvidia-cert-status"] == "valid"


def test_set_a_as_of_now_is_not_trusted_naming_expired_rim_signers() -> None:
    result = run_set_a(now=NOW)
    assert result.verdict is Verdict.NOT_TRUSTED and verdict_exit_code(result.verdict) == 1
    assert failed(result) == {"driver-rim-chain", "vbios-rim-chain"}
    joined = " ".join(result.reasons)
    assert "HCC RIM L4 Signer" in joined and "expired" in joined


def test_default_policy_refuses_unchecked_ocsp_as_undecided() -> None:
    result = run_set_a(policy=Policy())
    assert result.verdict is Verdict.UNDECIDED and verdict_exit_code(result.verdict) == 3


def test_expired_signer_grace_policy() -> None:
    # On 2026-01-01 only the L4 signers had expired (L3 "GH100 001" lasted to 2026-11-11).
    early_2026 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    grace = parse_policy({"ocsp": {"require": False}, "rim": {"expired_signer_grace_days": 365}})
    assert run_set_a(now=early_2026, policy=grace).verdict is Verdict.TRUSTED
    short = parse_policy({"ocsp": {"require": False}, "rim": {"expired_signer_grace_days": 30}})
    assert run_set_a(now=early_2026, policy=short).verdict is Verdict.NOT_TRUSTED
    # The grace covers the signer only: once the L3 CA has expired too, it no longer helps.
    wide = parse_policy({"ocsp": {"require": False}, "rim": {"expired_signer_grace_days": 3650}})
    before_l3 = dt.datetime(2026, 11, 10, tzinfo=dt.UTC)
    assert run_set_a(now=before_l3, policy=wide).verdict is Verdict.TRUSTED
    after_l3 = dt.datetime(2026, 11, 12, tzinfo=dt.UTC)
    assert run_set_a(now=after_l3, policy=wide).verdict is Verdict.NOT_TRUSTED


def test_prod_vbios_rim_gives_mismatch_at_exactly_1_2_3_9() -> None:
    result = run_set_a(vbios_rim=SET_A_PROD_VBIOS_RIM)
    assert result.verdict is Verdict.NOT_TRUSTED
    assert failed(result) == {"measurements"}
    meas = result.gpus[0].measurements
    assert meas is not None
    assert sorted(m.index for m in meas.mismatches) == [1, 2, 3, 9]
    assert {m.source for m in meas.mismatches} == {"vbios"}
    tolerant = parse_policy(
        {"ocsp": {"require": False}, "measurements": {"allow_mismatch": [1, 2, 3, 9]}}
    )
    assert run_set_a(vbios_rim=SET_A_PROD_VBIOS_RIM, policy=tolerant).trusted


def test_head_sample_without_rims_is_undecided_never_mismatch() -> None:
    result = verify(
        load_raw_evidence(HEAD_REPORT, HEAD_CHAIN),
        expected_nonce=bytes.fromhex(HEAD_NONCE),
        roots=ROOTS,
        now=NOW,
        rims=NoRimSource(),
        ocsp=NoOcsp(),
    )
    assert result.verdict is Verdict.UNDECIDED and verdict_exit_code(result.verdict) == 3
    gpu = result.gpus[0]
    for check_id in ("device-chain", "fwid", "report-signature", "nonce"):
        assert gpu.check(check_id).status is CheckStatus.PASS, check_id
    assert gpu.check("measurements").status is CheckStatus.NOT_CHECKED
    assert gpu.claims["measres"] == "not-run"
    assert "NV_GPU_DRIVER_GH100_550.90.07" in " ".join(gpu.reasons)


def test_wrong_nonce_fails_and_missing_nonce_is_refused() -> None:
    assert failed(run_set_a(nonce="00" * 32)) == {"nonce"}
    result = run_set_a(nonce=None)
    assert result.verdict is Verdict.NOT_TRUSTED
    assert result.gpus[0].check("nonce").status is CheckStatus.NOT_CHECKED
    relaxed = parse_policy({"ocsp": {"require": False}, "nonce": {"require": False}})
    assert run_set_a(nonce=None, policy=relaxed).trusted


@pytest.mark.parametrize("seed", range(6))
def test_flipped_bit_in_signed_part_fails_signature(seed: int) -> None:
    data = bytearray(report_bytes(SET_A_REPORT))
    rng = int.from_bytes(os.urandom(4), "big") + seed
    # Flip a bit in a measurement value or nonce, where the layout stays parseable.
    offsets = [4 + rng % 32, 52 + (rng % 64) * 55 + (rng % 48)]
    pos = offsets[seed % 2]
    data[pos] ^= 1 << (rng % 8)
    result = run_set_a(evidence=set_a(bytes(data)))
    assert "report-signature" in failed(result)
    assert result.verdict is Verdict.NOT_TRUSTED


def test_flipped_bit_in_signature_fails_signature() -> None:
    data = bytearray(report_bytes(SET_A_REPORT))
    data[-5] ^= 0x10
    assert failed(run_set_a(evidence=set_a(bytes(data)))) == {"report-signature"}


def _pem(certs: list[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def test_chain_with_missing_wrong_order_or_foreign_root_fails() -> None:
    certs = x509.load_pem_x509_certificates(SET_A_CHAIN.read_bytes())
    missing = [certs[0], certs[1], certs[3], certs[4]]
    swapped = [certs[0], certs[2], certs[1], certs[3], certs[4]]
    foreign = SimulatedGpu.create(now=IN_WINDOW).device_pki.root
    for chain in (missing, swapped, [*certs[:4], foreign]):
        result = run_set_a(evidence=set_a(chain=_pem(chain)))
        assert "device-chain" in failed(result)
        assert result.verdict is Verdict.NOT_TRUSTED


def test_garbage_chain_is_malformed() -> None:
    with pytest.raises(MalformedCertificateError):
        run_set_a(
            evidence=set_a(chain=b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
        )


def test_truncated_report_is_malformed_input() -> None:
    with pytest.raises(MalformedReportError):
        run_set_a(evidence=set_a(report_bytes(SET_A_REPORT)[:-10]))


def test_other_gpu_chain_fails_signature_and_fwid() -> None:
    # The 550.90.07 chain is valid but belongs to another GPU: set A's report does not verify.
    result = run_set_a(evidence=set_a(chain=HEAD_CHAIN.read_bytes()))
    assert "report-signature" in failed(result)


# --- simulated GPUs: paths the real samples cannot reach -------------------------------


def sim_verify(
    gpus: list[SimulatedGpu], nonce: bytes, evidence: EvidenceSet | None = None
) -> AttestationResult:
    rims: dict[str, bytes] = {}
    for g in gpus:
        rims.update(g.rims)
    ev = evidence or EvidenceSet(gpus=tuple(g.gpu_evidence(nonce) for g in gpus))
    return verify(
        ev,
        expected_nonce=nonce,
        roots=gpus[0].roots,
        now=NOW,
        rims=rim_sources_from_mapping(rims),
        ocsp=NoOcsp(),
        policy=NO_OCSP_REQUIRED,
    )


def test_simulated_gpu_is_trusted_under_its_own_roots_only() -> None:
    gpu = SimulatedGpu.create(now=NOW)
    nonce = os.urandom(32)
    assert sim_verify([gpu], nonce).trusted
    under_nvidia = verify(
        gpu.evidence(nonce),
        expected_nonce=nonce,
        roots=ROOTS,
        now=NOW,
        rims=rim_sources_from_mapping(gpu.rims),
        ocsp=NoOcsp(),
        policy=NO_OCSP_REQUIRED,
    )
    assert under_nvidia.verdict is Verdict.NOT_TRUSTED
    assert {"device-chain", "driver-rim-chain", "vbios-rim-chain"} <= failed(under_nvidia)


def test_fwid_mismatch_fails() -> None:
    gpu = SimulatedGpu.create(now=NOW)
    nonce = os.urandom(32)
    fields = [(t, os.urandom(48) if t == 20 else v) for t, v in gpu.opaque_fields()]
    ev = EvidenceSet(gpus=(gpu.gpu_evidence(nonce, opaque=fields),))
    assert failed(sim_verify([gpu], nonce, ev)) == {"fwid"}


def test_multi_gpu_trusted_only_if_all_are() -> None:
    a = SimulatedGpu.create(now=NOW)
    # A second GPU of the same simulated PKI and firmware, reporting one altered block.
    b = SimulatedGpu(device_pki=a.device_pki, rim_pki=a.rim_pki, golden=a.golden, fwid=a.fwid)
    nonce = os.urandom(32)
    mixed = EvidenceSet(
        gpus=(a.gpu_evidence(nonce), b.gpu_evidence(nonce, measurements={3: os.urandom(48)}))
    )
    result = sim_verify([a], nonce, mixed)
    assert [g.verdict for g in result.gpus] == [Verdict.TRUSTED, Verdict.NOT_TRUSTED]
    assert result.verdict is Verdict.NOT_TRUSTED
    meas = result.gpus[1].measurements
    assert meas is not None and [m.index for m in meas.mismatches] == [2]  # block 3 = index 2
    assert all(r.startswith("GPU 1:") for r in result.reasons)
    both = EvidenceSet(gpus=(a.gpu_evidence(nonce), b.gpu_evidence(nonce)))
    assert sim_verify([a], nonce, both).trusted


def test_nvml_evidence_with_devtools_on_is_refused() -> None:
    from gpucc.gpuattest.evidence import CcState

    gpu = SimulatedGpu.create(now=NOW)
    nonce = os.urandom(32)
    base = gpu.evidence(nonce)
    ev = EvidenceSet(gpus=base.gpus, source="nvml", cc=CcState(True, True, 0))
    assert failed(sim_verify([gpu], nonce, ev)) == {"devtools"}
    ok = EvidenceSet(gpus=base.gpus, source="nvml", cc=CcState(True, False, 0))
    assert sim_verify([gpu], nonce, ok).trusted


def test_min_driver_policy() -> None:
    strict = parse_policy({"ocsp": {"require": False}, "versions": {"min_driver": "550.0"}})
    assert failed(run_set_a(policy=strict)) == {"versions-policy"}
    allowed = parse_policy(
        {"ocsp": {"require": False}, "versions": {"allowed_vbios": ["96.00.5e.00.01"]}}
    )
    assert run_set_a(policy=allowed).trusted


def test_json_document_shape() -> None:
    doc = attest_document(PlatformResult.of_gpus(run_set_a()))
    assert doc["schema"] == "gpucc.attest/v1"
    assert doc["verdict"] == "trusted" and doc["exit_code"] == 0
    gpu = doc["gpus"][0]
    assert set(gpu) >= {"claims", "checks", "mismatches", "evidence_sha256", "rim_ids", "verdict"}
    assert gpu["rim_ids"]["vbios"] == "NV_GPU_VBIOS_1010_0200_882_96005E0001"


SET_A_UEID = "460032006552296075780760406069494258829212062021"


def test_a_policy_pinning_devices_admits_the_pinned_gpu_and_names_any_other() -> None:
    unpinned = run_set_a().gpus[0].check("device-identity")
    assert unpinned.status is CheckStatus.NOT_PRESENT and unpinned.decision is Decision.ACCEPT
    assert "not pinned" in unpinned.reason
    as_hex = hex(int(SET_A_UEID))
    for pins in ([SET_A_UEID], [as_hex.upper().replace("0X", "0x"), "7"]):
        policy = parse_policy({"ocsp": {"require": False}, "devices": {"allowed": pins}})
        result = run_set_a(policy=policy)
        assert result.verdict is Verdict.TRUSTED, result.reasons
        assert result.gpus[0].check("device-identity").status is CheckStatus.PASS
        assert policy.to_dict()["devices"]["allowed"] == sorted(
            str(int(p, 16) if p.lower().startswith("0x") else int(p)) for p in pins
        )
    other = parse_policy({"ocsp": {"require": False}, "devices": {"allowed": ["7", "8"]}})
    result = run_set_a(policy=other)
    assert result.verdict is Verdict.NOT_TRUSTED and failed(result) == {"device-identity"}
    assert f"GPU {SET_A_UEID} (leaf certificate serial) is not in the policy's devices.allowed" in (
        " ".join(result.reasons)
    )


@pytest.mark.parametrize("pins", [["GPU-1"], [""], [7], ["-1"], ["0xZZ"]])
def test_device_pins_are_serial_numbers(pins: list[object]) -> None:
    with pytest.raises(MalformedPolicyError, match="devices.allowed"):
        parse_policy({"devices": {"allowed": pins}})
