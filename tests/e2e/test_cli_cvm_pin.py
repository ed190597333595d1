"""``gpucc cvm pin``: a trusted result's CVM measurements become the policy that admits it,
and only that CVM (real processes on the bundled SEV-SNP report)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.support.cli import gpucc
from tests.support.paths import DATA

SNP = DATA / "cloud-cvm" / "snp-vlek"
RD = (
    "819770b7e6ea6df8dd8fd4dd146b073c0bf4f3ce5b0977ecac486e3a05ed1bd5"
    "4e2a7ac1f5d1ca02e7d7d5ef9f73b8574fd9359e3a480d741a4478e8a7bc27ca"
)
ATTEST = (
    "attest", "--cvm-only", "--cvm-evidence", str(SNP / "report.bin"),
    "--cvm-collateral", str(SNP / "vlek.der"), "--at", "2025-06-01T00:00:00Z", "--offline",
    "--cvm-report-data", RD,
)  # fmt: skip


def test_pinned_policy_admits_the_cvm_without_relaxation(tmp_path: Path) -> None:
    first = gpucc(*ATTEST, "-f", "json")
    assert first.returncode == 0, first.stderr
    result = tmp_path / "result.json"
    result.write_text(first.stdout)
    policy = tmp_path / "policy.yaml"
    pinned = gpucc("cvm", "pin", str(result), "-o", str(policy))
    assert pinned.returncode == 0, pinned.stderr
    pins = yaml.safe_load(policy.read_text())["cvm"]["measurements"]["snp"]
    assert pins["measurement"] == json.loads(first.stdout)["cvm"]["claims"]["measurement"]
    again = gpucc(*ATTEST, "--policy", str(policy))
    assert again.returncode == 0, again.stderr
    assert "no policy relaxation used" in again.stderr
    # another measurement pinned: the same CVM is no longer admitted
    other = policy.read_text().replace(pins["measurement"], "ab" * 48)
    policy.write_text(other)
    refused = gpucc(*ATTEST, "--policy", str(policy))
    assert refused.returncode == 1, refused.stderr


def test_only_a_trusted_result_with_a_cvm_is_pinned(tmp_path: Path) -> None:
    untrusted = json.loads(gpucc(*ATTEST, "-f", "json").stdout)
    untrusted["trusted"] = False
    path = tmp_path / "r.json"
    path.write_text(json.dumps(untrusted))
    proc = gpucc("cvm", "pin", str(path))
    assert proc.returncode == 1 and "not a trusted result" in proc.stderr
    gpu_only = gpucc("attest", "--sample", "--at", "2024-01-01T00:00:00Z", "-f", "json")
    path.write_text(gpu_only.stdout)
    proc = gpucc("cvm", "pin", str(path))
    assert proc.returncode == 4 and "verified no CVM" in proc.stderr
