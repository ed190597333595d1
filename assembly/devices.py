"""NVSwitches and Protected PCIe in the platform verifier: splitting evidence by device,
verifying the switches, checking the topology, and the key-release view of it all.

:class:`~gpucc.assembly.verifier.PlatformVerifier` calls these; nothing else should.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpucc.gpuattest.collateral import OcspChecker, RimSource
    from gpucc.gpuattest.evidence import EvidenceSet
    from gpucc.gpuattest.policy import Policy
    from gpucc.gpuattest.result import AttestationResult
    from gpucc.gpuattest.switch_result import SwitchAttestationResult
    from gpucc.gpuattest.topology import TopologyResult
    from gpucc.gpuattest.trust import TrustRoots
    from gpucc.keyrelease.protocol import GpuOutcome

__all__ = [
    "PlatformOutcome",
    "in_offer_order",
    "split_devices",
    "verify_switches",
    "verify_topology",
]


def split_devices(
    evidence: EvidenceSet | None, switches: EvidenceSet | None
) -> tuple[EvidenceSet | None, EvidenceSet | None]:
    """GPU entries and NVSwitch entries: one evidence file (or offer) may hold both, as a
    PPCIe machine's does; entries keep their order within each kind."""
    if evidence is None:
        return None, switches
    from gpucc.gpuattest.evidence import is_switch_arch

    gpus = tuple(e for e in evidence.gpus if not is_switch_arch(e.arch))
    found = tuple(e for e in evidence.gpus if is_switch_arch(e.arch))
    if not found:
        return evidence, switches
    if switches is not None:
        found = (*switches.gpus, *found)
    split_gpus = replace(evidence, gpus=gpus) if gpus else None
    return split_gpus, replace(evidence, gpus=found)


def verify_switches(
    evidence: EvidenceSet,
    nonce: bytes | None,
    now: dt.datetime,
    trust: tuple[TrustRoots, RimSource, OcspChecker],
    policy: Policy,
) -> SwitchAttestationResult:
    """Every switch through :func:`gpucc.gpuattest.switch_verifier.verify_switches`."""
    from gpucc.gpuattest.switch_verifier import verify_switches as verify

    roots, rims, ocsp = trust
    return verify(
        evidence, expected_nonce=nonce, roots=roots, now=now, rims=rims, ocsp=ocsp, policy=policy
    )


def verify_topology(
    gpus: EvidenceSet | None,
    gpu_result: AttestationResult | None,
    switch_result: SwitchAttestationResult | None,
    policy: Policy,
) -> TopologyResult:
    """The PPCIe topology checks over the verified devices (absent kinds count as none)."""
    from gpucc.gpuattest.topology import check_topology

    return check_topology(
        gpu_result.gpus if gpu_result is not None else (),
        [g.report for g in gpus.gpus] if gpus is not None else [],
        switch_result.switches if switch_result is not None else (),
        policy.topology,
    )


@dataclass(frozen=True)
class PlatformOutcome:
    """What the key-release protocol sees of a platform with NVSwitches: the platform's
    one verdict and reasons, and every device (GPUs, then switches) as the offer listed
    its reports."""

    trusted: bool
    reasons: tuple[str, ...]
    gpus: Sequence[GpuOutcome]


def in_offer_order(evidence: EvidenceSet, devices: Sequence[GpuOutcome]) -> tuple[GpuOutcome, ...]:
    """``devices`` in the order the offer listed their reports (the transcript's order)."""
    import hashlib

    by_digest = {bytes(d.report_digest): d for d in devices}
    ordered = (by_digest.get(hashlib.sha256(e.report).digest()) for e in evidence.gpus)
    return tuple(d for d in ordered if d is not None)
