"""The verification outline: evidence + collateral + policy → a verdict.

Everything that decides trust happens in :func:`verify`, in this order, for
each GPU:

1. architecture is one gpucc knows (Hopper; Blackwell where the rules are known)
2. the report parses strictly (exit 4 when it does not)
3. the device chain has 5 certificates and chains to the pinned device root at ``now``
4. OCSP for device certificates 1..n-2
5. the report's FWID equals the leaf certificate's FWID (when the report has one)
6. the report signature verifies with the leaf key (ECDSA P-384/SHA-384)
7. the report nonce equals the expected nonce
8. driver and VBIOS versions: NVML's self-report (when present) and the policy's limits
9. driver and VBIOS RIMs: obtained, XSD-valid, XML-DSig valid, chained to the pinned RIM
   root at ``now``, OCSP on RIM certificates 0..n-2, colloquialVersion equals the report's
10. measurements: active golden values of both RIMs against the report's blocks
11. CC state, for evidence collected from NVML

Each step yields a :class:`Check` with a status (pass, fail, not-checked,
not-present) and a reason; nothing unchecked ever counts as a pass. The policy
then decides per check: accept, refuse, or undecided (collateral missing).
Verdicts: any refusal → not trusted (exit 1); otherwise anything undecided →
undecided (exit 3); otherwise trusted (exit 0). Several GPUs: trusted only if
all are.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from ._internal import der
from ._internal.x509names import common_name
from .chain import ChainResult, ChainStatus, load_pem_chain, validate_chain
from .collateral import ChainKind, OcspChecker, OcspOutcome, OcspStatus, RimSource
from .errors import (
    EXIT_COLLATERAL,
    EXIT_NOT_TRUSTED,
    EXIT_OK,
    CollateralUnavailableError,
    MalformedEvidenceError,
)
from .evidence import EvidenceSet, GpuEvidence
from .measurements import MeasurementResult, MeasurementStatus, compare_measurements
from .policy import Policy, version_tuple
from .report import Architecture, AttestationReport
from .rim import ReferenceManifest
from .trust import TrustRoots

__all__ = [
    "AttestationResult",
    "Check",
    "CheckStatus",
    "Decision",
    "GpuResult",
    "Verdict",
    "verify",
]

DEVICE_CHAIN_LENGTH = 5  # HopperSettings.MAX_CERT_CHAIN_LENGTH in NVIDIA's verifier
_FWID_HOPPER = x509.ObjectIdentifier("2.23.133.5.4.1")
_FWID_DICE = x509.ObjectIdentifier("2.23.133.5.4.1.1")


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


class Verdict(enum.StrEnum):
    """Overall outcome."""

    TRUSTED = "trusted"
    NOT_TRUSTED = "not-trusted"
    UNDECIDED = "undecided"

    @property
    def exit_code(self) -> int:
        """0 trusted, 1 not trusted, 3 undecided for lack of collateral."""
        return {
            Verdict.TRUSTED: EXIT_OK,
            Verdict.NOT_TRUSTED: EXIT_NOT_TRUSTED,
            Verdict.UNDECIDED: EXIT_COLLATERAL,
        }[self]


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
        refused = [f"{c.title}: {c.reason}" for c in self.checks if c.decision is Decision.REFUSE]
        undecided = [
            f"{c.title}: {c.reason}" for c in self.checks if c.decision is Decision.UNDECIDED
        ]
        return tuple(refused + undecided)

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
            "checks": [c.to_dict() for c in self.checks],
            "mismatches": [m.to_dict() for m in self.measurements.mismatches]
            if self.measurements
            else [],
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True)
class AttestationResult:
    """The verdict over every GPU of one piece of evidence."""

    verdict: Verdict
    gpus: tuple[GpuResult, ...]
    policy: Policy
    verified_at: dt.datetime
    expected_nonce: bytes | None
    source: str

    @property
    def trusted(self) -> bool:
        """True only when every GPU passed every check the policy requires."""
        return self.verdict is Verdict.TRUSTED

    @property
    def exit_code(self) -> int:
        """The CLI exit code for this verdict."""
        return self.verdict.exit_code

    @property
    def reasons(self) -> tuple[str, ...]:
        """Per-GPU reasons, prefixed with the GPU index."""
        return tuple(f"GPU {g.index}: {r}" for g in self.gpus for r in g.reasons)

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON document (schema ``gpucc.attest/v1``)."""
        return {
            "schema": "gpucc.attest/v1",
            "verdict": str(self.verdict),
            "trusted": self.trusted,
            "exit_code": self.exit_code,
            "x-nvidia-overall-att-result": self.trusted,
            "verified_at": self.verified_at.isoformat().replace("+00:00", "Z"),
            "nonce": self.expected_nonce.hex() if self.expected_nonce is not None else None,
            "evidence_source": self.source,
            "policy": self.policy.to_dict(),
            "reasons": list(self.reasons),
            "gpus": [g.to_dict() for g in self.gpus],
        }


