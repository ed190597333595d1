"""`gpucc attest` on NVIDIA's current evidence (Rubin, Blackwell FSP) in every form it
comes in: a raw report with its chain, NVAT v1 JSON and NVIDIA's CMW file."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.samples import FSP, FSP_NONCE, NVDAOD_H100, RUBIN, RUBIN_NONCE, report_bytes

CASES = {"rubin": (RUBIN, RUBIN_NONCE), "fsp": (FSP, FSP_NONCE)}
FORMS = {
    "raw": ("attestation-report.hex", "cert-chain.pem"),
    "nvat": ("nvat-v1-evidence.json", None),
    "cmw": ("evidence.cmw.json", None),
}
AT = "2026-12-01T00:00:00Z"


def _attest(folder: Path, form: str, nonce: str, *extra: str):  # type: ignore[no-untyped-def]
    evidence, chain = FORMS[form]
    args: list[str | Path] = ["attest", "--evidence", folder / evidence, "--nonce", nonce]
    args.append("--offline")
    if chain:
        args += ["--cert-chain", folder / chain]
    return run_cli(*args, "--at", AT, "-f", "json", *extra)


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_right_nonce_is_exit_3_with_the_signature_verified(case: str, form: str) -> None:
    folder, nonce = CASES[case]
    proc = _attest(folder, form, nonce)
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    (gpu,) = doc["gpus"]
    assert gpu["claims"]["x-nvidia-gpu-attestation-report-signature-verified"] is True
    assert gpu["claims"]["x-nvidia-gpu-attestation-report-nonce-match"] is True
    assert any("published only as CoRIMs" in r for r in doc["reasons"]), doc["reasons"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_wrong_nonce_is_exit_1(case: str) -> None:
    folder, _ = CASES[case]
    proc = _attest(folder, "cmw" if case == "rubin" else "nvat", "11" * 32)
    assert proc.returncode == 1, proc.stderr


def test_fsp_cmw_says_its_hints_are_unsigned() -> None:
    proc = _attest(FSP, "cmw", FSP_NONCE)
    gpu = json.loads(proc.stdout)["gpus"][0]
    assert gpu["claims"]["x-nvidia-unsigned-hints"] == {"fwversion": "01.00.00.00.01"}
    assert "never decide" in gpu["claim_notes"]["x-nvidia-unsigned-hints"]


@pytest.mark.parametrize("change", ["flip", "truncate", "extend"])
def test_changed_report_exit_codes(change: str, tmp_path: Path) -> None:
    report = bytearray(report_bytes(RUBIN / "attestation-report.hex"))
    if change == "flip":
        report[-40] ^= 0x01
    elif change == "truncate":
        del report[-1]
    else:
        report += b"\x00"
    path = tmp_path / "report.hex"
    path.write_text(report.hex())
    proc = run_cli(
        "attest", "--evidence", path, "--cert-chain", RUBIN / "cert-chain.pem",
        "--nonce", RUBIN_NONCE, "--offline", "--at", AT,
    )  # fmt: skip
    assert proc.returncode == (1 if change == "flip" else 4), proc.stderr


def test_a_newer_opaque_major_version_is_unsupported_naming_it(tmp_path: Path) -> None:
    report = bytearray(report_bytes(RUBIN / "attestation-report.hex"))
    at = report.find(b"NVDAOD")
    assert at > 0 and struct.unpack_from("<H", report, at - 2)[0] == 496
    report[at + 8] = 3
    path = tmp_path / "report.hex"
    path.write_text(report.hex())
    proc = run_cli(
        "attest", "--evidence", path, "--cert-chain", RUBIN / "cert-chain.pem",
        "--nonce", RUBIN_NONCE, "--offline", "--at", AT,
    )  # fmt: skip
    assert proc.returncode == 4
    assert "version 3.0.0 is not supported" in proc.stderr
    assert "newest major version gpucc reads is 2" in proc.stderr


def test_inspect_reads_cmw() -> None:
    proc = run_cli("inspect", RUBIN / "evidence.cmw.json", "-f", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "evidence" and doc["details"]["arch"] == "RUBIN"
    assert doc["details"]["nonce"] == RUBIN_NONCE


def test_h100_620_transcript_reads() -> None:
    from gpucc.gpuattest.report import AttestationReport

    report = AttestationReport.parse(report_bytes(NVDAOD_H100))
    assert (report.driver_version, report.vbios_version) == ("620.12", "96.00.D9.00.0F")


def test_text_output_says_what_the_report_lacks_and_that_hints_are_unsigned() -> None:
    proc = run_cli(
        "attest", "--evidence", FSP / "evidence.cmw.json", "--nonce", FSP_NONCE,
        "--offline", "--at", AT,
    )  # fmt: skip
    assert proc.returncode == 3
    text = proc.stdout + proc.stderr
    assert "(not in the report)" in text
    assert "fwversion 01.00.00.00.01 (unsigned: never used to decide)" in text
