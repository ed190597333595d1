"""The verification outline: evidence + collateral + policy → a verdict.

Everything that decides trust happens in :func:`verify`, in this order, for
each GPU:

1. architecture is one gpucc knows (Hopper; Blackwell where the rules are known)
2. the report parses strictly (:class:`~gpuattest.errors.MalformedReportError` when not)
3. the device chain has 5 certificates and chains to the pinned device root at ``now``
4. OCSP for device certificates 1..n-2
5. the report's FWID equals the leaf certificate's FWID (when the report has one)
6. the report signature verifies with the leaf key (ECDSA P-384/SHA-384)
7. the report nonce equals the expected nonce
8. driver and VBIOS versions: NVML's self-report (when present) and the policy's limits
9. driver and VBIOS RIMs: obtained, XSD-valid, XML-DSig valid, chained to the pinned RIM
   root at ``now``, OCSP on RIM certificates 0..n-2, colloquialVersion equals the report's
   (:mod:`gpuattest.rim_step`); for a kind whose reference values are CoRIMs, its CoRIMs
   obtained, accepted (signed under the RIM root, or unsigned under the policy's
   relaxation) and their signers' OCSP (:mod:`gpuattest.corim_step`)
10. measurements: active golden values of both RIMs against the report's blocks, or the
   CoRIMs' reference values against the device's evidence values
11. CC state, for evidence collected from NVML

Each step yields a :class:`~gpuattest.result.Check` with a status (pass, fail,
not-checked, not-present) and a reason; nothing unchecked ever counts as a pass.
The policy then decides per check: accept, refuse, or undecided (collateral
missing). Verdicts: any refusal → not trusted; otherwise anything undecided →
undecided; otherwise trusted. Several GPUs: trusted only if all are.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from gpucc.core.errors import MalformedEvidenceError, MalformedReportError

from ._internal import der
from ._internal.x509names import common_name
from .chain import load_pem_chain
from .collateral import ChainKind, OcspChecker, RimSource
from .device import (
    DEVICE_CHAIN,
    DEVICE_CHAIN_LENGTH,
    CorimInputs,
    DeviceProfile,
    DeviceReport,
    gpu_profile,
    leaf_common_name,
)
from .evidence import EvidenceSet, GpuEvidence
from .measurements import (
    MeasurementResult,
    MeasurementStatus,
    MismatchRecord,
    compare_roles,
)
from .policy import Policy, version_tuple
from .report import Architecture, AttestationReport, OpaqueType
from .result import (
    CLAIMS_VERSION,
    AttestationResult,
    Check,
    CheckStatus,
    Decision,
    GpuResult,
    Verdict,
    combine_verdicts,
    runtime_measurements_of,
)
from .revocation import chain_claim, check_chain_revocation
from .rim_step import RimOutcome, verify_rim
from .trust import TrustRoots
from .x509chain import ChainResult, validate_chain

if TYPE_CHECKING:  # loaded only for the kinds that need them (start-up)
    from .corim_step import CorimOutcome
    from .spdm_toc import SpdmToc

# AttestationResult is what verify() returns; it is re-exported for its callers.
__all__ = [
    "DEVICE_CHAIN",
    "DEVICE_CHAIN_LENGTH",
    "AttestationResult",
    "DeviceOutcome",
    "VerificationContext",
    "verify",
    "verify_device",
]
_FWID_HOPPER = x509.ObjectIdentifier("2.23.133.5.4.1")
_FWID_DICE = x509.ObjectIdentifier("2.23.133.5.4.1.1")


@dataclass
class _Record:
    """The checks and claims of one device, in the order the steps produce them."""

    profile: DeviceProfile
    checks: list[Check] = field(default_factory=list)
    claims: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    def add(self, check: Check, claims: Mapping[str, Any] | None = None) -> None:
        self.checks.append(check)
        self.claims.update(claims or {})

    def claim(self, name: str) -> str:
        """A claim name in the device kind's vocabulary."""
        return self.profile.claim(name)


def _passed(ok: bool) -> CheckStatus:
    return CheckStatus.PASS if ok else CheckStatus.FAIL


