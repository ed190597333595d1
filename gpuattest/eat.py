"""Signed attestation results: gpucc's EAT, in NVIDIA's detached-EAT shape.

A result is a JSON list ``[["JWT", overall], {"GPU-0": token, ...}]`` of ES384
compact JWS tokens (docs/EAT.md has the format and known-answer vectors):

* each device token carries that GPU's verified claims (NVIDIA's names) plus
  ``iss``, ``iat``, ``nbf``, ``exp``, ``jti``, ``eat_nonce`` and
  ``x-gpucc-evidence-digest`` (``["SHA-256", hex]`` of the raw attestation report);
* the overall token carries ``iss``, ``sub``, ``iat``, ``nbf``, ``exp``, ``jti``,
  ``eat_nonce``, ``x-nvidia-ver``, ``x-nvidia-overall-att-result``, optionally
  ``x-gpucc-policy-digest``, and ``submods`` naming every device token by the
  SHA-256 of its compact text: ``{"GPU-0": ["DIGEST", ["SHA-256", hex]]}``.

Headers are ``{"alg": "ES384", "kid": <RFC 7638 thumbprint>, "typ": "JWT"}``;
header and payload JSON have sorted keys and no whitespace, so the signing input
is reproducible (ECDSA signatures are randomized, so the tokens are not).

Keys are ``cryptography`` objects. :func:`load_private_key_pem` reads a signing
key only from a regular file owned by the user with no group or other access;
key material never appears in messages or reprs.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.core.errors import ExposedKeyFileError, KeyFileError, UsageError
from gpucc.core.files import read_capped, read_secret

from .jws import (
    DEFAULT_CLOCK_SKEW,
    MalformedTokenError,
    TokenCheckError,
    b64url_encode,
    canonical_json,
    check_detached,
    check_issuer,
    check_nonce,
    check_times,
    parse_detached,
    read_header,
    require_es384,
    sign_es384,
    token_digest,
    verify_es384,
)
from .x509chain import load_certificates

__all__ = [
    "DEFAULT_LIFETIME",
    "ISSUER",
    "SUBJECT",
    "SignedEat",
    "VerifiedEat",
    "evidence_digest",
    "key_id",
    "load_private_key_pem",
    "load_public_key_pem",
    "policy_digest",
    "public_jwk",
    "sign_attestation_result",
    "sign_result_claims",
    "verify_eat",
]

ISSUER = "gpucc"
SUBJECT = "NVIDIA-PLATFORM-ATTESTATION"
CLAIMS_VERSION = "3.0"
DEFAULT_LIFETIME = dt.timedelta(hours=1)
MAX_KEY_FILE_BYTES = 64 * 1024
MAX_EAT_BYTES = 4 * 1024 * 1024
# Claims gpucc sets itself; a caller's value for them is replaced, never merged.
_RESERVED = frozenset(
    {"iss", "sub", "aud", "iat", "nbf", "exp", "jti", "eat_nonce", "submods", "cnf"}
)
_OVERALL_RESULT = "x-nvidia-overall-att-result"


@dataclass(frozen=True)
class SignedEat:
    """A signed result: the overall token and the device tokens, in order."""

    overall_token: str = field(repr=False)
    device_tokens: tuple[tuple[str, str], ...] = field(repr=False)
    kid: str = ""

    def detached(self) -> list[Any]:
        """``[["JWT", overall], {"GPU-0": token, ...}]``."""
        return [["JWT", self.overall_token], dict(self.device_tokens)]

    def to_json(self) -> str:
        """The detached EAT as one line of JSON plus a newline (what ``-o result.jwt`` holds)."""
        return json.dumps(self.detached(), separators=(",", ":")) + "\n"


@dataclass(frozen=True)
class VerifiedEat:
    """A checked result.

    Attributes:
        overall: the overall token's claims.
        devices: each device token's claims by name, in the order they came.
        kid: the ``kid`` of the overall token's header ("" when absent).
    """

    overall: Mapping[str, Any]
    devices: Mapping[str, Mapping[str, Any]]
    kid: str

    @property
    def overall_result(self) -> bool:
        """``x-nvidia-overall-att-result`` is exactly ``true`` and at least one GPU token
        was verified: a result that vouches for no GPU is not a trusted result."""
        return self.overall.get(_OVERALL_RESULT) is True and bool(self.devices)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{"kid", "overall", "devices"}``."""
        return {
            "kid": self.kid,
            "overall": dict(self.overall),
            "devices": {k: dict(v) for k, v in self.devices.items()},
        }

    VERIFY_SCHEMA: ClassVar[str] = "gpucc.token.verify/v1"

    def verify_document(self, *, nonce_checked: bool) -> dict[str, Any]:
        """The ``gpucc.token.verify/v1`` document: this result, valid, whether it says the
        GPUs are trusted, and whether its nonce was compared (``nonce-checked``) or not."""
        return {
            "schema": self.VERIFY_SCHEMA,
            "valid": True,
            "trusted": self.overall_result,
            "freshness": "nonce-checked" if nonce_checked else "not-checked",
            **self.to_dict(),
        }


