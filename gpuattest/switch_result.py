"""What NVSwitch verification found: per-switch results and the verdict over all switches."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .result import Check, Judged, RuntimeMeasurement, Verdict, check_reasons, measurements_to_dict

if TYPE_CHECKING:
    from .measurements import MeasurementResult
    from .policy import Policy

__all__ = ["SwitchAttestationResult", "SwitchResult"]


@dataclass(frozen=True)
class SwitchResult:
    """Everything verified about one NVSwitch.

    Attributes:
        device_pdi: the switch's PDI (opaque type 22), as reported.
        gpu_pdis: the GPU PDIs the switch reports (opaque type 26), in report order.
    """

    index: int
    arch: str
    checks: tuple[Check, ...]
    claims: dict[str, Any] = field(repr=False)
    measurements: MeasurementResult | None
    report_digest: bytes
    bios_rim_id: str
    device_pdi: bytes
    gpu_pdis: tuple[bytes, ...]
    verdict: Verdict
    claim_notes: dict[str, str] = field(default_factory=dict, repr=False)
    #: Every measurement block of the report, ordered by index (see RuntimeMeasurement).
    runtime_measurements: tuple[RuntimeMeasurement, ...] = ()

    def check(self, check_id: str) -> Check:
        """The check with this id.

        Raises:
            KeyError: no such check.
        """
        for c in self.checks:
            if c.id == check_id:
                return c
        raise KeyError(check_id)

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why this switch is not trusted (refusals first, then undecided items)."""
        return check_reasons(self.checks)

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "index": self.index,
            "arch": self.arch,
            "verdict": str(self.verdict),
            "evidence_sha256": self.report_digest.hex(),
            "rim_ids": {"bios": self.bios_rim_id},
            "device_pdi": self.device_pdi.hex(),
            "gpu_pdis": [p.hex() for p in self.gpu_pdis],
            "claims": self.claims,
            "claim_notes": self.claim_notes,
            "checks": [c.to_dict() for c in self.checks],
            "mismatches": [m.to_dict() for m in self.measurements.mismatches]
            if self.measurements
            else [],
            **measurements_to_dict(self.runtime_measurements),
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True)
class SwitchAttestationResult(Judged):
    """The verdict over every NVSwitch of one piece of evidence."""

    verdict: Verdict
    switches: tuple[SwitchResult, ...]
    policy: Policy
    verified_at: dt.datetime
    expected_nonce: bytes | None
    source: str

    @property
    def reasons(self) -> tuple[str, ...]:
        """Per-switch reasons, prefixed with the switch index."""
        return tuple(f"Switch {s.index}: {r}" for s in self.switches for r in s.reasons)