@dataclass(frozen=True)
class VerificationContext:
    """What every step of one verification may consult."""

    expected_nonce: bytes | None
    roots: TrustRoots
    now: dt.datetime
    rims: RimSource
    ocsp: OcspChecker
    policy: Policy


# --- (1) architecture, (2) report --------------------------------------------------


def _check_architecture(ev: GpuEvidence, profile: DeviceProfile, rec: _Record) -> None:
    ok = ev.arch.strip().upper() in profile.architectures
    reason = "" if ok else f"{ev.arch} is not {profile.kind_phrase} architecture gpucc verifies"
    rec.add(Check("arch", "Architecture", _passed(ok), reason), {rec.claim("arch-check"): ok})


def _parse_report(ev: GpuEvidence, profile: DeviceProfile, rec: _Record) -> DeviceReport:
    """Malformed input stops verification here (the parser raises)."""
    report = profile.parse(ev.report)
    profile.check_blocks(report.blocks)
    claims: dict[str, Any] = {rec.claim("attestation-report-parsed"): True}
    claims.update({rec.claim(k): v for k, v in profile.versions(report).items()})
    rec.add(Check("report-parsed", "Report parsed", CheckStatus.PASS), claims)
    return report


def _read_toc(report: DeviceReport, profile: DeviceProfile) -> SpdmToc | None:
    """The signed table of contents, for kinds that carry one (decoded, not yet trusted:
    the signature step judges the bytes it came from)."""
    if profile.toc_block is None:
        return None
    block = report.blocks.get(profile.toc_block)
    if block is None:
        return None
    from .spdm_toc import parse_toc  # only kinds with a table of contents load CBOR

    return parse_toc(block.value, report.blocks)


# --- (3) device chain, (4) its OCSP --------------------------------------------------


def _check_device_chain(
    index: int, ev: GpuEvidence, profile: DeviceProfile, ctx: VerificationContext, rec: _Record
) -> tuple[tuple[x509.Certificate, ...], ChainResult]:
    certs = load_pem_chain(ev.cert_chain_pem)
    if not certs:
        raise MalformedEvidenceError(f"{profile.noun} {index}: the certificate chain is empty")
    chain = validate_chain(certs, ctx.roots.device_root, ctx.now, profile.chain)
    reason = "" if chain.ok else f"{chain.status}: {chain.reason}"
    rec.add(
        Check("device-chain", "Device certificate chain", _passed(chain.ok), reason),
        {
            "hwmodel": common_name(certs[1]) if len(certs) > 1 else None,
            "ueid": str(certs[0].serial_number),
        },
    )
    return certs, chain


def _check_device_ocsp(chain: ChainResult, ctx: VerificationContext, rec: _Record) -> None:
    """OCSP for the device chain (the per-boot leaf and the root are not checked)."""
    check, revocation = check_chain_revocation(
        "device-ocsp",
        "Device certificate OCSP",
        chain,
        kind=ChainKind.DEVICE,
        anchor=ctx.roots.device_root,
        checker=ctx.ocsp,
        now=ctx.now,
        policy=ctx.policy,
    )
    rec.add(check, {rec.claim("attestation-report-cert-chain"): chain_claim(chain, revocation)})


# --- (5) FWID, (6) signature, (7) nonce -----------------------------------------------


def _check_fwid(
    report: DeviceReport, leaf: x509.Certificate, profile: DeviceProfile, rec: _Record
) -> None:
    claim = rec.claim("attestation-report-cert-chain-fwid-match")
    try:
        found = leaf_fwid(leaf)
    except der.DerError as exc:
        found, reason = None, f"the leaf FWID extension is malformed: {exc}"
    else:
        reason = "" if found is not None else "the leaf certificate has no FWID extension"
    if report.fwid is None:
        reason = profile.no_fwid_reason
        if found is not None and not profile.gpu_steps:
            reason += "; the leaf certificate's FWID has nothing to be compared with"
        rec.add(Check("fwid", "FWID", CheckStatus.NOT_PRESENT, reason), {claim: None})
        return
    match = found is not None and hmac.compare_digest(found, report.fwid)
    if found is not None and not match:
        reason = "the report FWID differs from the leaf certificate's"
    rec.add(Check("fwid", "FWID", _passed(match), reason), {claim: match})