def evidence_digest(report: bytes) -> str:
    """Hex SHA-256 of a raw attestation report (``x-gpucc-evidence-digest``)."""
    return hashlib.sha256(report).hexdigest()


def _p384_public(key: object, what: str) -> ec.EllipticCurvePublicKey:
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP384R1):
        raise KeyFileError(f"{what} is not an EC P-384 key")
    return key


def public_jwk(public_key: ec.EllipticCurvePublicKey) -> dict[str, str]:
    """The JWK of a P-384 public key, with ``kid``, ``use`` and ``alg`` (for a JWKS)."""
    numbers = _p384_public(public_key, "the key").public_numbers()
    jwk = {
        "crv": "P-384",
        "kty": "EC",
        "x": b64url_encode(numbers.x.to_bytes(48, "big")),
        "y": b64url_encode(numbers.y.to_bytes(48, "big")),
    }
    return {**jwk, "kid": key_id(public_key), "use": "sig", "alg": "ES384"}


def key_id(public_key: ec.EllipticCurvePublicKey) -> str:
    """RFC 7638 JWK thumbprint (SHA-256, base64url) of a P-384 public key."""
    numbers = _p384_public(public_key, "the key").public_numbers()
    members = {
        "crv": "P-384",
        "kty": "EC",
        "x": b64url_encode(numbers.x.to_bytes(48, "big")),
        "y": b64url_encode(numbers.y.to_bytes(48, "big")),
    }
    return b64url_encode(hashlib.sha256(canonical_json(members)).digest())


def sign_result_claims(
    gpu_claims: Sequence[Mapping[str, Any]],
    *,
    private_key: ec.EllipticCurvePrivateKey,
    nonce: bytes,
    now: dt.datetime,
    overall_result: bool,
    evidence_digests: Sequence[str],
    policy_digest: str | None = None,
    issuer: str = ISSUER,
    lifetime: dt.timedelta = DEFAULT_LIFETIME,
    jti: str | None = None,
    kid: str | None = None,
) -> SignedEat:
    """Sign verified per-GPU claims as a detached EAT.

    Args:
        gpu_claims: one claims dict per GPU, in evidence order (NVIDIA's names).
            Reserved names (``iss``, ``iat``, ``eat_nonce``, ``submods`` ...) are replaced.
        private_key: a P-384 private key.
        nonce: the attestation nonce (``eat_nonce`` is its lower-case hex).
        now: the verification time (``iat`` and ``nbf``; ``exp`` is ``now + lifetime``).
        overall_result: the verdict (``x-nvidia-overall-att-result``).
        evidence_digests: hex SHA-256 of each GPU's report (:func:`evidence_digest`).
        policy_digest: hex SHA-256 of the policy applied, if any.
        issuer: ``iss`` of every token.
        lifetime: how long the result is valid.
        jti: the overall token id (random when None); device ``jti`` is ``<jti>-GPU-<i>``.
        kid: the header ``kid`` (default: :func:`key_id` of the public key).

    Raises:
        ValueError: no GPU, a count mismatch, a digest that is not 64 hex characters,
            a naive ``now``, a non-positive lifetime or a key that is not P-384.
    """
    if not gpu_claims or len(gpu_claims) != len(evidence_digests):
        raise ValueError("one claims dict and one evidence digest per GPU are needed")
    if now.tzinfo is None or lifetime <= dt.timedelta(0):
        raise ValueError("now must be timezone-aware and the lifetime positive")
    digests = [_hex256(d, "evidence digest") for d in evidence_digests]
    if not isinstance(private_key.curve, ec.SECP384R1):
        raise ValueError("an ES384 signing key must be a P-384 private key")
    header = {"kid": kid if kid is not None else key_id(private_key.public_key()), "typ": "JWT"}
    iat = int(now.timestamp())
    exp = int((now + lifetime).timestamp())
    base_jti = jti if jti is not None else str(uuid.uuid4())
    times = {"iss": issuer, "iat": iat, "nbf": iat, "exp": exp, "eat_nonce": nonce.hex()}
    devices: list[tuple[str, str]] = []
    for i, (claims, digest) in enumerate(zip(gpu_claims, digests, strict=True)):
        name = f"GPU-{i}"
        body = {k: v for k, v in claims.items() if k not in _RESERVED}
        body.update(times)
        body["jti"] = f"{base_jti}-{name}"
        body["x-gpucc-evidence-digest"] = ["SHA-256", digest]
        devices.append((name, sign_es384(header, body, private_key)))
    overall: dict[str, Any] = dict(times)
    overall.update(
        {
            "sub": SUBJECT,
            "jti": base_jti,
            "x-nvidia-ver": CLAIMS_VERSION,
            _OVERALL_RESULT: bool(overall_result),
            "submods": {n: ["DIGEST", ["SHA-256", token_digest(t)]] for n, t in devices},
        }
    )
    if policy_digest is not None:
        overall["x-gpucc-policy-digest"] = ["SHA-256", _hex256(policy_digest, "policy digest")]
    return SignedEat(
        overall_token=sign_es384(header, overall, private_key),
        device_tokens=tuple(devices),
        kid=str(header["kid"]),
    )


