"""The verification outline for NVSwitches (LS10): evidence + collateral + policy -> a verdict.

The GPU outline (:mod:`gpuattest.verifier`), in the same order, with what a switch lacks
reported as such:

1. architecture is LS10
2. the report parses strictly (:mod:`gpuattest.switch_report`)
3. the device chain has 5 certificates and chains to the pinned device root at ``now``
   (switches and GPUs share NVIDIA's one device identity root)
4. OCSP for device certificates 1..n-2
5. FWID: "not present": a switch report carries no FWID (opaque type 20), so the leaf
   certificate's FWID has nothing to be compared with
6. the report signature verifies with the leaf key (ECDSA P-384/SHA-384)
7. the report nonce equals the expected nonce
8. (versions: a switch has no driver; no NVML self-report is compared)
9. the BIOS RIM ``NV_SWITCH_BIOS_5612_0002_890_<version>``: obtained, XSD-valid,
   XML-DSig valid, chained to the pinned RIM root at ``now``, OCSP on its chain,
   colloquialVersion equal to the report's ASCII VBIOS version
10. measurements: the RIM's active golden values against the report's 31 blocks

Claims use nvattest's switch names (``x-nvidia-switch-...``, ``x-nvidia-device-type:
nvswitch``, ``measres``, ``secboot``, ``dbgstat``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

from gpucc.core.errors import MalformedEvidenceError

from ._internal import der
from ._internal.x509names import common_name
from .chain import load_pem_chain, validate_chain
from .collateral import OcspChecker, RimSource
from .evidence import SWITCH_ARCHITECTURES, EvidenceSet, GpuEvidence, is_switch_arch
from .measurements import compare_switch_measurements
from .policy import Policy, device_identity_check
from .result import (
    CLAIMS_VERSION,
    Check,
    CheckStatus,
    Verdict,
    combine_verdicts,
    runtime_measurements_of,
)
from .rim_step import verify_rim
from .switch_report import SwitchReport
from .switch_result import SwitchAttestationResult, SwitchResult
from .trust import TrustRoots
from .verifier import (
    DEVICE_CHAIN_LENGTH,
    _check_device_ocsp,
    _check_nonce,
    _Context,
    _decide,
    _derive_secboot_dbgstat,
    _measurement_check,
    _passed,
    _Record,
    _verdict_of,
    leaf_fwid,
    verify_report_signature,
)

__all__ = ["SWITCH_ARCHITECTURES", "is_switch_arch", "verify_switches"]

#: The NVSwitch architectures gpucc verifies (nvattest's ``arch`` value).


def _switch_names(claims: dict[str, Any]) -> dict[str, Any]:
    """The GPU outline's claim names in nvattest's switch vocabulary."""
    out: dict[str, Any] = {}
    for key, value in claims.items():
        name = key.replace("x-nvidia-gpu-vbios-rim", "x-nvidia-switch-bios-rim")
        out[name.replace("x-nvidia-gpu-", "x-nvidia-switch-")] = value
    return out


def _bios_rim_check(check: Check) -> Check:
    return Check(
        check.id.replace("vbios-rim", "bios-rim", 1),
        check.title.replace("VBIOS RIM", "Switch BIOS RIM", 1),
        check.status,
        check.reason,
        check.collateral_missing,
        check.decision,
        check.note,
    )


def _verify_switch(index: int, ev: GpuEvidence, ctx: _Context) -> SwitchResult:
    rec = _Record()
    arch_ok = is_switch_arch(ev.arch)  # (1)
    reason = "" if arch_ok else f"{ev.arch} is not an NVSwitch architecture gpucc verifies"
    rec.add(
        Check("arch", "Architecture", _passed(arch_ok), reason),
        {"x-nvidia-gpu-arch-check": arch_ok},
    )
    report = SwitchReport.parse(ev.report)  # (2)
    rec.add(
        Check("report-parsed", "Report parsed", CheckStatus.PASS),
        {
            "x-nvidia-gpu-attestation-report-parsed": True,
            "x-nvidia-switch-bios-version": report.bios_version,
        },
    )
    certs = load_pem_chain(ev.cert_chain_pem)  # (3)
    if not certs:
        raise MalformedEvidenceError(f"switch {index}: the certificate chain is empty")
    chain = validate_chain(
        certs, ctx.roots.device_root, ctx.now, expected_length=DEVICE_CHAIN_LENGTH
    )
    rec.add(
        Check(
            "device-chain",
            "Device certificate chain",
            _passed(chain.ok),
            "" if chain.ok else f"{chain.status}: {chain.reason}",
        ),
        {
            "hwmodel": common_name(certs[1]) if len(certs) > 1 else None,
            "ueid": str(certs[0].serial_number),
        },
    )
    rec.add(device_identity_check(str(certs[0].serial_number), ctx.policy, "NVSwitch"))
    _check_device_ocsp(chain, ctx, rec)  # (4)
    _check_switch_fwid(report, certs[0], rec)  # (5)
    ok, why = verify_report_signature(report.signed_bytes, report.signature, certs[0])  # (6)
    rec.add(
        Check("report-signature", "Report signature", _passed(ok), why),
        {"x-nvidia-gpu-attestation-report-signature-verified": ok},
    )
    _check_nonce(report, ctx.expected_nonce, rec)  # type: ignore[arg-type]  # (7)
    bios = verify_rim(  # (9)
        role="vbios",
        rim_id=report.bios_rim_id(),
        expected_version=report.bios_version,
        rims=ctx.rims,
        ocsp=ctx.ocsp,
        roots=ctx.roots,
        now=ctx.now,
        policy=ctx.policy,
    )
    rec.checks.extend(_bios_rim_check(c) for c in bios.checks)
    rec.claims.update(bios.claims)
    meas = compare_switch_measurements(  # (10)
        bios=bios.manifest, runtime=report.runtime_measurements()
    )
    check = _measurement_check(meas, ctx.policy)
    ran = check.status is not CheckStatus.NOT_CHECKED
    measres = "not-run" if not ran else ("success" if check.status is CheckStatus.PASS else "fail")
    rec.add(
        check,
        {
            "measres": measres,
            "x-nvidia-mismatch-measurement-records": [m.to_dict() for m in meas.mismatches],
        },
    )
    _derive_secboot_dbgstat(meas, rec)

    decided = tuple(_decide(c, ctx.policy) for c in rec.checks)
    claims = _switch_names(rec.claims)
    claims["x-nvidia-device-type"] = "nvswitch"
    claims["x-nvidia-switch-claims-version"] = CLAIMS_VERSION
    manifest = bios.manifest
    claims["oemid"] = manifest.platform_manufacturer_id if manifest is not None else None
    return SwitchResult(
        index=index,
        arch=ev.arch,
        checks=decided,
        claims=claims,
        claim_notes=rec.notes,
        measurements=meas if ran or meas.mismatches else None,
        report_digest=hashlib.sha256(ev.report).digest(),
        bios_rim_id=report.bios_rim_id(),
        device_pdi=report.device_pdi,
        gpu_pdis=report.gpu_pdis,
        verdict=combine_verdicts([_verdict_of(c.decision) for c in decided]),
        runtime_measurements=runtime_measurements_of(report.runtime_measurements(), decided),
    )


def _check_switch_fwid(report: SwitchReport, leaf: Any, rec: _Record) -> None:
    """Step 5: a switch report has no FWID; say whether the leaf has one, compare if both do."""
    claim = "x-nvidia-gpu-attestation-report-cert-chain-fwid-match"
    try:
        found = leaf_fwid(leaf)
    except der.DerError:
        found = None
    if report.fwid is None:
        reason = "the switch report carries no FWID (opaque type 20)"
        if found is not None:
            reason += "; the leaf certificate's FWID has nothing to be compared with"
        rec.add(Check("fwid", "FWID", CheckStatus.NOT_PRESENT, reason), {claim: None})
        return
    match = found is not None and found == report.fwid
    reason = "" if match else "the report FWID differs from the leaf certificate's (or it has none)"
    rec.add(Check("fwid", "FWID", _passed(match), reason), {claim: match})


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
    ctx = _Context(expected_nonce, roots, now, rims, ocsp, policy)
    switches = tuple(_verify_switch(i, ev, ctx) for i, ev in enumerate(evidence.gpus))
    verdicts: list[Verdict] = [s.verdict for s in switches]
    return SwitchAttestationResult(
        verdict=combine_verdicts(verdicts),
        switches=switches,
        policy=policy,
        verified_at=now,
        expected_nonce=expected_nonce,
        source=evidence.source,
    )