def _check_report_signature(report: DeviceReport, leaf: x509.Certificate, rec: _Record) -> None:
    ok, reason = verify_report_signature(report.signed_bytes, report.signature, leaf)
    rec.add(
        Check("report-signature", "Report signature", _passed(ok), reason),
        {rec.claim("attestation-report-signature-verified"): ok},
    )


def _check_nonce(report: DeviceReport, expected: bytes | None, rec: _Record) -> None:
    claim = rec.claim("attestation-report-nonce-match")
    if expected is None:
        reason = "no expected nonce was given, so freshness is not established"
        rec.add(Check("nonce", "Nonce", CheckStatus.NOT_CHECKED, reason), {claim: None})
    else:
        ok = hmac.compare_digest(report.nonce, expected)
        reason = "" if ok else f"the report nonce is {report.nonce.hex()}"
        rec.add(Check("nonce", "Nonce", _passed(ok), reason), {claim: ok})
    rec.claims["eat_nonce"] = report.nonce.hex()


# --- (8) versions ------------------------------------------------------------------------


def _check_versions(
    report: DeviceReport, gpu: GpuEvidence, profile: DeviceProfile, policy: Policy, rec: _Record
) -> None:
    """NVML's self-report against the signed report, then the policy's limits (kinds with
    a driver and VBIOS version only)."""
    if not profile.gpu_steps:
        return
    if not isinstance(report, AttestationReport):
        limits = (policy.min_driver, policy.allowed_drivers, policy.allowed_vbios)
        pinned = any(limit is not None for limit in limits) or bool(policy.min_svn)
        reason = f"a {profile.name} report carries no driver or VBIOS version"
        if pinned:
            reason += ", so the policy's version limits cannot be met"
        status = CheckStatus.FAIL if pinned else CheckStatus.NOT_PRESENT
        rec.add(Check("versions-policy", "Versions allowed by policy", status, reason))
        return
    for key, title, reported, nvml in (
        ("driver-version", "Driver version (NVML)", report.driver_version, gpu.driver_version),
        ("vbios-version", "VBIOS version (NVML)", report.vbios_version, gpu.vbios_version),
    ):
        if nvml is None:
            reason = "no NVML-reported version to compare"
            rec.add(Check(key, title, CheckStatus.NOT_PRESENT, reason))
            continue
        same = nvml.strip().upper() == reported.upper()
        reason = "" if same else f"NVML reports {nvml}, the signed report {reported}"
        rec.add(Check(key, title, _passed(same), reason))
    rec.add(_version_policy(report, policy))


# --- (9) RIMs, (10) measurements, (11) CC state ----------------------------------------


def _check_rims(
    report: DeviceReport,
    arch: Architecture | None,
    profile: DeviceProfile,
    ctx: VerificationContext,
    rec: _Record,
) -> dict[str, RimOutcome]:
    """The profile's RIM roles, each obtained and verified (none where the kind's
    reference values are CoRIMs)."""
    if profile.corim_ids is not None:
        return {}
    outcomes: dict[str, RimOutcome] = {}
    for ref in profile.rims(report, arch):
        out = verify_rim(
            role=ref.role.role,
            rim_id=ref.rim_id,
            expected_version=ref.version,
            rims=ctx.rims,
            ocsp=ctx.ocsp,
            roots=ctx.roots,
            now=ctx.now,
            policy=ctx.policy,
            label=ref.role.label,
            claim=ref.role.claim,
        )
        rec.checks.extend(out.checks)
        rec.claims.update(out.claims)
        outcomes[ref.role.role] = out
    return outcomes


