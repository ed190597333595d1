"""Verify an AMD SEV-SNP attestation report against its VCEK or VLEK and AMD's pinned roots.

A report's SIGNING_KEY says which key signed it: a VCEK (one chip, issued by the ASK) or a
VLEK (a cloud provider's hosts, issued by the ASVK). The certificate given must be of that
kind; a VLEK's chain is VLEK -> ASVK -> ARK (:data:`VLEK_CHAIN`), checked by the same rules
as a VCEK's, and a VLEK has no chip ID (check 5 passes with a note). Below, "VCEK" stands for
either, except where said.

What is checked, in order (each a :class:`~gpuattest.result.Check` in the findings):

1. ``snp-report``: the report parses strictly (see :mod:`.snp_report`; a report that does
   not is :class:`~.snp_report.MalformedSnpReportError`, exit 4, and no findings).
2. ``snp-vcek-chain``: the VCEK's issuer names a product line (``SEV-Milan`` ...); a version 3
   report's CPUID names the same line; these roots have that line's ARK and ASK; VCEK, ASK and
   ARK pass :func:`~gpuattest.x509chain.validate_chain` with :data:`VCEK_CHAIN` (the ARK
   self-signed, the ASK signed by the ARK, the VCEK by the ASK, names and signatures all
   RSA-PSS SHA-384; ARK and ASK CAs within their path lengths and allowed to sign
   certificates; no unknown critical extension); the VCEK's key is ECDSA P-384 and its
   productName names the same line.
3. ``snp-vcek-validity``: ARK, ASK and VCEK are inside their validity periods at ``now``.
   Outside is a collateral problem (not-checked, ``collateral_missing``), not tampering.
4. ``snp-report-signature``: the report says it was signed with a VCEK, and the ECDSA P-384
   SHA-384 signature (R and S little-endian in the report) over bytes 0..0x2A0 verifies
   with the VCEK's key.
5. ``snp-chip-id``: the VCEK's hwID equals the report's CHIP_ID.
6. ``snp-tcb``: the VCEK's TCB extensions equal the report's REPORTED_TCB. The claim
   ``tcb_status`` is ``UpToDate`` when they are equal, ``OutOfDate`` otherwise. AMD
   publishes no TCB-status service like Intel's: ``UpToDate`` says the VCEK was issued for
   the TCB the report states, not that no newer firmware exists.

Without a VCEK, checks 2 to 6 are not-checked with ``collateral_missing`` and a reason:
never a pass. Nothing here applies policy: a debuggable guest is the ``debug`` claim, and
measurement, host data and report data are claims for the policy to compare.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from ..result import Check, CheckStatus
from ..x509chain import (
    ChainFault,
    ChainProfile,
    ChainStatus,
    SignatureRule,
    validate_chain,
    validity_fault,
)
from .findings import CvmFindings, CvmKind
from .snp_report import (
    SigningKey,
    SnpProduct,
    SnpReport,
    SnpTcb,
    looks_like_snp_report,
    parse_snp_report,
)
from .snp_roots import (
    SnpProductRoots,
    SnpRoots,
    VcekInfo,
    endorser_of_issuer,
    load_vcek,
    vcek_info,
)

__all__ = [
    "VCEK_CHAIN",
    "VLEK_CHAIN",
    "SnpRoots",
    "looks_like_snp_report",
    "verify_snp_report",
]

#: VCEK, ASK and ARK, each signed with RSA-PSS SHA-384 (AMD signs with nothing else).
VCEK_CHAIN = ChainProfile("SEV-SNP VCEK", expected_length=3, signature=SignatureRule.RSA_PSS_SHA384)
#: VLEK, ASVK and ARK, each signed with RSA-PSS SHA-384.
VLEK_CHAIN = ChainProfile("SEV-SNP VLEK", expected_length=3, signature=SignatureRule.RSA_PSS_SHA384)
_NO_VCEK = "no VCEK certificate was given (fetch it from AMD's KDS or pass it as a file)"
_NO_VLEK = (
    "the report is signed with a VLEK and none was given (pass it with --cvm-collateral, or "
    "collect it from the host's certificate table)"
)


def _status(ok: bool) -> CheckStatus:
    return CheckStatus.PASS if ok else CheckStatus.FAIL


def _ts(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def verify_snp_report(
    report: bytes,
    *,
    vcek: bytes | None,
    now: dt.datetime,
    roots: SnpRoots | None = None,
    problem: str = "",
) -> CvmFindings:
    """Verify ``report`` (see the module docstring for what, in which order).

    Args:
        report: the 1184-byte attestation report exactly as the firmware gave it.
        vcek: the chip's VCEK certificate (DER or PEM), or None when it could not be had.
        now: the verification time (timezone-aware).
        roots: the ARK/ASK pairs to chain to; None means AMD's, pinned in package data.
        problem: why there is no ``vcek`` (added to the undecided checks' reason).

    Returns:
        The findings: checks in order, claims, report data and the report's SHA-256.

    Raises:
        MalformedSnpReportError: the report cannot be parsed (exit 4).
        MalformedCertificateError: ``vcek`` is not a certificate (exit 4).
        TrustRootError: AMD's packaged roots are damaged (exit 5).
        ValueError: ``now`` is naive.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    parsed = parse_snp_report(report)
    cert = load_vcek(vcek) if vcek is not None else None
    anchors = roots if roots is not None else SnpRoots.amd()
    checks = [Check("snp-report", "SEV-SNP report parsed", CheckStatus.PASS)]
    product = parsed.cpuid_product
    info: VcekInfo | None = None
    tcb_status: str | None = None
    if cert is None:
        missing = _NO_VLEK if parsed.signing_key == SigningKey.VLEK else _NO_VCEK
        missing += f" ({problem})" if problem else ""
        for check_id, title in _CHECKS:
            checks.append(Check(check_id, title, CheckStatus.NOT_CHECKED, missing, True))
    else:
        info = vcek_info(cert)
        chain_check, vcek_product, line = _check_chain(cert, info, parsed, anchors, now)
        product = vcek_product or product
        checks.append(chain_check)
        checks.append(_check_validity(cert, line, now))
        checks.append(_check_signature(cert, parsed))
        checks.append(_check_chip_id(info, parsed, product, cert))
        tcb_check = _check_tcb(info, parsed, product)
        checks.append(tcb_check)
        if tcb_check.status is CheckStatus.PASS:
            tcb_status = "UpToDate"
        elif info.tcb() is not None:  # compared, and different
            tcb_status = "OutOfDate"
    return CvmFindings(
        kind=CvmKind.SNP,
        checks=tuple(checks),
        claims=_claims(parsed, product, info, tcb_status),
        report_data=parsed.report_data,
        evidence_sha256=hashlib.sha256(parsed.raw).digest(),
    )


_CHECKS = (
    ("snp-vcek-chain", "VCEK chain to AMD's root (VCEK, ASK, ARK)"),
    ("snp-vcek-validity", "Certificates valid at verification time"),
    ("snp-report-signature", "Report signature (VCEK, ECDSA P-384)"),
    ("snp-chip-id", "Chip ID matches the VCEK"),
    ("snp-tcb", "Reported TCB matches the VCEK"),
)


def _check_chain(
    cert: x509.Certificate, info: VcekInfo, report: SnpReport, roots: SnpRoots, now: dt.datetime
) -> tuple[Check, SnpProduct | None, SnpProductRoots | None]:
    check_id, title = _CHECKS[0]
    product, endorser = endorser_of_issuer(cert)
    if endorser == "vlek":
        title = "VLEK chain to AMD's root (VLEK, ASVK, ARK)"

    def fail(
        reason: str, line: SnpProductRoots | None = None
    ) -> tuple[Check, SnpProduct | None, SnpProductRoots | None]:
        return Check(check_id, title, CheckStatus.FAIL, reason), product, line

    if product is None:
        issuer = cert.issuer.rfc4514_string()[:120]
        return fail(f"the VCEK's issuer '{issuer}' is not an AMD SEV product line")
    wants = "vlek" if report.signing_key == SigningKey.VLEK else "vcek"
    if report.signing_key in (SigningKey.VCEK, SigningKey.VLEK) and endorser != wants:
        return fail(
            f"the report says it was signed with a {wants.upper()}, but the certificate "
            f"given is a {str(endorser).upper()} (issued by {cert.issuer.rfc4514_string()[:60]})"
        )
    cpu = report.cpuid_product
    if cpu is not None and cpu is not product:
        return fail(f"the report comes from a {cpu} CPU but the VCEK is for {product}")
    if report.cpuid_family is not None and cpu is None:
        return fail(
            f"the report's CPUID (family 0x{report.cpuid_family:02X}, model "
            f"0x{report.cpuid_model or 0:02X}) is not an AMD SEV-SNP product line gpucc knows"
        )
    line = roots.get(product)
    if line is None:
        return fail(f"no {product} root (ARK and ASK) is configured")
    if endorser == "vlek":
        if line.asvk is None:
            return fail(f"no {product} ASVK (SEV-VLEK-{product}) is configured")
        chain = validate_chain((cert, line.asvk, line.ark), line.ark, now, VLEK_CHAIN)
    else:
        chain = validate_chain((cert, line.ask, line.ark), line.ark, now, VCEK_CHAIN)
    if chain.status is ChainStatus.INVALID:  # expiry is the validity check's to report
        return fail(chain.reason, line)
    key = cert.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP384R1):
        return fail("the VCEK's key is not an ECDSA P-384 key", line)
    if info.problems:
        return fail("the VCEK is malformed: " + "; ".join(info.problems), line)
    if info.product_name is not None and info.product_name.split("-")[0] != product.value:
        return fail(f"the VCEK's productName '{info.product_name[:40]}' is not {product}", line)
    path = "VLEK -> ASVK -> ARK" if endorser == "vlek" else "VCEK -> ASK -> ARK"
    return Check(check_id, title, CheckStatus.PASS, f"{product}: {path}"), product, line


