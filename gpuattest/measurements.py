"""Compare a GPU's runtime measurements with the golden values of its RIMs.

Rules (as NVIDIA's verifiers apply them):

1. RIM index ``i`` is compared with SPDM measurement block ``Index = i + 1``.
2. The golden set is the active entries of the driver RIM plus the active
   entries of the VBIOS RIM.
3. An index active in both RIMs is a conflict: the comparison fails and the
   claim ``x-nvidia-gpu-vbios-index-no-conflict`` is false.
4. For every active golden entry, the runtime block must exist, its length must
   equal the golden ``size`` and its bytes must equal one of the alternatives.
   Values are compared as bytes, never as (case-sensitive) hex strings.
5. When the report says NVDEC0 is disabled (opaque type 11 is ``0x55``), index
   35 is not compared, and the result records that it was skipped.

6. A decided failure outranks missing collateral: when one RIM is missing, the
   other is still compared. A mismatch there fails the comparison (the reason
   also names the RIM that was missing); if everything that could be compared
   matches, the result is ``not-run`` and names the missing RIM, which is
   distinct from a mismatch.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucc.core.errors import MalformedReportError

from .report import OPAQUE_INDEX_BASE, SVN_VALUE_TYPE, OpaqueData

if TYPE_CHECKING:
    # Types only: importing the RIM parser (lxml, cryptography) is not needed to
    # compare or to report results, and would slow every command's start-up.
    from .rim import MeasurementEntry, ReferenceManifest

__all__ = [
    "NVDEC0_INDEX",
    "MeasurementResult",
    "MeasurementStatus",
    "MismatchRecord",
    "compare_measurements",
    "compare_roles",
    "compare_switch_measurements",
]

# RIM index of the NVDEC0 measurement, not compared when NVDEC0 is disabled.
NVDEC0_INDEX = 35


class MeasurementStatus(enum.StrEnum):
    """Outcome of the comparison, with NVIDIA's ``measres`` vocabulary."""

    SUCCESS = "success"
    FAIL = "fail"
    NOT_RUN = "not-run"