def _check_corims(
    report: DeviceReport,
    toc: SpdmToc | None,
    leaf: x509.Certificate,
    ev: GpuEvidence,
    profile: DeviceProfile,
    ctx: VerificationContext,
    rec: _Record,
) -> CorimOutcome | None:
    """The CoRIM variant of step 9, for kinds whose reference values are CoRIMs."""
    if profile.corim_ids is None:
        return None
    from .corim_step import verify_corims  # only kinds whose reference values are CoRIMs

    found = profile.corim_ids(CorimInputs(report, toc, common_name(leaf), dict(ev.hints or {})))
    out = verify_corims(
        profile=profile,
        found=found,
        blocks=report.blocks,
        leaf=leaf,
        rims=ctx.rims,
        ocsp=ctx.ocsp,
        roots=ctx.roots,
        now=ctx.now,
        policy=ctx.policy,
    )
    rec.checks.extend(out.checks)
    rec.claims.update(out.claims)
    return out


def _describe_mismatch(m: MismatchRecord) -> str:
    """``index 9 (vbios): golden <hex>[ or <hex>], runtime <hex>``: exact enough for a
    policy that names the index; a CoRIM record names its environment, key, reference and
    evidence."""
    if m.is_corim:
        reference = m.golden_values[0] if m.golden_values else "(none)"
        return f"{m.label}: reference {reference}, evidence {m.runtime_value}"
    golden = " or ".join(m.golden_values) or "(none)"
    runtime = m.runtime_value if m.runtime_value is not None else "(no block)"
    name = f" {m.name}" if m.name else ""
    return f"index {m.index}{name} ({m.source}): golden {golden}, runtime {runtime}"


def _measurement_check(meas: MeasurementResult, policy: Policy) -> Check:
    if meas.status is MeasurementStatus.NOT_RUN:
        return Check(
            "measurements",
            "Measurements",
            CheckStatus.NOT_CHECKED,
            meas.reason,
            collateral_missing=True,
        )
    tolerated = [m for m in meas.mismatches if not m.is_corim and m.index in policy.allow_mismatch]
    blocking = [m for m in meas.mismatches if m.is_corim or m.index not in policy.allow_mismatch]
    missing = " and no ".join(meas.missing_rims)
    if blocking:
        listed = "; ".join(_describe_mismatch(m) for m in blocking)
        reason = f"mismatch at {'CoRIM' if blocking[0].is_corim else 'RIM'} {listed}"
        if missing:
            reason += f" (not compared: no {missing} RIM)"
    elif meas.conflicts:
        reason = f"indices active in both RIMs: {', '.join(map(str, meas.conflicts))}"
    else:
        reason = f"{meas.matched_count} of {meas.compared_count} golden measurements match"
    note = (
        f"mismatch tolerated by policy at {', '.join(str(m.index) for m in tolerated)}"
        if tolerated
        else ""
    )
    if not blocking and not meas.conflicts and missing:
        # Only tolerated mismatches in what could be compared: the rest is undecided.
        return Check(
            "measurements",
            "Measurements",
            CheckStatus.NOT_CHECKED,
            f"reference values unavailable: no {missing} RIM; {reason}",
            collateral_missing=True,
            note=note,
        )
    ok = not blocking and not meas.conflicts
    relaxation = ""
    if tolerated and ok:
        relaxation = f"allow_mismatch: {', '.join(str(m.index) for m in tolerated)}"
    return Check(
        "measurements", "Measurements", _passed(ok), reason, note=note, relaxation=relaxation
    )


def _check_measurements(
    report: DeviceReport,
    rims: dict[str, RimOutcome],
    corims: CorimOutcome | None,
    profile: DeviceProfile,
    policy: Policy,
    rec: _Record,
) -> MeasurementResult | None:
    if corims is not None:
        meas = corims.measurements
    else:
        meas = compare_roles(
            {role: out.manifest for role, out in rims.items()},
            report.runtime_measurements(),
            report.nvdec0_disabled,
            report.opaque_data,
        )
    check = _measurement_check(meas, policy)
    ran = meas.status is not MeasurementStatus.NOT_RUN
    if not ran:
        measres = "not-run"
    else:
        measres = "success" if check.status is CheckStatus.PASS else "fail"
    claims: dict[str, Any] = {"measres": measres}
    if profile.gpu_steps:
        claims[rec.claim("vbios-index-no-conflict")] = not meas.conflicts if ran else None
    blocks = [m for m in meas.mismatches if not m.is_opaque]
    opaque = [m for m in meas.mismatches if m.is_opaque]
    claims["x-nvidia-mismatch-measurement-records"] = [m.to_dict() for m in blocks]
    if opaque:  # NVIDIA's claims 4.0 name: present only when an opaque record failed
        claims["x-nvidia-mismatch-opaque-data-records"] = [m.opaque_dict() for m in opaque]
    rec.add(check, claims)
    _derive_secboot_dbgstat(meas, rec)
    return meas if ran else None


