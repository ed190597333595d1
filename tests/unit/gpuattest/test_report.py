"""The report parser on NVIDIA's real reports and on generated malformations."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucc.core.errors import MalformedReportError
from gpucc.gpuattest.report import Architecture, AttestationReport, decode_vbios_version
from tests.support.samples import HEAD_NONCE, HEAD_REPORT, SET_A_NONCE, SET_A_REPORT, report_bytes

SET_A = report_bytes(SET_A_REPORT)
HEAD = report_bytes(HEAD_REPORT)
OPAQUE_START = 3599  # for 64-block GPU reports


def test_set_a_fields_match_nvidia_documentation() -> None:
    r = AttestationReport.parse(SET_A)
    assert len(r.raw) == 4049
    assert r.nonce.hex() == SET_A_NONCE
    assert r.responder_nonce.hex().startswith("1020ecb8f64dcfd5")
    assert r.driver_version == "545.00"
    assert r.vbios_version == "96.00.5E.00.01"
    assert (r.project, r.project_sku, r.chip_sku) == ("1010", "0200", "882")
    assert r.fwid is None
    assert r.nvdec0_disabled is True
    assert sorted(r.opaque) == [3, 4, 6, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    assert r.driver_rim_id() == "NV_GPU_DRIVER_GH100_545.00"
    assert r.vbios_rim_id() == "NV_GPU_VBIOS_1010_0200_882_96005E0001"
    nonzero = sorted(i for i, b in r.blocks.items() if any(b.value))
    assert nonzero == [2, 3, 4, 5, 6, 7, 8, 10, 12, 22, 23, 26, 27, 28, *range(30, 42)]
    assert len(r.blocks) == 64 and all(len(b.value) == 48 for b in r.blocks.values())


def test_head_sample_fields() -> None:
    r = AttestationReport.parse(HEAD)
    assert r.nonce.hex() == HEAD_NONCE
    assert r.driver_version == "550.90.07"
    assert r.vbios_rim_id() == "NV_GPU_VBIOS_1010_0200_882_96009F0001"
    assert r.fwid is not None and r.fwid.hex().startswith("f5c384aebb579217")
    assert r.blocks[2].value.hex().startswith("8048dfd18fe229bf")
    assert r.signed_bytes + r.signature == HEAD and len(r.signature) == 96


def test_blackwell_driver_rim_id_rules() -> None:
    r = AttestationReport.parse(HEAD)
    assert r.driver_rim_id(Architecture.BLACKWELL) == "NV_GPU_CC_DRIVER_GB100_550.90.07"


def test_vbios_decoding() -> None:
    assert decode_vbios_version(bytes.fromhex("009f009601000000")) == "96.00.9F.00.01"
    with pytest.raises(MalformedReportError):
        decode_vbios_version(b"\x00" * 7)


@pytest.mark.parametrize("cut", [1, 50, 96, 97, 500, 3000, 4048])
def test_truncated_reports_are_malformed(cut: int) -> None:
    with pytest.raises(MalformedReportError):
        AttestationReport.parse(SET_A[:-cut])


@pytest.mark.parametrize("extra", [b"\x00", b"\xff" * 96])
def test_trailing_bytes_are_malformed(extra: bytes) -> None:
    with pytest.raises(MalformedReportError, match="after the signature"):
        AttestationReport.parse(SET_A + extra)


def _patch(data: bytes, offset: int, new: bytes) -> bytes:
    return data[:offset] + new + data[offset + len(new) :]


@pytest.mark.parametrize(
    ("offset", "value"),
    [
        (0, b"\x12"),  # request version
        (1, b"\xe1"),  # request code
        (37, b"\x10"),  # response version
        (38, b"\x61"),  # response code
        (42, b"\x40\x00\x00"[:1] + b"\x0d\xc1"),  # record length +1
        (42, b"\xff\xff\xff"),  # record length beyond the data
        (45 + 2, struct.pack("<H", 52)),  # block 1 size
        (45 + 5, struct.pack("<H", 47)),  # block 1 value size
        (45 + 1, b"\x02"),  # block 1 not DMTF
        (45 + 55, b"\x01"),  # block 2 repeats index 1
        (3597, struct.pack("<H", 0xFFFF)),  # opaque length
        (3597, struct.pack("<H", 353)),  # opaque length one short
        (OPAQUE_START + 2, struct.pack("<H", 0xFFF0)),  # first TLV length
        (OPAQUE_START, struct.pack("<H", 0)),  # TLV type 0
    ],
)
def test_corrupt_lengths_and_headers_are_malformed(offset: int, value: bytes) -> None:
    with pytest.raises(MalformedReportError):
        AttestationReport.parse(_patch(SET_A, offset, value))


def _tlv_offset(data: bytes, wanted: int) -> int:
    """File offset of the TLV of type ``wanted`` (walking the real opaque data)."""
    pos = OPAQUE_START
    end = OPAQUE_START + struct.unpack_from("<H", data, OPAQUE_START - 2)[0]
    while pos < end:
        t, length = struct.unpack_from("<HH", data, pos)
        if t == wanted:
            return pos
        pos += 4 + length
    raise AssertionError(f"type {wanted} not in sample")


def test_duplicate_tlv_is_malformed() -> None:
    # Relabel GPU_INFO (type 4) as DRIVER_VERSION (type 3), which is also present.
    with pytest.raises(MalformedReportError, match="twice"):
        AttestationReport.parse(_patch(SET_A, _tlv_offset(SET_A, 4), struct.pack("<H", 3)))


def test_unknown_tlv_type_is_tolerated() -> None:
    # Relabel GPU_INFO (type 4, not required) as an unassigned type 200.
    r = AttestationReport.parse(_patch(SET_A, _tlv_offset(SET_A, 4), struct.pack("<H", 200)))
    assert r.unknown_types == (200,)
    assert r.driver_version == "545.00"


def test_missing_required_tlv_is_malformed() -> None:
    # Relabel DRIVER_VERSION (type 3) as an unknown type: now it is missing.
    with pytest.raises(MalformedReportError, match="DRIVER_VERSION"):
        AttestationReport.parse(_patch(SET_A, _tlv_offset(SET_A, 3), struct.pack("<H", 201)))


def test_tlv_running_past_opaque_data_is_malformed() -> None:
    off = _tlv_offset(SET_A, 14)
    with pytest.raises(MalformedReportError):
        AttestationReport.parse(_patch(SET_A, off + 2, struct.pack("<H", 400)))


def test_oversized_report_is_malformed() -> None:
    with pytest.raises(MalformedReportError, match="maximum"):
        AttestationReport.parse(SET_A + bytes(0x2000))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    sample=st.sampled_from([SET_A, HEAD]),
)
def test_fuzz_mutated_reports_raise_only_documented_errors(
    data: st.DataObject, sample: bytes
) -> None:
    mutated = bytearray(sample)
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, len(mutated) - 1))
        mutated[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(mutated)))
    candidate = bytes(mutated[:cut]) if data.draw(st.booleans()) else bytes(mutated)
    try:
        AttestationReport.parse(candidate)
    except MalformedReportError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=5000))
def test_fuzz_random_bytes(blob: bytes) -> None:
    try:
        AttestationReport.parse(blob)
    except MalformedReportError:
        pass