@dataclass(frozen=True)
class MismatchRecord:
    """One active golden entry the runtime evidence does not satisfy.

    Attributes:
        index: the RIM index (SPDM block ``index + 1``).
        source: ``"driver"``, ``"vbios"`` or (NVSwitch) ``"bios"``: which RIM the
            golden entry came from.
        golden_values: every golden alternative, lower-case hex.
        golden_size: the golden size in bytes.
        runtime_value: the runtime value in lower-case hex, or None when the
            block is missing.
        runtime_size: the runtime value length, or None when the block is missing.
        reason: ``"missing"``, ``"size"`` or ``"value"``; for an opaque-data entry
            (index 0x1000 or more) ``"missing"``, ``"not-svn"`` or ``"svn-below-minimum"``.
        name: the RIM entry's name (set for opaque-data entries); for a CoRIM record,
            the measurement key.
        environment: a CoRIM record's environment (empty for XML RIM records); its
            ``golden_values`` hold the reference and ``runtime_value`` the evidence, as text.
    """

    index: int
    source: str
    golden_values: tuple[str, ...]
    golden_size: int
    runtime_value: str | None
    runtime_size: int | None
    reason: str
    name: str = ""
    min_svn: int | None = None
    runtime_svn: int | None = None
    environment: str = ""

    @property
    def is_corim(self) -> bool:
        """True for a CoRIM record (environment and key, not a RIM index)."""
        return bool(self.environment)

    @property
    def label(self) -> str:
        """How a table names the record: the RIM index, or a CoRIM record's environment
        and key."""
        return f"{self.environment} [{self.name}]" if self.is_corim else str(self.index)

    @property
    def is_opaque(self) -> bool:
        """True for an opaque-data record (RIM index 0x1000 or more)."""
        return self.index >= OPAQUE_INDEX_BASE

    def opaque_dict(self) -> dict[str, Any]:
        """NVIDIA's ``x-nvidia-mismatch-opaque-data-records`` entry: ``id`` (the opaque
        type), ``name``, ``goldenType``/``goldenValue`` (``MIN_SVN`` and the floor),
        ``runtimeType``/``runtimeValue`` (``MIN_SVN`` and the SVN, or the raw hex and
        ``RAW`` when the entry is not an SVN, null when absent)."""
        svn = self.runtime_svn is not None
        return {
            "id": self.index - OPAQUE_INDEX_BASE,
            "name": self.name,
            "goldenType": "MIN_SVN",
            "goldenValue": self.min_svn,
            "runtimeType": "MIN_SVN" if svn else ("RAW" if self.runtime_value else None),
            "runtimeValue": self.runtime_svn if svn else self.runtime_value,
        }

    @property
    def spdm_index(self) -> int | None:
        """The SPDM measurement block index this record refers to (None for an
        opaque-data entry, which names an opaque type, not a block)."""
        return None if self.index >= OPAQUE_INDEX_BASE else self.index + 1

    @property
    def measurement_source(self) -> str:
        """NVIDIA's name for the source: ``"Driver"``, ``"Firmware"`` for the VBIOS,
        ``"CoRIM"`` for a CoRIM record."""
        if self.is_corim:
            return "CoRIM"
        return "Driver" if self.source == "driver" else "Firmware"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: NVAT's record (``index``, ``goldenValue`` (the first
        alternative), ``goldenSize``, ``runtimeValue``, ``runtimeSize``,
        ``measurementSource``) and, beside it, every golden alternative, the SPDM block
        index and why the entry failed. A CoRIM record is its environment, key, reference,
        evidence and reason."""
        if self.is_corim:
            return {
                "environment": self.environment,
                "key": self.name,
                "reference": self.golden_values[0] if self.golden_values else None,
                "evidence": self.runtime_value,
                "measurementSource": self.measurement_source,
                "reason": self.reason,
            }
        return {
            "index": self.index,
            "goldenValue": self.golden_values[0] if self.golden_values else None,
            "goldenSize": self.golden_size,
            "runtimeValue": self.runtime_value,
            "runtimeSize": self.runtime_size,
            "measurementSource": self.measurement_source,
            "goldenValues": list(self.golden_values),
            "spdmIndex": self.spdm_index,
            "reason": self.reason,
            **({"name": self.name} if self.name else {}),
        }


@dataclass(frozen=True)
class MeasurementResult:
    """Outcome of comparing runtime measurements with both RIMs.

    Attributes:
        status: success, fail, or not-run (a RIM is missing).
        reason: one line explaining a fail or not-run; empty on success.
        missing_rims: which RIMs were not supplied (``"driver"``, ``"vbios"``).
        mismatches: the entries that did not match, ordered by index then source.
        conflicts: RIM indices active in both RIMs, ascending.
        skipped: RIM indices deliberately not compared (NVDEC0 disabled).
        golden_count: active golden entries in both RIMs together.
        compared_count: entries actually compared (golden minus skipped).
        matched_count: compared entries that matched.
        nvdec0_disabled: the NVDEC0 state the comparison used (None: unknown,
            so index 35 was compared).
    """

    status: MeasurementStatus
    reason: str
    missing_rims: tuple[str, ...]
    mismatches: tuple[MismatchRecord, ...]
    conflicts: tuple[int, ...]
    skipped: tuple[int, ...]
    golden_count: int
    compared_count: int
    matched_count: int
    nvdec0_disabled: bool | None

    @property
    def ok(self) -> bool:
        """True only for a successful comparison."""
        return self.status is MeasurementStatus.SUCCESS

    @property
    def index_no_conflict(self) -> bool | None:
        """Claim ``x-nvidia-gpu-vbios-index-no-conflict``; None when not run."""
        if self.status is MeasurementStatus.NOT_RUN:
            return None
        return not self.conflicts

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "status": str(self.status),
            "reason": self.reason,
            "missing_rims": list(self.missing_rims),
            "index_no_conflict": self.index_no_conflict,
            "golden_count": self.golden_count,
            "compared_count": self.compared_count,
            "matched_count": self.matched_count,
            "skipped": list(self.skipped),
            "conflicts": list(self.conflicts),
            "nvdec0_disabled": self.nvdec0_disabled,
            "mismatches": [m.to_dict() for m in self.mismatches],
        }


def _check_svn(
    entry: MeasurementEntry, source: str, opaque: OpaqueData | None
) -> MismatchRecord | None:
    """An opaque-data entry: the report's opaque value of that type must be present, of
    the SVN value type and at least ``minSvn``."""
    opaque_type, floor = entry.opaque_type, entry.min_svn
    if opaque_type is None or floor is None:
        raise ValueError(f"RIM index {entry.index} is not an opaque-data entry")
    fields = opaque.fields if opaque is not None else {}
    raw = fields.get(opaque_type)
    if raw is None:
        reason, runtime, svn = "missing", None, None
    elif opaque is None or opaque.value_types.get(opaque_type) != SVN_VALUE_TYPE:
        reason, runtime, svn = "not-svn", raw, None
    else:
        try:
            svn = opaque.svn(opaque_type)
        except MalformedReportError:
            svn = None
        if svn is not None and svn >= floor:
            return None
        reason, runtime = ("svn-below-minimum" if svn is not None else "not-svn"), raw
    return MismatchRecord(
        index=entry.index,
        source=source,
        golden_values=(f"svn>={floor}",),
        golden_size=len(runtime) if runtime is not None else 0,
        runtime_value=runtime.hex() if runtime is not None else None,
        runtime_size=len(runtime) if runtime is not None else None,
        reason=reason,
        name=entry.name or f"opaque type {opaque_type}",
        min_svn=floor,
        runtime_svn=svn if reason == "svn-below-minimum" else None,
    )


def _check(entry: MeasurementEntry, source: str, runtime: bytes | None) -> MismatchRecord | None:
    """None when ``runtime`` satisfies ``entry``; otherwise the mismatch record."""
    if runtime is not None and entry.matches(runtime):
        return None
    if runtime is None:
        reason = "missing"
    elif len(runtime) != entry.size:
        reason = "size"
    else:
        reason = "value"
    return MismatchRecord(
        index=entry.index,
        source=source,
        golden_values=tuple(v.hex() for v in entry.values),
        golden_size=entry.size,
        runtime_value=runtime.hex() if runtime is not None else None,
        runtime_size=len(runtime) if runtime is not None else None,
        reason=reason,
    )


def compare_measurements(
    *,
    driver: ReferenceManifest | None,
    vbios: ReferenceManifest | None,
    runtime: Mapping[int, bytes],
    nvdec0_disabled: bool | None,
) -> MeasurementResult:
    """Compare runtime SPDM measurement values with the active golden values.

    Args:
        driver: the driver RIM, or None when it could not be obtained.
        vbios: the VBIOS RIM, or None when it could not be obtained.
        runtime: SPDM block ``Index`` (1-based) to the measurement value bytes.
        nvdec0_disabled: True when the report says NVDEC0 is disabled (index 35
            is then skipped), False when enabled, None when the report does not
            say (index 35 is compared).

    Returns:
        A :class:`MeasurementResult`. Mismatches, conflicts and missing RIMs are
        results, never exceptions; this function does not raise.
    """
    rims = {"driver": driver, "vbios": vbios}
    return _compare(rims, runtime, nvdec0_disabled)


def compare_roles(
    rims: Mapping[str, ReferenceManifest | None],
    runtime: Mapping[int, bytes],
    nvdec0_disabled: bool | None = None,
    opaque: OpaqueData | None = None,
) -> MeasurementResult:
    """Compare ``runtime`` with the RIMs of a device profile's roles (role name to the
    RIM, None when it could not be obtained); mismatch records name the role. RIM
    entries that name an opaque type (``minSvn``) are checked against ``opaque``."""
    return _compare(rims, runtime, nvdec0_disabled, opaque)


def compare_switch_measurements(
    *, bios: ReferenceManifest | None, runtime: Mapping[int, bytes]
) -> MeasurementResult:
    """Compare an NVSwitch's runtime measurements with its one BIOS RIM (a switch has no
    driver RIM and no NVDEC0).

    Returns:
        A :class:`MeasurementResult` whose mismatch records name the source ``"bios"``.
    """
    return _compare({"bios": bios}, runtime, None)


def _not_run(missing: tuple[str, ...], nvdec0_disabled: bool | None) -> MeasurementResult:
    return MeasurementResult(
        status=MeasurementStatus.NOT_RUN,
        reason=f"reference values unavailable: no {' and no '.join(missing)} RIM",
        missing_rims=missing,
        mismatches=(),
        conflicts=(),
        skipped=(),
        golden_count=0,
        compared_count=0,
        matched_count=0,
        nvdec0_disabled=nvdec0_disabled,
    )


def _compare(
    rims: Mapping[str, ReferenceManifest | None],
    runtime: Mapping[int, bytes],
    nvdec0_disabled: bool | None,
    opaque: OpaqueData | None = None,
) -> MeasurementResult:
    """Compare every RIM that is there; a missing one leaves the result not-run unless
    what could be compared already failed (a decided failure outranks missing collateral)."""
    order = tuple(rims)
    missing = tuple(name for name, rim in rims.items() if rim is None)
    present = [(name, rim) for name, rim in rims.items() if rim is not None]
    if not present:
        return _not_run(missing, nvdec0_disabled)
    conflicts: tuple[int, ...] = ()
    if len(present) == 2:
        conflicts = tuple(sorted(present[0][1].active_indices & present[1][1].active_indices))
    golden = [(e, name) for name, rim in present for e in rim.active]
    golden.sort(key=lambda pair: (pair[0].index, order.index(pair[1])))

    mismatches: list[MismatchRecord] = []
    skipped: set[int] = set()
    compared = 0
    for entry, source in golden:
        if nvdec0_disabled is True and entry.index == NVDEC0_INDEX:
            skipped.add(entry.index)
            continue
        compared += 1
        if entry.min_svn is not None:
            record = _check_svn(entry, source, opaque)
        else:
            record = _check(entry, source, runtime.get(entry.index + 1))
        if record is not None:
            mismatches.append(record)

    problems: list[str] = []
    if compared == 0 and not missing:
        # Vacuous success would let two empty RIMs vouch for any GPU.
        problems.append("the RIMs have no active measurements to compare")
    if conflicts:
        problems.append("indices active in both RIMs: " + ", ".join(str(i) for i in conflicts))
    if mismatches:
        problems.append(
            "measurement mismatch at RIM indices "
            + ", ".join(f"{m.index} ({m.source})" for m in mismatches)
        )
    if missing and not problems:
        # Nothing that could be compared failed, but the rest cannot be judged.
        partial = _not_run(missing, nvdec0_disabled)
        present_names = " and ".join(name for name, _ in present)
        return MeasurementResult(
            status=MeasurementStatus.NOT_RUN,
            reason=f"{partial.reason}; the {compared} golden values of the {present_names} "
            "RIM that could be compared match",
            missing_rims=missing,
            mismatches=(),
            conflicts=(),
            skipped=tuple(sorted(skipped)),
            golden_count=len(golden),
            compared_count=compared,
            matched_count=compared,
            nvdec0_disabled=nvdec0_disabled,
        )
    if missing:
        problems.append(f"not compared: no {' and no '.join(missing)} RIM")
    return MeasurementResult(
        status=MeasurementStatus.FAIL if problems else MeasurementStatus.SUCCESS,
        reason="; ".join(problems),
        missing_rims=missing,
        mismatches=tuple(mismatches),
        conflicts=conflicts,
        skipped=tuple(sorted(skipped)),
        golden_count=len(golden),
        compared_count=compared,
        matched_count=compared - len(mismatches),
        nvdec0_disabled=nvdec0_disabled,
    )