def _derive_secboot_dbgstat(meas: MeasurementResult, rec: _Record) -> None:
    """``secboot`` and ``dbgstat`` as NVIDIA's verifiers set them: from the measurement
    comparison (every golden value matched), not from separate evidence.

    They are set only when every compared golden value matched, with no conflict and
    nothing tolerated by policy; otherwise they are null and the note says why.
    """
    if meas.status is MeasurementStatus.SUCCESS:
        rec.claims["secboot"] = True
        rec.claims["dbgstat"] = "disabled"
        note = (
            "derived from the measurement comparison (every golden value matched), as "
            "NVIDIA's verifiers derive it; the evidence carries no separate value"
        )
    else:
        rec.claims["secboot"] = None
        rec.claims["dbgstat"] = None
        why = "not run" if meas.status is MeasurementStatus.NOT_RUN else "failed"
        note = (
            f"not derived: the measurement comparison {why} ({meas.reason}); NVIDIA "
            "derives it from a successful comparison only"
        )
    rec.notes["secboot"] = note
    rec.notes["dbgstat"] = note


_GPU_MODES = {0: "spt", 1: "mpt", 2: "ppcie"}
_PPCIE_ON = b"\xaa"
_PPCIE_OFF = b"\x55"


_TOC_MODES = {"CC SPT": "spt", "CC MPT": "mpt", "CC PPCIE": "ppcie"}


def _gpu_mode(
    report: DeviceReport, toc: SpdmToc | None, evidence: EvidenceSet, rec: _Record
) -> None:
    """``x-nvidia-gpu-mode`` (spt, mpt, ppcie) from the signed table of contents' purpose
    where the report has one, else the signed report's FEATURE_FLAG, or PPCIe from its
    PROTECTED_PCIE_STATUS or NVML's CC settings; absent, with a note, when none says."""
    claim = rec.claim("mode")
    if toc is not None:
        mode = _TOC_MODES.get(toc.purpose or "")
        if mode is not None:
            rec.claims[claim] = mode
            rec.notes[claim] = (
                f"from the signed table of contents (block 0xFD), purpose {toc.purpose!r}; "
                "the opaque FEATURE_FLAG is not used where a table exists"
            )
        else:
            rec.notes[claim] = (
                f"absent: the table of contents' purpose {toc.purpose!r} names no known mode"
            )
        return
    flag = report.opaque_data.fields.get(OpaqueType.FEATURE_FLAG)
    flag_value = int.from_bytes(flag, "little") if flag else None
    if flag_value is not None:
        if flag_value in _GPU_MODES:
            rec.claims[claim] = _GPU_MODES[flag_value]
            rec.notes[claim] = "from the report's FEATURE_FLAG (opaque type 36)"
        else:
            rec.notes[claim] = f"absent: the report's FEATURE_FLAG {flag_value} names no known mode"
        return
    ppcie = report.opaque_data.fields.get(OpaqueType.PROTECTED_PCIE_STATUS)
    if ppcie == _PPCIE_ON:
        rec.claims[claim] = "ppcie"
        rec.notes[claim] = "from the report's PROTECTED_PCIE_STATUS (opaque type 21)"
        return
    if evidence.source == "nvml" and evidence.cc is not None and evidence.cc.multi_gpu_mode == 1:
        rec.claims[claim] = "ppcie"
        rec.notes[claim] = "from NVML's CC settings (multiGpuMode), not from the signed report"
        return
    reason = "absent: the report has no FEATURE_FLAG (opaque type 36)"
    if ppcie == _PPCIE_OFF:
        reason += (
            "; its PROTECTED_PCIE_STATUS says not PPCIe, which does not tell single- "
            "from multi-GPU passthrough"
        )
    rec.notes[claim] = reason


