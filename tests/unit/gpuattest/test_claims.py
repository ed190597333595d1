"""NVIDIA-compatible claims: names, shapes and derivations, on real samples and simulated
GPUs."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpucc.assembly import PlatformResult
from gpucc.cli.render import attest_document
from gpucc.gpuattest.collateral import FileRimSource, NoOcsp, NoRimSource, rim_sources_from_mapping
from gpucc.gpuattest.evidence import CcState, EvidenceSet, load_raw_evidence
from gpucc.gpuattest.policy import Policy, parse_policy
from gpucc.gpuattest.result import AttestationResult, GpuResult
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
)

ROOTS = TrustRoots.nvidia()
NO_OCSP = parse_policy({"ocsp": {"require": False}})
NOW = dt.datetime.now(dt.UTC)
NVAT_RECORD_KEYS = {
    "index",
    "goldenValue",
    "goldenSize",
    "runtimeValue",
    "runtimeSize",
    "measurementSource",
}


def set_a(vbios: Path = SET_A_VBIOS_RIM, policy: Policy = NO_OCSP) -> AttestationResult:
    return verify(
        load_raw_evidence(SET_A_REPORT, SET_A_CHAIN),
        expected_nonce=bytes.fromhex(SET_A_NONCE),
        roots=ROOTS,
        now=IN_WINDOW,
        rims=FileRimSource(SET_A_DRIVER_RIM, vbios),
        ocsp=NoOcsp(),
        policy=policy,
    )


def gpu_doc(result: AttestationResult) -> dict[str, object]:
    doc = json.loads(json.dumps(attest_document(PlatformResult.of_gpus(result))))
    gpu: dict[str, object] = doc["gpus"][0]
    return gpu


def test_trusted_sample_claims() -> None:
    result = set_a()
    doc = attest_document(PlatformResult.of_gpus(result))
    assert doc["x-nvidia-ver"] == "3.0"
    assert doc["x-nvidia-overall-att-result"] is True
    gpu = result.gpus[0]
    assert gpu.claims["x-nvidia-device-type"] == "gpu"
    assert gpu.claims["x-nvidia-gpu-claims-version"] == "3.0"
    assert gpu.claims["measres"] == "success"
    assert gpu.claims["secboot"] is True and gpu.claims["dbgstat"] == "disabled"
    assert "derived from the measurement comparison" in gpu.claim_notes["secboot"]
    assert gpu.claims["x-nvidia-mismatch-measurement-records"] == []
    # Set A has neither FEATURE_FLAG nor PROTECTED_PCIE_STATUS: no mode, and a reason.
    assert "x-nvidia-gpu-mode" not in gpu.claims
    assert "FEATURE_FLAG" in gpu.claim_notes["x-nvidia-gpu-mode"]


def test_prod_vbios_mismatch_records_use_nvat_names() -> None:
    result = set_a(vbios=SET_A_PROD_VBIOS_RIM)
    gpu = result.gpus[0]
    meas = gpu.measurements
    assert meas is not None
    records = gpu.claims["x-nvidia-mismatch-measurement-records"]
    assert [r["index"] for r in records] == [1, 2, 3, 9]
    for record, m in zip(records, meas.mismatches, strict=True):
        assert NVAT_RECORD_KEYS <= set(record)
        assert record["measurementSource"] == "Firmware"
        assert record["goldenValue"] == m.golden_values[0]
        assert record["goldenValues"] == list(m.golden_values)
        assert record["goldenSize"] == record["runtimeSize"] == 48
        assert isinstance(record["runtimeValue"], str) and len(record["runtimeValue"]) == 96
        assert record["runtimeValue"] != record["goldenValue"]
        assert record["spdmIndex"] == record["index"] + 1
        assert record["reason"] == "value"
        assert not any("_" in key for key in record)  # one shape, no snake_case aliases
    doc = gpu_doc(result)
    assert doc["mismatches"] == records
    assert gpu.claims["measres"] == "fail"
    assert gpu.claims["secboot"] is None and gpu.claims["dbgstat"] is None
    assert "failed" in gpu.claim_notes["secboot"] and "1 (vbios)" in gpu.claim_notes["dbgstat"]


def test_mismatch_tolerated_by_policy_never_yields_secboot() -> None:
    tolerant = parse_policy(
        {"ocsp": {"require": False}, "measurements": {"allow_mismatch": [1, 2, 3, 9]}}
    )
    result = set_a(vbios=SET_A_PROD_VBIOS_RIM, policy=tolerant)
    assert result.trusted
    gpu = result.gpus[0]
    assert gpu.claims["secboot"] is None and gpu.claims["dbgstat"] is None
    assert gpu.claim_notes["secboot"].startswith("not derived")


def test_head_sample_without_rims_reports_claims_not_derived() -> None:
    result = verify(
        load_raw_evidence(HEAD_REPORT, HEAD_CHAIN),
        expected_nonce=bytes.fromhex(HEAD_NONCE),
        roots=ROOTS,
        now=NOW,
        rims=NoRimSource(),
        ocsp=NoOcsp(),
    )
    gpu = result.gpus[0]
    assert gpu.claims["measres"] == "not-run"
    assert gpu.claims["secboot"] is None and gpu.claims["dbgstat"] is None
    assert "not run" in gpu.claim_notes["secboot"]
    # The HEAD report says PROTECTED_PCIE_STATUS = 0x55 but has no FEATURE_FLAG.
    assert "x-nvidia-gpu-mode" not in gpu.claims
    assert "PROTECTED_PCIE_STATUS" in gpu.claim_notes["x-nvidia-gpu-mode"]
    doc = gpu_doc(result)
    assert doc["claim_notes"] == gpu.claim_notes


def simulated(opaque: dict[int, bytes], cc: CcState | None = None) -> GpuResult:
    sim = SimulatedGpu.create(now=NOW)
    nonce = os.urandom(32)
    fields = [(t, opaque.get(t, v)) for t, v in sim.opaque_fields()]
    fields += [(t, v) for t, v in opaque.items() if t not in dict(sim.opaque_fields())]
    ev = EvidenceSet(
        gpus=(sim.gpu_evidence(nonce, opaque=fields),),
        source="nvml" if cc else "file",
        cc=cc,
    )
    result = verify(
        ev,
        expected_nonce=nonce,
        roots=sim.roots,
        now=NOW,
        rims=rim_sources_from_mapping(sim.rims),
        ocsp=NoOcsp(),
        policy=NO_OCSP,
    )
    assert result.trusted, result.reasons
    return result.gpus[0]


@pytest.mark.parametrize(("flag", "mode"), [(0, "spt"), (1, "mpt"), (2, "ppcie")])
def test_gpu_mode_from_the_feature_flag(flag: int, mode: str) -> None:
    gpu = simulated({34: b"\x01\x00", 36: flag.to_bytes(2, "little")})
    assert gpu.claims["x-nvidia-gpu-mode"] == mode
    assert "FEATURE_FLAG" in gpu.claim_notes["x-nvidia-gpu-mode"]
    assert gpu.claims["secboot"] is True


def test_unknown_feature_flag_gives_no_mode() -> None:
    gpu = simulated({36: (7).to_bytes(2, "little")})
    assert "x-nvidia-gpu-mode" not in gpu.claims
    assert "7" in gpu.claim_notes["x-nvidia-gpu-mode"]


def test_gpu_mode_ppcie_from_protected_pcie_status_or_nvml() -> None:
    assert simulated({21: b"\xaa"}).claims["x-nvidia-gpu-mode"] == "ppcie"
    gpu = simulated({}, cc=CcState(True, False, 1))
    assert gpu.claims["x-nvidia-gpu-mode"] == "ppcie"
    assert "NVML" in gpu.claim_notes["x-nvidia-gpu-mode"]
    assert "x-nvidia-gpu-mode" not in simulated({}, cc=CcState(True, False, 0)).claims


def test_cli_json_mismatch_records() -> None:
    gpucc = shutil.which("gpucc", path=str(Path(sys.executable).parent)) or "gpucc"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCC_", "NVAT_", "NV_"))}
    proc = subprocess.run(
        [
            gpucc,
            "attest",
            "--evidence",
            str(SET_A_REPORT),
            "--cert-chain",
            str(SET_A_CHAIN),
            "--nonce",
            SET_A_NONCE,
            "--driver-rim",
            str(SET_A_DRIVER_RIM),
            "--vbios-rim",
            str(SET_A_PROD_VBIOS_RIM),
            "--offline",
            "--at",
            "2024-01-01T00:00:00Z",
            "--format",
            "json",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["x-nvidia-ver"] == "3.0"
    claims = doc["gpus"][0]["claims"]
    records = claims["x-nvidia-mismatch-measurement-records"]
    assert [(r["index"], r["measurementSource"]) for r in records] == [
        (1, "Firmware"),
        (2, "Firmware"),
        (3, "Firmware"),
        (9, "Firmware"),
    ]
    assert claims["secboot"] is None and claims["x-nvidia-device-type"] == "gpu"
