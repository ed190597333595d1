"""`gpucc attest --cvm-evidence` as a real process: the Intel-signed TDX sample, composite
verdicts with the GPU sample, and the bad-input matrix with its exit codes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from gpucc.cli.schemas import load_schema
from tests.support.cli import run_cli
from tests.support.paths import DATA
from tests.support.samples import (
    SET_A_CHAIN,
    SET_A_DRIVER_RIM,
    SET_A_NONCE,
    SET_A_REPORT,
    SET_A_VBIOS_RIM,
)

TDX = DATA / "cpu-tee" / "tdx"
QUOTE = TDX / "quote.bin"
COLLATERAL = TDX / "collateral.json"
AT = "2025-06-19T11:16:03Z"
REPORT_DATA = (
    "9a9d48e7f6799642d3d1b34e1e5e1742d4bb02dd6ddd551862c1211d35c304f9"
    "eca3efdbb481601c163cf52493d6e44aed55d51ec39b7e518fadb92c2b523f20"
)
MRTD = (
    "91eb2b44d141d4ece09f0c75c2c53d247a3c68edd7fafe8a3520c942a604a407"
    "de03ae6dc5f87f27428b2538873118b7"
)


def cvm(*extra: str | Path, quote: Path = QUOTE) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "attest", "--cvm-only", "--cvm-evidence", quote, "--cvm-collateral", COLLATERAL, *extra
    )


def json_doc(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    doc = json.loads(proc.stdout)
    assert isinstance(doc, dict)
    Draft202012Validator(load_schema(str(doc["schema"]))).validate(doc)
    return doc


def one_error_line(proc: subprocess.CompletedProcess[str], words: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpucc: error: "), proc.stderr
    assert words in lines[0], proc.stderr


def test_the_intel_signed_quote_is_trusted_at_its_time_json() -> None:
    proc = cvm("--at", AT, "--cvm-report-data", REPORT_DATA, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json_doc(proc)
    assert doc["verdict"] == "trusted" and doc["exit_code"] == 0 and doc["gpus"] == []
    section = doc["cvm"]
    assert isinstance(section, dict)
    assert section["kind"] == "tdx" and section["verdict"] == "trusted"
    assert section["claims"]["tcb_status"] == "UpToDate"
    assert section["claims"]["mrtd"] == MRTD and section["claims"]["debug"] is False
    checks = {c["id"]: c for c in section["checks"]}
    assert checks["cvm-measurements"]["status"] == "not-checked"
    assert checks["cvm-measurements"]["decision"] == "accept"
    assert "not pinned" in checks["cvm-measurements"]["policy_note"]


def test_the_quote_is_trusted_at_its_time_text() -> None:
    proc = cvm("--at", AT, "--cvm-report-data", REPORT_DATA)
    assert proc.returncode == 0, proc.stderr
    assert "TRUSTED: the CVM (tdx) verified as of 2025-06-19T11:16:03Z" in proc.stdout
    assert "not pinned" in proc.stdout and "UpToDate" in proc.stdout


@pytest.mark.parametrize(
    ("at", "words"),
    [("2025-06-19T09:00:00Z", "not valid until"), ("2025-08-01T00:00:00Z", "expired")],
)
def test_collateral_outside_its_window_exits_3(at: str, words: str) -> None:
    proc = cvm("--at", at, "--cvm-report-data", REPORT_DATA, "--format", "json")
    assert proc.returncode == 3, proc.stderr
    doc = json_doc(proc)
    assert doc["verdict"] == "undecided"
    assert any(words in r for r in doc["reasons"])  # type: ignore[attr-defined]


def test_report_data_is_required_by_default_and_must_match(tmp_path: Path) -> None:
    proc = cvm("--at", AT)
    assert proc.returncode == 1 and "no expected report data" in proc.stdout
    other = "00" * 64
    proc = cvm("--at", AT, "--cvm-report-data", other)
    assert proc.returncode == 1 and "does not commit to this session" in proc.stdout
    relaxed = tmp_path / "p.yaml"
    relaxed.write_text("cvm:\n  require_report_data: false\n")
    proc = cvm("--at", AT, "--policy", relaxed, "--format", "json")
    assert proc.returncode == 0, proc.stdout
    checks = {c["id"]: c for c in json_doc(proc)["cvm"]["checks"]}  # type: ignore[index]
    assert "cvm.require_report_data: false" in checks["cvm-report-data"]["policy_note"]


def test_pinned_measurements_are_compared(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(f"cvm:\n  measurements:\n    tdx:\n      mrtd: '{MRTD.upper()}'\n")
    assert cvm("--at", AT, "--cvm-report-data", REPORT_DATA, "--policy", good).returncode == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"cvm:\n  measurements:\n    tdx:\n      rtmr3: '{'11' * 48}'\n")
    proc = cvm("--at", AT, "--cvm-report-data", REPORT_DATA, "--policy", bad)
    assert proc.returncode == 1 and "differs from the policy: rtmr3" in proc.stdout


@pytest.mark.parametrize(
    "policy",
    [
        "cvm:\n  accept_tcb_status: [Fine]\n",
        "cvm:\n  accept_tcb_status: [Revoked]\n",
        "cvm:\n  measurements:\n    tdx:\n      mrtd: abcd\n",
        "cvm:\n  measurements:\n    sgx: {}\n",
        "cvm:\n  allow_debug: yes-please\n",
        "cvm:\n  surprise: 1\n",
    ],
)
def test_bad_cvm_policies_are_malformed(tmp_path: Path, policy: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(policy)
    proc = cvm("--at", AT, "--cvm-report-data", REPORT_DATA, "--policy", path)
    assert proc.returncode == 4
    one_error_line(proc, "cvm")


def _flipped(tmp_path: Path, offset: int) -> Path:
    data = bytearray(QUOTE.read_bytes())
    data[offset] ^= 1
    path = tmp_path / f"flip-{offset}.bin"
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("offset", [48 + 200, 48 + 584 + 4 + 10, 48 + 584 + 4 + 134 + 20])
def test_a_flipped_bit_is_not_trusted(tmp_path: Path, offset: int) -> None:
    proc = cvm("--at", AT, "--cvm-report-data", REPORT_DATA, quote=_flipped(tmp_path, offset))
    assert proc.returncode == 1, proc.stdout
    assert "REFUSED: " in proc.stdout


def test_a_flipped_bit_with_stale_collateral_is_still_not_trusted(tmp_path: Path) -> None:
    proc = cvm(
        "--at", "2025-08-01T00:00:00Z", "--cvm-report-data", REPORT_DATA,
        quote=_flipped(tmp_path, 48 + 200),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (QUOTE.read_bytes()[:700], "truncated"),
        (QUOTE.read_bytes() + b"\x01" * 70_000, "larger than"),
        (b"\x04\x00\x02\x00\x00\x00\x00\x00" + QUOTE.read_bytes()[8:], "SGX quote"),
        (b"\x06\x00\x02\x00\x81\x00\x00\x00" + QUOTE.read_bytes()[8:], "neither a TDX quote"),
        (SET_A_REPORT.read_bytes(), "neither a TDX quote"),
        (b"", "neither a TDX quote"),
    ],
)
def test_bad_evidence_is_malformed(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "evidence.bin"
    path.write_bytes(content)
    proc = cvm("--at", AT, "--cvm-report-data", REPORT_DATA, quote=path)
    assert proc.returncode == 4
    one_error_line(proc, words)


def test_bad_collateral_is_malformed_and_missing_collateral_is_exit_3(tmp_path: Path) -> None:
    bad = tmp_path / "c.json"
    bad.write_text('{"tcb_info": "{}"}')
    proc = run_cli("attest", "--cvm-only", "--cvm-evidence", QUOTE, "--cvm-collateral", bad)
    assert proc.returncode == 4
    one_error_line(proc, "missing keys")
    proc = run_cli(
        "attest", "--cvm-only", "--cvm-evidence", QUOTE, "--at", AT, "--cvm-report-data",
        REPORT_DATA, "--offline", "--cache-dir", tmp_path / "cache",
    )  # fmt: skip
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "UNDECIDED" in proc.stdout and "Traceback" not in proc.stderr
    assert "give it with --cvm-collateral FILE" in proc.stderr


def test_a_decided_failure_outranks_missing_collateral(tmp_path: Path) -> None:
    """The quote's own signature and the report data are checked without Intel's collateral:
    the wrong report data is not trusted (exit 1), naming the check, not undecided."""
    proc = run_cli(
        "attest", "--cvm-only", "--cvm-evidence", QUOTE, "--at", AT, "--cvm-report-data",
        "00" * 64, "--offline", "--cache-dir", tmp_path / "cache", "--format", "json",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json_doc(proc)
    assert doc["verdict"] == "not-trusted"
    cvm_doc = doc["cvm"]
    assert isinstance(cvm_doc, dict)
    decisions = {c["id"]: c["decision"] for c in cvm_doc["checks"]}
    assert decisions["cvm-report-data"] == "refuse"
    assert decisions["tdx-quote-signature"] == "accept"
    assert decisions["cvm-collateral"] == "undecided"
    assert cvm_doc["reasons"][0].startswith("Report data: the evidence does not commit")


@pytest.mark.parametrize(
    "args",
    [
        ["--cvm-only"],
        ["--cvm-collateral", str(COLLATERAL)],
        ["--cvm-only", "--cvm-evidence", str(QUOTE), "--sample"],
        ["--cvm-only", "--cvm-evidence", str(QUOTE), "--cvm-report-data", "abcd"],
    ],
)
def test_usage_errors(args: list[str]) -> None:
    proc = run_cli("attest", *args)
    assert proc.returncode == 2, proc.stderr


def _gpu(policy: Path) -> list[str | Path]:
    return [
        "attest",
        "--evidence", SET_A_REPORT,
        "--cert-chain", SET_A_CHAIN,
        "--nonce", SET_A_NONCE,
        "--driver-rim", SET_A_DRIVER_RIM,
        "--vbios-rim", SET_A_VBIOS_RIM,
        "--policy", policy,
        "--offline",
        "--cvm-collateral", COLLATERAL,
        "--cvm-report-data", REPORT_DATA,
        "--format", "json",
    ]  # fmt: skip


def test_composite_verdict_needs_the_cvm_and_every_gpu(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("ocsp:\n  require: false\n")
    proc = run_cli(*_gpu(policy), "--cvm-evidence", QUOTE, "--at", AT)
    assert proc.returncode == 0, proc.stderr
    doc = json_doc(proc)
    assert doc["verdict"] == "trusted" and len(doc["gpus"]) == 1  # type: ignore[arg-type]
    assert doc["cvm"]["verdict"] == "trusted"  # type: ignore[index]
    # A good GPU does not make up for a tampered CVM, nor for its stale collateral.
    proc = run_cli(*_gpu(policy), "--cvm-evidence", _flipped(tmp_path, 300), "--at", AT)
    doc = json_doc(proc)
    assert proc.returncode == 1 and doc["gpus"][0]["verdict"] == "trusted"  # type: ignore[index]
    assert doc["reasons"][0].startswith("CVM: ")  # type: ignore[index]
    proc = run_cli(*_gpu(policy), "--cvm-evidence", QUOTE, "--at", "2025-06-19T09:00:00Z")
    assert proc.returncode == 3 and json_doc(proc)["verdict"] == "undecided"


def test_with_gpu_evidence_the_cvm_must_commit_to_its_nonce(tmp_path: Path) -> None:
    """Without --cvm-report-data the CVM evidence must sign SHA-512(label || GPU nonce): the
    sample quote was made for something else, so it does not belong to this GPU evidence."""
    policy = tmp_path / "p.yaml"
    policy.write_text("ocsp:\n  require: false\n")
    args = [a for a in _gpu(policy) if a not in ("--cvm-report-data", REPORT_DATA)]
    proc = run_cli(*args, "--cvm-evidence", QUOTE, "--at", AT)
    doc = json_doc(proc)
    assert proc.returncode == 1 and doc["gpus"][0]["verdict"] == "trusted"  # type: ignore[index]
    assert any("does not commit" in r for r in doc["reasons"])  # type: ignore[attr-defined]


def test_cvm_pin_pins_a_trusted_results_measurements(tmp_path: Path) -> None:
    import json

    from jsonschema import Draft202012Validator

    from gpucc.cli.schemas import load_schema
    from gpucc.gpuattest.policy import load_policy

    result = tmp_path / "result.json"
    attested = cvm("--at", AT, "--cvm-report-data", REPORT_DATA, "--format", "json")
    assert attested.returncode == 0, attested.stderr
    result.write_text(attested.stdout)
    pinned = run_cli("cvm", "pin", result, "-o", tmp_path / "policy.yaml", "-f", "json")
    assert pinned.returncode == 0, pinned.stderr
    doc = json.loads(pinned.stdout)
    Draft202012Validator(load_schema("gpucc.cvm.reference/v1")).validate(doc)
    assert doc["kind"] == "tdx" and doc["policy"]["cvm"]["measurements"]["tdx"]["mrtd"] == MRTD
    assert load_policy(tmp_path / "policy.yaml").cvm.pins("tdx")["mrtd"] == MRTD
    # the pinned policy admits the quote it came from and nothing with another MRTD
    again = cvm("--at", AT, "--cvm-report-data", REPORT_DATA, "--policy", tmp_path / "policy.yaml")
    assert again.returncode == 0, again.stderr


def test_a_piped_cvm_report_keeps_each_check_on_one_line() -> None:
    """The Rich report (a CVM's) written to a pipe is not wrapped either: the row of a check
    holds its whole reason, unless COLUMNS sets a width."""
    from tests.support.cli import gpucc

    args = ["attest", "--cvm-only", "--cvm-evidence", str(QUOTE)]
    args += ["--cvm-collateral", str(COLLATERAL), "--at", AT]
    reason = "policy: not pinned: no cvm.measurements.tdx in the policy; reported only"
    rows = [line for line in gpucc(*args).stdout.splitlines() if line.startswith("| Measurements")]
    assert len(rows) == 1 and reason in rows[0], rows
    narrow = gpucc(*args, env={"COLUMNS": "60"}).stdout.splitlines()
    assert not any(reason in line for line in narrow)
