"""CVM evidence in, one judged result out: kind detection, verification, then the policy.

:func:`verify_cvm_evidence` detects the kind from the content (a TDX quote or an SEV-SNP
report), verifies it with that kind's verifier and applies the ``cvm:`` policy on top
(:func:`appraise`). The result's checks read like a GPU's: evidence checks first, then the
policy's own (TCB status, debug, measurements, report data), each with a decision.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import hmac
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cryptography import x509

from gpucc.core.errors import MalformedEvidenceError

from ..result import Check, CheckStatus, Decision, Judged, Verdict, check_reasons, combine_verdicts
from .findings import CvmFindings, CvmKind
from .policy import CvmPolicy
from .vtpm_policy import vtpm_policy_checks

if TYPE_CHECKING:
    from .eventlog import CcEventLog
    from .snp_roots import SnpRoots
    from .vtpm_evidence import VtpmEvidence

__all__ = [
    "ATTEST_REPORT_DATA_LABEL",
    "CvmResult",
    "appraise",
    "attest_report_data",
    "check_evidence_size",
    "detect_kind",
    "verify_cvm_evidence",
    "verify_snp",
    "verify_tdx",
    "verify_vtpm",
]

MAX_EVIDENCE_BYTES = 64 * 1024
ATTEST_REPORT_DATA_LABEL = b"gpucc/attest/v1/cvm-report-data"


def attest_report_data(nonce: bytes) -> bytes:
    """The CVM report data that binds CVM evidence to GPU evidence collected with ``nonce``
    (``gpucc evidence collect --cvm``): ``SHA-512("gpucc/attest/v1/cvm-report-data" || nonce)``.
    """
    if len(nonce) != 32:
        raise ValueError("the nonce is 32 bytes")
    return hashlib.sha512(ATTEST_REPORT_DATA_LABEL + nonce).digest()


@dataclass(frozen=True)
class CvmResult(Judged):
    """One confidential VM's evidence, verified and judged."""

    kind: CvmKind
    verdict: Verdict
    checks: tuple[Check, ...]
    claims: dict[str, Any] = field(repr=False)
    report_data: bytes
    evidence_sha256: bytes
    event_log: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why this CVM is not trusted (refusals first, then undecided items)."""
        return check_reasons(self.checks)

    def to_dict(self) -> dict[str, Any]:
        """The ``cvm`` section of the ``gpucc.attest/v1`` document."""
        return {
            "kind": str(self.kind),
            "verdict": str(self.verdict),
            "evidence_sha256": self.evidence_sha256.hex(),
            "claims": self.claims,
            "checks": [c.to_dict() for c in self.checks],
            "reasons": list(self.reasons),
            "event_log": self.event_log,
        }


def _decide(check: Check) -> Check:
    """Evidence checks: pass is accepted, missing collateral undecided, anything else refused."""
    if check.status is CheckStatus.PASS:
        decision = Decision.ACCEPT
    elif check.status is CheckStatus.NOT_CHECKED and check.collateral_missing:
        decision = Decision.UNDECIDED
    else:
        decision = Decision.REFUSE
    return dataclasses.replace(check, decision=decision)


def _judged(
    cid: str, title: str, ok: bool, reason: str = "", note: str = "", relaxation: str = ""
) -> Check:
    status = CheckStatus.PASS if ok else CheckStatus.FAIL
    decision = Decision.ACCEPT if ok else Decision.REFUSE
    relaxed = relaxation if ok else ""
    return Check(cid, title, status, "" if ok else reason, False, decision, note, relaxed)


def _unchecked(
    cid: str, title: str, decision: Decision, reason: str = "", note: str = "", relaxation: str = ""
) -> Check:
    return Check(cid, title, CheckStatus.NOT_CHECKED, reason, False, decision, note, relaxation)


def _tcb_check(findings: CvmFindings, policy: CvmPolicy) -> Check:
    title = "TCB status"
    status = findings.claims.get("tcb_status")
    advisories = [str(a) for a in findings.claims.get("advisory_ids") or []]
    if status is None:
        reason = "not evaluated (the evidence checks did not complete)"
        if any(c.collateral_missing for c in findings.checks):
            reason = "not evaluated (collateral missing)"
            return Check(
                "cvm-tcb", title, CheckStatus.NOT_CHECKED, reason, True, Decision.UNDECIDED
            )
        return _unchecked("cvm-tcb", title, Decision.REFUSE, reason)
    if status not in policy.accept_tcb_status:
        allowed = ", ".join(sorted(policy.accept_tcb_status))
        return _judged("cvm-tcb", title, False, f"{status} is not accepted (accepted: {allowed})")
    unaccepted = [a for a in advisories if a.upper() not in policy.accept_advisories]
    if unaccepted:
        reason = f"{status} with advisories not accepted: {', '.join(unaccepted)}"
        return _judged("cvm-tcb", title, False, reason)
    note = relaxation = ""
    if status != "UpToDate":
        note = f"{status} accepted by policy (cvm.accept_tcb_status)"
        relaxation = f"cvm.accept_tcb_status: {status}"
    if advisories:
        note += (" with" if note else "accepted by policy") + (
            f" advisories {', '.join(advisories)} (cvm.accept_advisories)"
        )
        relaxation += ("; " if relaxation else "") + (
            f"cvm.accept_advisories: {', '.join(advisories)}"
        )
    return _judged("cvm-tcb", title, True, note=note, relaxation=relaxation)


def _debug_check(findings: CvmFindings, policy: CvmPolicy) -> Check:
    debug = bool(findings.claims.get("debug"))
    what = "TD" if findings.kind is CvmKind.TDX else "guest"
    if debug and policy.allow_debug:
        note = f"a debuggable {what} accepted by policy (cvm.allow_debug)"
        return _judged(
            "cvm-debug", "Not debuggable", True, note=note, relaxation="cvm.allow_debug: true"
        )
    return _judged("cvm-debug", "Not debuggable", not debug, f"the {what} is debuggable")


def _measurement_check(findings: CvmFindings, policy: CvmPolicy, require_pins: bool) -> Check:
    title = "Measurements"
    pins = policy.pins(str(findings.kind))
    if not pins and policy.event_pins(str(findings.kind)):
        note = f"pinned by events (cvm.events.{findings.kind}); no register pinned"
        return _unchecked("cvm-measurements", title, Decision.ACCEPT, note=note)
    if not pins and require_pins:
        reason = f"not pinned: releasing keys needs cvm.measurements.{findings.kind} in the policy"
        return _unchecked("cvm-measurements", title, Decision.REFUSE, reason)
    if not pins:
        note = f"not pinned: no cvm.measurements.{findings.kind} in the policy; reported only"
        # Key release needs pins unless the policy names cvm.allow_unpinned; a verdict without
        # pins says that it trusted whatever the CVM runs.
        relaxation = "cvm.allow_unpinned: true" if policy.allow_unpinned else ""
        relaxation = relaxation or f"cvm.measurements.{findings.kind}: none pinned"
        return _unchecked(
            "cvm-measurements", title, Decision.ACCEPT, note=note, relaxation=relaxation
        )
    wrong = [
        name for name, value in sorted(pins.items()) if findings.claims.get(name) != value.lower()
    ]
    reason = f"differs from the policy: {', '.join(wrong)}"
    note = f"pinned: {', '.join(sorted(pins))}"
    return _judged("cvm-measurements", title, not wrong, reason, note=note)


def _report_data_check(findings: CvmFindings, policy: CvmPolicy, expected: bytes | None) -> Check:
    title = "Report data"
    vtpm = findings.claims.get("vtpm")
    if vtpm is not None:
        title = "Report data (the TPM quote's qualifying data)"
    if expected is None:
        if policy.require_report_data:
            reason = "no expected report data was given"
            return _unchecked("cvm-report-data", title, Decision.REFUSE, reason)
        note = "accepted without expected report data by policy (cvm.require_report_data: false)"
        return _unchecked(
            "cvm-report-data",
            title,
            Decision.ACCEPT,
            note=note,
            relaxation="cvm.require_report_data: false",
        )
    ok = hmac.compare_digest(findings.report_data, expected)
    reason = "the evidence does not commit to this session (another VM's evidence, or a replay)"
    if ok and vtpm is not None and vtpm.get("user_data_bound"):
        padded = expected.ljust(64, b"\0").hex()
        ok = hmac.compare_digest(str(vtpm.get("user_data")), padded)
        reason = "the runtime claims' user-data does not hold this session's report data"
    return _judged("cvm-report-data", title, ok, reason)


def appraise(
    findings: CvmFindings,
    policy: CvmPolicy,
    *,
    expected_report_data: bytes | None,
    require_pins: bool = False,
    event_log: CcEventLog | None = None,
) -> CvmResult:
    """Apply ``policy`` to ``findings``; ``expected_report_data`` is what the evidence must sign.

    With ``require_pins`` (key release) unpinned measurements are refused, not just shown.
    ``event_log`` is replayed against the quote's RTMRs (TDX) or the vTPM's quoted PCRs (a
    measured-boot log) and judged against the policy's ``cvm.events`` (``tdx``, ``vtpm``).

    Raises:
        MalformedEvidenceError: the expected report data is not 64 bytes.
    """
    if expected_report_data is not None:
        if "vtpm" in findings.claims and not 1 <= len(expected_report_data) <= 64:
            raise MalformedEvidenceError(
                "the expected report data of vTPM evidence is 1 to 64 bytes"
            )
        if "vtpm" not in findings.claims and len(expected_report_data) != 64:
            raise MalformedEvidenceError("the expected CVM report data must be 64 bytes")
    from .eventcheck import event_checks

    checks = [_decide(c) for c in findings.checks]
    events_kind = "vtpm" if "vtpm" in findings.claims else str(findings.kind)
    checks += event_checks(event_log, findings.claims, policy, events_kind)
    checks += [
        _tcb_check(findings, policy),
        _debug_check(findings, policy),
        _measurement_check(findings, policy, require_pins),
    ]
    if "vtpm" in findings.claims:
        checks += vtpm_policy_checks(findings.claims["vtpm"], policy, require_pins)
    elif policy.pcrs:
        reason = "the policy pins PCRs (cvm.pcrs) but this evidence has no vTPM quote"
        checks.append(_judged("cvm-pcrs", "PCRs", False, reason))
    checks.append(_report_data_check(findings, policy, expected_report_data))
    verdicts = [
        {Decision.ACCEPT: Verdict.TRUSTED, Decision.REFUSE: Verdict.NOT_TRUSTED}.get(
            c.decision, Verdict.UNDECIDED
        )
        for c in checks
    ]
    return CvmResult(
        kind=findings.kind,
        verdict=combine_verdicts(verdicts),
        checks=tuple(checks),
        claims=dict(findings.claims),
        report_data=findings.report_data,
        evidence_sha256=findings.evidence_sha256,
        event_log=event_log.to_dict() if event_log is not None else None,
    )


def detect_kind(evidence: bytes) -> CvmKind:
    """TDX or SNP, from the content (a vTPM document: the TEE under its paravisor).

    A platform verification decides the kind once, where the evidence enters
    (:class:`gpucc.assembly.parts.PartRegistry`); this is for callers outside one.

    Raises:
        MalformedEvidenceError: neither kind (an SGX quote, GPU evidence, anything else).
    """
    from .vtpm_evidence import looks_like_vtpm_evidence, parse_vtpm_evidence

    if looks_like_vtpm_evidence(evidence):
        return CvmKind(parse_vtpm_evidence(evidence).hcl.tee)
    return _bare_kind(evidence)


def _bare_kind(evidence: bytes) -> CvmKind:
    from .snp import looks_like_snp_report
    from .tdx import looks_like_tdx_quote

    if looks_like_tdx_quote(evidence):
        return CvmKind.TDX
    if looks_like_snp_report(evidence):
        return CvmKind.SNP
    raise MalformedEvidenceError(UNKNOWN_CVM_EVIDENCE)


#: What unrecognised CVM evidence is told.
UNKNOWN_CVM_EVIDENCE = "the CVM evidence is neither a TDX quote nor an SEV-SNP report"


def check_evidence_size(evidence: bytes) -> None:
    """Refuse CVM evidence over :data:`MAX_EVIDENCE_BYTES` before anything reads it.

    Raises:
        MalformedEvidenceError: it is larger.
    """
    if len(evidence) > MAX_EVIDENCE_BYTES:
        raise MalformedEvidenceError(f"the CVM evidence is larger than {MAX_EVIDENCE_BYTES} bytes")


def verify_cvm_evidence(
    evidence: bytes,
    collateral: bytes | None,
    *,
    now: dt.datetime,
    policy: CvmPolicy,
    expected_report_data: bytes | None,
    tdx_root: x509.Certificate | None = None,
    snp_roots: SnpRoots | None = None,
    require_pins: bool = False,
    event_log: bytes | None = None,
    collateral_problem: str = "",
) -> CvmResult:
    """Detect, verify and judge one piece of CVM evidence.

    The kind is decided once, from the content, and the evidence goes to that kind's
    verifier (:func:`verify_vtpm`, :func:`verify_tdx`, :func:`verify_snp`).

    Args:
        evidence: a TDX quote or an SEV-SNP report, raw.
        collateral: TDX: Intel's collateral as PCCS JSON; SNP: the VCEK certificate. None:
            the checks that need it are undecided.
        now: the verification time (timezone-aware).
        policy: the ``cvm:`` policy.
        expected_report_data: the 64 bytes the evidence must sign, or None.
        tdx_root: the TDX trust anchor; Intel's pinned SGX Root CA when None.
        snp_roots: the SEV-SNP anchors (ARK and ASK per product line); AMD's pinned roots
            when None.
        require_pins: refuse unpinned measurements (key release).
        event_log: the TDX CC event log (the ACPI CCEL table's), replayed against the
            quote's RTMRs. With vTPM evidence: the TPM measured-boot log, replayed against
            the quoted PCRs.
        collateral_problem: why there is no collateral (shown when ``collateral`` is None).

    Without collateral the evidence is still judged: what needs the collateral is undecided,
    but a check that ran and failed (a signature, the report data, debug, the measurements,
    an event log that does not replay) makes the result not trusted, never undecided.

    Raises:
        MalformedEvidenceError: unknown kind, oversized or malformed evidence, collateral or
            event log.
        UsageError: an event log with bare SEV-SNP evidence (it has no RTMRs or PCRs to
            replay into).
    """
    check_evidence_size(evidence)
    from .vtpm_evidence import looks_like_vtpm_evidence, parse_vtpm_evidence

    if looks_like_vtpm_evidence(evidence):
        return verify_vtpm(
            parse_vtpm_evidence(evidence),
            evidence,
            collateral,
            now=now,
            policy=policy,
            expected_report_data=expected_report_data,
            tdx_root=tdx_root,
            snp_roots=snp_roots,
            require_pins=require_pins,
            event_log=event_log,
        )
    if _bare_kind(evidence) is CvmKind.TDX:
        return verify_tdx(
            evidence,
            collateral,
            now=now,
            policy=policy,
            expected_report_data=expected_report_data,
            root=tdx_root,
            require_pins=require_pins,
            event_log=event_log,
            collateral_problem=collateral_problem,
        )
    return verify_snp(
        evidence,
        collateral,
        now=now,
        policy=policy,
        expected_report_data=expected_report_data,
        roots=snp_roots,
        require_pins=require_pins,
        event_log=event_log,
        collateral_problem=collateral_problem,
    )


def verify_vtpm(
    document: VtpmEvidence,
    evidence: bytes,
    collateral: bytes | None,
    *,
    now: dt.datetime,
    policy: CvmPolicy,
    expected_report_data: bytes | None,
    tdx_root: x509.Certificate | None = None,
    snp_roots: SnpRoots | None = None,
    require_pins: bool = False,
    event_log: bytes | None = None,
) -> CvmResult:
    """Verify and judge a paravisor's vTPM evidence (``document``, decoded from
    ``evidence``); ``event_log`` is the TPM measured-boot log, replayed against the quoted
    PCRs. Arguments and errors as :func:`verify_cvm_evidence`."""
    check_evidence_size(evidence)
    from .eventlog import parse_event_log
    from .vtpm import verify_vtpm_evidence

    findings = verify_vtpm_evidence(
        document, collateral, now=now, snp_roots=snp_roots, tdx_root=tdx_root
    )
    findings = dataclasses.replace(findings, evidence_sha256=hashlib.sha256(evidence).digest())
    return appraise(
        findings,
        policy,
        expected_report_data=expected_report_data,
        require_pins=require_pins,
        event_log=parse_event_log(event_log, pcrs=True) if event_log is not None else None,
    )


def verify_tdx(
    evidence: bytes,
    collateral: bytes | None,
    *,
    now: dt.datetime,
    policy: CvmPolicy,
    expected_report_data: bytes | None,
    root: x509.Certificate | None = None,
    require_pins: bool = False,
    event_log: bytes | None = None,
    collateral_problem: str = "",
) -> CvmResult:
    """Verify and judge a TDX quote; ``event_log`` is the CC event log, replayed against the
    quote's RTMRs. Arguments and errors as :func:`verify_cvm_evidence`."""
    check_evidence_size(evidence)
    from .eventlog import parse_event_log
    from .tdx import TdxCollateral, unverified_tdx_quote, verify_tdx_quote

    log = parse_event_log(event_log, require_sha384=True) if event_log is not None else None
    findings: CvmFindings
    if collateral is None:
        # Judged as far as it can be: the quote's own cryptography and the policy's checks
        # decide a refusal; TCB status and revocation stay undecided.
        findings = unverified_tdx_quote(evidence, collateral_problem, now=now, root=root)
    else:
        findings = verify_tdx_quote(
            evidence, TdxCollateral.from_json(collateral), now=now, root=root
        )
    return appraise(
        findings,
        policy,
        expected_report_data=expected_report_data,
        require_pins=require_pins,
        event_log=log,
    )


def verify_snp(
    evidence: bytes,
    collateral: bytes | None,
    *,
    now: dt.datetime,
    policy: CvmPolicy,
    expected_report_data: bytes | None,
    roots: SnpRoots | None = None,
    require_pins: bool = False,
    event_log: bytes | None = None,
    collateral_problem: str = "",
) -> CvmResult:
    """Verify and judge an SEV-SNP report (``collateral``: its VCEK or VLEK). Arguments and
    errors as :func:`verify_cvm_evidence`; an event log is refused (no RTMRs or PCRs)."""
    check_evidence_size(evidence)
    if event_log is not None:
        from gpucc.core.errors import UsageError

        raise UsageError(
            "an event log is replayed into a TDX quote's RTMRs; SEV-SNP evidence has none"
        )
    from .snp import verify_snp_report

    # No VCEK: the chain and signature checks are reported unchecked (collateral missing).
    findings = verify_snp_report(
        evidence, vcek=collateral, now=now, roots=roots, problem=collateral_problem
    )
    return appraise(
        findings,
        policy,
        expected_report_data=expected_report_data,
        require_pins=require_pins,
    )