# --- helpers -----------------------------------------------------------------


def _leaf_fwid(leaf: x509.Certificate) -> bytes | None:
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


def _verify_report_signature(report: AttestationReport, leaf: x509.Certificate) -> tuple[bool, str]:
    key = leaf.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp384r1":
        return False, "the leaf key is not an ECDSA P-384 key"
    sig = report.signature
    der_sig = encode_dss_signature(int.from_bytes(sig[:48], "big"), int.from_bytes(sig[48:], "big"))
    try:
        key.verify(der_sig, report.signed_bytes, ec.ECDSA(hashes.SHA384()))
    except InvalidSignature:
        return False, "the report signature does not verify with the leaf key"
    return True, ""


@dataclass
class _ChainOcsp:
    status: CheckStatus
    reason: str
    collateral_missing: bool
    claim_status: str
    revocation_reason: str | None
    nonce_match: bool | None
    response_valid: bool | None
    note: str = ""


def _ocsp_chain(
    certs: Sequence[x509.Certificate],
    indices: range,
    *,
    kind: ChainKind,
    anchor: x509.Certificate,
    checker: OcspChecker,
    now: dt.datetime,
    policy: Policy,
) -> _ChainOcsp:
    """OCSP for ``certs[i]`` (issuer ``certs[i+1]``) for i in ``indices``.

    The chain-level status is the first non-good one scanning from the root side,
    as NVAT reports it. Policy allowances (unknown, certificate_hold for named
    chains, missing nonce echo) are applied here and recorded in ``note``.
    """
    outcomes: list[tuple[x509.Certificate, OcspOutcome]] = []
    for i in reversed(indices):
        outcomes.append(
            (
                certs[i],
                checker.check(
                    certs[i],
                    certs[i + 1],
                    kind=kind,
                    anchor=anchor,
                    now=now,
                    issuer_chain=certs[i + 2 :],
                ),
            )
        )
    notes: list[str] = []
    nonce_match: bool | None = None
    response_valid: bool | None = None
    for _cert, out in outcomes:
        if out.nonce_match is not None:
            nonce_match = (
                out.nonce_match if nonce_match is None else (nonce_match and out.nonce_match)
            )
        if out.response_valid is not None:
            response_valid = (
                out.response_valid
                if response_valid is None
                else (response_valid and out.response_valid)
            )
    for cert, out in outcomes:
        name = common_name(cert)
        if out.status is OcspStatus.NOT_CHECKED:
            return _ChainOcsp(
                CheckStatus.NOT_CHECKED,
                f"'{name}': {out.reason or 'not checked'}",
                out.collateral_missing,
                "not-checked",
                None,
                nonce_match,
                response_valid,
            )
        if out.response_valid is False:
            return _ChainOcsp(
                CheckStatus.FAIL,
                f"'{name}': invalid OCSP response: {out.reason}",
                False,
                "invalid",
                None,
                nonce_match,
                response_valid,
            )
        if out.status is OcspStatus.REVOKED:
            reason = out.revocation_reason or "unspecified"
            if reason == "certificate_hold" and str(kind) in policy.allow_hold:
                notes.append(f"certificate_hold on '{name}' accepted by policy")
                continue
            return _ChainOcsp(
                CheckStatus.FAIL,
                f"'{name}' is revoked ({reason})",
                False,
                "revoked",
                reason,
                nonce_match,
                response_valid,
            )
        if out.status is OcspStatus.UNKNOWN:
            if policy.allow_ocsp_unknown:
                notes.append(f"status unknown for '{name}' accepted by policy")
                continue
            return _ChainOcsp(
                CheckStatus.FAIL,
                f"the responder does not know '{name}'",
                False,
                "unknown",
                None,
                nonce_match,
                response_valid,
            )
        if out.nonce_match is False:
            if policy.allow_ocsp_nonce_mismatch:
                notes.append(f"OCSP nonce not echoed for '{name}', accepted by policy")
                continue
            return _ChainOcsp(
                CheckStatus.FAIL,
                f"the OCSP response for '{name}' does not echo the request nonce",
                False,
                "good",
                None,
                nonce_match,
                response_valid,
            )
    held = any(o.status is OcspStatus.REVOKED for _, o in outcomes)
    return _ChainOcsp(
        CheckStatus.PASS,
        "",
        False,
        "revoked" if held else "good",
        "certificate_hold" if held else None,
        nonce_match,
        response_valid,
        note="; ".join(notes),
    )


