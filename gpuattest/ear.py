"""Attestation results as an EAR (IETF RATS "EAT Attestation Results"), signed ES384.

One compact JWS (JWT) whose claims are (docs/EAT.md, "EAR"):

* ``eat_profile``: :data:`EAR_PROFILE`; ``iss``, ``iat``, ``nbf``, ``exp``, ``jti``;
  ``eat_nonce`` (the attestation nonce, lower-case hex); ``ear.verifier-id``
  (``{"developer": "gpucc", "build": "gpucc <version>"}``);
* ``ear.status``: the worst of the submodules' statuses;
* ``submods``: one object per part (``GPU-0``, ``GPU-1``..., ``CVM``) with ``ear.status``,
  ``ear.gpucc.outcome`` (gpucc's own word), ``ear.gpucc.claims`` (the part's verified
  claims), ``ear.gpucc.reasons`` and ``ear.gpucc.relaxations`` (the named relaxations the
  verdict was reached under, e.g. ``allow_unsigned_corim``).

gpucc's three outcomes map onto EAR's trust tiers (:data:`STATUS_FOR_OUTCOME`):
trusted is ``affirming``; not trusted is ``contraindicated``; undecided (something needed
to decide was missing) is ``none``, "the verifier makes no assurance", never ``warning``,
which asserts an appraisal with concerns and which relying parties often accept.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from cryptography.hazmat.primitives.asymmetric import ec

from .jws import (
    DEFAULT_CLOCK_SKEW,
    MalformedTokenError,
    TokenCheckError,
    check_issuer,
    check_nonce,
    check_times,
    read_header,
    require_es384,
    sign_es384,
    verify_es384,
)

__all__ = [
    "EAR_PROFILE",
    "MAX_SUBMODS",
    "STATUS_FOR_OUTCOME",
    "EarStatus",
    "EarSubmodule",
    "Outcome",
    "VerifiedEar",
    "part_of",
    "sign_ear",
    "verify_ear",
]

#: The EAR profile of draft-fv-rats-ear (as Veraison and Trustee emit it).
EAR_PROFILE = "tag:github.com,2023:veraison/ear"
ISSUER = "gpucc"
DEFAULT_LIFETIME = dt.timedelta(hours=1)
MAX_SUBMODS = 64
MAX_EAR_BYTES = 1024 * 1024


class Outcome(enum.StrEnum):
    """gpucc's verdict for one part."""

    TRUSTED = "trusted"
    NOT_TRUSTED = "not-trusted"
    UNDECIDED = "undecided"


class EarStatus(enum.StrEnum):
    """EAR trust tiers, in order of severity."""

    NONE = "none"
    AFFIRMING = "affirming"
    WARNING = "warning"
    CONTRAINDICATED = "contraindicated"


STATUS_FOR_OUTCOME = {
    Outcome.TRUSTED: EarStatus.AFFIRMING,
    Outcome.NOT_TRUSTED: EarStatus.CONTRAINDICATED,
    Outcome.UNDECIDED: EarStatus.NONE,
}
# Worst first: one contraindicated part makes the whole contraindicated; a part that was not
# decided keeps the whole from affirming.
_SEVERITY = {
    EarStatus.AFFIRMING: 0,
    EarStatus.WARNING: 1,
    EarStatus.NONE: 2,
    EarStatus.CONTRAINDICATED: 3,
}


def _worst(statuses: Sequence[EarStatus]) -> EarStatus:
    return max(statuses, key=lambda s: _SEVERITY[s])


@dataclass(frozen=True)
class EarSubmodule:
    """One part's result: name (``GPU-0``, ``CVM``), outcome, claims, reasons, relaxations."""

    name: str
    outcome: Outcome
    claims: Mapping[str, Any] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    relaxations: tuple[str, ...] = ()

    @property
    def status(self) -> EarStatus:
        """The EAR status of this outcome."""
        return STATUS_FOR_OUTCOME[self.outcome]

    def to_claims(self) -> dict[str, Any]:
        """The submodule's EAR claims."""
        return {
            "ear.status": str(self.status),
            "ear.gpucc.outcome": str(self.outcome),
            "ear.gpucc.claims": dict(self.claims),
            "ear.gpucc.reasons": list(self.reasons),
            "ear.gpucc.relaxations": list(self.relaxations),
        }


class _CheckLike(Protocol):
    @property
    def relaxation(self) -> str: ...


class _PartLike(Protocol):
    """A GPU's or the CVM's result (``GpuResult``, ``CvmResult``)."""

    @property
    def verdict(self) -> str: ...

    @property
    def claims(self) -> Mapping[str, Any]: ...

    @property
    def reasons(self) -> tuple[str, ...]: ...

    @property
    def checks(self) -> Sequence[_CheckLike]: ...


def part_of(name: str, result: _PartLike, *, relaxations: Sequence[str] = ()) -> EarSubmodule:
    """The submodule of one part's result: its verdict, claims and reasons, and the
    relaxations its checks were accepted under plus ``relaxations`` (e.g. a CoRIM
    appraisal's ``allow_unsigned_corim``), each named once.

    Raises:
        ValueError: a verdict that is not one of gpucc's three outcomes.
    """
    used = [c.relaxation for c in result.checks if c.relaxation] + list(relaxations)
    return EarSubmodule(
        name=name,
        outcome=Outcome(str(result.verdict)),
        claims=dict(result.claims),
        reasons=tuple(result.reasons),
        relaxations=tuple(dict.fromkeys(used)),
    )


