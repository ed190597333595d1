"""Verify a paravisor CVM's vTPM evidence (Azure's SEV-SNP and TDX confidential VMs).

The chain of trust, each link a check in the findings:

1. the hardware report, verified as a bare-metal one: SEV-SNP through the VCEK (or VLEK) to
   AMD's pinned roots (:func:`.snp.verify_snp_report`); TDX through dcap-qvl with Intel's
   collateral (:func:`.tdx.verify_tdx_quote`) or, without it, every collateral-free check
   (:mod:`.tdx_offline`) and an undecided collateral check naming the FMSPC;
2. ``vtpm-binding``: the hardware report's REPORT_DATA is SHA-256 of the HCL report's runtime
   claims followed by 32 zero bytes, so the paravisor's claims (and the AK in them) are what
   the hardware signed. TDX also: the TDREPORT in the HCL report states the same report data,
   MRTD, RTMRs, TD attributes and XFAM as the signed TD quote;
3. ``vtpm-quote-signature``: the TPM quote's RSASSA-PKCS1-v1_5/SHA-256 signature verifies
   with the AK ``HCLAkPub`` from those runtime claims;
4. ``vtpm-pcrs``: the quote's PCR digest is SHA-256 of the PCR values given.

The quote's qualifying data is the evidence's freshness value (:attr:`CvmFindings.report_data`
here); the policy compares it, and, where the evidence says the runtime claims' ``user-data``
carries it (CoCo version 2), that too (:func:`.appraise.appraise`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from typing import TYPE_CHECKING, Any

from cryptography import x509

from ..result import Check, CheckStatus
from .findings import CvmFindings
from .hcl import RuntimeClaims, parse_runtime_claims
from .tpm_quote import parse_tpm_quote, pcr_digest_matches, verify_quote_signature
from .vtpm_evidence import VtpmEvidence

if TYPE_CHECKING:
    from .snp_roots import SnpRoots

__all__ = ["verify_vtpm_evidence"]

# TDREPORT (1024 bytes) offsets of the fields a TD quote's body repeats: name -> (TDREPORT
# offset, TD report body offset, size).
_TDREPORT_FIELDS = {
    "report data": (128, 520, 64),
    "TD attributes": (512, 120, 8),
    "XFAM": (520, 128, 8),
    "MRTD": (528, 136, 48),
    "RTMR0": (720, 328, 48),
    "RTMR1": (768, 376, 48),
    "RTMR2": (816, 424, 48),
    "RTMR3": (864, 472, 48),
}


def _check(cid: str, title: str, ok: bool, reason: str) -> Check:
    return Check(cid, title, CheckStatus.PASS if ok else CheckStatus.FAIL, "" if ok else reason)


def _hardware(
    ev: VtpmEvidence,
    collateral: bytes | None,
    now: dt.datetime,
    snp_roots: SnpRoots | None,
    tdx_root: x509.Certificate | None,
) -> tuple[CvmFindings, bytes]:
    """The hardware report's findings and the report data it signed."""
    if ev.hcl.tee == "snp":
        from .snp import verify_snp_report

        vcek = collateral if collateral is not None else ev.vcek
        found = verify_snp_report(ev.hcl.hardware_report, vcek=vcek, now=now, roots=snp_roots)
        return found, found.report_data
    from .tdx import TdxCollateral, check_layout, unverified_tdx_quote, verify_tdx_quote

    quote = ev.td_quote or b""
    check_layout(quote)
    if collateral is not None:
        found = verify_tdx_quote(quote, TdxCollateral.from_json(collateral), now=now, root=tdx_root)
        return found, found.report_data
    found = unverified_tdx_quote(quote, "", now=now, root=tdx_root)
    return found, found.report_data


