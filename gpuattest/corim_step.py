"""Steps 9 and 10 for a device whose reference values are CoRIMs (Rubin, Blackwell FSP).

The XML RIM step's counterpart (:mod:`gpuattest.rim_step`), chosen by the device profile
(``DeviceProfile.corim_ids``), never by a branch on the device's name:

1. the CoRIM IDs the profile names (the signed table of contents' locators, or the ID
   built from the model, APSKU and firmware-version hint) are obtained from the same
   :class:`~gpuattest.collateral.RimSource` XML RIMs come from (files, ``--rim-dir``, the
   cache, a bundle, NVIDIA's RIM service); one that cannot be obtained leaves every later
   check not checked, collateral missing, so the verdict is undecided with that reason;
2. each is read and accepted (:func:`gpuattest.corim.read_corim`): signed (COSE_Sign1,
   ES384) under the RIM signing root, or unsigned only under the policy's relaxation
   ``rim.allow_unsigned_corim``, which the check records;
3. each signer's chain goes through the RIM chains' OCSP step;
4. the device's evidence (:func:`gpuattest.corim_appraise.device_evidence`) is appraised
   against them, with the policy's required purpose (``rim.corim_purpose``); every
   mismatch becomes a :class:`~gpuattest.measurements.MismatchRecord` naming its
   environment, key, reference and evidence, in the records XML RIM mismatches use.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from gpucc.core.errors import CollateralUnavailableError, NotTrustedError

from .collateral import ChainKind, OcspChecker, RimSource
from .corim import Corim, CorimPolicy, MalformedCorimError, looks_like_corim, read_corim
from .corim_appraise import CorimAppraisal, CorimMismatch, appraise, device_evidence
from .device import CorimIds, DeviceProfile
from .measurements import MeasurementResult, MeasurementStatus, MismatchRecord
from .policy import Policy
from .result import Check, CheckStatus
from .revocation import chain_claim, check_chain_revocation
from .trust import TrustRoots
from .x509chain import ChainResult, ChainStatus

__all__ = ["RELAXATION_UNSIGNED_CORIM", "CorimOutcome", "corim_policy", "verify_corims"]

#: How the policy relaxation that accepts unsigned CoRIMs is shown.
RELAXATION_UNSIGNED_CORIM = "rim.allow_unsigned_corim: true"
_TITLE = "CoRIM reference values"


@dataclass(frozen=True)
class CorimOutcome:
    """The CoRIM steps' checks and claims, the measurement result they imply (None when
    the CoRIMs could not be obtained: the caller reports the measurements not run with
    ``missing``), and the IDs looked up by role."""

    checks: tuple[Check, ...]
    claims: dict[str, Any]
    measurements: MeasurementResult
    ids: Mapping[str, str]
    appraisal: CorimAppraisal | None = None


def corim_policy(policy: Policy) -> CorimPolicy:
    """The CoRIM reader's policy from the appraisal policy."""
    return CorimPolicy(
        allow_unsigned=policy.allow_unsigned_corim, required_purpose=policy.corim_purpose
    )


def _not_run(reason: str) -> MeasurementResult:
    return MeasurementResult(
        status=MeasurementStatus.NOT_RUN,
        reason=reason,
        missing_rims=(),
        mismatches=(),
        conflicts=(),
        skipped=(),
        golden_count=0,
        compared_count=0,
        matched_count=0,
        nvdec0_disabled=None,
    )


def _unchecked(reason: str, *, missing: bool) -> tuple[Check, ...]:
    return tuple(
        Check(f"corim-{s}", f"CoRIM {t}", CheckStatus.NOT_CHECKED, reason, missing)
        for s, t in (("signature", "signature and chain"), ("ocsp", "certificate OCSP"))
    )


def _claims(
    profile: DeviceProfile, fetched: bool, signed: bool | None, chains: list[dict[str, Any]]
) -> dict[str, Any]:
    stem = profile.claim("corim")
    return {
        f"{stem}-fetched": fetched,
        f"{stem}-signature-verified": signed,
        f"{stem}-cert-chains": chains,
    }


def _record(m: CorimMismatch) -> MismatchRecord:
    reason = "missing" if m.evidence in ("absent", "no purpose named") else "value"
    if m.reference == "absent":
        reason = "not-appraised"
    return MismatchRecord(
        index=-1,
        source="corim",
        golden_values=(m.reference,),
        golden_size=0,
        runtime_value=m.evidence,
        runtime_size=None,
        reason=reason,
        name=m.key,
        environment=m.environment,
    )


def _measurements(result: CorimAppraisal) -> MeasurementResult:
    compared = len(result.matched) + len(result.mismatches)
    listed = "; ".join(str(m) for m in result.mismatches)
    return MeasurementResult(
        status=MeasurementStatus.SUCCESS if result.trusted else MeasurementStatus.FAIL,
        reason="" if result.trusted else f"CoRIM mismatch: {listed}",
        missing_rims=(),
        mismatches=tuple(_record(m) for m in result.mismatches),
        conflicts=(),
        skipped=(),
        golden_count=compared,
        compared_count=compared,
        matched_count=len(result.matched),
        nvdec0_disabled=None,
    )