def _check_cc_state(evidence: EvidenceSet, policy: Policy, rec: _Record) -> None:
    """Only meaningful for evidence just collected through NVML."""
    if evidence.source != "nvml" or evidence.cc is None:
        return
    cc_on = evidence.cc.cc_feature or evidence.cc.multi_gpu_mode != 0
    reason = "" if cc_on else "confidential computing is off"
    rec.add(Check("cc-mode", "CC mode on", _passed(cc_on or not policy.require_cc_on), reason))
    dev = evidence.cc.devtools_mode
    reason = "DevTools mode is on (not a production mode)" if dev else ""
    rec.add(
        Check(
            "devtools", "DevTools mode off", _passed(not dev or not policy.forbid_devtools), reason
        )
    )


def device_identity_check(ueid: str, policy: Policy, what: str) -> Check:
    """Whether the device whose leaf certificate has serial ``ueid`` is one the policy
    pins (``devices.allowed``); without pins, a reported value that accepts any device."""
    title = "Device identity pinned"
    if policy.allowed_devices is None:
        reason = "not pinned: no devices.allowed in the policy; any device that verifies"
        return Check("device-identity", title, CheckStatus.NOT_PRESENT, reason)
    if ueid in policy.allowed_devices:
        return Check("device-identity", title, CheckStatus.PASS)
    reason = f"{what} {ueid} (leaf certificate serial) is not in the policy's devices.allowed"
    return Check("device-identity", title, CheckStatus.FAIL, reason)


# --- the outline ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceOutcome:
    """What the outline found about one device, before it is shaped into a GPU's or a
    switch's result.

    Attributes:
        report: the parsed report (its type is the profile's).
        toc: the decoded table of contents, for kinds that carry one.
        rims: role to the RIM step's outcome (empty where the kind has no XML RIMs).
    """

    index: int
    evidence: GpuEvidence
    profile: DeviceProfile
    arch: Architecture | None
    report: DeviceReport
    toc: SpdmToc | None
    checks: tuple[Check, ...]
    claims: dict[str, Any]
    notes: dict[str, str]
    measurements: MeasurementResult | None
    rims: Mapping[str, RimOutcome]
    verdict: Verdict
    corim_ids: Mapping[str, str] = field(default_factory=dict)

    @property
    def rim_ids(self) -> dict[str, str]:
        """Role to the RIM ID the report names (the CoRIM IDs where the kind's reference
        values are CoRIMs)."""
        if self.profile.corim_ids is not None:
            return dict(self.corim_ids)
        return {ref.role.role: ref.rim_id for ref in self.profile.rims(self.report, self.arch)}


def _arch_of(ev: GpuEvidence) -> Architecture | None:
    try:
        return Architecture.parse(ev.arch)
    except Exception:
        return None


def verify_device(
    index: int,
    ev: GpuEvidence,
    evidence: EvidenceSet,
    ctx: VerificationContext,
    profile: DeviceProfile,
) -> DeviceOutcome:
    """The one outline, for any device kind (see the module documentation)."""
    rec = _Record(profile)
    arch = _arch_of(ev)
    _check_architecture(ev, profile, rec)  # (1)
    report = _parse_report(ev, profile, rec)  # (2)
    toc = _read_toc(report, profile)
    certs, chain = _check_device_chain(index, ev, profile, ctx, rec)  # (3)
    rec.add(device_identity_check(str(certs[0].serial_number), ctx.policy, profile.noun))
    _check_device_ocsp(chain, ctx, rec)  # (4)
    _check_fwid(report, certs[0], profile, rec)  # (5)
    _check_report_signature(report, certs[0], rec)  # (6)
    _check_nonce(report, ctx.expected_nonce, rec)  # (7)
    _check_versions(report, ev, profile, ctx.policy, rec)  # (8)
    rims = _check_rims(report, arch, profile, ctx, rec)  # (9)
    corims = _check_corims(report, toc, certs[0], ev, profile, ctx, rec)  # (9, CoRIMs)
    measurements = _check_measurements(report, rims, corims, profile, ctx.policy, rec)  # (10)
    if profile.gpu_steps:
        _check_cc_state(evidence, ctx.policy, rec)  # (11)

    decided = tuple(_decide(c, ctx.policy) for c in rec.checks)
    rec.claims["x-nvidia-device-type"] = profile.device_type
    if profile.gpu_steps:
        _gpu_mode(report, toc, evidence, rec)
    rec.claims[rec.claim("claims-version")] = CLAIMS_VERSION
    _note_hints(ev, rec)
    manifest = next(iter(rims.values())).manifest if rims else None
    rec.claims["oemid"] = manifest.platform_manufacturer_id if manifest is not None else None
    return DeviceOutcome(
        index=index,
        evidence=ev,
        profile=profile,
        arch=arch,
        report=report,
        toc=toc,
        corim_ids=MappingProxyType(dict(corims.ids) if corims is not None else {}),
        checks=decided,
        claims=rec.claims,
        notes=rec.notes,
        measurements=measurements,
        rims=MappingProxyType(rims),
        verdict=combine_verdicts([_verdict_of(c.decision) for c in decided]),
    )


