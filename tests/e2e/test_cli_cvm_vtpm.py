"""`gpucc attest --cvm-evidence` with Azure's real vTPM evidence, through real processes: the
verdicts and exit codes the documentation names, the claims shown, and malformed files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from jsonschema import Draft202012Validator

from gpucc.cli.schemas import load_schema
from tests.support.cli import run_cli
from tests.support.paths import DATA

SNP = DATA / "cloud-cvm" / "azure-snp-vtpm" / "evidence-v1.json"
TDX = DATA / "cloud-cvm" / "azure-tdx-vtpm" / "evidence-v1.json"
CHALLENGE = b"challenge".hex()
AT = "2026-01-01T00:00:00Z"


def attest(evidence: Path, *extra: str | Path) -> subprocess.CompletedProcess[str]:
    return run_cli("attest", "--cvm-only", "--cvm-evidence", evidence, "--at", AT, "--offline",
                   *extra)  # fmt: skip


def test_the_azure_snp_sample_is_trusted_and_its_claims_shown() -> None:
    proc = attest(SNP, "--cvm-report-data", CHALLENGE, "-f", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    Draft202012Validator(load_schema(doc["schema"])).validate(doc)
    vtpm = doc["cvm"]["claims"]["vtpm"]
    assert doc["trusted"] is True and doc["cvm"]["kind"] == "snp"
    assert vtpm["vm_configuration"]["console-enabled"] is True and len(vtpm["pcrs"]) == 24
    text = attest(SNP, "--cvm-report-data", CHALLENGE)
    assert text.returncode == 0 and "secure-boot" in text.stdout and "PCR0" in text.stdout


def test_another_nonce_exits_1() -> None:
    proc = attest(SNP, "--cvm-report-data", b"challengf".hex())
    assert proc.returncode == 1, proc.stderr
    assert "qualifying data" in proc.stdout


def test_a_policy_refusing_the_console_exits_1(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("cvm:\n  allow_console: false\n")
    proc = attest(SNP, "--cvm-report-data", CHALLENGE, "--policy", policy)
    assert proc.returncode == 1, proc.stderr
    assert "console" in proc.stdout


def test_the_azure_tdx_sample_is_undecided_offline() -> None:
    proc = attest(TDX, "--cvm-report-data", CHALLENGE)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "FMSPC 00806F050000" in proc.stdout.replace("\n", " ")


def test_malformed_vtpm_evidence_exits_4_with_one_line(tmp_path: Path) -> None:
    doc = json.loads(SNP.read_text())
    bad = tmp_path / "bad.json"
    for broken in ({**doc, "hcl_report": doc["hcl_report"][:-8]}, {**doc, "version": 9}):
        bad.write_text(json.dumps(broken))
        proc = attest(bad, "--cvm-report-data", CHALLENGE)
        assert proc.returncode == 4, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_report_data_longer_than_64_bytes_is_a_usage_error() -> None:
    proc = attest(SNP, "--cvm-report-data", "00" * 65)
    assert proc.returncode == 2 and "1 to 64 bytes" in proc.stderr


def test_help_says_what_the_report_data_is_for_vtpm_evidence() -> None:
    proc = run_cli("attest", "--help")
    assert "qualifying data" in " ".join(proc.stdout.split())


def test_short_report_data_for_a_raw_report_is_still_a_usage_error() -> None:
    proc = attest(DATA / "cpu-tee" / "snp" / "report.bin", "--cvm-report-data", CHALLENGE)
    assert proc.returncode == 2 and "64 bytes" in proc.stderr


def test_an_aws_vlek_report_with_its_vlek_through_the_cli() -> None:
    vlek = DATA / "cloud-cvm" / "snp-vlek"
    report_data = (vlek / "report.bin").read_bytes()[0x50:0x90].hex()

    def run(at: str) -> subprocess.CompletedProcess[str]:
        return run_cli("attest", "--cvm-only", "--cvm-evidence", vlek / "report.bin",
                       "--cvm-collateral", vlek / "vlek.der", "--cvm-report-data", report_data,
                       "--at", at, "--offline", "-f", "json")  # fmt: skip

    trusted = run("2025-06-01T00:00:00Z")
    assert trusted.returncode == 0, trusted.stderr
    assert json.loads(trusted.stdout)["cvm"]["claims"]["csp_id"] == "CN=cc-us-east-2.amazonaws.com"
    assert run("2026-11-01T00:00:00Z").returncode == 3
