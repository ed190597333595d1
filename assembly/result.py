"""A platform's evidence and its one verdict: the values :class:`PlatformVerifier` takes and
returns (:mod:`gpucc.assembly.verifier`), each device's result, the CVM's, and the record of
what the verdict trusted.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpucc.gpuattest.result import AttestationResult, Judged, Verdict

from .record import Roots, TrustRecord, relaxations_of
from .settings import TimeSource

if TYPE_CHECKING:
    from gpucc.gpuattest.cvm.appraise import CvmResult
    from gpucc.gpuattest.evidence import EvidenceSet
    from gpucc.gpuattest.policy import Policy
    from gpucc.gpuattest.result import GpuResult
    from gpucc.gpuattest.switch_result import SwitchAttestationResult
    from gpucc.gpuattest.topology import TopologyResult

    from .parts import Part

__all__ = ["PlatformEvidence", "PlatformResult", "relaxations_in"]


@dataclass(frozen=True)
class PlatformEvidence:
    """What one platform presents: its GPUs' evidence and its CVM's (either may be absent).

    Attributes:
        gpus: every GPU's reports and chains.
        cvm: the CVM's TDX quote or SEV-SNP report, raw.
        cvm_collateral: collateral that came with the CVM evidence (the settings' own
            collateral, when given, replaces it).
        cvm_event_log: the CVM's CC event log (TDX: the ACPI CCEL table's log), replayed
            against the quote's RTMRs and judged by the policy's ``cvm.events``.
        source: where the evidence came from (``file``, ``nvml``, ``offer``, ...).
        switches: every NVSwitch's reports and chains (switch entries in ``gpus``, as a
            PPCIe machine's evidence file or offer carries them, are moved here).
    """

    gpus: EvidenceSet | None = None
    cvm: bytes | None = field(default=None, repr=False)
    cvm_collateral: bytes | None = field(default=None, repr=False)
    cvm_event_log: bytes | None = field(default=None, repr=False)
    source: str = "file"
    switches: EvidenceSet | None = None


#: The ``gpucc.attest/v1`` document's part slots when the default kinds are registered
#: (:attr:`gpucc.assembly.parts.PartRegistry.slots`): each key, and whether it is a list.
DEFAULT_SLOTS: tuple[tuple[str, bool], ...] = (
    ("gpus", True),
    ("cvm", False),
    ("switches", True),
    ("topology", False),
)


@dataclass(frozen=True)
class PlatformResult(Judged):
    """One platform's verdict: each part's result, and the combined verdict.

    Attributes:
        verdict: the combined verdict.
        parts: every verified part (:class:`~gpucc.assembly.parts.Part`: its kind and its
            result), in report order: the CVM, the devices, the topology.
        policy: the policy applied.
        verified_at: the verification time.
        time_source: whether that time was the clock or given by the caller.
        simulated: whether a simulation's self-made roots were trusted.
        expected_nonce: the GPU nonce required.
        source: where the evidence came from.
        record: what the verdict trusted: relaxations used, time, roots.
        slots: the document's part slots, in order (the registry's).
    """

    verdict: Verdict
    parts: tuple[Part, ...]
    policy: Policy
    verified_at: dt.datetime
    time_source: TimeSource
    simulated: bool
    expected_nonce: bytes | None
    source: str
    record: TrustRecord
    slots: tuple[tuple[str, bool], ...] = DEFAULT_SLOTS

    @classmethod
    def of_gpus(cls, result: AttestationResult) -> PlatformResult:
        """A platform result holding the GPUs' result alone (verified at the time the
        caller gave :func:`gpucc.gpuattest.verifier.verify`)."""
        from .parts import GpuPart, Part

        parts = (Part(GpuPart(), result),)
        return cls(
            verdict=result.verdict,
            parts=parts,
            policy=result.policy,
            verified_at=result.verified_at,
            time_source=TimeSource.GIVEN,
            simulated=False,
            expected_nonce=result.expected_nonce,
            source=result.source,
            record=TrustRecord(
                relaxations=relaxations_in(parts),
                verified_at=result.verified_at,
                time_source=str(TimeSource.GIVEN),
                time_origin="the caller",
                roots=Roots.GIVEN,
            ),
        )

    def part(self, name: str) -> Part | None:
        """The part of the kind named ``name`` (``gpu``, ``nvswitch``, ``tdx``, ...), if any."""
        return next((p for p in self.parts if p.kind.name == name), None)

    @property
    def gpu(self) -> AttestationResult | None:
        """The GPUs' result (None: no GPU evidence was verified)."""
        part = self.part("gpu")
        return part.result if part is not None else None

    @property
    def cvm(self) -> CvmResult | None:
        """The CVM's result (None: no CVM evidence was verified)."""
        part = next((p for p in self.parts if p.kind.slot == "cvm"), None)
        return part.result if part is not None else None

    @property
    def switch(self) -> SwitchAttestationResult | None:
        """The NVSwitches' result (None: no switch evidence was verified)."""
        part = self.part("nvswitch")
        return part.result if part is not None else None

    @property
    def topology(self) -> TopologyResult | None:
        """The Protected PCIe topology checks (None: the policy does not ask for PPCIe,
        ``topology.ppcie``)."""
        part = self.part("topology")
        return part.result if part is not None else None

    @property
    def gpus(self) -> tuple[GpuResult, ...]:
        """Per GPU, in evidence order."""
        return self.gpu.gpus if self.gpu is not None else ()

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why not trusted: each part's reasons, in report order (the CVM's first)."""
        return tuple(r for p in self.parts for r in p.reasons)

    def to_dict(self) -> dict[str, Any]:
        """The ``gpucc.attest/v1`` document, less what only a command line knows."""
        document: dict[str, Any] = {
            "schema": "gpucc.attest/v1",
            "verdict": str(self.verdict),
            "trusted": self.trusted,
            "x-nvidia-overall-att-result": self.trusted,
            "x-nvidia-ver": _claims_version(),
            "verified_at": self.verified_at.isoformat().replace("+00:00", "Z"),
            "nonce": self.expected_nonce.hex() if self.expected_nonce is not None else None,
            "evidence_source": self.source,
            "policy": self.policy.to_dict(),
            "reasons": list(self.reasons),
        }
        for slot, many in self.slots:
            document[slot] = [] if many else None
        for part in self.parts:
            kind = part.kind
            entry = kind.document(part.result)
            document[kind.slot] = [*document.get(kind.slot, []), *entry] if kind.many else entry
        document["trusted_with"] = self.record.to_dict()
        return document

    def failed_checks(self) -> list[dict[str, str]]:
        """Every check that was refused or left undecided, as data: part, check, detail."""
        from gpucc.gpuattest.result import Decision

        return [
            {
                "part": section.label,
                "check": c.id,
                "title": c.title,
                "decision": str(c.decision),
                "detail": c.reason,
            }
            for part in self.parts
            for section in part.sections
            for c in section.checks
            if c.decision is not Decision.ACCEPT
        ]


def relaxations_in(parts: Iterable[Part]) -> tuple[Any, ...]:
    """The relaxations the checks of these parts relied on, in report order."""
    return tuple(
        r
        for part in parts
        for section in part.sections
        for r in relaxations_of(section.checks, section.label)
    )


def _claims_version() -> str:
    from gpucc.gpuattest.result import CLAIMS_VERSION

    return CLAIMS_VERSION
