"""nvattest habits accepted by ``gpucc attest``: flag names and NVAT_* variables."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from tests.support.cli import gpucc
from tests.support.samples import (
    SET_A_CHAIN,
    SET_A_DRIVER_RIM,
    SET_A_NONCE,
    SET_A_REPORT,
    SET_A_VBIOS_RIM,
    report_bytes,
)


def nvattest_evidence(tmp_path: Path) -> Path:
    """Set A written the way ``nvattest collect-evidence`` writes evidence files."""
    path = tmp_path / "evidence.json"
    entry = {
        "arch": "HOPPER",
        "nonce": SET_A_NONCE,
        "evidence": base64.b64encode(report_bytes(SET_A_REPORT)).decode(),
        "certificate": base64.b64encode(SET_A_CHAIN.read_bytes()).decode(),
    }
    path.write_text(json.dumps([entry]))
    return path


def test_gpu_evidence_file_is_an_alias_of_evidence(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("ocsp:\n  require: false\n")
    common = [
        "--nonce", SET_A_NONCE, "--driver-rim", str(SET_A_DRIVER_RIM),
        "--vbios-rim", str(SET_A_VBIOS_RIM), "--policy", str(policy),
        "--offline", "--at", "2024-01-01T00:00:00Z", "--format", "json",
    ]  # fmt: skip
    evidence = nvattest_evidence(tmp_path)
    alias = gpucc("attest", "--gpu-evidence-file", str(evidence), *common)
    plain = gpucc("attest", "--evidence", str(evidence), *common)
    assert alias.returncode == plain.returncode == 0, alias.stderr
    assert json.loads(alias.stdout) == json.loads(plain.stdout)
    assert json.loads(alias.stdout)["verdict"] == "trusted"


def test_attest_help_names_the_alias() -> None:
    proc = gpucc("attest", "--help", env={"COLUMNS": "200"})
    assert proc.returncode == 0
    assert "--gpu-evidence-file" in proc.stdout


def test_nvat_service_url_variables_are_used() -> None:
    """NVAT_RIM_SERVICE_BASE_URL and NVAT_OCSP_BASE_URL name the services as --rim-url
    and --ocsp-url do: the (refused) requests go to them."""
    closed = "http://127.0.0.1:9"
    proc = gpucc(
        "attest", "--evidence", str(SET_A_REPORT), "--cert-chain", str(SET_A_CHAIN),
        "--nonce", SET_A_NONCE, "--at", "2024-01-01T00:00:00Z", "--format", "json",
        "--no-cache", "--timeout", "2",
        env={"NVAT_RIM_SERVICE_BASE_URL": closed, "NVAT_OCSP_BASE_URL": closed},
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    reasons = json.loads(proc.stdout)["reasons"]
    assert any(f"{closed}/v1/rim/NV_GPU_DRIVER_GH100_545.00" in r for r in reasons)
    assert any("OCSP" in r and closed in r for r in reasons), reasons
