"""NVSwitch (LS10) verification: the device outline of :mod:`gpuattest.verifier` with the
:data:`~gpuattest.device.NVSWITCH` profile.

What the profile changes against a GPU's:

1. architecture is LS10
2. the report parses strictly (:mod:`gpuattest.switch_report`)
3. the device chain: 5 certificates to NVIDIA's one device identity root
5. FWID: "not present": a switch report carries no FWID (opaque type 20)
8. (versions: a switch has no driver; no NVML self-report is compared)
9. one RIM, the BIOS RIM ``NV_SWITCH_BIOS_5612_0002_890_<version>``, whose
   colloquialVersion must equal the report's ASCII VBIOS version
10. measurements: the RIM's active golden values against the report's blocks

Claims use nvattest's switch names (``x-nvidia-switch-...``, ``x-nvidia-device-type:
nvswitch``, ``measres``, ``secboot``, ``dbgstat``).
"""

from __future__ import annotations

import datetime as dt
import hashlib

from gpucc.core.errors import MalformedEvidenceError

from .collateral import OcspChecker, RimSource
from .device import NVSWITCH
from .evidence import SWITCH_ARCHITECTURES, EvidenceSet, is_switch_arch
from .policy import Policy
from .result import combine_verdicts, runtime_measurements_of
from .switch_report import SwitchReport
from .switch_result import SwitchAttestationResult, SwitchResult
from .trust import TrustRoots
from .verifier import DeviceOutcome, VerificationContext, verify_device

__all__ = ["SWITCH_ARCHITECTURES", "is_switch_arch", "verify_switches"]


def _switch_result(out: DeviceOutcome) -> SwitchResult:
    report = out.report
    if not isinstance(report, SwitchReport):  # the NVSWITCH profile parses SwitchReports
        raise TypeError(f"a switch outcome holds a {type(report).__name__}")
    return SwitchResult(
        index=out.index,
        arch=out.evidence.arch,
        checks=out.checks,
        claims=out.claims,
        claim_notes=out.notes,
        measurements=out.measurements,
        report_digest=hashlib.sha256(out.evidence.report).digest(),
        bios_rim_id=report.bios_rim_id(),
        device_pdi=report.device_pdi,
        gpu_pdis=report.gpu_pdis,
        verdict=out.verdict,
        runtime_measurements=runtime_measurements_of(report.runtime_measurements(), out.checks),
    )


def verify_switches(
    evidence: EvidenceSet,
    *,
    expected_nonce: bytes | None,
    roots: TrustRoots,
    now: dt.datetime,
    rims: RimSource,
    ocsp: OcspChecker,
    policy: Policy | None = None,
) -> SwitchAttestationResult:
    """Verify every NVSwitch in ``evidence`` and apply ``policy``.

    Args: as :func:`gpuattest.verifier.verify`; ``evidence`` holds switch entries
    (``arch`` LS10).

    Raises:
        ValueError: ``now`` is naive.
        MalformedInputError: the expected nonce is not 32 bytes, the evidence holds no
            switch, or a report, chain or RIM cannot be parsed.
    """
    if now.tzinfo is None:
        raise ValueError("the verification time must be timezone-aware")
    if expected_nonce is not None and len(expected_nonce) != 32:
        raise MalformedEvidenceError("the expected nonce must be 32 bytes")
    if not evidence.gpus:
        raise MalformedEvidenceError("the evidence holds no NVSwitch")
    policy = policy or Policy()
    ctx = VerificationContext(expected_nonce, roots, now, rims, ocsp, policy)
    switches = tuple(
        _switch_result(verify_device(i, ev, evidence, ctx, NVSWITCH))
        for i, ev in enumerate(evidence.gpus)
    )
    return SwitchAttestationResult(
        verdict=combine_verdicts([s.verdict for s in switches]),
        switches=switches,
        policy=policy,
        verified_at=now,
        expected_nonce=expected_nonce,
        source=evidence.source,
    )
