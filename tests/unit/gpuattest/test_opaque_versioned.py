"""Both opaque-data layouts: NVIDIA's versioned (NVDAOD) layout and the legacy one."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucc.core.errors import (
    GpuccError,
    MalformedReportError,
    UnsupportedFormatError,
)
from gpucc.gpuattest.report import (
    OPAQUE_MAJOR_VERSION,
    SVN_VALUE_TYPE,
    AttestationReport,
    OpaqueData,
    OpaqueType,
    SpdmEnvelope,
)
from tests.support.samples import NVDAOD_H100, RUBIN, SET_A_REPORT, report_bytes

H100 = report_bytes(NVDAOD_H100)
RUBIN_REPORT = report_bytes(RUBIN / "attestation-report.hex")


def _opaque_span(report: bytes) -> tuple[int, int]:
    """(start, length) of the opaque data: it ends 96 bytes before the report does."""
    env = SpdmEnvelope.parse(report)
    length = sum(6 + len(v) for v in env.opaque.values())
    length += 12 + (6 + 2 if env.opaque_data.version else 0)  # header; the ignored type 34
    end = len(report) - 96
    assert int.from_bytes(report[end - length - 2 : end - length], "little") == length
    return end - length, length


def test_h100_620_versions_read_from_versioned_layout() -> None:
    report = AttestationReport.parse(H100)
    assert report.driver_version == "620.12"
    assert report.vbios_version == "96.00.D9.00.0F"
    assert (report.project, report.project_sku, report.chip_sku) == ("G520", "0201", "884")
    assert report.opaque_data.layout == "versioned"
    assert report.opaque_data.version == (2, 0, 0)
    assert report.fwid is not None and len(report.fwid) == 48
    assert report.opaque.get(OpaqueType.PROTECTED_PCIE_STATUS) == b"\x55"
    assert report.opaque_data.value_types[OpaqueType.SVN] == SVN_VALUE_TYPE
    assert report.opaque_data.svn(OpaqueType.SVN) == 0
    # The legacy version entry (type 34) beside the header is ignored.
    assert OpaqueType.OPAQUE_DATA_VERSION not in report.opaque
    assert report.vbios_rim_id() == "NV_GPU_VBIOS_G520_0201_884_9600D9000F"


def test_rubin_opaque_fields() -> None:
    report = AttestationReport.parse(RUBIN_REPORT)
    assert (report.driver_version, report.vbios_version) == ("620.54", "99.00.23.00.00")
    assert report.chip_info == "GR100"
    assert report.feature_flag == 1
    assert len(report.blocks) == 65 and report.blocks[253].is_raw


def test_legacy_layout_unchanged() -> None:
    report = AttestationReport.parse(report_bytes(SET_A_REPORT))
    assert report.opaque_data.layout == "legacy"
    assert report.opaque_data.svn(OpaqueType.SVN) is None
    assert report.driver_version == "545.00"


def _with_opaque(report: bytes, opaque: bytes) -> bytes:
    start, length = _opaque_span(report)
    head = report[: start - 2] + struct.pack("<H", len(opaque))
    return head + opaque + report[start + length :]


@pytest.mark.parametrize("major", [3, 9, 255])
def test_newer_major_is_unsupported_naming_it(major: int) -> None:
    start, length = _opaque_span(H100)
    opaque = bytearray(H100[start : start + length])
    opaque[8] = major
    with pytest.raises(UnsupportedFormatError) as err:
        AttestationReport.parse(_with_opaque(H100, bytes(opaque)))
    text = str(err.value)
    assert f"version {major}.0.0 is not supported" in text
    assert f"newest major version gpucc reads is {OPAQUE_MAJOR_VERSION}" in text
    assert "truncated" not in text


def test_nonzero_profile_is_unsupported() -> None:
    with pytest.raises(UnsupportedFormatError, match="profile 1"):
        OpaqueData.parse(b"NVDAOD\x01\x00\x02\x00\x00\x00")


def test_entries_keyed_on_type_not_position() -> None:
    entries = [(3, 0x86, b"620.12\x00"), (37, SVN_VALUE_TYPE, b"\x05\x00"), (200, 1, b"xy")]
    body = b"".join(struct.pack("<HHH", t, vt, len(v)) + v for t, vt, v in entries)
    forward = OpaqueData.parse(b"NVDAOD\x00\x00\x02\x00\x00\x00" + body)
    body = b"".join(struct.pack("<HHH", t, vt, len(v)) + v for t, vt, v in reversed(entries))
    backward = OpaqueData.parse(b"NVDAOD\x00\x00\x02\x00\x00\x00" + body)
    assert dict(forward.fields) == dict(backward.fields)
    assert forward.svn(37) == backward.svn(37) == 5
    assert forward.unknown_types == (200,)
    assert forward.svn(3) is None  # not of the SVN value type


@pytest.mark.parametrize(
    ("opaque", "message"),
    [
        (b"NVDAOD\x00\x00\x02\x00", "opaque patch"),
        (b"NVDAOD\x00\x00\x02\x00\x00\x00\x03\x00\x86\x00\x09\x00abc", "needs 9 bytes"),
        (b"NVDAOD\x00\x00\x02\x00\x00\x00\x03\x00\x86\x00", "length"),
        (
            b"NVDAOD\x00\x00\x02\x00\x00\x00" + b"\x03\x00\x86\x00\x01\x00a" * 2,
            "appears twice",
        ),
        (b"NVDAOD\x00\x00\x02\x00\x00\x00\x00\x00\x86\x00\x01\x00a", "not a valid type"),
    ],
)
def test_malformed_versioned(opaque: bytes, message: str) -> None:
    with pytest.raises(MalformedReportError, match=message):
        OpaqueData.parse(opaque)


def test_truncated_or_extended_report_is_malformed() -> None:
    with pytest.raises(MalformedReportError):
        AttestationReport.parse(H100[:-1])
    with pytest.raises(MalformedReportError, match="unexpected bytes after the signature"):
        AttestationReport.parse(H100 + b"\x00")


_SEEDS = [
    b"",
    H100[_opaque_span(H100)[0] : sum(_opaque_span(H100))],
    RUBIN_REPORT[_opaque_span(RUBIN_REPORT)[0] : sum(_opaque_span(RUBIN_REPORT))],
]


@settings(max_examples=300, deadline=None)
@given(
    seed=st.sampled_from(_SEEDS),
    cut=st.integers(0, 600),
    pos=st.integers(0, 600),
    byte=st.integers(0, 255),
    tail=st.binary(max_size=16),
)
def test_fuzz_opaque_raises_only_gpucc_errors(
    seed: bytes, cut: int, pos: int, byte: int, tail: bytes
) -> None:
    data = bytearray(seed[:cut] if cut < len(seed) else seed)
    if data:
        data[pos % len(data)] = byte
    try:
        parsed = OpaqueData.parse(bytes(data) + tail)
    except GpuccError:
        return
    for t in parsed.fields:
        try:
            parsed.svn(t)
        except MalformedReportError:
            pass
