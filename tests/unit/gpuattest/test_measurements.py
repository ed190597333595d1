"""Tests for gpuattest.measurements with NVIDIA's real set-A data.

The runtime blocks are read from the report here directly (not through
gpuattest.report), so these tests check the comparison rules independently of
the report parser: block k (1-based) starts at byte 45 + 55 * (k - 1) and its
48-byte value starts 7 bytes into the block.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpucc.gpuattest.measurements import (
    NVDEC0_INDEX,
    MeasurementStatus,
    compare_measurements,
)
from gpucc.gpuattest.rim import MeasurementEntry, ReferenceManifest
from tests.support.samples import (
    SET_A_DRIVER_RIM,
    SET_A_PROD_VBIOS_RIM,
    SET_A_REPORT,
    SET_A_VBIOS_RIM,
)

_BLOCKS_AT = 45
_BLOCK_LEN = 55
_VALUE_AT = 7
_VALUE_LEN = 48


def set_a_runtime() -> dict[int, bytes]:
    """SPDM block Index -> value bytes, read straight from the set-A report."""
    report = bytes.fromhex(SET_A_REPORT.read_text().strip())
    assert report[37:41] == bytes.fromhex("11600000")
    count = report[41]
    assert count == 64
    blocks: dict[int, bytes] = {}
    for k in range(1, count + 1):
        block = report[_BLOCKS_AT + _BLOCK_LEN * (k - 1) :][:_BLOCK_LEN]
        assert block[0] == k, "block index byte"
        assert int.from_bytes(block[2:4], "little") == 3 + _VALUE_LEN, "measurement size"
        assert int.from_bytes(block[5:7], "little") == _VALUE_LEN, "DMTF value size"
        blocks[k] = block[_VALUE_AT : _VALUE_AT + _VALUE_LEN]
    return blocks


@pytest.fixture(scope="module")
def runtime() -> dict[int, bytes]:
    return set_a_runtime()


@pytest.fixture(scope="module")
def driver() -> ReferenceManifest:
    return ReferenceManifest.parse(SET_A_DRIVER_RIM.read_bytes())


@pytest.fixture(scope="module")
def vbios() -> ReferenceManifest:
    return ReferenceManifest.parse(SET_A_VBIOS_RIM.read_bytes())


@pytest.fixture(scope="module")
def prod_vbios() -> ReferenceManifest:
    return ReferenceManifest.parse(SET_A_PROD_VBIOS_RIM.read_bytes())


def _with_entries(rim: ReferenceManifest, change: dict[int, MeasurementEntry]) -> ReferenceManifest:
    """A copy of ``rim`` with some entries replaced (synthetic, unsigned)."""
    entries = tuple(change.get(e.index, e) for e in rim.measurements)
    return dataclasses.replace(rim, measurements=entries)


def test_runtime_blocks_shape(runtime: dict[int, bytes]) -> None:
    non_zero = {k for k, v in runtime.items() if any(v)}
    # In NVIDIA's sample set A, blocks 2-8, 10, 12, 22, 23, 26-28, 30-41 are non-zero.
    expected = {*range(2, 9), 10, 12, 22, 23, 26, 27, 28, *range(30, 42)}
    assert non_zero == expected


# --- set A: the consistent set ------------------------------------------------------


def test_set_a_matches_with_nvdec0_disabled(
    driver: ReferenceManifest, vbios: ReferenceManifest, runtime: dict[int, bytes]
) -> None:
    # Set A's opaque NVDEC0 status is 0x55: disabled.
    result = compare_measurements(driver=driver, vbios=vbios, runtime=runtime, nvdec0_disabled=True)
    assert result.status is MeasurementStatus.SUCCESS, result.reason
    assert result.ok
    assert result.golden_count == 33
    assert result.skipped == (NVDEC0_INDEX,)
    assert result.compared_count == 32
    assert result.matched_count == 32
    assert result.mismatches == ()
    assert result.conflicts == ()
    assert result.index_no_conflict is True
    assert result.reason == ""


@pytest.mark.parametrize("nvdec0", [False, None], ids=["enabled", "unknown"])
def test_set_a_matches_index_35_compared(
    driver: ReferenceManifest,
    vbios: ReferenceManifest,
    runtime: dict[int, bytes],
    nvdec0: bool | None,
) -> None:
    result = compare_measurements(
        driver=driver, vbios=vbios, runtime=runtime, nvdec0_disabled=nvdec0
    )
    assert result.ok, result.reason
    assert result.skipped == ()
    assert result.compared_count == result.matched_count == 33


def test_all_zero_golden_values_are_compared(
    vbios: ReferenceManifest, runtime: dict[int, bytes]
) -> None:
    """Active entries with an all-zero golden value match all-zero runtime blocks."""
    entry0 = vbios.entry(0)
    assert entry0 is not None and entry0.active and entry0.values == (bytes(48),)
    assert runtime[1] == bytes(48)


def test_second_alternative_matches(
    driver: ReferenceManifest, vbios: ReferenceManifest, runtime: dict[int, bytes]
) -> None:
    entry35 = driver.entry(35)
    assert entry35 is not None and entry35.alternatives == 2
    other = next(v for v in entry35.values if v != runtime[36])
    swapped = {**runtime, 36: other}
    result = compare_measurements(
        driver=driver, vbios=vbios, runtime=swapped, nvdec0_disabled=False
    )
    assert result.ok, result.reason


# --- set A with the production VBIOS RIM: the known negative ---------------------------


def test_set_a_with_prod_vbios_rim_fails_at_1_2_3_9(
    driver: ReferenceManifest, prod_vbios: ReferenceManifest, runtime: dict[int, bytes]
) -> None:
    assert prod_vbios.colloquial_version == "96.00.5E.00.01"
    result = compare_measurements(
        driver=driver, vbios=prod_vbios, runtime=runtime, nvdec0_disabled=True
    )
    assert result.status is MeasurementStatus.FAIL
    assert [m.index for m in result.mismatches] == [1, 2, 3, 9]
    assert [m.spdm_index for m in result.mismatches] == [2, 3, 4, 10]
    assert {m.source for m in result.mismatches} == {"vbios"}
    assert result.conflicts == ()
    assert result.index_no_conflict is True
    assert result.compared_count == 32
    assert result.matched_count == 28
    for m in result.mismatches:
        entry = prod_vbios.entry(m.index)
        assert entry is not None
        assert m.reason == "value"
        assert m.golden_values == tuple(v.hex() for v in entry.values)
        assert m.golden_size == 48
        assert m.runtime_value == runtime[m.index + 1].hex()
        assert m.runtime_size == 48
    assert "1 (vbios), 2 (vbios), 3 (vbios), 9 (vbios)" in result.reason
    json.dumps(result.to_dict())
    assert result.to_dict()["mismatches"][0]["spdmIndex"] == 2


# --- missing RIMs -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("has_driver", "has_vbios", "missing"),
    [
        (False, True, ("driver",)),
        (True, False, ("vbios",)),
        (False, False, ("driver", "vbios")),
    ],
    ids=["no-driver", "no-vbios", "neither"],
)
def test_missing_rim_is_not_run(
    driver: ReferenceManifest,
    vbios: ReferenceManifest,
    runtime: dict[int, bytes],
    has_driver: bool,
    has_vbios: bool,
    missing: tuple[str, ...],
) -> None:
    result = compare_measurements(
        driver=driver if has_driver else None,
        vbios=vbios if has_vbios else None,
        runtime=runtime,
        nvdec0_disabled=True,
    )
    assert result.status is MeasurementStatus.NOT_RUN
    assert result.missing_rims == missing
    assert not result.ok
    assert result.index_no_conflict is None
    assert result.mismatches == ()
    for name in missing:
        assert name in result.reason
    assert result.to_dict()["status"] == "not-run"


# --- synthetic cases ----------------------------------------------------------------------


def test_index_active_in_both_rims_is_a_conflict(
    driver: ReferenceManifest, vbios: ReferenceManifest, runtime: dict[int, bytes]
) -> None:
    # The VBIOS RIM claims index 7 too, with the very value the GPU reports:
    # every value matches, and the result must still fail.
    entry7 = vbios.entry(7)
    assert entry7 is not None and not entry7.active
    claimed = dataclasses.replace(entry7, active=True, values=(runtime[8],))
    result = compare_measurements(
        driver=driver,
        vbios=_with_entries(vbios, {7: claimed}),
        runtime=runtime,
        nvdec0_disabled=True,
    )
    assert result.status is MeasurementStatus.FAIL
    assert result.conflicts == (7,)
    assert result.index_no_conflict is False
    assert result.mismatches == ()
    assert "active in both" in result.reason
    assert result.to_dict()["index_no_conflict"] is False


def test_missing_runtime_block(
    driver: ReferenceManifest, vbios: ReferenceManifest, runtime: dict[int, bytes]
) -> None:
    partial = {k: v for k, v in runtime.items() if k != 8}
    result = compare_measurements(driver=driver, vbios=vbios, runtime=partial, nvdec0_disabled=True)
    assert result.status is MeasurementStatus.FAIL
    (m,) = result.mismatches
    assert (m.index, m.source, m.reason) == (7, "driver", "missing")
    assert m.runtime_value is None and m.runtime_size is None
    assert m.golden_values == (runtime[8].hex(),)


def test_no_runtime_blocks_at_all(driver: ReferenceManifest, vbios: ReferenceManifest) -> None:
    result = compare_measurements(driver=driver, vbios=vbios, runtime={}, nvdec0_disabled=True)
    assert result.status is MeasurementStatus.FAIL
    assert len(result.mismatches) == 32
    assert {m.reason for m in result.mismatches} == {"missing"}


def test_runtime_size_must_equal_golden_size(
    driver: ReferenceManifest, vbios: ReferenceManifest, runtime: dict[int, bytes]
) -> None:
    # A prefix of the right value, or the right value with a byte appended.
    for value in (runtime[8][:47], runtime[8] + b"\x00"):
        result = compare_measurements(
            driver=driver, vbios=vbios, runtime={**runtime, 8: value}, nvdec0_disabled=True
        )
        (m,) = result.mismatches
        assert (m.index, m.reason, m.runtime_size) == (7, "size", len(value))


def test_one_changed_byte_is_a_mismatch(
    driver: ReferenceManifest, vbios: ReferenceManifest, runtime: dict[int, bytes]
) -> None:
    value = bytearray(runtime[13])  # RIM index 12, VBIOS, four alternatives
    value[-1] ^= 0x01
    result = compare_measurements(
        driver=driver, vbios=vbios, runtime={**runtime, 13: bytes(value)}, nvdec0_disabled=True
    )
    (m,) = result.mismatches
    assert (m.index, m.source, m.reason) == (12, "vbios", "value")
    assert len(m.golden_values) == 4


def test_nvdec0_disabled_skips_only_index_35(
    driver: ReferenceManifest, vbios: ReferenceManifest, runtime: dict[int, bytes]
) -> None:
    garbage = {**runtime, 36: b"\xee" * 48}
    skipped = compare_measurements(
        driver=driver, vbios=vbios, runtime=garbage, nvdec0_disabled=True
    )
    assert skipped.ok and skipped.skipped == (35,)
    compared = compare_measurements(
        driver=driver, vbios=vbios, runtime=garbage, nvdec0_disabled=False
    )
    assert [m.index for m in compared.mismatches] == [35]


def test_upper_case_golden_hex_compares_as_bytes(
    vbios: ReferenceManifest, runtime: dict[int, bytes]
) -> None:
    raw = SET_A_DRIVER_RIM.read_bytes()
    lower = raw.split(b'index="7" ', 1)[1].split(b'ns2:Hash0="', 1)[1][:96]
    upper_rim = ReferenceManifest.parse(raw.replace(lower, lower.upper(), 1))
    result = compare_measurements(
        driver=upper_rim, vbios=vbios, runtime=runtime, nvdec0_disabled=True
    )
    assert result.ok, result.reason


def test_inactive_entries_are_ignored(
    driver: ReferenceManifest, vbios: ReferenceManifest, runtime: dict[int, bytes]
) -> None:
    # Index 41 is inactive in both RIMs; its runtime block may hold anything.
    result = compare_measurements(
        driver=driver, vbios=vbios, runtime={**runtime, 42: b"\x01" * 48}, nvdec0_disabled=True
    )
    assert result.ok


def test_no_active_entries_is_not_a_success(
    driver: ReferenceManifest, vbios: ReferenceManifest, runtime: dict[int, bytes]
) -> None:
    def inactive(rim: ReferenceManifest) -> ReferenceManifest:
        return _with_entries(
            rim, {e.index: dataclasses.replace(e, active=False) for e in rim.measurements}
        )

    result = compare_measurements(
        driver=inactive(driver), vbios=inactive(vbios), runtime=runtime, nvdec0_disabled=True
    )
    assert result.status is MeasurementStatus.FAIL
    assert result.golden_count == 0
    assert "no active" in result.reason
