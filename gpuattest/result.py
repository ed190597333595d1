"""What verification found: checks, per-GPU results, the overall verdict, and their JSON.

These are plain value objects. How a verdict is reported (an exit status, a
colour) is up to the front end that shows it.
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Types only: the CLI imports verdicts at start-up, before any verification.
    from .measurements import MeasurementResult
    from .policy import Policy

__all__ = [
    "CLAIMS_VERSION",
    "AttestationResult",
    "Check",
    "CheckStatus",
    "Decision",
    "GpuResult",
    "Judged",
    "RuntimeMeasurement",
    "Verdict",
    "check_reasons",
    "combine_verdicts",
    "measurements_to_dict",
    "runtime_measurements_of",
]

# NVIDIA's claims version whose names the per-GPU claims use (EAT ``x-nvidia-ver``).
CLAIMS_VERSION = "3.0"


class CheckStatus(enum.StrEnum):
    """What a check found."""

    PASS = "pass"  # noqa: S105 - a check status, not a password
    FAIL = "fail"
    NOT_CHECKED = "not-checked"
    NOT_PRESENT = "not-present"


class Decision(enum.StrEnum):
    """What the policy made of a check."""

    ACCEPT = "accept"
    REFUSE = "refuse"
    UNDECIDED = "undecided"


class Judged:
    """What every result of the family shares: ``trusted`` and ``undecided``, read from its
    ``verdict`` (a GPU set's, a switch set's, the topology's, a CVM's, a platform's)."""

    verdict: Verdict

    @property
    def trusted(self) -> bool:
        """True only when every check was accepted."""
        return self.verdict is Verdict.TRUSTED

    @property
    def undecided(self) -> bool:
        """Nothing was refused, but something could not be decided (collateral, time)."""
        return self.verdict is Verdict.UNDECIDED


class Verdict(enum.StrEnum):
    """Overall outcome."""

    TRUSTED = "trusted"
    NOT_TRUSTED = "not-trusted"
    UNDECIDED = "undecided"


@dataclass(frozen=True)
class Check:
    """One verification step's result and the policy's decision on it."""

    id: str
    title: str
    status: CheckStatus
    reason: str = ""
    collateral_missing: bool = False
    decision: Decision = Decision.REFUSE
    note: str = ""
    #: The policy item that accepted what the strict default would not (``ocsp.require:
    #: false``, ``cvm.accept_tcb_status: OutOfDate``, ...); empty when none was needed.
    relaxation: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "id": self.id,
            "title": self.title,
            "status": str(self.status),
            "decision": str(self.decision),
            "reason": self.reason,
            "collateral_missing": self.collateral_missing,
            "policy_note": self.note,
            "relaxation": self.relaxation or None,
        }


@dataclass(frozen=True)
class RuntimeMeasurement:
    """One measurement block of a device's attestation report, as the device reported it.

    ``authenticated`` is True only when the report's signature verified with the leaf key
    of a device certificate chain that validated and that OCSP did not find revoked:
    otherwise anyone could have written the value, and the JSON form lists it under
    ``unverified_runtime_measurements`` instead of ``runtime_measurements`` (see
    :func:`measurements_to_dict`).
    """

    index: int
    value: bytes
    authenticated: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the block index and its value in full lowercase hex."""
        return {"index": self.index, "value": self.value.hex()}


def runtime_measurements_of(
    blocks: dict[int, bytes], checks: list[Check] | tuple[Check, ...]
) -> tuple[RuntimeMeasurement, ...]:
    """The report's blocks ordered by index, authenticated only when the checks
    ``device-chain`` and ``report-signature`` both passed and ``device-ocsp`` did not
    fail (a revoked chain vouches for nothing; OCSP not checked is its own reported check)."""
    passed = {c.id for c in checks if c.status is CheckStatus.PASS}
    failed = {c.id for c in checks if c.status is CheckStatus.FAIL}
    authenticated = {"device-chain", "report-signature"} <= passed and "device-ocsp" not in failed
    return tuple(RuntimeMeasurement(i, blocks[i], authenticated) for i in sorted(blocks))


def measurements_to_dict(measurements: tuple[RuntimeMeasurement, ...]) -> dict[str, Any]:
    """The two JSON lists: ``runtime_measurements`` holds only authenticated values,
    ``unverified_runtime_measurements`` those of a report that did not authenticate,
    so a reader of the first can never take an unverified value for a verified one."""
    return {
        "runtime_measurements": [m.to_dict() for m in measurements if m.authenticated],
        "unverified_runtime_measurements": [
            m.to_dict() for m in measurements if not m.authenticated
        ],
    }


@dataclass(frozen=True)
class GpuResult:
    """Everything verified about one GPU."""

    index: int
    uuid: str | None
    arch: str
    checks: tuple[Check, ...]
    claims: dict[str, Any] = field(repr=False)
    measurements: MeasurementResult | None
    report_digest: bytes
    driver_rim_id: str
    vbios_rim_id: str
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
        """Why this GPU is not trusted (refusals first, then undecided items)."""
        return check_reasons(self.checks)

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "index": self.index,
            "uuid": self.uuid,
            "arch": self.arch,
            "verdict": str(self.verdict),
            "evidence_sha256": self.report_digest.hex(),
            "rim_ids": {"driver": self.driver_rim_id, "vbios": self.vbios_rim_id},
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
class AttestationResult(Judged):
    """The verdict over every GPU of one piece of evidence."""

    verdict: Verdict
    gpus: tuple[GpuResult, ...]
    policy: Policy
    verified_at: dt.datetime
    expected_nonce: bytes | None
    source: str

    @property
    def reasons(self) -> tuple[str, ...]:
        """Per-GPU reasons, prefixed with the GPU index."""
        return tuple(f"GPU {g.index}: {r}" for g in self.gpus for r in g.reasons)

    def to_dict(self) -> dict[str, Any]:
        """The ``gpucc.attest/v1`` document, less what only a command line knows.

        A front end that reports an exit status adds it under ``exit_code``, right
        after ``trusted`` (see the CLI's renderer).
        """
        return {
            "schema": "gpucc.attest/v1",
            "verdict": str(self.verdict),
            "trusted": self.trusted,
            "x-nvidia-overall-att-result": self.trusted,
            "x-nvidia-ver": CLAIMS_VERSION,
            "verified_at": self.verified_at.isoformat().replace("+00:00", "Z"),
            "nonce": self.expected_nonce.hex() if self.expected_nonce is not None else None,
            "evidence_source": self.source,
            "policy": self.policy.to_dict(),
            "reasons": list(self.reasons),
            "gpus": [g.to_dict() for g in self.gpus],
            "cvm": None,  # no CVM evidence here (see gpucc.assembly.PlatformResult)
        }


def check_reasons(checks: tuple[Check, ...]) -> tuple[str, ...]:
    """``title: reason`` of every refused check, then of every undecided one."""
    refused = [f"{c.title}: {c.reason}" for c in checks if c.decision is Decision.REFUSE]
    undecided = [f"{c.title}: {c.reason}" for c in checks if c.decision is Decision.UNDECIDED]
    return tuple(refused + undecided)


def combine_verdicts(verdicts: list[Verdict] | tuple[Verdict, ...]) -> Verdict:
    """Any not-trusted wins, then any undecided; trusted only when all are trusted."""
    if any(v is Verdict.NOT_TRUSTED for v in verdicts):
        return Verdict.NOT_TRUSTED
    if any(v is Verdict.UNDECIDED for v in verdicts):
        return Verdict.UNDECIDED
    return Verdict.TRUSTED
