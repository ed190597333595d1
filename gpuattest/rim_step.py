"""Step 9 of verification: one RIM obtained and verified, as checks and claims.

A RIM is looked up by ID, then: schema-valid, XML-DSig valid, its signing chain
valid to the pinned RIM root at the verification time (an expired signer may be
accepted within the policy's grace), OCSP on the signing chain, and its
colloquialVersion equal to the version the report states. When the RIM cannot be
obtained every one of these is "not checked, collateral missing".
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucc.core.errors import CollateralUnavailableError, MalformedRimError

from .collateral import ChainKind, OcspChecker, RimSource
from .policy import Policy
from .result import Check, CheckStatus
from .revocation import chain_claim, check_chain_revocation
from .trust import TrustRoots
from .x509chain import ChainResult, ChainStatus

if TYPE_CHECKING:
    from .rim import ReferenceManifest

__all__ = ["RimOutcome", "verify_rim"]


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
                relaxation=f"rim.expired_signer_grace_days: {policy.rim_expired_signer_grace.days}",
            )
    return Check(f"{prefix}-chain", title, CheckStatus.FAIL, f"{chain.status}: {chain.reason}")


@dataclass(frozen=True)
class RimOutcome:
    """One RIM's checks and claims, and the manifest when it could be read."""

    manifest: ReferenceManifest | None
    checks: tuple[Check, ...]
    claims: dict[str, Any]


def verify_rim(
    *,
    role: str,
    rim_id: str,
    expected_version: str,
    rims: RimSource,
    ocsp: OcspChecker,
    roots: TrustRoots,
    now: dt.datetime,
    policy: Policy,
    label: str | None = None,
    claim: str | None = None,
) -> RimOutcome:
    """Obtain and verify the RIM ``rim_id`` for ``role`` ("driver", "vbios", or a device
    profile's role such as a switch's "bios").

    Check ids are ``<role>-rim-...``; ``label`` titles them ("Driver RIM", "VBIOS RIM" by
    default) and ``claim`` stems the claims (``x-nvidia-gpu-<role>-rim`` by default).

    Raises:
        MalformedRimError: the RIM obtained is not a parseable RIM document.
    """
    p = f"{role}-rim"
    label = label or ("Driver RIM" if role == "driver" else "VBIOS RIM")
    kind = ChainKind.DRIVER_RIM if role == "driver" else ChainKind.VBIOS_RIM
    claim = claim or f"x-nvidia-gpu-{role}-rim"
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
            f"{claim}-cert-chain": chain_claim(None, None),
            f"{claim}-signature-verified": None,
            f"{claim}-version-match": None,
            f"{claim}-measurements-available": False,
        }
        return RimOutcome(None, tuple(checks), claims)
    from .corim_format import looks_like_corim
    from .rim import verify_document  # lxml loads only when a RIM is there to parse

    if looks_like_corim(data):
        raise MalformedRimError(
            f"{rim_id}: the file given is a CoRIM; this device's {label} is an XML RIM"
        )

    manifest, schema, sig = verify_document(data, anchor=roots.rim_root, now=now)
    checks = [Check(f"{p}-fetched", f"{label} available", CheckStatus.PASS, rim_id)]
    checks.append(
        Check(
            f"{p}-schema",
            f"{label} schema",
            CheckStatus.PASS if schema.valid else CheckStatus.FAIL,
            schema.reason,
        )
    )
    checks.append(
        Check(
            f"{p}-signature",
            f"{label} signature",
            CheckStatus.PASS if sig.signature_valid else CheckStatus.FAIL,
            sig.signature_reason,
        )
    )
    checks.append(_rim_chain_check(p, f"{label} certificate chain", sig.chain, now, policy))
    ocsp_check, ocsp_res = check_chain_revocation(
        f"{p}-ocsp",
        f"{label} certificate OCSP",
        sig.chain,
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
        f"{claim}-cert-chain": chain_claim(sig.chain, ocsp_res),
        f"{claim}-signature-verified": sig.signature_valid,
        f"{claim}-version-match": version_ok,
        f"{claim}-measurements-available": bool(manifest.measurements),
    }
    return RimOutcome(manifest, tuple(checks), claims)
