"""A platform's evidence and its one verdict: the values :class:`PlatformVerifier` takes and
returns (:mod:`gpucc.assembly.verifier`), each device's result, the CVM's, and the record of
what the verdict trusted.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpucc.gpuattest.result import AttestationResult, Verdict

from .record import Roots, TrustRecord, relaxations_of
from .settings import TimeSource

if TYPE_CHECKING:
    from gpucc.gpuattest.cvm.appraise import CvmResult
    from gpucc.gpuattest.evidence import EvidenceSet
    from gpucc.gpuattest.policy import Policy
    from gpucc.gpuattest.result import GpuResult
    from gpucc.gpuattest.switch_result import SwitchAttestationResult
    from gpucc.gpuattest.topology import TopologyResult

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


@dataclass(frozen=True)
class PlatformResult:
    """One platform's verdict: each device's result, the CVM's, and the combined verdict.

    Attributes:
        verdict: the combined verdict.
        gpu: the GPUs' result (None: no GPU evidence was verified).
        cvm: the CVM's result (None: no CVM evidence was verified).
        policy: the policy applied.
        verified_at: the verification time.
        time_source: whether that time was the clock or given by the caller.
        simulated: whether a simulation's self-made roots were trusted.
        expected_nonce: the GPU nonce required.
        source: where the evidence came from.
        record: what the verdict trusted: relaxations used, time, roots.
        switch: the NVSwitches' result (None: no switch evidence was verified).
        topology: the Protected PCIe topology checks (None: the policy does not ask for
            PPCIe, ``topology.ppcie``).
    """

    verdict: Verdict
    gpu: AttestationResult | None
    cvm: CvmResult | None
    policy: Policy
    verified_at: dt.datetime
    time_source: TimeSource
    simulated: bool
    expected_nonce: bytes | None
    source: str
    record: TrustRecord
    switch: SwitchAttestationResult | None = None
    topology: TopologyResult | None = None

    @classmethod
    def of_gpus(cls, result: AttestationResult) -> PlatformResult:
        """A platform result holding the GPUs' result alone (verified at the time the
        caller gave :func:`gpucc.gpuattest.verifier.verify`)."""
        return cls(
            verdict=result.verdict,
            gpu=result,
            cvm=None,
            policy=result.policy,
            verified_at=result.verified_at,
            time_source=TimeSource.GIVEN,
            simulated=False,
            expected_nonce=result.expected_nonce,
            source=result.source,
            record=TrustRecord(
                relaxations=relaxations_in(result, None),
                verified_at=result.verified_at,
                time_source=str(TimeSource.GIVEN),
                time_origin="the caller",
                roots=Roots.GIVEN,
            ),
        )

    @property
    def trusted(self) -> bool:
        """True only when every device and the CVM passed every required check."""
        return self.verdict is Verdict.TRUSTED

    @property
    def undecided(self) -> bool:
        """Nothing failed, but something could not be decided (collateral, time)."""
        return self.verdict is Verdict.UNDECIDED

    @property
    def gpus(self) -> tuple[GpuResult, ...]:
        """Per GPU, in evidence order."""
        return self.gpu.gpus if self.gpu is not None else ()

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why not trusted: the CVM's reasons, then each GPU's, prefixed."""
        cvm = tuple(f"CVM: {r}" for r in self.cvm.reasons) if self.cvm is not None else ()
        switch = self.switch.reasons if self.switch is not None else ()
        topo = tuple(f"Topology: {r}" for r in self.topology.reasons) if self.topology else ()
        return cvm + (self.gpu.reasons if self.gpu is not None else ()) + switch + topo

    def to_dict(self) -> dict[str, Any]:
        """The ``gpucc.attest/v1`` document, less what only a command line knows."""
        return {
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
            "gpus": [g.to_dict() for g in self.gpus],
            "cvm": self.cvm.to_dict() if self.cvm is not None else None,
            "switches": [s.to_dict() for s in self.switch.switches] if self.switch else [],
            "topology": self.topology.to_dict() if self.topology is not None else None,
            "trusted_with": self.record.to_dict(),
        }

    def failed_checks(self) -> list[dict[str, str]]:
        """Every check that was refused or left undecided, as data: part, check, detail."""
        from gpucc.gpuattest.result import Decision

        parts = [(f"GPU {g.index}", g.checks) for g in self.gpus]
        if self.cvm is not None:
            parts.insert(0, ("CVM", self.cvm.checks))
        if self.switch is not None:
            parts += [(f"NVSwitch {s.index}", s.checks) for s in self.switch.switches]
        if self.topology is not None:
            parts.append(("topology", self.topology.checks))
        return [
            {
                "part": part,
                "check": c.id,
                "title": c.title,
                "decision": str(c.decision),
                "detail": c.reason,
            }
            for part, checks in parts
            for c in checks
            if c.decision is not Decision.ACCEPT
        ]


def relaxations_in(
    gpu: AttestationResult | None,
    cvm: CvmResult | None,
    switch: SwitchAttestationResult | None = None,
) -> tuple[Any, ...]:
    """The relaxations the checks of these parts relied on, the CVM's first."""
    found: list[Any] = []
    if cvm is not None:
        found += relaxations_of(cvm.checks, "CVM")
    for g in gpu.gpus if gpu is not None else ():
        found += relaxations_of(g.checks, f"GPU {g.index}")
    for sw in switch.switches if switch is not None else ():
        found += relaxations_of(sw.checks, f"NVSwitch {sw.index}")
    return tuple(found)


def _claims_version() -> str:
    from gpucc.gpuattest.result import CLAIMS_VERSION

    return CLAIMS_VERSION