def _check_validity(
    cert: x509.Certificate, line: SnpProductRoots | None, now: dt.datetime
) -> Check:
    check_id, title = _CHECKS[1]
    vlek = endorser_of_issuer(cert)[1] == "vlek"
    middle = line.asvk if vlek and line is not None else line.ask if line is not None else None
    certs = (cert,) if line is None or middle is None else (cert, middle, line.ark)
    outside = validity_fault(certs, now)
    if outside is not None:
        fault, i = outside
        role, c = (("VLEK", "ASVK", "ARK") if vlek else ("VCEK", "ASK", "ARK"))[i], certs[i]
        window = f"valid {_ts(c.not_valid_before_utc)} to {_ts(c.not_valid_after_utc)}"
        if fault is ChainFault.NOT_YET_VALID:
            reason = f"the {role} is not valid yet at {_ts(now)} ({window})"
        else:
            reason = f"the {role} expired before {_ts(now)} ({window})"
        return Check(check_id, title, CheckStatus.NOT_CHECKED, reason, True)
    if line is None:
        return Check(
            check_id, title, CheckStatus.NOT_CHECKED, "the VCEK chains to no configured root"
        )
    return Check(check_id, title, CheckStatus.PASS, "")


def _check_signature(cert: x509.Certificate, report: SnpReport) -> Check:
    check_id, title = _CHECKS[2]
    if report.signing_key == SigningKey.VLEK:
        title = "Report signature (VLEK, ECDSA P-384)"
    if report.signing_key not in (SigningKey.VCEK, SigningKey.VLEK):
        used = {"vlek": "a VLEK", "none": "no key"}.get(
            _signing_key_name(report.signing_key), f"key type {report.signing_key}"
        )
        reason = (
            f"the report says it was signed with {used}; gpucc verifies VCEK and VLEK signatures"
        )
        return Check(check_id, title, CheckStatus.NOT_CHECKED, reason)
    wants = "vlek" if report.signing_key == SigningKey.VLEK else "vcek"
    endorser = endorser_of_issuer(cert)[1]
    if endorser != wants:
        reason = f"the report names a {wants.upper()} as its signer; the certificate is not one"
        return Check(check_id, title, CheckStatus.FAIL, reason)
    key = cert.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP384R1):
        return Check(check_id, title, CheckStatus.FAIL, "the VCEK's key is not ECDSA P-384")
    signature = encode_dss_signature(report.signature_r, report.signature_s)
    try:
        key.verify(signature, report.signed_bytes, ec.ECDSA(hashes.SHA384()))
    except InvalidSignature:
        return Check(
            check_id,
            title,
            CheckStatus.FAIL,
            "the report signature does not verify with the "
            + ("VLEK" if report.signing_key == SigningKey.VLEK else "VCEK"),
        )
    return Check(check_id, title, CheckStatus.PASS, "")