def _note_hints(ev: GpuEvidence, rec: _Record) -> None:
    """Unsigned hints (a CMW file's) are shown as such; no check reads them."""
    if not ev.hints:
        return
    claim = "x-nvidia-unsigned-hints"
    rec.claims[claim] = dict(ev.hints)
    rec.notes[claim] = (
        "unsigned hints from the evidence file: they may only choose which reference values "
        "to look up, never decide anything; no reference value was chosen by them here"
    )


def _verify_gpu(
    index: int, gpu: GpuEvidence, evidence: EvidenceSet, ctx: VerificationContext
) -> GpuResult:
    profile = gpu_profile(gpu.arch, leaf_common_name(gpu.cert_chain_pem))
    out = verify_device(index, gpu, evidence, ctx, profile)
    ids = out.rim_ids
    return GpuResult(
        index=index,
        uuid=gpu.uuid,
        arch=gpu.arch,
        checks=out.checks,
        claims=out.claims,
        claim_notes=out.notes,
        measurements=out.measurements,
        report_digest=hashlib.sha256(gpu.report).digest(),
        driver_rim_id=ids.get("driver", ""),
        vbios_rim_id=ids.get("vbios", ""),
        verdict=out.verdict,
        runtime_measurements=runtime_measurements_of(out.report.runtime_measurements(), out.checks),
    )


def _verdict_of(decision: Decision) -> Verdict:
    return {
        Decision.ACCEPT: Verdict.TRUSTED,
        Decision.REFUSE: Verdict.NOT_TRUSTED,
        Decision.UNDECIDED: Verdict.UNDECIDED,
    }[decision]


def verify(
    evidence: EvidenceSet,
    *,
    expected_nonce: bytes | None,
    roots: TrustRoots,
    now: dt.datetime,
    rims: RimSource,
    ocsp: OcspChecker,
    policy: Policy | None = None,
) -> AttestationResult:
    """Verify every GPU in ``evidence`` and apply ``policy``.

    Args:
        evidence: reports and chains, from files or NVML.
        expected_nonce: the 32-byte nonce the reports must carry; None means freshness
            cannot be established (refused by the default policy).
        roots: the trust anchors (``TrustRoots.nvidia()`` in production).
        now: the verification time (timezone-aware); certificates are judged at it.
        rims: where RIMs come from.
        ocsp: how revocation is checked.
        policy: the appraisal policy; the strict default when None.

    Returns:
        The result; its ``verdict`` is trusted, not-trusted or undecided.

    Raises:
        ValueError: ``now`` is naive.
        MalformedInputError: the expected nonce is not 32 bytes, the evidence holds no
            GPU, or a report, chain, or RIM cannot be parsed.
    """
    if now.tzinfo is None:
        raise ValueError("the verification time must be timezone-aware")
    if expected_nonce is not None and len(expected_nonce) != 32:
        raise MalformedEvidenceError("the expected nonce must be 32 bytes")
    policy = policy or Policy()
    if not evidence.gpus:
        raise MalformedEvidenceError("the evidence holds no GPU")
    ctx = VerificationContext(expected_nonce, roots, now, rims, ocsp, policy)
    gpus = tuple(_verify_gpu(i, gpu, evidence, ctx) for i, gpu in enumerate(evidence.gpus))
    return AttestationResult(
        verdict=combine_verdicts([g.verdict for g in gpus]),
        gpus=gpus,
        policy=policy,
        verified_at=now,
        expected_nonce=expected_nonce,
        source=evidence.source,
    )


