"""ES384 compact JWS tokens: the checks NRAS answers and gpucc's own EATs share.

Only one algorithm is ever accepted: ES384 (ECDSA P-384 with SHA-384, RFC 7518
§3.4). The header is read and its ``alg`` checked *before* any key is looked at,
so ``alg: none``, the HMAC family and every other algorithm are refused whatever
key the caller holds. Signatures are checked by PyJWT with the algorithm list
pinned to ES384 and a key that must be a P-384 public key.

Times are checked against a caller-supplied ``now`` with a symmetric tolerance
(:data:`DEFAULT_CLOCK_SKEW`, 120 s): a token is refused when ``now`` is at or past
``exp + skew``, before ``nbf - skew``, or when ``iat`` lies more than ``skew`` in
the future.

Detached EATs (NVIDIA's shape) are a JSON list ``[["JWT", overall], {name:
device_token, ...}]``; the overall token's ``submods`` maps every name to
``["DIGEST", ["SHA-256", hex]]`` where ``hex`` is the SHA-256 of the device
token's compact ASCII text. ``SHA256`` (no hyphen, NVIDIA's local verifier) is
accepted on input; gpucc writes ``SHA-256`` as NRAS does.

Errors: :class:`MalformedTokenError` (exit 4) when a token cannot be parsed at
all, :class:`TokenCheckError` (exit 1) naming the check that failed otherwise.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from gpucc.core.errors import MalformedInputError, NotTrustedError
from gpucc.core.jsonio import loads_untrusted

__all__ = [
    "ALGORITHM",
    "DEFAULT_CLOCK_SKEW",
    "MAX_TOKEN_BYTES",
    "MalformedTokenError",
    "TokenCheckError",
    "b64url_decode",
    "b64url_encode",
    "canonical_json",
    "check_detached",
    "check_issuer",
    "check_nonce",
    "check_times",
    "parse_detached",
    "read_header",
    "require_es384",
    "sign_es384",
    "submod_digests",
    "token_digest",
    "verify_es384",
]

ALGORITHM = "ES384"
DEFAULT_CLOCK_SKEW = dt.timedelta(seconds=120)
# An NRAS device token is a few KiB; nothing legitimate comes near this.
MAX_TOKEN_BYTES = 256 * 1024
MAX_DEVICE_TOKENS = 64
_DIGEST_NAMES = ("SHA-256", "SHA256")
_B64URL = re.compile(r"^[A-Za-z0-9_-]*$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_P384_BYTES = 48


class MalformedTokenError(MalformedInputError):
    """A token (or detached EAT) cannot be parsed: not a compact JWS, bad base64 or JSON."""


class TokenCheckError(NotTrustedError):
    """A token parsed but failed a check; ``check`` names which (alg, signature, exp, ...).

    Attributes:
        check: the failing check's short name.
    """

    def __init__(self, check: str, detail: str) -> None:
        self.check = check
        super().__init__(f"{check} check failed: {detail}")


def b64url_encode(data: bytes) -> str:
    """Base64url without padding (RFC 7515 §2)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str, what: str) -> bytes:
    """Strict base64url without padding.

    Raises:
        MalformedTokenError: characters outside the alphabet, padding, or a bad length.
    """
    if not _B64URL.match(text) or len(text) % 4 == 1:
        raise MalformedTokenError(f"{what} is not base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise MalformedTokenError(f"{what} is not base64url") from None


def canonical_json(value: Mapping[str, Any]) -> bytes:
    """The JSON bytes gpucc signs: sorted keys, no spaces, ASCII only."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode(
        "ascii"
    )


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    value = loads_untrusted(data, what=what, error=MalformedTokenError)
    if not isinstance(value, dict):
        raise MalformedTokenError(f"{what} is not a JSON object")
    return value


def _parts(token: str, what: str) -> list[str]:
    if not token:
        raise MalformedTokenError(f"{what} is empty")
    if len(token) > MAX_TOKEN_BYTES:
        raise MalformedTokenError(f"{what} is longer than {MAX_TOKEN_BYTES} bytes")
    if not token.isascii():
        raise MalformedTokenError(f"{what} holds characters outside ASCII")
    parts = token.split(".")
    if len(parts) != 3:
        raise MalformedTokenError(f"{what} is not a compact JWS (three dot-separated parts)")
    return parts


def read_header(token: str, what: str = "token") -> dict[str, Any]:
    """The decoded (unverified) protected header of a compact JWS.

    Raises:
        MalformedTokenError: not a compact JWS with a JSON object header.
    """
    return _json_object(b64url_decode(_parts(token, what)[0], f"{what} header"), f"{what} header")


def require_es384(header: Mapping[str, Any], what: str) -> None:
    """Refuse every algorithm but ES384, and the ``crit`` and ``b64`` header extensions.

    Raises:
        TokenCheckError: check ``alg`` (or ``crit``).
    """
    alg = header.get("alg")
    if alg != ALGORITHM:
        shown = alg if isinstance(alg, str) else type(alg).__name__
        if isinstance(alg, str) and alg.lower() == "none":
            detail = "unsigned token (alg none)"
        elif isinstance(alg, str) and alg.upper().startswith("HS"):
            detail = f"shared-secret algorithm {shown!r} is never accepted"
        else:
            detail = f"algorithm {shown!r} is not {ALGORITHM}"
        raise TokenCheckError("alg", f"{what}: {detail}")
    if "crit" in header or "b64" in header:
        raise TokenCheckError("alg", f"{what}: header extensions (crit, b64) are not supported")


def _require_p384(key: object, what: str) -> ec.EllipticCurvePublicKey:
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP384R1):
        raise TokenCheckError("key", f"{what}: the verification key is not a P-384 public key")
    return key


def verify_es384(token: str, key: ec.EllipticCurvePublicKey, what: str = "token") -> dict[str, Any]:
    """Check the ES384 signature of ``token`` with ``key`` and return its claims.

    Nothing but the signature and the algorithm is checked here; callers check
    times, issuer, nonce and digests with the other functions of this module.

    Raises:
        MalformedTokenError: not a compact JWS, or a payload that is not a JSON object.
        TokenCheckError: check ``alg``, ``key`` or ``signature``.
    """
    import jwt

    require_es384(read_header(token, what), what)
    _require_p384(key, what)
    try:
        decoded = jwt.PyJWS().decode_complete(token, key=key, algorithms=[ALGORITHM])
    except jwt.InvalidSignatureError:
        raise TokenCheckError("signature", f"{what}: the ES384 signature does not verify") from None
    except jwt.InvalidAlgorithmError:
        raise TokenCheckError("alg", f"{what}: algorithm is not {ALGORITHM}") from None
    except jwt.PyJWTError as exc:
        raise MalformedTokenError(f"{what}: {' '.join(str(exc).split())}") from None
    payload = decoded["payload"]
    if not isinstance(payload, bytes):
        raise MalformedTokenError(f"{what}: payload is not bytes")
    return _json_object(payload, f"{what} payload")


def sign_es384(
    header: Mapping[str, Any], claims: Mapping[str, Any], key: ec.EllipticCurvePrivateKey
) -> str:
    """A compact JWS over :func:`canonical_json` of ``header`` and ``claims``.

    ``header["alg"]`` is forced to ES384. The signature is ECDSA P-384/SHA-384 in
    the JWS form: ``r`` and ``s`` as 48-byte big-endian integers, concatenated.

    Raises:
        ValueError: ``key`` is not a P-384 private key.
    """
    if not isinstance(key.curve, ec.SECP384R1):
        raise ValueError("an ES384 signing key must be a P-384 private key")
    protected = dict(header)
    protected["alg"] = ALGORITHM
    signing_input = (
        b64url_encode(canonical_json(protected)) + "." + b64url_encode(canonical_json(claims))
    )
    der = key.sign(signing_input.encode("ascii"), ec.ECDSA(hashes.SHA384()))
    r, s = decode_dss_signature(der)
    raw = r.to_bytes(_P384_BYTES, "big") + s.to_bytes(_P384_BYTES, "big")
    return signing_input + "." + b64url_encode(raw)


def _numeric(claims: Mapping[str, Any], name: str, what: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    try:
        seconds = float(value) if isinstance(value, int | float) else math.nan
    except OverflowError:  # an integer of hundreds of digits
        seconds = math.nan
    if isinstance(value, bool) or not math.isfinite(seconds):
        raise TokenCheckError(name, f"{what}: '{name}' is not a NumericDate")
    return seconds


def check_times(
    claims: Mapping[str, Any],
    *,
    now: dt.datetime,
    skew: dt.timedelta = DEFAULT_CLOCK_SKEW,
    what: str = "token",
    require_nbf: bool = False,
) -> None:
    """``exp`` and ``iat`` must be present, ``nbf`` too when ``require_nbf``; all must hold.

    Raises:
        TokenCheckError: check ``exp``, ``nbf`` or ``iat``.
    """
    if now.tzinfo is None:
        raise ValueError("the verification time must be timezone-aware")
    t = now.timestamp()
    tolerance = skew.total_seconds()
    exp = _numeric(claims, "exp", what)
    nbf = _numeric(claims, "nbf", what)
    iat = _numeric(claims, "iat", what)
    if exp is None:
        raise TokenCheckError("exp", f"{what}: no 'exp' claim")
    if iat is None:
        raise TokenCheckError("iat", f"{what}: no 'iat' claim")
    if nbf is None and require_nbf:
        raise TokenCheckError("nbf", f"{what}: no 'nbf' claim")
    if t >= exp + tolerance:
        raise TokenCheckError("exp", f"{what}: expired at {_iso(exp)}")
    if nbf is not None and t < nbf - tolerance:
        raise TokenCheckError("nbf", f"{what}: not valid before {_iso(nbf)}")
    if iat > t + tolerance:
        raise TokenCheckError("iat", f"{what}: issued in the future ({_iso(iat)})")


def _iso(seconds: float) -> str:
    try:
        return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat().replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return repr(seconds)


def check_issuer(claims: Mapping[str, Any], expected: str, what: str = "token") -> None:
    """``iss`` must equal ``expected`` exactly.

    Raises:
        TokenCheckError: check ``iss``.
    """
    iss = claims.get("iss")
    if not isinstance(iss, str) or iss != expected:
        shown = repr(iss)[:80]
        raise TokenCheckError("iss", f"{what}: issuer {shown} is not {expected!r}")


def check_nonce(claims: Mapping[str, Any], nonce: bytes, what: str = "token") -> None:
    """``eat_nonce`` must be the hex of ``nonce`` (compared in constant time, any case).

    Raises:
        TokenCheckError: check ``eat_nonce``.
    """
    value = claims.get("eat_nonce")
    if not isinstance(value, str):
        raise TokenCheckError("eat_nonce", f"{what}: no 'eat_nonce' claim")
    got = value.strip().lower().encode("ascii", "replace")
    if not hmac.compare_digest(got, nonce.hex().encode("ascii")):
        raise TokenCheckError("eat_nonce", f"{what}: eat_nonce is not the nonce sent")


def token_digest(token: str) -> str:
    """Hex SHA-256 of a compact token's ASCII text (the ``submods`` digest)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def submod_digests(claims: Mapping[str, Any], what: str = "overall token") -> dict[str, str]:
    """``submods`` as ``{name: hex digest}``.

    Raises:
        TokenCheckError: check ``submods`` (absent, or an entry not of the DIGEST form).
    """
    submods = claims.get("submods")
    if not isinstance(submods, dict) or not submods:
        raise TokenCheckError("submods", f"{what}: no 'submods' object")
    if len(submods) > MAX_DEVICE_TOKENS:
        raise TokenCheckError("submods", f"{what}: more than {MAX_DEVICE_TOKENS} submodules")
    out: dict[str, str] = {}
    for name, entry in submods.items():
        ok = (
            isinstance(entry, list)
            and len(entry) == 2
            and entry[0] == "DIGEST"
            and isinstance(entry[1], list)
            and len(entry[1]) == 2
            and entry[1][0] in _DIGEST_NAMES
            and isinstance(entry[1][1], str)
            and _HEX64.match(entry[1][1].lower()) is not None
        )
        if not ok:
            raise TokenCheckError(
                "submods", f'{what}: submods[{name!r}] is not ["DIGEST", ["SHA-256", hex]]'
            )
        out[str(name)] = entry[1][1].lower()
    return out


def check_detached(
    overall_claims: Mapping[str, Any], device_tokens: Mapping[str, str], what: str = "overall token"
) -> None:
    """Every submodule has its device token, every device token is a submodule, digests match.

    Raises:
        TokenCheckError: check ``device-token`` (a token missing or unexpected) or
            ``submods`` (a digest that does not match).
    """
    digests = submod_digests(overall_claims, what)
    missing = sorted(set(digests) - set(device_tokens))
    if missing:
        raise TokenCheckError("device-token", f"no device token for {', '.join(missing)}")
    extra = sorted(set(device_tokens) - set(digests))
    if extra:
        raise TokenCheckError(
            "device-token", f"device token {', '.join(extra)} is not listed in {what} submods"
        )
    for name, expected in digests.items():
        actual = token_digest(device_tokens[name])
        if not hmac.compare_digest(actual.encode("ascii"), expected.encode("ascii")):
            raise TokenCheckError("submods", f"the digest of {name}'s token does not match {what}")


def parse_detached(data: bytes | str, what: str = "detached EAT") -> tuple[str, dict[str, str]]:
    """Split ``[["JWT", overall], {name: token, ...}]`` into its tokens.

    Raises:
        MalformedTokenError: any other shape.
    """
    doc = loads_untrusted(data, what=what, error=MalformedTokenError)
    if not (isinstance(doc, list) and len(doc) == 2):
        raise MalformedTokenError(f'{what} is not [["JWT", overall], {{devices}}]')
    head, devices = doc
    if not (
        isinstance(head, list) and len(head) == 2 and head[0] == "JWT" and isinstance(head[1], str)
    ):
        raise MalformedTokenError(f'{what}: the first element is not ["JWT", token]')
    if not isinstance(devices, dict):
        raise MalformedTokenError(f"{what}: the second element is not an object of device tokens")
    if len(devices) > MAX_DEVICE_TOKENS:
        raise MalformedTokenError(f"{what}: more than {MAX_DEVICE_TOKENS} device tokens")
    tokens: dict[str, str] = {}
    for name, token in devices.items():
        if not isinstance(token, str):
            raise MalformedTokenError(f"{what}: the token for {name!r} is not text")
        tokens[name] = token
    return head[1], tokens
