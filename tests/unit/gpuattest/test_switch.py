"""NVSwitch (LS10) verification on NVIDIA's real switch evidence and RIM."""

from __future__ import annotations

import datetime as dt
import struct
from pathlib import Path

import pytest

from gpucc.core.errors import MalformedReportError
from gpucc.gpuattest.collateral import DirectoryRimSource, FileRimSource, NoOcsp, RimSource
from gpucc.gpuattest.evidence import EvidenceSet, GpuEvidence, load_evidence_file
from gpucc.gpuattest.policy import Policy
from gpucc.gpuattest.result import CheckStatus, Verdict
from gpucc.gpuattest.switch_report import SwitchReport
from gpucc.gpuattest.switch_result import SwitchAttestationResult
from gpucc.gpuattest.switch_verifier import verify_switches
from gpucc.gpuattest.trust import TrustRoots
from tests.support.samples import (
    SWITCH,
    SWITCH_AT,
    SWITCH_CHAIN,
    SWITCH_FROM,
    SWITCH_JSON,
    SWITCH_NONCE,
    SWITCH_REPORT,
    SWITCH_RIM,
    SWITCH_UNTIL,
    report_bytes,
)

NO_OCSP = Policy(require_ocsp=False)


def _evidence(report: bytes | None = None) -> EvidenceSet:
    chain = SWITCH_CHAIN.read_bytes()
    return EvidenceSet(gpus=(GpuEvidence(report or report_bytes(SWITCH_REPORT), chain, "LS10"),))


def _verify(
    evidence: EvidenceSet | None = None,
    *,
    at: dt.datetime = SWITCH_AT,
    nonce: str = SWITCH_NONCE,
    rims: RimSource | None = None,
) -> SwitchAttestationResult:
    return verify_switches(
        evidence or _evidence(),
        expected_nonce=bytes.fromhex(nonce),
        roots=TrustRoots.nvidia(),
        now=at,
        rims=rims or DirectoryRimSource(SWITCH),
        ocsp=NoOcsp("offline"),
        policy=NO_OCSP,
    )


def test_the_nvattest_json_and_the_raw_report_are_the_same_evidence() -> None:
    loaded = load_evidence_file(SWITCH_JSON)
    assert loaded.gpus[0].arch == "LS10"
    assert loaded.gpus[0].report == report_bytes(SWITCH_REPORT)
    raw = load_evidence_file(SWITCH_REPORT, SWITCH_CHAIN)
    assert raw.gpus[0].arch == "LS10"  # read from the leaf LS_10 A01 FSP FMC LF


def test_the_report_parses_with_the_switch_fields() -> None:
    report = SwitchReport.parse(report_bytes(SWITCH_REPORT))
    assert len(report.blocks) == 31
    assert report.bios_version == "96.10.55.00.01"
    assert report.device_pdi.hex() == "203eb31ad9ed0008"
    assert len(report.gpu_pdis) == 16
    assert report.position_id == 2 and report.lock_status == 1
    assert report.disabled_ports == bytes.fromhex("ec00")
    assert report.fwid is None
    assert report.bios_rim_id() == "NV_SWITCH_BIOS_5612_0002_890_9610550001"


@pytest.mark.parametrize("at", [SWITCH_FROM, SWITCH_AT, SWITCH_UNTIL])
def test_trusted_inside_the_rim_signers_window(at: dt.datetime) -> None:
    result = _verify(at=at)
    assert result.verdict is Verdict.TRUSTED, result.reasons
    switch = result.switches[0]
    assert switch.check("fwid").status is CheckStatus.NOT_PRESENT
    assert switch.check("measurements").reason == "31 of 31 golden measurements match"
    claims = switch.claims
    assert claims["x-nvidia-device-type"] == "nvswitch"
    assert claims["x-nvidia-switch-bios-version"] == "96.10.55.00.01"
    assert claims["x-nvidia-switch-attestation-report-signature-verified"] is True
    assert claims["x-nvidia-switch-bios-rim-version-match"] is True
    assert claims["measres"] == "success" and claims["secboot"] is True
    assert claims["hwmodel"] == "LS_10 A01 FSP BROM"
    assert not any(k.startswith("x-nvidia-gpu-") for k in claims)


@pytest.mark.parametrize(
    "at",
    [SWITCH_FROM - dt.timedelta(seconds=1), SWITCH_UNTIL + dt.timedelta(seconds=1)],
)
def test_not_trusted_outside_the_window(at: dt.datetime) -> None:
    result = _verify(at=at)
    assert result.verdict is Verdict.NOT_TRUSTED
    assert result.switches[0].check("bios-rim-chain").status is CheckStatus.FAIL