def _chain_ocsp_check(
    check_id: str,
    title: str,
    chain: ChainResult,
    *,
    first: int,
    kind: ChainKind,
    anchor: x509.Certificate,
    checker: OcspChecker,
    now: dt.datetime,
    policy: Policy,
) -> tuple[Check, _ChainOcsp | None]:
    """The OCSP check for certificates ``first``..n-2 of a chain (not run on an invalid chain)."""
    certs = chain.certificates
    if chain.status is ChainStatus.INVALID or len(certs) < 2:
        return Check(check_id, title, CheckStatus.NOT_CHECKED, "the chain is invalid"), None
    res = _ocsp_chain(
        certs,
        range(first, len(certs) - 1),
        kind=kind,
        anchor=anchor,
        checker=checker,
        now=now,
        policy=policy,
    )
    check = Check(check_id, title, res.status, res.reason, res.collateral_missing, note=res.note)
    return check, res


def _chain_claim(chain: ChainResult | None, ocsp: _ChainOcsp | None) -> dict[str, Any]:
    status = str(chain.status) if chain else None
    if ocsp is not None and ocsp.claim_status == "revoked" and ocsp.status is CheckStatus.FAIL:
        status = "revoked"
    expiry = chain.earliest_expiry if chain else None
    return {
        "x-nvidia-cert-expiration-date": expiry.isoformat().replace("+00:00", "Z")
        if expiry
        else None,
        "x-nvidia-cert-status": status,
        "x-nvidia-cert-ocsp-status": ocsp.claim_status if ocsp else "not-checked",
        "x-nvidia-cert-revocation-reason": ocsp.revocation_reason if ocsp else None,
        "x-nvidia-cert-ocsp-nonce-matches": ocsp.nonce_match if ocsp else None,
        "x-nvidia-cert-ocsp-response-valid": ocsp.response_valid if ocsp else None,
    }


def _decide(check: Check, policy: Policy) -> Check:
    """Apply the policy to one check (facts in, decision out)."""
    decision, note = Decision.REFUSE, check.note
    if check.status in (CheckStatus.PASS, CheckStatus.NOT_PRESENT):
        decision = Decision.ACCEPT
    elif check.status is CheckStatus.NOT_CHECKED:
        if check.id == "nonce" and not policy.require_nonce:
            decision, note = (
                Decision.ACCEPT,
                "accepted without a nonce by policy (nonce.require: false)",
            )
        elif check.id.endswith("ocsp") and not policy.require_ocsp:
            decision, note = Decision.ACCEPT, "accepted unchecked by policy (ocsp.require: false)"
        elif check.collateral_missing:
            decision = Decision.UNDECIDED
    return Check(
        check.id, check.title, check.status, check.reason, check.collateral_missing, decision, note
    )


