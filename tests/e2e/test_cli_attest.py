"""`gpucc attest` run as a real process: exit codes, stdout/stderr, JSON shape."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import gpucc
from tests.support.paths import ROOT
from tests.support.samples import (
    HEAD_CHAIN,
    HEAD_NONCE,
    HEAD_REPORT,
    SET_A_CHAIN,
    SET_A_DRIVER_RIM,
    SET_A_NONCE,
    SET_A_PROD_VBIOS_RIM,
    SET_A_REPORT,
    SET_A_VBIOS_RIM,
    report_bytes,
)
from tests.support.spdm import spdm_measurement_blocks


def no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout


@pytest.fixture
def ocsp_optional(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text("ocsp:\n  require: false\n")
    return path


def set_a_args(policy: Path, vbios: Path = SET_A_VBIOS_RIM) -> list[str]:
    return [
        "attest",
        "--evidence", str(SET_A_REPORT),
        "--cert-chain", str(SET_A_CHAIN),
        "--nonce", SET_A_NONCE,
        "--driver-rim", str(SET_A_DRIVER_RIM),
        "--vbios-rim", str(vbios),
        "--policy", str(policy),
        "--offline",
    ]  # fmt: skip


def test_set_a_trusted_in_2024_json(ocsp_optional: Path) -> None:
    proc = gpucc(*set_a_args(ocsp_optional), "--at", "2024-01-01T00:00:00Z", "--format", "json")
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["verdict"] == "trusted" and doc["trusted"] is True
    assert doc["gpus"][0]["claims"]["measres"] == "success"
    assert doc["verified_at"] == "2024-01-01T00:00:00Z"


def test_set_a_now_not_trusted_text(ocsp_optional: Path) -> None:
    proc = gpucc(*set_a_args(ocsp_optional))
    no_traceback(proc)
    assert proc.returncode == 1
    assert "REFUSED: " in proc.stdout and "HCC RIM L4 Signer" in proc.stdout


def test_prod_vbios_mismatch_exit_1(ocsp_optional: Path) -> None:
    proc = gpucc(
        *set_a_args(ocsp_optional, SET_A_PROD_VBIOS_RIM), "--at", "1704067200", "--format", "json"
    )
    assert proc.returncode == 1
    mism = json.loads(proc.stdout)["gpus"][0]["mismatches"]
    assert sorted(m["index"] for m in mism) == [1, 2, 3, 9]


def test_head_sample_without_rims_exit_3() -> None:
    proc = gpucc(
        "attest", "--evidence", str(HEAD_REPORT), "--cert-chain", str(HEAD_CHAIN),
        "--nonce", HEAD_NONCE, "--offline", "--format", "json",
    )  # fmt: skip
    no_traceback(proc)
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["verdict"] == "undecided"
    checks = {c["id"]: c["status"] for c in doc["gpus"][0]["checks"]}
    assert checks["device-chain"] == checks["fwid"] == checks["report-signature"] == "pass"
    assert doc["gpus"][0]["claims"]["measres"] == "not-run"


def test_sample_flag_and_env_fallbacks() -> None:
    proc = gpucc("attest", "--sample", "--offline", env={"GPUCC_AT": "2024-01-01T00:00:00Z"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "TRUSTED" in proc.stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["attest", "--evidence", str(SET_A_REPORT)], 4, "not evidence JSON"),
        (["attest", "--sample", "--nonce", "xyz"], 2, "--nonce: a nonce is 64 hex"),
        (["attest", "--sample", "--at", "yesterday"], 2, "--at"),
        (["attest", "--bogus"], 2, "No such option"),
        (["attest", "--offline"], 5, "NVML"),
        (["evidence", "collect", "-o", "x.json"], 5, "NVML"),
    ],
)
def test_errors_are_one_line_with_documented_codes(
    args: list[str], code: int, message: str
) -> None:
    proc = gpucc(*args)
    no_traceback(proc)
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr
    assert proc.stdout == ""


def test_truncated_report_file_exit_4(tmp_path: Path, ocsp_optional: Path) -> None:
    bad = tmp_path / "r.hex"
    bad.write_text(SET_A_REPORT.read_text().strip()[:-40])
    args = set_a_args(ocsp_optional)
    args[2] = str(bad)
    proc = gpucc(*args)
    no_traceback(proc)
    assert proc.returncode == 4
    assert proc.stderr.startswith("gpucc: error:") and proc.stderr.count("\n") == 1


def test_malformed_policy_exit_4(tmp_path: Path) -> None:
    pol = tmp_path / "p.yaml"
    pol.write_text("ocsp:\n  requir: false\n")
    proc = gpucc("attest", "--sample", "--policy", str(pol))
    assert proc.returncode == 4 and "ocsp.requir" in proc.stderr


def test_demo_runs_every_step() -> None:
    proc = gpucc("demo", "--size-mib", "2", env={"COLUMNS": "80"})
    no_traceback(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert "TRUSTED" in out and "bytes identical: True" in out
    # Piped, no line is wrapped: `gpucc demo | grep TRUSTED` prints the whole verdict line.
    trusted = [line for line in proc.stdout.splitlines() if "TRUSTED" in line]
    assert len(trusted) == 1, proc.stdout
    assert trusted[0].startswith("1. attest") and trusted[0].endswith("exist for the sample)")
    assert "caught: chunk" in out and "failed authentication" in out


def test_a_piped_report_keeps_each_check_on_one_line() -> None:
    """Output to a pipe is not wrapped: a pipeline greps a check's whole row (its status
    and its reason), unless COLUMNS asks for a width."""
    args = ["attest", "--evidence", str(HEAD_REPORT), "--cert-chain", str(HEAD_CHAIN)]
    args += ["--nonce", HEAD_NONCE, "--offline"]
    proc = gpucc(*args)
    assert proc.returncode == 3, proc.stderr
    lines = proc.stdout.splitlines()
    rows = [line for line in lines if line.startswith("| Device certificate OCSP ")]
    assert len(rows) == 1, proc.stdout
    assert "not-checked (undecided)" in rows[0]
    assert "running offline: not contacting https://ocsp.ndis.nvidia.com" in rows[0]
    narrow = gpucc(*args, env={"COLUMNS": "80"})
    table = [line for line in narrow.stdout.splitlines() if line.startswith(("|", "+"))]
    assert table and max(len(line) for line in table) <= 80
    assert not any(
        line.startswith("| Device certificate OCSP ") for line in narrow.stdout.splitlines()
    )


SAMPLE_ARGS = ("attest", "--sample", "--offline", "--at", "2024-01-01T00:00:00Z")
MEASUREMENT_LINE = re.compile(r"^(unverified )?measurement \d")


def test_the_bundled_sample_reports_every_runtime_measurement_in_full() -> None:
    blocks = spdm_measurement_blocks(
        report_bytes(ROOT / "gpuattest/_samples/attestation-report.hex")
    )
    assert len(blocks) == 64
    proc = gpucc(*SAMPLE_ARGS, "-f", "json")
    assert proc.returncode == 0, proc.stderr
    gpu = json.loads(proc.stdout)["gpus"][0]
    assert gpu["runtime_measurements"] == [
        {"index": i, "value": blocks[i].hex()} for i in sorted(blocks)
    ]
    assert gpu["unverified_runtime_measurements"] == []
    text = gpucc(*SAMPLE_ARGS, "-v")  # piped: the plain writer
    assert text.returncode == 0, text.stderr
    shown = [line for line in text.stdout.splitlines() if MEASUREMENT_LINE.match(line)]
    assert shown == [f"measurement {i:<2}  {blocks[i].hex()}" for i in sorted(blocks)]
    quiet = gpucc(*SAMPLE_ARGS)
    assert not [line for line in quiet.stdout.splitlines() if MEASUREMENT_LINE.match(line)]


def test_a_report_with_a_bad_signature_reports_its_measurements_as_unverified(
    tmp_path: Path, ocsp_optional: Path
) -> None:
    data = bytearray(report_bytes(SET_A_REPORT))
    data[-5] ^= 0x10  # inside the signature
    bad = tmp_path / "r.hex"
    bad.write_text(data.hex())
    blocks = spdm_measurement_blocks(bytes(data))
    args = set_a_args(ocsp_optional)
    args[2] = str(bad)
    proc = gpucc(*args, "--at", "2024-01-01T00:00:00Z", "-f", "json")
    no_traceback(proc)
    assert proc.returncode == 1
    gpu = json.loads(proc.stdout)["gpus"][0]
    assert gpu["runtime_measurements"] == []
    assert gpu["unverified_runtime_measurements"] == [
        {"index": i, "value": blocks[i].hex()} for i in sorted(blocks)
    ]
    text = gpucc(*args, "--at", "2024-01-01T00:00:00Z", "-v")
    shown = [line for line in text.stdout.splitlines() if MEASUREMENT_LINE.match(line)]
    assert shown == [f"unverified measurement {i:<2}  {blocks[i].hex()}" for i in sorted(blocks)]
