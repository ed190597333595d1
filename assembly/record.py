"""What a decision trusted: the policy's relaxations it used, its time and whose roots.

Every :class:`~gpucc.assembly.verifier.PlatformResult` carries a :class:`TrustRecord`, and a
key release combines the records of the results it relied on (:func:`release_record`).
Front ends put it, whole, in every JSON document, holder log line, signed answer and journey
log entry, and in the human output; quiet output never hides it.

A relaxation is *used* when a check was accepted only because the policy allowed something
the strict default refuses (``ocsp.require: false``, ``cvm.accept_tcb_status: OutOfDate``,
``cvm.allow_unpinned: true``, ...), or when the key-release protocol accepted GPU-only
evidence (``cvm.allow_gpu_only: true``). A relaxation merely present in the policy, that no
check needed, is not listed.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpucc.gpuattest.result import Check

__all__ = ["Relaxation", "Roots", "TrustRecord", "release_record"]

GPU_ONLY = "cvm.allow_gpu_only: true"


class Roots(enum.StrEnum):
    """Whose trust anchors a decision used."""

    VENDOR = "vendor"  # NVIDIA's, Intel's and AMD's pinned roots
    SIMULATED = "simulated"  # a simulation's self-made roots: attests nothing real
    GIVEN = "given"  # roots the caller passed in (tests, private PKIs)


@dataclass(frozen=True)
class Relaxation:
    """One policy relaxation a decision relied on.

    Attributes:
        item: the policy item and the value used (``ocsp.require: false``).
        part: what it applied to (``GPU 0``, ``CVM``, ``offer``).
        check: the check it accepted (``gpu-ocsp``, ``cvm-tcb``, ...).
    """

    item: str
    part: str
    check: str

    def to_dict(self) -> dict[str, str]:
        """JSON form."""
        return {"item": self.item, "part": self.part, "check": self.check}

    def __str__(self) -> str:
        return f"{self.item} ({self.part}, {self.check})"


@dataclass(frozen=True)
class TrustRecord:
    """What one decision trusted.

    Attributes:
        relaxations: every relaxation used, in check order.
        verified_at: the verification time.
        time_source: ``clock`` (read at the decision) or ``given`` (fixed by the caller).
        time_origin: where a given time came from (``--at or GPUCC_AT``, ``api``).
        roots: whose trust anchors were used.
    """

    relaxations: tuple[Relaxation, ...]
    verified_at: dt.datetime
    time_source: str
    time_origin: str
    roots: Roots

    @property
    def strict(self) -> bool:
        """Nothing relaxed, the clock's time, the vendors' roots."""
        return not self.relaxations and self.time_source == "clock" and self.roots is Roots.VENDOR

    @property
    def simulated(self) -> bool:
        """A simulation's self-made roots were trusted."""
        return self.roots is Roots.SIMULATED

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the ``trusted_with`` member of gpucc's documents)."""
        return {
            "relaxations": [r.to_dict() for r in self.relaxations],
            "verified_at": self.verified_at.isoformat().replace("+00:00", "Z"),
            "time_source": self.time_source,
            "time_origin": self.time_origin or None,
            "roots": str(self.roots),
            "simulated": self.simulated,
        }

    def summary(self) -> str:
        """One line for people: what was relaxed, the time used, and simulated roots."""
        parts = []
        if self.simulated:
            parts.append("SIMULATED roots (attests nothing real)")
        elif self.roots is Roots.GIVEN:
            parts.append("roots given by the caller, not the vendors'")
        if self.relaxations:
            items = sorted({r.item for r in self.relaxations})
            parts.append(f"policy relaxations used: {'; '.join(items)}")
        else:
            parts.append("no policy relaxation used")
        at = self.verified_at.isoformat().replace("+00:00", "Z")
        if self.time_source == "clock":
            parts.append(f"verified at {at} (clock)")
        else:
            parts.append(f"verified as of {at} (given: {self.time_origin or 'by the caller'})")
        return "; ".join(parts)

    def with_relaxation(self, relaxation: Relaxation) -> TrustRecord:
        """This record with one more relaxation used."""
        return replace(self, relaxations=(*self.relaxations, relaxation))


def relaxations_of(checks: Iterable[Check], part: str) -> tuple[Relaxation, ...]:
    """The relaxations accepted checks relied on."""
    from gpucc.gpuattest.result import Decision

    found = []
    for check in checks:
        if check.relaxation and check.decision is Decision.ACCEPT:
            for item in check.relaxation.split("; "):
                found.append(Relaxation(item=item, part=part, check=check.id))
    return tuple(found)


def release_record(records: Iterable[TrustRecord], *, gpu_only: bool) -> TrustRecord:
    """One key release's record: the records of the results it relied on (the GPUs' and the
    CVM's), and ``cvm.allow_gpu_only`` when it accepted GPU-only evidence.

    Raises:
        ValueError: no record was given.
    """
    given = list(records)
    if not given:
        raise ValueError("a release relies on at least one verification")
    first = given[0]
    relaxations = tuple(r for record in given for r in record.relaxations)
    if gpu_only:
        relaxations += (Relaxation(item=GPU_ONLY, part="offer", check="cvm-evidence"),)
    roots = next((r.roots for r in given if r.roots is not Roots.VENDOR), Roots.VENDOR)
    return TrustRecord(
        relaxations=relaxations,
        verified_at=first.verified_at,
        time_source=first.time_source,
        time_origin=first.time_origin,
        roots=roots,
    )