def _chain_kind(role: str) -> ChainKind:
    return ChainKind.DRIVER_RIM if role == "driver" else ChainKind.VBIOS_RIM


def verify_corims(
    *,
    profile: DeviceProfile,
    found: CorimIds,
    blocks: Mapping[int, Any],
    leaf: x509.Certificate,
    rims: RimSource,
    ocsp: OcspChecker,
    roots: TrustRoots,
    now: dt.datetime,
    policy: Policy,
) -> CorimOutcome:
    """Obtain, accept and appraise a device's CoRIMs (module docstring).

    Raises:
        MalformedCorimError, MalformedCoseError: a CoRIM obtained cannot be read.
        MalformedTocError, MalformedReportError: the device's evidence values cannot be read.
    """
    ids = dict(found.ids)
    if not found.ids:
        reason = (
            f"reference values for {profile.name} are published only as CoRIMs and none "
            f"can be named: {found.missing}"
        )
        none = (
            Check("corim-fetched", "CoRIMs available", CheckStatus.NOT_CHECKED, reason, True),
            *_unchecked("no CoRIM", missing=True),
        )
        return CorimOutcome(none, _claims(profile, False, None, []), _not_run(reason), ids)
    files: list[tuple[str, str, bytes]] = []
    for role, rim_id in found.ids:
        try:
            files.append((role, rim_id, rims.get_rim(rim_id)))
        except CollateralUnavailableError as exc:
            reason = (
                f"reference values for {profile.name} are published only as CoRIMs: "
                f"{exc.diagnostics()}"
            )
            absent = (
                Check("corim-fetched", "CoRIMs available", CheckStatus.NOT_CHECKED, reason, True),
                *_unchecked(f"{rim_id} not available", missing=True),
            )
            return CorimOutcome(absent, _claims(profile, False, None, []), _not_run(reason), ids)
    names = ", ".join(rim_id for _, rim_id, _ in files)
    checks = [Check("corim-fetched", "CoRIMs available", CheckStatus.PASS, names)]
    accepted: list[tuple[str, Corim]] = []
    cpol = corim_policy(policy)
    for role, rim_id, data in files:
        if not looks_like_corim(data):
            raise MalformedCorimError(
                "schema",
                f"{rim_id} is not a CoRIM (an XML RIM?): reference values for "
                f"{profile.name} are CoRIMs",
            )
        try:
            accepted.append((role, read_corim(data, anchor=roots.rim_root, now=now, policy=cpol)))
        except NotTrustedError as exc:
            reason = f"{rim_id}: {exc}"
            checks.append(
                Check("corim-signature", "CoRIM signature and chain", CheckStatus.FAIL, reason)
            )
            checks.append(
                Check("corim-ocsp", "CoRIM certificate OCSP", CheckStatus.NOT_CHECKED, reason)
            )
            meas = _not_run(f"CoRIM {rim_id} was not accepted: {exc}")
            claims = _claims(profile, True, False, [])
            return CorimOutcome(tuple(checks), claims, meas, ids)
    unsigned = [c.corim_id for _, c in accepted if c.signer is None]
    signers = ", ".join(f"{c.corim_id} by {c.signer}" for _, c in accepted if c.signer)
    if unsigned:
        checks.append(
            Check(
                "corim-signature",
                "CoRIM signature and chain",
                CheckStatus.PASS,
                f"unsigned: {', '.join(unsigned)}" + (f"; signed: {signers}" if signers else ""),
                note="unsigned CoRIMs accepted by policy (rim.allow_unsigned_corim: true)",
                relaxation=RELAXATION_UNSIGNED_CORIM,
            )
        )
    else:
        checks.append(
            Check("corim-signature", "CoRIM signature and chain", CheckStatus.PASS, signers)
        )
    chain_claims: list[dict[str, Any]] = []
    ocsp_checks: list[Check] = []
    for role, corim in accepted:
        if corim.signer is None:
            continue
        chain = ChainResult(
            ChainStatus.VALID,
            "",
            min(c.not_valid_after_utc for c in corim.chain),
            corim.chain,
        )
        check, revocation = check_chain_revocation(
            "corim-ocsp",
            "CoRIM certificate OCSP",
            chain,
            kind=_chain_kind(role),
            anchor=roots.rim_root,
            checker=ocsp,
            now=now,
            policy=policy,
        )
        ocsp_checks.append(check)
        chain_claims.append(chain_claim(chain, revocation))
    checks.append(_fold_ocsp(ocsp_checks))
    evidence = device_evidence(blocks, leaf)
    result = appraise(evidence, [c for _, c in accepted], cpol)
    claims = _claims(profile, True, not unsigned, chain_claims)
    claims[profile.claim("corim-purpose")] = result.purpose
    return CorimOutcome(tuple(checks), claims, _measurements(result), ids, result)


def _fold_ocsp(checks: list[Check]) -> Check:
    """One OCSP check for every signer chain: the first not passing, else the first."""
    if not checks:
        return Check(
            "corim-ocsp",
            "CoRIM certificate OCSP",
            CheckStatus.NOT_PRESENT,
            "no signed CoRIM: no signer chain to check",
        )
    return next((c for c in checks if c.status is not CheckStatus.PASS), checks[0])