# --- helpers ------------------------------------------------------------------------------


def leaf_fwid(leaf: x509.Certificate) -> bytes | None:
    """The FWID of the leaf certificate (Hopper or DICE TcbInfo form), if any."""
    for oid, extract in ((_FWID_HOPPER, der.hopper_fwid), (_FWID_DICE, der.dice_tcbinfo_fwid)):
        try:
            ext = leaf.extensions.get_extension_for_oid(oid)
        except x509.ExtensionNotFound:
            continue
        value = ext.value
        raw = value.value if isinstance(value, x509.UnrecognizedExtension) else None
        if raw is None:
            return None
        return extract(raw)
    return None


def verify_report_signature(signed: bytes, sig: bytes, leaf: x509.Certificate) -> tuple[bool, str]:
    """ECDSA P-384/SHA-384 over ``signed`` with the leaf key; raw ``r || s`` signature
    (the rule for every NVIDIA device report, GPU or NVSwitch)."""
    key = leaf.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp384r1":
        return False, "the leaf key is not an ECDSA P-384 key"
    der_sig = encode_dss_signature(int.from_bytes(sig[:48], "big"), int.from_bytes(sig[48:], "big"))
    try:
        key.verify(der_sig, signed, ec.ECDSA(hashes.SHA384()))
    except InvalidSignature:
        return False, "the report signature does not verify with the leaf key"
    return True, ""


def _decide(check: Check, policy: Policy) -> Check:
    """Apply the policy to one check (facts in, decision out)."""
    decision, note, relaxation = Decision.REFUSE, check.note, check.relaxation
    if check.status in (CheckStatus.PASS, CheckStatus.NOT_PRESENT):
        decision = Decision.ACCEPT
    elif check.status is CheckStatus.NOT_CHECKED:
        if check.id == "nonce" and not policy.require_nonce:
            decision, note = (
                Decision.ACCEPT,
                "accepted without a nonce by policy (nonce.require: false)",
            )
            relaxation = "nonce.require: false"
        elif check.id.endswith("ocsp") and not policy.require_ocsp:
            decision, note = Decision.ACCEPT, "accepted unchecked by policy (ocsp.require: false)"
            relaxation = "ocsp.require: false"
        elif check.collateral_missing:
            decision = Decision.UNDECIDED
    return dataclasses.replace(check, decision=decision, note=note, relaxation=relaxation)


def _version_policy(report: AttestationReport, policy: Policy) -> Check:
    """The policy's driver and VBIOS limits."""
    problems: list[str] = []
    if policy.min_driver is not None:
        try:
            if version_tuple(report.driver_version) < version_tuple(policy.min_driver):
                problems.append(f"driver {report.driver_version} is older than {policy.min_driver}")
        except ValueError:
            problems.append(f"driver version {report.driver_version!r} cannot be compared")
    if policy.allowed_drivers is not None and report.driver_version not in policy.allowed_drivers:
        problems.append(f"driver {report.driver_version} is not in the allowed list")
    if (
        policy.allowed_vbios is not None
        and report.vbios_version.upper() not in policy.allowed_vbios
    ):
        problems.append(f"VBIOS {report.vbios_version} is not in the allowed list")
    for opaque_type, floor in sorted(policy.min_svn.items()):
        try:
            svn = report.opaque_data.svn(opaque_type)
        except MalformedReportError:
            svn = None
        if svn is None:
            problems.append(f"opaque entry {opaque_type} is not an SVN in the report")
        elif svn < floor:
            problems.append(f"opaque entry {opaque_type} SVN {svn} is below {floor}")
    return Check(
        "versions-policy",
        "Versions allowed by policy",
        CheckStatus.FAIL if problems else CheckStatus.PASS,
        "; ".join(problems),
    )
