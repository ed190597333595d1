"""`gpucc attest --cvm-evidence` with AMD SEV-SNP reports: AMD's real Milan report and its VCEK
through real processes, and simulated reports (a self-made ARK/ASK/VCEK) through the library's
one judged result, with report data and the policy's debug and measurement rules."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from gpucc.cli.exitcodes import exit_code_for
from gpucc.cli.schemas import load_schema
from gpucc.core.errors import MalformedInputError
from gpucc.gpuattest.cvm.appraise import verify_cvm_evidence
from gpucc.gpuattest.cvm.policy import parse_cvm_policy
from gpucc.gpuattest.cvm.snp_simulate import DEFAULT_MEASUREMENT, SimulatedSnp
from gpucc.gpuattest.result import Verdict
from tests.support.cli import run_cli
from tests.support.paths import DATA

SNP = DATA / "cpu-tee" / "snp"
REPORT = SNP / "report.bin"
VCEK = SNP / "vcek.der"
AT = "2025-01-01T00:00:00Z"  # inside the VCEK's validity (2023-04-03 to 2030-04-03)
REPORT_DATA = REPORT.read_bytes()[0x50:0x90].hex()
NOW = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def snp(*extra: str | Path, report: Path = REPORT) -> subprocess.CompletedProcess[str]:
    return run_cli("attest", "--cvm-only", "--cvm-evidence", report, *extra)


def test_amds_real_report_is_trusted_with_its_vcek() -> None:
    proc = snp("--cvm-collateral", VCEK, "--at", AT, "--cvm-report-data", REPORT_DATA, "-f", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    Draft202012Validator(load_schema(doc["schema"])).validate(doc)
    assert doc["trusted"] is True and doc["cvm"]["kind"] == "snp"
    assert doc["cvm"]["claims"]["measurement"].startswith("7a1e5c26")


def test_amds_real_report_text_names_the_cvm() -> None:
    proc = snp("--cvm-collateral", VCEK, "--at", AT, "--cvm-report-data", REPORT_DATA)
    assert proc.returncode == 0, proc.stderr
    assert "snp" in proc.stdout.lower()


def test_a_vcek_outside_its_validity_cannot_decide() -> None:
    proc = snp("--cvm-collateral", VCEK, "--at", "2031-01-01T00:00:00Z",
               "--cvm-report-data", REPORT_DATA)  # fmt: skip
    assert proc.returncode == 3, (proc.stdout, proc.stderr)


def test_no_vcek_offline_cannot_decide(tmp_path: Path) -> None:
    proc = snp("--at", AT, "--cvm-report-data", REPORT_DATA, "--offline",
               "--cache-dir", tmp_path / "cache")  # fmt: skip
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr


def test_no_vcek_offline_and_a_debuggable_guest_is_not_trusted(tmp_path: Path) -> None:
    data = bytearray(REPORT.read_bytes())
    data[0x08 + 2] |= 0x08  # guest policy bit 19: debugging allowed (the signature is unchecked)
    debuggable = tmp_path / "debug.bin"
    debuggable.write_bytes(bytes(data))
    proc = snp("--at", AT, "--cvm-report-data", REPORT_DATA, "--offline",
               "--cache-dir", tmp_path / "cache", report=debuggable)  # fmt: skip
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "the guest is debuggable" in proc.stdout
    proc = snp("--at", AT, "--cvm-report-data", "00" * 64, "--offline",
               "--cache-dir", tmp_path / "cache")  # fmt: skip
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "does not commit to this session" in proc.stdout


def test_a_flipped_measurement_bit_is_not_trusted(tmp_path: Path) -> None:
    data = bytearray(REPORT.read_bytes())
    data[0x90] ^= 1  # the measurement
    bad = tmp_path / "flipped.bin"
    bad.write_bytes(bytes(data))
    proc = snp("--cvm-collateral", VCEK, "--at", AT, "--cvm-report-data", REPORT_DATA,
               report=bad)  # fmt: skip
    assert proc.returncode == 1, (proc.stdout, proc.stderr)


def test_other_report_data_is_not_trusted() -> None:
    proc = snp("--cvm-collateral", VCEK, "--at", AT, "--cvm-report-data", "00" * 64)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)


def test_a_truncated_report_is_malformed(tmp_path: Path) -> None:
    bad = tmp_path / "short.bin"
    bad.write_bytes(REPORT.read_bytes()[:700])
    proc = snp("--cvm-collateral", VCEK, "--at", AT, report=bad)
    assert proc.returncode == 4, (proc.stdout, proc.stderr)
    assert len([x for x in proc.stderr.splitlines() if x.strip()]) == 1


@pytest.fixture(scope="module")
def chip() -> SimulatedSnp:
    return SimulatedSnp.create(seed=b"composite")


def _judge(
    chip: SimulatedSnp,
    cvm_policy: Mapping[str, object],
    *,
    measurement: bytes = DEFAULT_MEASUREMENT,
    guest_policy: int = 0x30000,
) -> Verdict:
    rd = bytes(range(64))
    evidence = chip.report(report_data=rd, measurement=measurement, policy=guest_policy)
    result = verify_cvm_evidence(
        evidence,
        chip.vcek,
        now=NOW,
        policy=parse_cvm_policy(cvm_policy),
        expected_report_data=rd,
        snp_roots=chip.roots,
    )
    return result.verdict


def test_simulated_snp_evidence_is_judged_by_the_cvm_policy(chip: SimulatedSnp) -> None:
    measurement = bytes(range(48))
    pinned = {"measurements": {"snp": {"measurement": measurement.hex()}}}
    assert _judge(chip, {}, measurement=measurement) is Verdict.TRUSTED
    assert _judge(chip, pinned, measurement=measurement) is Verdict.TRUSTED
    assert _judge(chip, pinned, measurement=bytes(48)) is Verdict.NOT_TRUSTED
    debug = 0x30000 | (1 << 19)
    assert _judge(chip, {}, guest_policy=debug) is Verdict.NOT_TRUSTED
    assert _judge(chip, {"allow_debug": True}, guest_policy=debug) is Verdict.TRUSTED


def test_simulated_evidence_under_amds_pinned_roots_is_not_trusted(chip: SimulatedSnp) -> None:
    rd = bytes(64)
    result = verify_cvm_evidence(
        chip.report(report_data=rd),
        chip.vcek,
        now=NOW,
        policy=parse_cvm_policy({}),
        expected_report_data=rd,
    )
    assert result.verdict is not Verdict.TRUSTED


def test_gpu_evidence_given_as_cvm_evidence_is_malformed() -> None:
    with pytest.raises(MalformedInputError) as info:
        verify_cvm_evidence(
            b"\x11" * 300, None, now=NOW, policy=parse_cvm_policy({}), expected_report_data=None
        )
    assert exit_code_for(info.value) == 4