def _rim_chain_check(
    prefix: str, title: str, chain: ChainResult, now: dt.datetime, policy: Policy
) -> Check:
    if chain.status is ChainStatus.VALID:
        return Check(f"{prefix}-chain", title, CheckStatus.PASS)
    if chain.status is ChainStatus.EXPIRED and policy.rim_expired_signer_grace:
        certs = chain.certificates
        expired = [c for c in certs if now > c.not_valid_after_utc or now < c.not_valid_before_utc]
        leaf = certs[0]
        if (
            expired == [leaf]
            and now > leaf.not_valid_after_utc
            and now - leaf.not_valid_after_utc <= policy.rim_expired_signer_grace
        ):
            return Check(
                f"{prefix}-chain",
                title,
                CheckStatus.PASS,
                chain.reason,
                note=f"expired signer accepted within the "
                f"{policy.rim_expired_signer_grace.days}-day grace",
            )
    return Check(f"{prefix}-chain", title, CheckStatus.FAIL, f"{chain.status}: {chain.reason}")


@dataclass
class _RimOutcome:
    manifest: ReferenceManifest | None
    checks: list[Check]
    claims: dict[str, Any]


def _verify_rim(
    *,
    role: str,
    rim_id: str,
    expected_version: str,
    rims: RimSource,
    ocsp: OcspChecker,
    roots: TrustRoots,
    now: dt.datetime,
    policy: Policy,
) -> _RimOutcome:
    p = f"{role}-rim"
    label = "Driver RIM" if role == "driver" else "VBIOS RIM"
    kind = ChainKind.DRIVER_RIM if role == "driver" else ChainKind.VBIOS_RIM
    claim = f"x-nvidia-gpu-{role}-rim"
    try:
        data = rims.get_rim(rim_id)
    except CollateralUnavailableError as exc:
        reason = exc.diagnostics()
        checks = [
            Check(f"{p}-fetched", f"{label} available", CheckStatus.NOT_CHECKED, reason, True),
        ] + [
            Check(
                f"{p}-{s}", f"{label} {t}", CheckStatus.NOT_CHECKED, f"{rim_id} not available", True
            )
            for s, t in (
                ("schema", "schema"),
                ("signature", "signature"),
                ("chain", "certificate chain"),
                ("ocsp", "certificate OCSP"),
                ("version", "version match"),
            )
        ]
        claims = {
            f"{claim}-fetched": False,
            f"{claim}-schema-validated": None,
            f"{claim}-cert-chain": _chain_claim(None, None),
            f"{claim}-signature-verified": None,
            f"{claim}-version-match": None,
            f"{claim}-measurements-available": False,
        }
        return _RimOutcome(None, checks, claims)
    manifest = ReferenceManifest.parse(data)
    checks = [Check(f"{p}-fetched", f"{label} available", CheckStatus.PASS, rim_id)]
    schema = manifest.validate_schema()
    checks.append(
        Check(
            f"{p}-schema",
            f"{label} schema",
            CheckStatus.PASS if schema.valid else CheckStatus.FAIL,
            schema.reason,
        )
    )
    sig = manifest.verify_signature(anchor=roots.rim_root, now=now)
    checks.append(
        Check(
            f"{p}-signature",
            f"{label} signature",
            CheckStatus.PASS if sig.signature_valid else CheckStatus.FAIL,
            sig.signature_reason,
        )
    )
    checks.append(_rim_chain_check(p, f"{label} certificate chain", sig.chain, now, policy))
    ocsp_check, ocsp_res = _chain_ocsp_check(
        f"{p}-ocsp",
        f"{label} certificate OCSP",
        sig.chain,
        first=0,
        kind=kind,
        anchor=roots.rim_root,
        checker=ocsp,
        now=now,
        policy=policy,
    )
    checks.append(ocsp_check)
    version_ok = manifest.colloquial_version.strip().upper() == expected_version.strip().upper()
    checks.append(
        Check(
            f"{p}-version",
            f"{label} version match",
            CheckStatus.PASS if version_ok else CheckStatus.FAIL,
            ""
            if version_ok
            else f"RIM is for {manifest.colloquial_version}, the report says {expected_version}",
        )
    )
    claims = {
        f"{claim}-fetched": True,
        f"{claim}-schema-validated": schema.valid,
        f"{claim}-cert-chain": _chain_claim(sig.chain, ocsp_res),
        f"{claim}-signature-verified": sig.signature_valid,
        f"{claim}-version-match": version_ok,
        f"{claim}-measurements-available": bool(manifest.measurements),
    }
    return _RimOutcome(manifest, checks, claims)