def _check_chip_id(
    info: VcekInfo, report: SnpReport, product: SnpProduct | None, cert: x509.Certificate
) -> Check:
    check_id, title = _CHECKS[3]
    if endorser_of_issuer(cert)[1] == "vlek":
        note = "a VLEK endorses a cloud provider's hosts, not one chip: no chip ID to compare"
        return Check(check_id, title, CheckStatus.PASS, note=note)
    hwid = info.hwid
    if hwid is None:
        return Check(check_id, title, CheckStatus.FAIL, "the VCEK has no hwID extension")
    same = hwid == report.chip_id or (
        # Turin's VCEKs are issued for the first 8 bytes of the chip ID.
        product is SnpProduct.TURIN and len(hwid) == 8 and hwid == report.chip_id[:8]
    )
    if same:
        return Check(check_id, title, CheckStatus.PASS, "")
    masked = (
        " (the report masks its chip ID)" if report.mask_chip_key or not any(report.chip_id) else ""
    )
    reason = (
        f"the VCEK is for chip {hwid.hex()[:16]}..., the report comes from chip "
        f"{report.chip_id.hex()[:16]}...{masked}"
    )
    return Check(check_id, title, CheckStatus.FAIL, reason)


def _check_tcb(info: VcekInfo, report: SnpReport, product: SnpProduct | None) -> Check:
    check_id, title = _CHECKS[4]
    vcek_tcb = info.tcb()
    if vcek_tcb is None or (product is SnpProduct.TURIN and vcek_tcb.fmc is None):
        return Check(check_id, title, CheckStatus.FAIL, "the VCEK lacks a TCB SPL extension")
    reported = report.tcb("reported", product).to_dict()
    issued = vcek_tcb.to_dict()
    if product is not SnpProduct.TURIN:
        issued.pop("fmc", None)
    diffs = [
        f"{name} {reported.get(name)} (VCEK {issued.get(name)})"
        for name in sorted(set(reported) | set(issued))
        if reported.get(name) != issued.get(name)
    ]
    if diffs:
        reason = "the reported TCB differs from the VCEK's: " + ", ".join(diffs)
        return Check(check_id, title, CheckStatus.FAIL, reason)
    return Check(check_id, title, CheckStatus.PASS, "")