def test_a_broken_signature_is_not_trusted() -> None:
    raw = bytearray(report_bytes(SWITCH_REPORT))
    raw[-1] ^= 0x01
    result = _verify(_evidence(bytes(raw)))
    assert result.verdict is Verdict.NOT_TRUSTED
    assert result.switches[0].check("report-signature").status is CheckStatus.FAIL


def test_a_measurement_changed_in_the_report_is_not_trusted() -> None:
    raw = bytearray(report_bytes(SWITCH_REPORT))
    raw[37 + 8 + 7] ^= 0x01  # block 1's first value byte (the signature breaks too)
    result = _verify(_evidence(bytes(raw)))
    assert result.verdict is Verdict.NOT_TRUSTED
    assert "index 0 (bios)" in result.switches[0].check("measurements").reason


def test_a_rim_edited_after_signing_is_not_trusted(tmp_path: Path) -> None:
    text = SWITCH_RIM.read_text()
    assert 'colloquialVersion="96.10.55.00.01"' in text
    edited = tmp_path / "edited.xml"
    edited.write_text(text.replace("LS10", "LS11", 1))
    rims = FileRimSource(vbios=edited, driver=None)
    result = _verify(rims=rims)
    assert result.verdict is Verdict.NOT_TRUSTED
    assert result.switches[0].check("bios-rim-signature").status is CheckStatus.FAIL


def test_the_wrong_nonce_is_not_trusted() -> None:
    result = _verify(nonce="00" * 32)
    assert result.verdict is Verdict.NOT_TRUSTED
    assert result.switches[0].check("nonce").status is CheckStatus.FAIL


def test_without_the_rim_it_is_undecided(tmp_path: Path) -> None:
    result = _verify(rims=DirectoryRimSource(tmp_path))
    assert result.verdict is Verdict.UNDECIDED
    assert result.switches[0].claims["measres"] == "not-run"
    assert any("NV_SWITCH_BIOS_5612_0002_890_9610550001" in r for r in result.reasons)


def test_a_trailing_byte_is_malformed_and_the_message_names_the_length() -> None:
    raw = report_bytes(SWITCH_REPORT)
    with pytest.raises(MalformedReportError, match=r"1 unexpected bytes .* ends after 2168 bytes"):
        SwitchReport.parse(raw + b"\x00")
    with pytest.raises(MalformedReportError, match="2168"):
        _verify(_evidence(raw + b"\x00"))


def test_truncated_and_oversized_reports_are_malformed() -> None:
    raw = report_bytes(SWITCH_REPORT)
    for cut in (0, 10, 100, len(raw) - 97, len(raw) - 1):
        with pytest.raises(MalformedReportError):
            SwitchReport.parse(raw[:cut])
    with pytest.raises(MalformedReportError, match="maximum"):
        SwitchReport.parse(raw + bytes(0x2000))


def _with_opaque_field(raw: bytes, field_type: int, value: bytes | None) -> bytes:
    """``raw`` with one opaque field replaced (or removed); the signature stays as it was."""
    record_len = int.from_bytes(raw[42:45], "little")
    start = 45 + record_len + 32
    length = int.from_bytes(raw[start : start + 2], "little")
    body, pos, out = raw[start + 2 : start + 2 + length], 0, b""
    while pos < len(body):
        t, n = struct.unpack("<HH", body[pos : pos + 4])
        item = body[pos + 4 : pos + 4 + n]
        if t == field_type:
            item = value if value is not None else b""
            if value is None:
                pos += 4 + n
                continue
        out += struct.pack("<HH", t, len(item)) + item
        pos += 4 + n
    return raw[:start] + struct.pack("<H", len(out)) + out + raw[start + 2 + length :]


@pytest.mark.parametrize(
    ("field_type", "value", "message"),
    [
        (22, None, "lacks required field DEVICE_PDI"),
        (22, b"\x01" * 7, "DEVICE_PDI is 7 bytes"),
        (26, b"\x01" * 12, "not a whole number"),
        (6, None, "lacks required field VBIOS_VERSION"),
        (6, b"\xff\xfe", "not ASCII"),
        (6, b"abc-1", "not a version"),
    ],
)
def test_malformed_switch_fields(field_type: int, value: bytes | None, message: str) -> None:
    raw = _with_opaque_field(report_bytes(SWITCH_REPORT), field_type, value)
    with pytest.raises(MalformedReportError, match=message):
        SwitchReport.parse(raw)