class _PolicyLike(Protocol):
    def to_dict(self) -> Mapping[str, Any]: ...


class _GpuLike(Protocol):
    @property
    def claims(self) -> Mapping[str, Any]: ...
    @property
    def report_digest(self) -> bytes: ...


class _ResultLike(Protocol):
    @property
    def gpus(self) -> Sequence[_GpuLike]: ...
    @property
    def trusted(self) -> bool: ...
    @property
    def verified_at(self) -> dt.datetime: ...
    @property
    def expected_nonce(self) -> bytes | None: ...
    @property
    def policy(self) -> _PolicyLike: ...


def policy_digest(policy: Mapping[str, Any]) -> str:
    """Hex SHA-256 of a policy's JSON form (sorted keys, no whitespace)."""
    return hashlib.sha256(canonical_json(policy)).hexdigest()


def sign_attestation_result(
    result: _ResultLike,
    *,
    private_key: ec.EllipticCurvePrivateKey,
    lifetime: dt.timedelta = DEFAULT_LIFETIME,
    jti: str | None = None,
) -> SignedEat:
    """Sign a local verification result (``gpucc.attest/v1``'s source object).

    Takes each GPU's ``claims`` and ``report_digest``, the verdict (``trusted``),
    ``verified_at``, ``expected_nonce`` and ``policy.to_dict()`` (digested with
    :func:`policy_digest`).

    Raises:
        UsageError: the result has no nonce (an EAT without ``eat_nonce`` proves no freshness).
        ValueError: see :func:`sign_result_claims`.
    """
    if result.expected_nonce is None:
        raise UsageError("a signed result needs the attestation nonce; this result has none")
    return sign_result_claims(
        [g.claims for g in result.gpus],
        private_key=private_key,
        nonce=result.expected_nonce,
        now=result.verified_at,
        overall_result=result.trusted,
        evidence_digests=[g.report_digest.hex() for g in result.gpus],
        policy_digest=policy_digest(result.policy.to_dict()),
        lifetime=lifetime,
        jti=jti,
    )


def _hex256(value: str, what: str) -> str:
    text = value.lower()
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise ValueError(f"{what} must be 64 hex characters")
    return text


