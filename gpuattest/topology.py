"""Protected PCIe (PPCIe): the topology checks that make many devices one machine.

In PPCIe mode the GPUs of an HGX board and its NVSwitches are passed to one confidential
VM and NVLink traffic between them is not encrypted, so the machine is trusted only when
every device is and the devices are the ones wired together. The checks, each reported
by name (all of them run; none stops the others):

``gpu-count``, ``switch-count``
    the expected numbers of GPUs and switches were presented (8 and 4 on HGX Hopper; the
    policy's ``topology.gpus`` / ``topology.switches`` for other boards).
``unique-devices``
    no device appears twice: no two reports, leaf certificates (``ueid``) or switch
    DEVICE_PDIs are the same.
``gpu-ppcie-mode``
    every GPU reports PPCIe mode (``x-nvidia-gpu-mode: ppcie``: the signed FEATURE_FLAG,
    or PROTECTED_PCIE_STATUS 0xAA).
``gpu-switch-pdis``
    every GPU's switch PDI list (opaque type 22; all-zero entries are disabled links and
    are dropped, as NVIDIA's checks do) holds exactly as many distinct PDIs as there are
    switches, and every GPU names the same set.
``switch-pdis-known``
    every switch's DEVICE_PDI is in that set, and every PDI of the set belongs to a switch
    presented.
``switch-gpu-pdis``
    every switch's GPU PDI list (its opaque type 26) holds as many distinct PDIs as there
    are GPUs, and every switch names the same set (NVIDIA's checks drop nothing here).

These follow NVIDIA's published PPCIe verifiers (nvtrust's ``validate_topology.py`` and
its Rust port); the last half of ``switch-pdis-known`` is gpucc's own addition. A GPU
report carries no PDI of its own, so the GPUs named by the switches cannot be matched to
the GPU reports one by one: only their number and agreement are checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .report import AttestationReport, OpaqueType
from .result import Check, CheckStatus, Decision, Judged, Verdict, check_reasons, combine_verdicts
from .switch_report import PDI_LENGTH, split_pdis
from .topology_policy import TopologyPolicy

if TYPE_CHECKING:
    from .result import GpuResult
    from .switch_result import SwitchResult

__all__ = ["TopologyPolicy", "TopologyResult", "check_topology"]

_DISABLED_PDI = bytes(PDI_LENGTH)
MAX_DEVICES = 64


@dataclass(frozen=True)
class TopologyResult(Judged):
    """The topology checks, their verdict and the PDI sets they found."""

    verdict: Verdict
    checks: tuple[Check, ...]
    switch_pdis: tuple[bytes, ...]
    gpu_pdis: tuple[bytes, ...]
    expected: TopologyPolicy

    @property
    def reasons(self) -> tuple[str, ...]:
        """``title: reason`` of each failed check."""
        return check_reasons(self.checks)

    def check(self, check_id: str) -> Check:
        """The check with this id.

        Raises:
            KeyError: no such check.
        """
        for c in self.checks:
            if c.id == check_id:
                return c
        raise KeyError(check_id)

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "verdict": str(self.verdict),
            "expected": self.expected.to_dict(),
            "switch_pdis": [p.hex() for p in self.switch_pdis],
            "gpu_pdis": [p.hex() for p in self.gpu_pdis],
            "checks": [c.to_dict() for c in self.checks],
            "reasons": list(self.reasons),
        }


def _check(check_id: str, title: str, problems: list[str]) -> Check:
    if problems:
        return Check(check_id, title, CheckStatus.FAIL, "; ".join(problems))
    return Check(check_id, title, CheckStatus.PASS, decision=Decision.ACCEPT)


def _repeats(labels: Sequence[str], keys: Sequence[object], what: str) -> list[str]:
    seen: dict[object, str] = {}
    out = []
    for label, key in zip(labels, keys, strict=True):
        if key in seen:
            out.append(f"{label} repeats {seen[key]} ({what})")
        else:
            seen[key] = label
    return out


def _gpu_switch_pdis(gpu_reports: Sequence[bytes]) -> list[frozenset[bytes]]:
    sets = []
    for raw in gpu_reports:
        report = AttestationReport.parse(raw)
        listed = split_pdis(report.opaque.get(OpaqueType.SWITCH_PDI, b""), "SWITCH_PDI")
        sets.append(frozenset(listed) - {_DISABLED_PDI})
    return sets


def _fmt(pdis: frozenset[bytes] | set[bytes]) -> str:
    return "{" + ", ".join(sorted(p.hex() for p in pdis)) + "}"


def check_topology(
    gpus: Sequence[GpuResult],
    gpu_reports: Sequence[bytes],
    switches: Sequence[SwitchResult],
    expected: TopologyPolicy,
) -> TopologyResult:
    """Run every PPCIe topology check over verified devices.

    Args:
        gpus: the GPUs' results, in evidence order.
        gpu_reports: their raw reports, in the same order.
        switches: the switches' results, in evidence order.
        expected: the board's expected counts.

    Raises:
        MalformedReportError: a GPU report (already verified) cannot be parsed again, or
            its switch PDI list is not a whole number of PDIs.
    """
    checks: list[Check] = []
    n_gpus, n_switches = len(gpus), len(switches)
    count = (
        [f"{n_gpus} GPUs presented, {expected.gpus} expected"] if n_gpus != expected.gpus else []
    )
    checks.append(_check("gpu-count", "GPU count", count))
    gpu_labels = [f"GPU {g.index}" for g in gpus]
    sw_labels = [f"switch {s.index}" for s in switches]
    labels = gpu_labels + sw_labels
    digests = [g.report_digest for g in gpus] + [s.report_digest for s in switches]
    ueids = [str(g.claims.get("ueid")) for g in gpus] + [
        str(s.claims.get("ueid")) for s in switches
    ]
    dupes = _repeats(labels, digests, "the same report")
    dupes += [d for d in _repeats(labels, ueids, "the same leaf certificate") if d not in dupes]
    dupes += _repeats(sw_labels, [s.device_pdi for s in switches], "the same DEVICE_PDI")
    not_ppcie = [
        f"{label} reports {g.claims.get('x-nvidia-gpu-mode') or 'no mode'}"
        for label, g in zip(gpu_labels, gpus, strict=True)
        if g.claims.get("x-nvidia-gpu-mode") != "ppcie"
    ]
    # GPU side: each lists the same switches.
    sets = _gpu_switch_pdis(gpu_reports)
    gpu_side: list[str] = []
    reference: frozenset[bytes] = sets[0] if sets else frozenset()
    for label, found in zip(gpu_labels, sets, strict=True):
        if len(found) != expected.switches:
            gpu_side.append(f"{label} lists {len(found)} switch PDIs, {expected.switches} expected")
        if found != reference:
            gpu_side.append(f"{label} lists {_fmt(found)}, GPU {gpus[0].index} {_fmt(reference)}")
    # Switch side: each is one of those switches, and each names the same GPUs.
    known: list[str] = []
    for label, s in zip(sw_labels, switches, strict=True):
        if s.device_pdi not in reference:
            known.append(f"{label}'s DEVICE_PDI {s.device_pdi.hex()} is not among the GPUs'")
    absent = reference - {s.device_pdi for s in switches}
    if absent:
        known.append(f"no switch presented for the GPUs' switch PDIs {_fmt(absent)}")
    sw_side: list[str] = []
    gpu_sets = [frozenset(s.gpu_pdis) for s in switches]
    first: frozenset[bytes] = gpu_sets[0] if gpu_sets else frozenset()
    for label, found in zip(sw_labels, gpu_sets, strict=True):
        if len(found) != n_gpus:
            sw_side.append(f"{label} names {len(found)} GPU PDIs, {n_gpus} GPUs presented")
        if found != first:
            sw_side.append(f"{label} names {_fmt(found)}, switch {switches[0].index} {_fmt(first)}")
    count = (
        [f"{n_switches} switches presented, {expected.switches} expected"]
        if n_switches != expected.switches
        else []
    )
    checks.append(_check("switch-count", "NVSwitch count", count))
    checks.append(_check("unique-devices", "No device repeated", dupes))
    checks.append(_check("gpu-ppcie-mode", "Every GPU in PPCIe mode", not_ppcie))
    checks.append(_check("gpu-switch-pdis", "GPUs agree on the switches", gpu_side))
    checks.append(_check("switch-pdis-known", "Switches are the GPUs' switches", known))
    checks.append(_check("switch-gpu-pdis", "Switches agree on the GPUs", sw_side))
    verdict = combine_verdicts(
        [Verdict.TRUSTED if c.status is CheckStatus.PASS else Verdict.NOT_TRUSTED for c in checks]
    )
    return TopologyResult(
        verdict=verdict,
        checks=tuple(checks),
        switch_pdis=tuple(sorted(reference)),
        gpu_pdis=tuple(sorted(first)),
        expected=expected,
    )
