"""Who asks: an offer signed by its requester's long-term key (an orchestrator's).

A holder's release policy may release a dataset only to offers of named requesters. The
requester signs, with its P-384 key (ECDSA, SHA-384)::

    "gpucc/session/v1/requester" || 0x00 || version (1 byte) || nonce

where ``nonce = SHA-256(label || challenge || SHA-256(Q_H))`` is the offer's session nonce
(:func:`~gpucc.keyrelease.messages.session_nonce`): the signature covers the holder's
one-time challenge and the host key the dataset keys are wrapped to. It cannot be moved to
another offer (another challenge or host key) and the challenge it covers is answered at most
once, so a signed offer cannot be replayed; a stolen one releases keys only to the attested
host that made it. The offer carries the signer's SubjectPublicKeyInfo (DER) and the
signature; the requester is named by its key id, the SHA-256 of that DER (as the holder's
and the orchestrator's keys are).
"""

from __future__ import annotations

import hashlib

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.staging.errors import ProtocolError

from .messages import Offer, session_nonce

__all__ = [
    "REQUESTER_LABEL",
    "RequesterSignatureError",
    "requester_key_id",
    "requester_signing_input",
    "sign_offer",
]

REQUESTER_LABEL = b"gpucc/session/v1/requester\x00"


class RequesterSignatureError(ProtocolError):
    """An offer's requester signature does not verify under the key it names."""


def requester_signing_input(offer: Offer) -> bytes:
    """What the requester signs for ``offer`` (see the module docstring)."""
    return (
        REQUESTER_LABEL
        + bytes([offer.version & 0xFF])
        + session_nonce(offer.challenge, offer.host_public_key)
    )


def sign_offer(offer: Offer, key: ec.EllipticCurvePrivateKey) -> Offer:
    """``offer`` signed by the requester ``key`` (P-384)."""
    from dataclasses import replace

    if key.curve.name != ec.SECP384R1().name:
        raise ValueError("a requester key is a P-384 key")
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    signature = key.sign(requester_signing_input(offer), ec.ECDSA(hashes.SHA384()))
    return replace(offer, requester_public_key=der, requester_signature=signature)


def requester_key_id(offer: Offer) -> str | None:
    """The key id of the requester that signed ``offer``; None when it is not signed.

    Raises:
        RequesterSignatureError: it is signed, and the signature does not verify (or the
            key is not a P-384 public key).
    """
    if offer.requester_public_key is None or offer.requester_signature is None:
        return None
    der = offer.requester_public_key
    try:
        key = serialization.load_der_public_key(der)
        if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp384r1":
            raise ValueError("not P-384")
        key.verify(
            offer.requester_signature, requester_signing_input(offer), ec.ECDSA(hashes.SHA384())
        )
    except (InvalidSignature, ValueError, TypeError):
        raise RequesterSignatureError(
            "the offer's requester signature does not verify under the key it names"
        ) from None
    return hashlib.sha256(der).hexdigest()
