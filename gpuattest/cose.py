"""COSE_Sign1 (RFC 9052) as NVIDIA signs CoRIMs: ES384, the signer's chain in ``x5chain``.

:func:`verify_cose_sign1` accepts exactly one shape, and refuses every other one with a
:class:`CoseCheckError` naming the check:

* ``#6.18([protected: bstr, unprotected: map, payload: bstr, signature: bstr])``; a
  detached (``nil``) payload is refused;
* the protected header is a non-empty map whose ``alg`` (1) is ES384 (-35), nothing else;
  ``crit`` (2) is refused (no extension is understood); other labels (content type 3,
  kid 4, CoRIM meta 8) are covered by the signature and otherwise ignored;
* ``x5chain`` (33) is a certificate (bstr) or a leaf-first array of them, in the protected
  header, or in the unprotected one when the protected header binds its leaf by ``x5t``
  (34: ``[hash, thumbprint]``, SHA-256/384/512, RFC 9360); in both headers, in neither,
  or unprotected without a matching ``x5t`` is refused; the unprotected header may hold
  nothing else but ``kid``;
* the chain is validated by :func:`gpucc.gpuattest.x509chain.validate_chain` against the
  pinned root at ``now`` (the root is appended when the chain stops below it);
* the signature is ``r || s`` of 48 bytes each and verifies with the leaf's P-384 key over
  ``Sig_structure = ["Signature1", protected, h'', payload]``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cbor2
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from gpucc.core.errors import MalformedInputError, NotTrustedError

from ._internal.x509names import common_name
from .cbor_strict import CborLimits, decode_strict
from .x509chain import ANY_CHAIN, ChainProfile, ChainResult, load_certificate, validate_chain

__all__ = [
    "ALG_ES384",
    "COSE_SIGN1_TAG",
    "CoseCheckError",
    "MalformedCoseError",
    "VerifiedSign1",
    "is_cose_sign1",
    "verify_cose_sign1",
]

COSE_SIGN1_TAG = 18
ALG_ES384 = -35
_ALG, _CRIT, _KID, _X5CHAIN, _X5T = 1, 2, 4, 33, 34
_X5T_HASHES = {-16: hashlib.sha256, -43: hashlib.sha384, -44: hashlib.sha512}
_UNPROTECTED_ALLOWED = frozenset({_KID, _X5CHAIN})
_P384 = 48
_MAX_CERTS = 10
_HEADER_LIMITS = CborLimits(max_bytes=64 * 1024, max_depth=4, max_items=16, max_string=16 * 1024)


class MalformedCoseError(MalformedInputError):
    """The bytes are not a COSE_Sign1 structure at all."""


class CoseCheckError(NotTrustedError):
    """A COSE_Sign1 parsed but failed a check; ``check`` names it (alg, x5chain, chain...).

    Attributes:
        check: the failing check's short name.
    """

    portable = ("check",)

    def __init__(self, check: str, detail: str) -> None:
        self.check = check
        super().__init__(f"COSE_Sign1 {check} check failed: {detail}")


@dataclass(frozen=True)
class VerifiedSign1:
    """A COSE_Sign1 whose signature and chain verified.

    Attributes:
        payload: the signed payload bytes.
        chain: the validation result of the signer's chain (leaf first, root last).
        signer: the leaf certificate's common name.
        x5chain_protected: True when the chain sat in the protected header, False when it
            was unprotected and bound by ``x5t``.
    """

    payload: bytes
    chain: ChainResult
    signer: str
    x5chain_protected: bool


def is_cose_sign1(value: Any) -> bool:
    """Whether a strictly decoded value is a tag-18 item (a COSE_Sign1 candidate)."""
    return isinstance(value, cbor2.CBORTag) and value.tag == COSE_SIGN1_TAG


def _certs(value: Any) -> tuple[x509.Certificate, ...]:
    items: Sequence[Any] = (value,) if isinstance(value, bytes) else value
    if not isinstance(items, tuple | list) or not items or len(items) > _MAX_CERTS:
        raise CoseCheckError("x5chain", f"x5chain must hold 1 to {_MAX_CERTS} certificates")
    out = []
    for i, der in enumerate(items):
        if not isinstance(der, bytes):
            raise CoseCheckError("x5chain", f"x5chain entry {i} is not a byte string")
        out.append(
            load_certificate(
                der,
                what=f"x5chain entry {i}",
                error=lambda message: CoseCheckError("x5chain", message),
                pem=False,
            )
        )
    return tuple(out)


def _protected(raw: bytes) -> Mapping[Any, Any]:
    if not raw:
        raise CoseCheckError("alg", "the protected header is empty (no algorithm is signed)")
    header = decode_strict(
        raw,
        what="COSE protected header",
        allowed_tags=frozenset(),
        limits=_HEADER_LIMITS,
        error=MalformedCoseError,
    )
    if not isinstance(header, Mapping):
        raise MalformedCoseError("the COSE protected header is not a map")
    return header


def _leaf_binding(protected: Mapping[Any, Any], leaf_der: bytes) -> None:
    x5t = protected.get(_X5T)
    if x5t is None:
        raise CoseCheckError(
            "x5t", "x5chain is unprotected and the protected header does not bind it by x5t"
        )
    if not isinstance(x5t, tuple | list) or len(x5t) != 2 or not isinstance(x5t[1], bytes):
        raise CoseCheckError("x5t", "x5t is not [hash algorithm, thumbprint]")
    alg, thumb = x5t
    digest = _X5T_HASHES.get(alg) if isinstance(alg, int) and not isinstance(alg, bool) else None
    if digest is None:
        raise CoseCheckError("x5t", f"x5t hash algorithm {alg!r} is not SHA-256, -384 or -512")
    if not hmac.compare_digest(digest(leaf_der).digest(), thumb):
        raise CoseCheckError("x5t", "x5t does not match the leaf certificate in x5chain")


def verify_cose_sign1(
    value: Any,
    *,
    anchor: x509.Certificate,
    now: dt.datetime,
    profile: ChainProfile = ANY_CHAIN,
    what: str = "COSE_Sign1",
) -> VerifiedSign1:
    """Verify a strictly decoded tag-18 item (module docstring has the rules).

    Args:
        value: the decoded item (``cbor_strict.decode_strict`` of the file).
        anchor: the pinned root the signer's chain must end in.
        now: the verification time (timezone-aware).
        profile: the chain's :class:`~gpucc.gpuattest.x509chain.ChainProfile`.
        what: names the object in messages.

    Raises:
        MalformedCoseError: not a COSE_Sign1 structure.
        CoseCheckError: a check failed (``check``: alg, crit, payload, x5chain, x5t,
            unprotected, chain, key, signature).
    """
    if not is_cose_sign1(value):
        raise MalformedCoseError(f"{what} is not a COSE_Sign1 (tag 18)")
    body = value.value
    if not isinstance(body, tuple | list) or len(body) != 4:
        raise MalformedCoseError(f"{what} is not a four-element COSE_Sign1 array")
    protected_raw, unprotected, payload, signature = body
    if not isinstance(protected_raw, bytes) or not isinstance(unprotected, Mapping):
        raise MalformedCoseError(f"{what} headers are not a byte string and a map")
    if payload is None:
        raise CoseCheckError("payload", "detached payloads are not accepted")
    if not isinstance(payload, bytes) or not isinstance(signature, bytes):
        raise MalformedCoseError(f"{what} payload or signature is not a byte string")
    protected = _protected(protected_raw)
    alg = protected.get(_ALG)
    if alg != ALG_ES384 or isinstance(alg, bool):
        raise CoseCheckError("alg", f"algorithm {alg!r} is not ES384 (-35)")
    if _CRIT in protected:
        raise CoseCheckError("crit", "critical header parameters are not supported")
    extra = sorted(str(k) for k in unprotected if k not in _UNPROTECTED_ALLOWED)
    if extra:
        raise CoseCheckError("unprotected", f"unprotected header labels {', '.join(extra)}")
    in_protected, in_unprotected = _X5CHAIN in protected, _X5CHAIN in unprotected
    if in_protected and in_unprotected:
        raise CoseCheckError("x5chain", "x5chain is in both the protected and unprotected header")
    if not (in_protected or in_unprotected):
        raise CoseCheckError("x5chain", "there is no x5chain")
    certs = _certs(protected[_X5CHAIN] if in_protected else unprotected[_X5CHAIN])
    leaf_der = certs[0].public_bytes(serialization.Encoding.DER)
    if in_unprotected:
        _leaf_binding(protected, leaf_der)
    anchor_der = anchor.public_bytes(serialization.Encoding.DER)
    if certs[-1].public_bytes(serialization.Encoding.DER) != anchor_der:
        certs = (*certs, anchor)
    result = validate_chain(certs, anchor, now, profile)
    if not result.ok:
        raise CoseCheckError("chain", f"the signer's chain is {result.status}: {result.reason}")
    key = certs[0].public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP384R1):
        raise CoseCheckError("key", "the signer's key is not a P-384 key")
    if len(signature) != 2 * _P384:
        raise CoseCheckError("signature", f"an ES384 signature is 96 bytes, not {len(signature)}")
    to_be_signed = cbor2.dumps(["Signature1", protected_raw, b"", payload])
    der = encode_dss_signature(
        int.from_bytes(signature[:_P384], "big"), int.from_bytes(signature[_P384:], "big")
    )
    try:
        key.verify(der, to_be_signed, ec.ECDSA(hashes.SHA384()))
    except InvalidSignature:
        raise CoseCheckError(
            "signature", f"the ES384 signature on {what} does not verify"
        ) from None
    return VerifiedSign1(payload, result, common_name(certs[0]), in_protected)