def verify_eat(
    token_text: str | bytes,
    public_key: ec.EllipticCurvePublicKey,
    *,
    nonce: bytes | None = None,
    now: dt.datetime,
    issuer: str = ISSUER,
    skew: dt.timedelta = DEFAULT_CLOCK_SKEW,
) -> VerifiedEat:
    """Check a gpucc result (detached EAT, or one compact token) and return its claims.

    Every token must be ES384 (checked before the key is used), verify with
    ``public_key``, carry ``iss == issuer`` and hold ``exp``/``nbf``/``iat`` at
    ``now`` within ``skew``. Device tokens must match the overall ``submods``
    digests one for one, and carry the overall token's ``eat_nonce``; with
    ``nonce``, that must be its hex. A signed result that says
    ``x-nvidia-overall-att-result: false`` is returned; callers read
    :attr:`VerifiedEat.overall_result`.

    Raises:
        MalformedTokenError: not a detached EAT or compact JWS, bad base64 or JSON (exit 4).
        TokenCheckError: a check failed, named in the message (exit 1).
    """
    text = token_text.decode("utf-8", "replace") if isinstance(token_text, bytes) else token_text
    text = text.strip()
    if len(text) > MAX_EAT_BYTES:
        raise MalformedTokenError(f"the result is larger than {MAX_EAT_BYTES} bytes")
    if text.startswith("["):
        overall_token, device_tokens = parse_detached(text)
    else:
        overall_token, device_tokens = text, {}
    for name, token in (("overall token", overall_token), *device_tokens.items()):
        require_es384(read_header(token, name), name)
    header = read_header(overall_token, "overall token")
    overall = _verify_one(overall_token, public_key, "overall token", issuer, now, skew)
    if nonce is not None:
        check_nonce(overall, nonce, "overall token")
    if device_tokens or "submods" in overall:
        check_detached(overall, device_tokens)
    overall_nonce = overall.get("eat_nonce")
    if not isinstance(overall_nonce, str):
        raise TokenCheckError("eat_nonce", "overall token: no 'eat_nonce' claim")
    devices: dict[str, Mapping[str, Any]] = {}
    for name, token in device_tokens.items():
        claims = _verify_one(token, public_key, f"{name} token", issuer, now, skew)
        got = claims.get("eat_nonce")
        if not isinstance(got, str) or not hmac.compare_digest(
            got.lower().encode("ascii", "replace"), overall_nonce.lower().encode("ascii", "replace")
        ):
            raise TokenCheckError("eat_nonce", f"{name} token: eat_nonce differs from the overall")
        devices[name] = claims
    kid = header.get("kid")
    return VerifiedEat(overall=overall, devices=devices, kid=kid if isinstance(kid, str) else "")


def _verify_one(
    token: str,
    key: ec.EllipticCurvePublicKey,
    what: str,
    issuer: str,
    now: dt.datetime,
    skew: dt.timedelta,
) -> dict[str, Any]:
    claims = verify_es384(token, key, what)
    check_issuer(claims, issuer, what)
    check_times(claims, now=now, skew=skew, what=what, require_nbf=True)
    return claims


# --- key files -----------------------------------------------------------------------


def _read_key_file(path: Path, *, private: bool) -> bytes:
    """A key file's bytes; a private key must also be the caller's alone (0600 or 0400)."""
    if private:
        data = read_secret(
            path, MAX_KEY_FILE_BYTES, what="signing key", exposed=ExposedKeyFileError
        )
    else:
        data = read_capped(path, MAX_KEY_FILE_BYTES, what="key file")
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"key file {path} is larger than {MAX_KEY_FILE_BYTES} bytes")
    return data


def load_private_key_pem(path: Path) -> ec.EllipticCurvePrivateKey:
    """A P-384 signing key from an unencrypted PEM file that is 0600 (or 0400) and yours.

    Raises:
        KeyFileError: unreadable, a symlink, not owned by the user, readable by
            group or others, encrypted, not PEM, or not P-384 (exit 4).
    """
    data = _read_key_file(path, private=True)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise KeyFileError(f"signing key {path} is encrypted; gpucc needs it unencrypted") from None
    except (ValueError, UnsupportedAlgorithm):
        raise KeyFileError(f"signing key {path} is not a PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP384R1):
        raise KeyFileError(f"signing key {path} is not an EC P-384 key (ES384 needs one)")
    return key


def load_public_key_pem(path: Path) -> ec.EllipticCurvePublicKey:
    """A P-384 public key from a PEM public key or certificate file.

    Raises:
        KeyFileError: unreadable, not PEM, or not P-384 (exit 4).
    """
    data = _read_key_file(path, private=False)
    key: object
    try:
        if b"-----BEGIN CERTIFICATE-----" in data:
            key = load_certificates(data, what=str(path), error=KeyFileError)[0].public_key()
        else:
            key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise KeyFileError(f"{path} is not a PEM public key or certificate") from None
    return _p384_public(key, f"the key in {path}")