def _binding(ev: VtpmEvidence, signed: bytes) -> Check:
    title = "Hardware report commits to the paravisor's runtime claims"
    expected = ev.hcl.claims_sha256 + bytes(32)
    if not hmac.compare_digest(signed, expected):
        reason = "the hardware report's data is not SHA-256 of the runtime claims (altered claims)"
        return _check("vtpm-binding", title, False, reason)
    if ev.hcl.tee == "tdx":
        from .tdx import td_report_span

        _, _, body, _ = td_report_span(ev.td_quote or b"")
        tdreport, quote = ev.hcl.hardware_report, ev.td_quote or b""
        for name, (at, qat, size) in _TDREPORT_FIELDS.items():
            if tdreport[at : at + size] != quote[body + qat : body + qat + size]:
                reason = f"the HCL report's TDREPORT states another {name} than the TD quote"
                return _check("vtpm-binding", title, False, reason)
    return _check("vtpm-binding", title, True, "")


def verify_vtpm_evidence(
    ev: VtpmEvidence,
    collateral: bytes | None,
    *,
    now: dt.datetime,
    snp_roots: SnpRoots | None = None,
    tdx_root: x509.Certificate | None = None,
) -> CvmFindings:
    """Verify vTPM evidence (see the module docstring); no policy applied.

    Args:
        ev: the decoded evidence.
        collateral: SEV-SNP: a VCEK/VLEK replacing the one in the evidence; TDX: Intel's
            collateral as PCCS JSON. None: the evidence's own VCEK / TDX checked offline.
        now: the verification time (timezone-aware).
        snp_roots, tdx_root: trust anchors; the pinned ones when None.

    Raises:
        MalformedEvidenceError: the quote, TD quote or collateral is malformed.
        MalformedHclReportError: the runtime claims are not the JSON expected.
        MalformedTpmQuoteError: the TPM quote is not the shape gpucc reads.
    """
    quote = parse_tpm_quote(ev.quote)
    claims_doc: RuntimeClaims = parse_runtime_claims(ev.hcl.runtime_claims)
    hardware, signed = _hardware(ev, collateral, now, snp_roots, tdx_root)
    checks = [
        Check("vtpm-evidence", "vTPM evidence parsed (HCL report, TPM quote)", CheckStatus.PASS)
    ]
    checks += hardware.checks
    checks.append(_binding(ev, signed))
    ok = verify_quote_signature(quote, ev.signature, claims_doc.ak)
    checks.append(
        _check(
            "vtpm-quote-signature",
            "TPM quote signed by the attestation key in the runtime claims",
            ok,
            "the TPM quote's signature does not verify with the runtime claims' AK (HCLAkPub)",
        )
    )
    pcrs = dict(zip(quote.pcr_indices, ev.pcrs, strict=False))
    ok = len(ev.pcrs) == len(quote.pcr_indices) and pcr_digest_matches(quote, pcrs)
    checks.append(
        _check(
            "vtpm-pcrs",
            "PCR values match the quote's PCR digest",
            ok,
            f"the {len(ev.pcrs)} PCR values given do not hash to the quote's PCR digest "
            f"(it selects {len(quote.pcr_indices)})",
        )
    )
    claims: dict[str, Any] = dict(hardware.claims)
    claims["vtpm"] = {
        "paravisor": "azure-hcl",
        "evidence_format": ev.version,
        "hcl_header_version": ev.hcl.header_version,
        "vm_configuration": claims_doc.vm_configuration,
        "console_enabled": claims_doc.vm_configuration.get("console-enabled") is True,
        "pcrs": {str(i): v.hex() for i, v in pcrs.items()},
        "qualifying_data": quote.extra_data.hex(),
        "ak_sha256": claims_doc.ak_sha256.hex(),
        "runtime_claims_sha256": ev.hcl.claims_sha256.hex(),
        "runtime_keys": list(claims_doc.key_ids),
        "user_data": claims_doc.user_data.hex() if claims_doc.user_data is not None else None,
        "user_data_bound": ev.user_data_bound,
        "tpm_reset_count": quote.reset_count,
        "tpm_restart_count": quote.restart_count,
    }
    return CvmFindings(
        kind=hardware.kind,
        checks=tuple(checks),
        claims=claims,
        report_data=quote.extra_data,
        evidence_sha256=hashlib.sha256(ev.quote + ev.signature + ev.hcl.runtime_claims).digest(),
    )
