"""`gpucc attest --cvm-event-log` as a real process: the real TDX quote and CC event log that do
not match are refused (exit 1) naming the mismatch, ahead of the missing Intel collateral;
events are shown escaped and carried in JSON; bad logs are one-line errors with their exit
codes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from jsonschema import Draft202012Validator

from gpucc.cli.schemas import load_schema
from gpucc.gpuattest.cvm.eventlog_build import LogEvent, build_event_log, efi_variable_data
from tests.support.cli import run_cli
from tests.support.paths import DATA

CCEL = DATA / "cloud-cvm" / "tdx-ccel"
QUOTE = CCEL / "tdx_quote_4.dat"
LOG = CCEL / "CCEL_data"
SNP = DATA / "cpu-tee" / "snp" / "report.bin"
RD = QUOTE.read_bytes()[48 + 520 : 48 + 584].hex()  # the quote's own REPORTDATA


def attest(*extra: str | Path, quote: Path = QUOTE) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "attest", "--cvm-only", "--cvm-evidence", quote, "--offline", "--no-cache",
        "--cvm-report-data", RD, *extra,
    )  # fmt: skip


def one_error_line(proc: subprocess.CompletedProcess[str], words: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpucc: error: "), proc.stderr
    assert words in lines[0], proc.stderr


def test_without_the_log_the_quote_is_undecided_unless_a_check_failed(tmp_path: Path) -> None:
    # The TD is debuggable: refused by the default policy although Intel's collateral is missing.
    proc = attest()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Not debuggable: the TD is debuggable" in proc.stdout
    policy = tmp_path / "p.yaml"
    policy.write_text("cvm:\n  allow_debug: true\n")
    proc = attest("--policy", policy)
    assert proc.returncode == 3, proc.stdout + proc.stderr


def test_the_real_pair_is_not_trusted_and_names_the_mismatch_text() -> None:
    proc = attest("--cvm-event-log", LOG)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REFUSED: " in proc.stdout
    assert "the event log does not match the quote: RTMR0, RTMR1 differ" in proc.stdout
    assert "Event log (5 events)" in proc.stdout
    assert "EV_EFI_PLATFORM_FIRMWARE_BLOB2" in proc.stdout
    assert "td_payload at 0x901000" in proc.stdout


def test_the_real_pair_in_json_carries_the_events(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("cvm:\n  allow_debug: true\n")
    proc = attest("--cvm-event-log", LOG, "--policy", policy, "--format", "json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    Draft202012Validator(load_schema(doc["schema"])).validate(doc)
    log = doc["cvm"]["event_log"]
    assert log["replay"]["rtmr0"].startswith("2dc712306a963ead")
    assert log["replay"]["rtmr1"].endswith("c28cd3cf")
    assert [e["type_name"] for e in log["events"]][:2] == [
        "EV_PLATFORM_CONFIG_FLAGS",
        "EV_SEPARATOR",
    ]
    refused = [c["id"] for c in doc["cvm"]["checks"] if c["decision"] == "refuse"]
    assert refused == ["cvm-event-log"]
    assert doc["reasons"][0].startswith("CVM: Event log replays to the RTMRs: the event log")


OVMF_LOG = DATA / "cloud-cvm" / "tdx-ccel-ovmf" / "CCEL_data_ovmf"


def test_an_ovmf_log_is_read_and_refused_against_a_quote_it_is_not_for(tmp_path: Path) -> None:
    # OVMF writes the Spec ID event at index 1 and leaves 0xFF fill after its last event
    policy = tmp_path / "p.yaml"
    policy.write_text("cvm:\n  allow_debug: true\n")
    proc = attest("--cvm-event-log", OVMF_LOG, "--policy", policy, "--format", "json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    Draft202012Validator(load_schema(doc["schema"])).validate(doc)
    log = doc["cvm"]["event_log"]
    assert len(log["events"]) == 20 and log["size"] == 2120
    assert log["replay"]["rtmr2"].startswith("94eaf7a7bf398ed8")
    refused = [c["id"] for c in doc["cvm"]["checks"] if c["decision"] == "refuse"]
    assert refused == ["cvm-event-log"]
    reason = doc["reasons"][0]
    assert "the event log does not match the quote: RTMR0, RTMR1, RTMR2 differ" in reason
    text = attest("--cvm-event-log", OVMF_LOG)
    assert text.returncode == 1 and "Event log (20 events)" in text.stdout


def test_a_hostile_description_reaches_no_terminal(tmp_path: Path) -> None:
    data = efi_variable_data(b"\0" * 16, "Boot\x1b]0;owned\x07\u202e", b"\x01")
    hostile = tmp_path / "log"
    hostile.write_bytes(build_event_log([LogEvent("rtmr0", 0x80000001, data)]))
    proc = attest("--cvm-event-log", hostile)
    assert proc.returncode == 1, proc.stderr
    assert "\x1b" not in proc.stdout and "\u202e" not in proc.stdout and "\x07" not in proc.stdout
    assert "Boot\\\\x1b]0;owned" in proc.stdout or "Boot\\x1b]0;owned" in proc.stdout


def test_bad_logs_are_one_line_errors(tmp_path: Path) -> None:
    raw = LOG.read_bytes()
    cases = {
        "truncated": (raw[:5000], "truncated"),
        "oversized": (raw * 9, "larger than"),
        "malformed": (b"not an event log" * 8, "Spec ID"),
        "tampered": (raw[:9822 + 10] + b"\x01" + raw[9822 + 11 :], "data after its end"),
    }  # fmt: skip
    for name, (data, words) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        proc = attest("--cvm-event-log", path)
        assert proc.returncode == 4, (name, proc.stderr)
        one_error_line(proc, words)


def test_usage_errors_exit_2() -> None:
    proc = run_cli("attest", "--cvm-only", "--cvm-event-log", LOG)
    assert proc.returncode == 2
    one_error_line(proc, "need --cvm-evidence")
    proc = attest("--cvm-event-log", LOG, quote=SNP)
    assert proc.returncode == 2, proc.stderr
    one_error_line(proc, "SEV-SNP evidence has none")


# --- a vTPM's measured-boot log (Azure SEV-SNP sample, which comes without one) --------------

VTPM = DATA / "cloud-cvm" / "azure-snp-vtpm" / "evidence-v1.json"


def attest_vtpm(*extra: str | Path) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "attest", "--cvm-only", "--cvm-evidence", VTPM, "--offline", "--no-cache",
        "--cvm-report-data", b"challenge".hex(), "--at", "2026-01-01T00:00:00Z", *extra,
    )  # fmt: skip


def test_a_vtpm_with_a_log_that_is_not_its_own_is_refused_naming_the_pcrs(
    tmp_path: Path,
) -> None:
    from gpucc.gpuattest.cvm.eventlog_build import build_tpm_log

    assert attest_vtpm().returncode == 0  # the sample alone is trusted for its nonce
    log = tmp_path / "binary_bios_measurements"
    log.write_bytes(
        build_tpm_log(
            [
                LogEvent("pcr0", 0x08, b"S-CRTM"),
                LogEvent("pcr7", 0x80000001, efi_variable_data(bytes(16), "SecureBoot", b"\1")),
            ]
        )
    )
    proc = attest_vtpm("--cvm-event-log", log, "--format", "json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    Draft202012Validator(load_schema(doc["schema"])).validate(doc)
    assert sorted(doc["cvm"]["event_log"]["replay"]) == ["pcr0", "pcr7"]
    assert doc["cvm"]["event_log"]["events"][1]["register"] == "pcr7"
    refused = [c["id"] for c in doc["cvm"]["checks"] if c["decision"] == "refuse"]
    assert refused == ["cvm-event-log"]
    assert "PCR0 replays to" in doc["reasons"][0] and "PCR7 replays to" in doc["reasons"][0]
    text = attest_vtpm("--cvm-event-log", log)
    assert text.returncode == 1 and "Event log (2 events)" in text.stdout
    # a log cut short, or one without SHA-256, is malformed input (exit 4) in one line
    log.write_bytes(log.read_bytes()[:-3])
    proc = attest_vtpm("--cvm-event-log", log)
    assert proc.returncode == 4
    one_error_line(proc, "truncated")
    log.write_bytes(build_event_log([LogEvent("rtmr0", 0x08, b"x")]))
    proc = attest_vtpm("--cvm-event-log", log)
    assert proc.returncode == 4
    one_error_line(proc, "no SHA-256")
