"""Revocation of a whole chain: per-certificate OCSP outcomes folded into one check.

Which certificates are asked about is decided once, by
:func:`~gpuattest.collateral.ocsp_targets`. Their outcomes are scanned from the
root side, and the chain's status is the first one that is not good, as NVIDIA's
attestation tools report it. The policy's allowances are applied here and recorded
in the check's note: ``certificate_hold`` on the chains ``Policy.allow_hold``
names, ``unknown`` when ``allow_ocsp_unknown``, a missing nonce echo when
``allow_ocsp_nonce_mismatch``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from ._internal.x509names import common_name
from .collateral import ChainKind, OcspChecker, OcspOutcome, OcspStatus, ocsp_targets
from .policy import Policy
from .result import Check, CheckStatus
from .x509chain import ChainResult, ChainStatus

__all__ = ["ChainRevocation", "chain_claim", "check_chain_revocation"]


@dataclass(frozen=True)
class ChainRevocation:
    """What OCSP said about a chain, as one status plus the claim fields.

    Attributes:
        status: the check status for the chain.
        reason: why, when not a pass.
        collateral_missing: not checked because an answer could not be obtained.
        claim_status: ``x-nvidia-cert-ocsp-status`` (good, revoked, unknown, invalid,
            not-checked).
        revocation_reason: the revocation reason claimed, when revoked or held.
        nonce_match: all echoed nonces matched (None when no nonce was sent).
        response_valid: all evaluated responses verified (None when none was).
        note: the allowances the policy applied.
    """

    status: CheckStatus
    reason: str
    collateral_missing: bool
    claim_status: str
    revocation_reason: str | None
    nonce_match: bool | None
    response_valid: bool | None
    note: str = ""


def _all_true(values: list[bool | None]) -> bool | None:
    """False if any is False, True if any is True (and none False), else None."""
    known = [v for v in values if v is not None]
    return all(known) if known else None


def _fold(
    outcomes: list[tuple[x509.Certificate, OcspOutcome]], kind: ChainKind, policy: Policy
) -> ChainRevocation:
    nonce_match = _all_true([out.nonce_match for _, out in outcomes])
    response_valid = _all_true([out.response_valid for _, out in outcomes])

    def fail(reason: str, claim: str, revocation: str | None = None) -> ChainRevocation:
        return ChainRevocation(
            CheckStatus.FAIL, reason, False, claim, revocation, nonce_match, response_valid
        )

    notes: list[str] = []
    for cert, out in outcomes:
        name = common_name(cert)
        if out.status is OcspStatus.NOT_CHECKED:
            return ChainRevocation(
                CheckStatus.NOT_CHECKED,
                f"'{name}': {out.reason or 'not checked'}",
                out.collateral_missing,
                "not-checked",
                None,
                nonce_match,
                response_valid,
            )
        if out.response_valid is False:
            return fail(f"'{name}': invalid OCSP response: {out.reason}", "invalid")
        if out.status is OcspStatus.REVOKED:
            reason = out.revocation_reason or "unspecified"
            if reason == "certificate_hold" and str(kind) in policy.allow_hold:
                notes.append(f"certificate_hold on '{name}' accepted by policy")
                continue
            return fail(f"'{name}' is revoked ({reason})", "revoked", reason)
        if out.status is OcspStatus.UNKNOWN:
            if policy.allow_ocsp_unknown:
                notes.append(f"status unknown for '{name}' accepted by policy")
                continue
            return fail(f"the responder does not know '{name}'", "unknown")
        if out.nonce_match is False:
            if policy.allow_ocsp_nonce_mismatch:
                notes.append(f"OCSP nonce not echoed for '{name}', accepted by policy")
                continue
            return fail(f"the OCSP response for '{name}' does not echo the request nonce", "good")
    held = any(out.status is OcspStatus.REVOKED for _, out in outcomes)
    return ChainRevocation(
        CheckStatus.PASS,
        "",
        False,
        "revoked" if held else "good",
        "certificate_hold" if held else None,
        nonce_match,
        response_valid,
        note="; ".join(notes),
    )


def check_chain_revocation(
    check_id: str,
    title: str,
    chain: ChainResult,
    *,
    kind: ChainKind,
    anchor: x509.Certificate,
    checker: OcspChecker,
    now: dt.datetime,
    policy: Policy,
) -> tuple[Check, ChainRevocation | None]:
    """The OCSP check of a validated chain (not run on an invalid one).

    Returns:
        The check, and the folded result for the claims (None when not run).
    """
    if chain.status is ChainStatus.INVALID or len(chain.certificates) < 2:
        return Check(check_id, title, CheckStatus.NOT_CHECKED, "the chain is invalid"), None
    targets = ocsp_targets(chain.certificates, kind=kind, anchor=anchor, now=now)
    outcomes = [(t.cert, checker.check(t)) for t in reversed(targets)]
    res = _fold(outcomes, kind, policy)
    check = Check(check_id, title, res.status, res.reason, res.collateral_missing, note=res.note)
    return check, res


def chain_claim(chain: ChainResult | None, revocation: ChainRevocation | None) -> dict[str, Any]:
    """The ``x-nvidia-...-cert-chain`` claim object for a chain and its revocation check."""
    status = str(chain.status) if chain else None
    if (
        revocation is not None
        and revocation.claim_status == "revoked"
        and revocation.status is CheckStatus.FAIL
    ):
        status = "revoked"
    expiry = chain.earliest_expiry if chain else None
    rev = revocation
    return {
        "x-nvidia-cert-expiration-date": expiry.isoformat().replace("+00:00", "Z")
        if expiry
        else None,
        "x-nvidia-cert-status": status,
        "x-nvidia-cert-ocsp-status": rev.claim_status if rev else "not-checked",
        "x-nvidia-cert-revocation-reason": rev.revocation_reason if rev else None,
        "x-nvidia-cert-ocsp-nonce-matches": rev.nonce_match if rev else None,
        "x-nvidia-cert-ocsp-response-valid": rev.response_valid if rev else None,
    }