def _claims(
    report: SnpReport,
    product: SnpProduct | None,
    info: VcekInfo | None,
    tcb_status: str | None,
) -> dict[str, Any]:
    vcek_tcb: SnpTcb | None = info.tcb() if info is not None else None
    claims: dict[str, Any] = {
        "kind": "snp",
        "report_version": report.version,
        "report_data": report.report_data.hex(),
        "debug": report.debug,
        "tcb_status": tcb_status,
        "advisory_ids": [],
        "measurement": report.measurement.hex(),
        "host_data": report.host_data.hex(),
        "policy": f"{report.policy:016x}",
        "vmpl": report.vmpl,
        "product": str(product) if product is not None else None,
        "chip_id": report.chip_id.hex(),
        "reported_tcb": report.tcb("reported", product).to_dict(),
        "committed_tcb": report.tcb("committed", product).to_dict(),
        "vcek_tcb": vcek_tcb.to_dict() if vcek_tcb is not None else None,
        # Beyond the shared names: what the report states besides.
        "current_tcb": report.tcb("current", product).to_dict(),
        "launch_tcb": report.tcb("launch", product).to_dict(),
        "guest_svn": report.guest_svn,
        "family_id": report.family_id.hex(),
        "image_id": report.image_id.hex(),
        "id_key_digest": report.id_key_digest.hex(),
        "author_key_digest": report.author_key_digest.hex(),
        "report_id": report.report_id.hex(),
        "report_id_ma": report.report_id_ma.hex(),
        "platform_info": f"{report.platform_info:016x}",
        "signing_key": _signing_key_name(report.signing_key),
        "csp_id": info.csp_id if info is not None else None,
        "firmware": "{}.{}.{}".format(*report.current_version),
        "migration_agent_allowed": bool(report.policy >> 18 & 1),
    }
    if report.cpuid_family is not None:
        claims["cpuid"] = {
            "family": report.cpuid_family,
            "model": report.cpuid_model,
            "stepping": report.cpuid_stepping,
        }
    return claims


def _signing_key_name(value: int) -> str:
    try:
        return SigningKey(value).name.lower()
    except ValueError:
        return f"reserved-{value}"