def sign_ear(
    parts: Sequence[EarSubmodule],
    *,
    private_key: ec.EllipticCurvePrivateKey,
    nonce: bytes,
    now: dt.datetime,
    lifetime: dt.timedelta = DEFAULT_LIFETIME,
    version: str = "",
    jti: str | None = None,
    kid: str | None = None,
) -> str:
    """Sign the parts' results as one EAR (compact JWS, ES384).

    Raises:
        ValueError: no part, too many, a name given twice, a naive ``now``, a lifetime that
            is not positive, or a key that is not P-384.
    """
    from .eat import key_id

    if not parts or len(parts) > MAX_SUBMODS:
        raise ValueError(f"an EAR needs 1 to {MAX_SUBMODS} parts")
    names = [p.name for p in parts]
    if len(set(names)) != len(names) or not all(names):
        raise ValueError("every part needs a distinct, non-empty name")
    if now.tzinfo is None or lifetime <= dt.timedelta(0):
        raise ValueError("now must be timezone-aware and the lifetime positive")
    if not isinstance(private_key.curve, ec.SECP384R1):
        raise ValueError("an ES384 signing key must be a P-384 private key")
    iat = int(now.timestamp())
    claims: dict[str, Any] = {
        "eat_profile": EAR_PROFILE,
        "iss": ISSUER,
        "iat": iat,
        "nbf": iat,
        "exp": int((now + lifetime).timestamp()),
        "jti": jti if jti is not None else str(uuid.uuid4()),
        "eat_nonce": nonce.hex(),
        "ear.verifier-id": {"developer": ISSUER, "build": f"gpucc {version}".strip()},
        "ear.status": str(_worst([p.status for p in parts])),
        "submods": {p.name: p.to_claims() for p in parts},
    }
    header = {"kid": kid if kid is not None else key_id(private_key.public_key()), "typ": "JWT"}
    return sign_es384(header, claims, private_key)


@dataclass(frozen=True)
class VerifiedEar:
    """A checked EAR.

    Attributes:
        status: the overall ``ear.status``.
        submods: each part's ``ear.status`` by name, in the order they came.
        claims: every claim of the token.
        kid: the header's ``kid`` ("" when absent).
    """

    status: EarStatus
    submods: Mapping[str, EarStatus]
    claims: Mapping[str, Any]
    kid: str

    @property
    def affirming(self) -> bool:
        """True only when the whole result and every part affirm."""
        return self.status is EarStatus.AFFIRMING and all(
            s is EarStatus.AFFIRMING for s in self.submods.values()
        )

    VERIFY_SCHEMA: ClassVar[str] = "gpucc.token.verify-ear/v1"

    def verify_document(self, *, nonce_checked: bool) -> dict[str, Any]:
        """The ``gpucc.token.verify-ear/v1`` document (``gpucc token verify-ear -f json``):
        valid, whether every part affirms, whether the nonce was compared, each status."""
        return {
            "schema": self.VERIFY_SCHEMA,
            "valid": True,
            "trusted": self.affirming,
            "freshness": "nonce-checked" if nonce_checked else "not-checked",
            "status": str(self.status),
            "submods": {k: str(v) for k, v in self.submods.items()},
            "kid": self.kid,
        }


def _status(value: Any, what: str) -> EarStatus:
    try:
        return EarStatus(value) if isinstance(value, str) else EarStatus("?")
    except ValueError:
        raise TokenCheckError(
            "ear.status", f"{what}: status {str(value)[:40]!r} is not an EAR tier"
        ) from None


def verify_ear(
    token: str | bytes,
    public_key: ec.EllipticCurvePublicKey,
    *,
    now: dt.datetime,
    nonce: bytes | None = None,
    issuer: str = ISSUER,
    skew: dt.timedelta = DEFAULT_CLOCK_SKEW,
) -> VerifiedEar:
    """Check an EAR: ES384 signature, profile, issuer, times, nonce, statuses.

    The overall ``ear.status`` must be the worst of the submodules' (a token that affirms
    while a part does not is refused). A valid EAR that does not affirm is returned;
    callers read :attr:`VerifiedEar.affirming`.

    Raises:
        MalformedTokenError: not a compact JWS with a JSON object payload.
        TokenCheckError: a check failed (``alg``, ``signature``, ``eat_profile``, ``iss``,
            ``exp``/``nbf``/``iat``, ``eat_nonce``, ``submods``, ``ear.status``).
    """
    text = token.decode("ascii", "replace") if isinstance(token, bytes) else token
    text = text.strip()
    if len(text) > MAX_EAR_BYTES:
        raise MalformedTokenError(f"the EAR is larger than {MAX_EAR_BYTES} bytes")
    header = read_header(text, "EAR")
    require_es384(header, "EAR")
    claims = verify_es384(text, public_key, "EAR")
    if claims.get("eat_profile") != EAR_PROFILE:
        raise TokenCheckError("eat_profile", f"EAR: profile is not {EAR_PROFILE}")
    check_issuer(claims, issuer, "EAR")
    check_times(claims, now=now, skew=skew, what="EAR")
    if nonce is not None:
        check_nonce(claims, nonce, "EAR")
    submods = claims.get("submods")
    if not isinstance(submods, dict) or not submods or len(submods) > MAX_SUBMODS:
        raise TokenCheckError("submods", f"EAR: 'submods' must hold 1 to {MAX_SUBMODS} parts")
    statuses: dict[str, EarStatus] = {}
    for name, sub in submods.items():
        if not isinstance(sub, dict):
            raise TokenCheckError("submods", f"EAR: submodule {str(name)[:40]!r} is not an object")
        statuses[str(name)] = _status(sub.get("ear.status"), f"EAR submodule {name}")
    overall = _status(claims.get("ear.status"), "EAR")
    if overall is not _worst(list(statuses.values())):
        raise TokenCheckError(
            "ear.status", f"EAR: overall status {overall} is not the worst of its submodules"
        )
    kid = header.get("kid")
    return VerifiedEar(overall, statuses, claims, kid if isinstance(kid, str) else "")
