"""An offer signed by its requester: the signature covers the session (challenge and host
key), survives the offer's JSON, and does not verify on any other offer."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.keyrelease.protocol import Offer, encode_public_key
from gpucc.keyrelease.requester import RequesterSignatureError, requester_key_id, sign_offer
from gpucc.staging.errors import MalformedSessionMessageError
from gpucc.travel.signing import key_id


def _offer(challenge: bytes = b"c" * 32) -> Offer:
    host = encode_public_key(ec.generate_private_key(ec.SECP384R1()).public_key())
    evidence = json.dumps([{"arch": "HOPPER", "nonce": "00", "evidence": "", "certificate": ""}])
    return Offer(challenge=challenge, host_public_key=host, evidence_json=evidence.encode())


def test_a_signed_offer_names_its_requester_through_its_json() -> None:
    key = ec.generate_private_key(ec.SECP384R1())
    signed = sign_offer(_offer(), key)
    parsed = Offer.from_json(signed.to_json())
    assert requester_key_id(parsed) == key_id(key)
    assert requester_key_id(_offer()) is None
    assert "requester" not in json.loads(_offer().to_json())  # unsigned: as before


@pytest.mark.parametrize("change", ["challenge", "host key", "version", "signature"])
def test_a_signature_does_not_move_to_another_offer(change: str) -> None:
    signed = sign_offer(_offer(), ec.generate_private_key(ec.SECP384R1()))
    other = {
        "challenge": replace(signed, challenge=b"d" * 32),
        "host key": replace(signed, host_public_key=_offer().host_public_key),
        "version": replace(signed, version=2),
        "signature": replace(
            signed,
            requester_public_key=sign_offer(
                _offer(), ec.generate_private_key(ec.SECP384R1())
            ).requester_public_key,
        ),
    }[change]
    with pytest.raises(RequesterSignatureError, match="does not verify"):
        requester_key_id(other)


def test_a_requester_key_must_be_p384() -> None:
    signed = sign_offer(_offer(), ec.generate_private_key(ec.SECP384R1()))
    p256 = ec.generate_private_key(ec.SECP256R1()).public_key()
    der = p256.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(RequesterSignatureError):
        requester_key_id(replace(signed, requester_public_key=der))
    with pytest.raises(RequesterSignatureError):
        requester_key_id(replace(signed, requester_public_key=b"junk"))
    with pytest.raises(ValueError, match="P-384"):
        sign_offer(_offer(), ec.generate_private_key(ec.SECP256R1()))


@pytest.mark.parametrize(
    "requester",
    [None, [], {"public_key": "AA=="}, {"public_key": "!", "signature": "AA=="},
     {"public_key": "AA==", "signature": "AA==", "x": 1}],
)  # fmt: skip
def test_a_malformed_requester_is_refused(requester: object) -> None:
    doc = json.loads(_offer().to_json())
    doc["requester"] = requester  # null included: present is not absent
    with pytest.raises(MalformedSessionMessageError):
        Offer.from_json(json.dumps(doc).encode())