def _version_policy(report: AttestationReport, policy: Policy) -> Check:
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
    return Check(
        "versions-policy",
        "Versions allowed by policy",
        CheckStatus.FAIL if problems else CheckStatus.PASS,
        "; ".join(problems),
    )


def _verify_gpu(
    index: int,
    gpu: GpuEvidence,
    evidence: EvidenceSet,
    *,
    expected_nonce: bytes | None,
    roots: TrustRoots,
    now: dt.datetime,
    rims: RimSource,
    ocsp: OcspChecker,
    policy: Policy,
) -> GpuResult:
    checks: list[Check] = []
    claims: dict[str, Any] = {}

    # (1) architecture
    try:
        arch: Architecture | None = Architecture.parse(gpu.arch)
    except Exception:
        arch = None
    checks.append(
        Check(
            "arch",
            "Architecture",
            CheckStatus.PASS if arch else CheckStatus.FAIL,
            "" if arch else f"{gpu.arch} is not a GPU architecture gpucc verifies",
        )
    )
    claims["x-nvidia-gpu-arch-check"] = arch is not None

    # (2) report parsing: malformed input stops here with exit 4
    report = AttestationReport.parse(gpu.report)
    checks.append(Check("report-parsed", "Report parsed", CheckStatus.PASS))
    claims["x-nvidia-gpu-attestation-report-parsed"] = True
    claims["x-nvidia-gpu-driver-version"] = report.driver_version
    claims["x-nvidia-gpu-vbios-version"] = report.vbios_version

    # (3) device chain to the pinned root
    certs = load_pem_chain(gpu.cert_chain_pem)
    if not certs:
        raise MalformedEvidenceError(f"GPU {index}: the certificate chain is empty")
    chain = validate_chain(certs, roots.device_root, now, expected_length=DEVICE_CHAIN_LENGTH)
    checks.append(
        Check(
            "device-chain",
            "Device certificate chain",
            CheckStatus.PASS if chain.ok else CheckStatus.FAIL,
            "" if chain.ok else f"{chain.status}: {chain.reason}",
        )
    )
    leaf = certs[0]
    claims["hwmodel"] = common_name(certs[1]) if len(certs) > 1 else None
    claims["ueid"] = str(leaf.serial_number)

    # (4) OCSP for device certificates 1..n-2 (the per-boot leaf and the root are not checked)
    ocsp_check, device_ocsp = _chain_ocsp_check(
        "device-ocsp",
        "Device certificate OCSP",
        chain,
        first=1,
        kind=ChainKind.DEVICE,
        anchor=roots.device_root,
        checker=ocsp,
        now=now,
        policy=policy,
    )
    checks.append(ocsp_check)
    claims["x-nvidia-gpu-attestation-report-cert-chain"] = _chain_claim(chain, device_ocsp)

    # (5) FWID
    try:
        leaf_fwid = _leaf_fwid(leaf)
    except der.DerError as exc:
        leaf_fwid, fwid_error = None, f"the leaf FWID extension is malformed: {exc}"
    else:
        fwid_error = ""
    if report.fwid is None:
        fwid = Check(
            "fwid", "FWID", CheckStatus.NOT_PRESENT, "the report carries no FWID (older firmware)"
        )
        claims["x-nvidia-gpu-attestation-report-cert-chain-fwid-match"] = None
    else:
        match = leaf_fwid is not None and hmac.compare_digest(leaf_fwid, report.fwid)
        reason = fwid_error or (
            "" if match else "the report FWID differs from the leaf certificate's"
        )
        if leaf_fwid is None and not fwid_error:
            reason = "the leaf certificate has no FWID extension"
        fwid = Check("fwid", "FWID", CheckStatus.PASS if match else CheckStatus.FAIL, reason)
        claims["x-nvidia-gpu-attestation-report-cert-chain-fwid-match"] = match
    checks.append(fwid)

    # (6) report signature
    sig_ok, sig_reason = _verify_report_signature(report, leaf)
    checks.append(
        Check(
            "report-signature",
            "Report signature",
            CheckStatus.PASS if sig_ok else CheckStatus.FAIL,
            sig_reason,
        )
    )
    claims["x-nvidia-gpu-attestation-report-signature-verified"] = sig_ok

    # (7) nonce
    if expected_nonce is None:
        checks.append(
            Check(
                "nonce",
                "Nonce",
                CheckStatus.NOT_CHECKED,
                "no expected nonce was given, so freshness is not established",
            )
        )
        claims["x-nvidia-gpu-attestation-report-nonce-match"] = None
    else:
        ok = hmac.compare_digest(report.nonce, expected_nonce)
        checks.append(
            Check(
                "nonce",
                "Nonce",
                CheckStatus.PASS if ok else CheckStatus.FAIL,
                "" if ok else f"the report nonce is {report.nonce.hex()}",
            )
        )
        claims["x-nvidia-gpu-attestation-report-nonce-match"] = ok
    claims["eat_nonce"] = report.nonce.hex()

    # (8) versions: NVML self-report consistency, then policy limits
    for key, title, reported, nvml in (
        ("driver-version", "Driver version (NVML)", report.driver_version, gpu.driver_version),
        ("vbios-version", "VBIOS version (NVML)", report.vbios_version, gpu.vbios_version),
    ):
        if nvml is None:
            checks.append(
                Check(key, title, CheckStatus.NOT_PRESENT, "no NVML-reported version to compare")
            )
        else:
            same = nvml.strip().upper() == reported.upper()
            checks.append(
                Check(
                    key,
                    title,
                    CheckStatus.PASS if same else CheckStatus.FAIL,
                    "" if same else f"NVML reports {nvml}, the signed report {reported}",
                )
            )
    checks.append(_version_policy(report, policy))

    # (9) RIMs
    driver_id = report.driver_rim_id(arch or Architecture.HOPPER)
    vbios_id = report.vbios_rim_id()
    outcomes = {}
    for role, rim_id, version in (
        ("driver", driver_id, report.driver_version),
        ("vbios", vbios_id, report.vbios_version),
    ):
        out = _verify_rim(
            role=role,
            rim_id=rim_id,
            expected_version=version,
            rims=rims,
            ocsp=ocsp,
            roots=roots,
            now=now,
            policy=policy,
        )
        checks.extend(out.checks)
        claims.update(out.claims)
        outcomes[role] = out

    # (10) measurements
    driver_rim, vbios_rim = outcomes["driver"].manifest, outcomes["vbios"].manifest
    meas = compare_measurements(
        driver=driver_rim,
        vbios=vbios_rim,
        runtime=report.runtime_measurements(),
        nvdec0_disabled=report.nvdec0_disabled,
    )
    if meas.status is MeasurementStatus.NOT_RUN:
        checks.append(
            Check(
                "measurements",
                "Measurements",
                CheckStatus.NOT_CHECKED,
                meas.reason,
                collateral_missing=True,
            )
        )
        claims["measres"] = "not-run"
    else:
        tolerated = [m for m in meas.mismatches if m.index in policy.allow_mismatch]
        blocking = [m for m in meas.mismatches if m.index not in policy.allow_mismatch]
        ok = not blocking and not meas.conflicts
        if blocking:
            listed = ", ".join(f"{m.index} ({m.source})" for m in blocking)
            reason = f"mismatch at RIM indices {listed}"
        elif meas.conflicts:
            reason = f"indices active in both RIMs: {', '.join(map(str, meas.conflicts))}"
        else:
            reason = f"{meas.matched_count} of {meas.compared_count} golden measurements match"
        note = (
            f"mismatch tolerated by policy at {', '.join(str(m.index) for m in tolerated)}"
            if tolerated
            else ""
        )
        checks.append(
            Check(
                "measurements",
                "Measurements",
                CheckStatus.PASS if ok else CheckStatus.FAIL,
                reason,
                note=note,
            )
        )
        claims["measres"] = "success" if ok else "fail"
    claims["x-nvidia-gpu-vbios-index-no-conflict"] = (
        None if meas.status is MeasurementStatus.NOT_RUN else not meas.conflicts
    )
    claims["x-nvidia-mismatch-measurement-records"] = [m.to_dict() for m in meas.mismatches]

    # (11) CC state, only meaningful for evidence just collected through NVML
    if evidence.source == "nvml" and evidence.cc is not None:
        cc_on = evidence.cc.cc_feature or evidence.cc.multi_gpu_mode != 0
        checks.append(
            Check(
                "cc-mode",
                "CC mode on",
                CheckStatus.PASS if cc_on or not policy.require_cc_on else CheckStatus.FAIL,
                "" if cc_on else "confidential computing is off",
            )
        )
        dev = evidence.cc.devtools_mode
        checks.append(
            Check(
                "devtools",
                "DevTools mode off",
                CheckStatus.PASS if not dev or not policy.forbid_devtools else CheckStatus.FAIL,
                "DevTools mode is on (not a production mode)" if dev else "",
            )
        )

    decided = tuple(_decide(c, policy) for c in checks)
    if any(c.decision is Decision.REFUSE for c in decided):
        verdict = Verdict.NOT_TRUSTED
    elif any(c.decision is Decision.UNDECIDED for c in decided):
        verdict = Verdict.UNDECIDED
    else:
        verdict = Verdict.TRUSTED
    claims["x-nvidia-gpu-claims-version"] = "3.0"
    claims["oemid"] = driver_rim.platform_manufacturer_id if driver_rim is not None else None
    return GpuResult(
        index=index,
        uuid=gpu.uuid,
        arch=gpu.arch,
        checks=decided,
        claims=claims,
        measurements=None if meas.status is MeasurementStatus.NOT_RUN else meas,
        report_digest=hashlib.sha256(gpu.report).digest(),
        driver_rim_id=driver_id,
        vbios_rim_id=vbios_id,
        verdict=verdict,
    )


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
        MalformedInputError: a report, chain, or RIM cannot be parsed (exit 4).
    """
    if now.tzinfo is None:
        raise ValueError("the verification time must be timezone-aware")
    if expected_nonce is not None and len(expected_nonce) != 32:
        raise MalformedEvidenceError("the expected nonce must be 32 bytes")
    policy = policy or Policy()
    if not evidence.gpus:
        raise MalformedEvidenceError("the evidence holds no GPU")
    gpus = tuple(
        _verify_gpu(
            i,
            gpu,
            evidence,
            expected_nonce=expected_nonce,
            roots=roots,
            now=now,
            rims=rims,
            ocsp=ocsp,
            policy=policy,
        )
        for i, gpu in enumerate(evidence.gpus)
    )
    if any(g.verdict is Verdict.NOT_TRUSTED for g in gpus):
        verdict = Verdict.NOT_TRUSTED
    elif any(g.verdict is Verdict.UNDECIDED for g in gpus):
        verdict = Verdict.UNDECIDED
    else:
        verdict = Verdict.TRUSTED
    return AttestationResult(
        verdict=verdict,
        gpus=gpus,
        policy=policy,
        verified_at=now,
        expected_nonce=expected_nonce,
        source=evidence.source,
    )
