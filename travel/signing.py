"""Long-term P-384 signing keys, canonical JSON and the holder's answer envelope.

Holder and orchestrator each have a long-term ECDSA P-384 key (PKCS#8 PEM, mode 0600,
refused when group or others have access). A key is named by its id: the SHA-256 of its
SubjectPublicKeyInfo DER.

The answer envelope (``schema: gpucc.holder-envelope/v2``) carries the protocol answer
bytes unchanged, the holder's trust record for the release (what it relied on: policy
relaxations used, verification time, whose roots) and a signature over::

    "gpucc/holder-answer/v2" || transcript_hash (48 bytes) || SHA-256(answer bytes)
        || SHA-256(canonical JSON of the trust record)

so a signature made for one session cannot be moved to another, nor to other answer bytes,
and the record the holder signed cannot be changed on the way.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.core.errors import FileAccessError, KeyFileError
from gpucc.core.jsonio import loads_untrusted
from gpucc.staging.format import read_secret_file, write_secret_file

from .errors import HolderAuthenticationError, MalformedEnvelopeError

__all__ = [
    "ENVELOPE_LABEL",
    "ENVELOPE_SCHEMA",
    "MAX_ENVELOPE_BYTES",
    "Envelope",
    "KeyPairWritten",
    "KeyPin",
    "canonical_json",
    "envelope_signing_input",
    "generate_signing_key",
    "key_id",
    "load_public_key",
    "load_signing_key",
    "public_pem",
    "sign_answer",
    "write_key_pair",
    "write_signing_key",
]

ENVELOPE_SCHEMA = "gpucc.holder-envelope/v2"
ENVELOPE_LABEL = b"gpucc/holder-answer/v2"
MAX_ENVELOPE_BYTES = 6 * 1024 * 1024
_MAX_KEY_FILE = 16 * 1024
_CURVE = ec.SECP384R1()


def canonical_json(doc: Any) -> bytes:
    """Sorted keys, no whitespace, ASCII only: the bytes gpucc signs and hashes."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def generate_signing_key() -> ec.EllipticCurvePrivateKey:
    """A fresh P-384 signing key."""
    return ec.generate_private_key(_CURVE)


def write_signing_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Write ``key`` as PKCS#8 PEM with mode 0600; an existing file is never replaced.

    Raises:
        OutputExistsError: the file exists.
        FileAccessError: it cannot be written.
    """
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    write_secret_file(path, pem)


def load_signing_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """Read a P-384 signing key that only its owner can access.

    Raises:
        KeyFileError: missing, owned by another user, exposed, not a PEM private key, or
            not P-384.
    """
    data = read_secret_file(path, _MAX_KEY_FILE)  # owner and mode checked on the open file
    if len(data) > _MAX_KEY_FILE:
        raise KeyFileError(f"{path} is too large for a signing key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise KeyFileError(f"{path} is not an unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != _CURVE.name:
        raise KeyFileError(f"{path} is not a P-384 key")
    return key


def public_pem(key: ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) -> bytes:
    """The SubjectPublicKeyInfo PEM of a key."""
    pub = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey) else key
    return pub.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@dataclass(frozen=True)
class KeyPairWritten:
    """A long-term signing key written with its public key, and the pin that names it."""

    SCHEMA: ClassVar[str] = "gpucc.keygen/v1"

    key: Path
    pub: Path
    pin: str

    def to_dict(self) -> dict[str, Any]:
        """The ``gpucc.keygen/v1`` document (``gpucc holder keygen``, ``travel keygen``)."""
        return {"schema": self.SCHEMA, "key": str(self.key), "pub": str(self.pub), "pin": self.pin}


def write_key_pair(key: Path, pub: Path) -> KeyPairWritten:
    """Make a P-384 signing key at ``key`` (0600) and its public key PEM at ``pub``; neither
    file is ever replaced.

    Raises:
        FileAccessError: ``pub`` exists or cannot be written.
        KeyFileError, FileAccessError: ``key`` exists or cannot be written.
    """
    if pub.exists():
        raise FileAccessError(f"{pub} exists; it is never replaced")
    signing = generate_signing_key()
    write_signing_key(key, signing)
    try:
        with pub.open("xb") as fh:
            fh.write(public_pem(signing))
    except OSError as exc:
        raise FileAccessError(f"cannot write {pub}: {exc.strerror or exc}") from None
    return KeyPairWritten(key, pub, f"sha256:{key_id(signing)}")


def _spki_der(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def key_id(key: ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) -> str:
    """SHA-256 of the SubjectPublicKeyInfo DER, hex."""
    pub = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey) else key
    return hashlib.sha256(_spki_der(pub)).hexdigest()


def _load_public_bytes(data: bytes, what: str) -> ec.EllipticCurvePublicKey:
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(data)
        else:
            key = serialization.load_der_public_key(data)
    except (ValueError, TypeError):
        raise KeyFileError(f"{what} is not a public key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != _CURVE.name:
        raise KeyFileError(f"{what} is not a P-384 public key")
    return key


def load_public_key(data: bytes, what: str = "the public key") -> ec.EllipticCurvePublicKey:
    """A P-384 public key from PEM or DER SubjectPublicKeyInfo.

    Raises:
        KeyFileError: not a P-384 public key.
    """
    return _load_public_bytes(data, what)


@dataclass(frozen=True)
class KeyPin:
    """What a plan pins for a holder: a key id (SHA-256 of its SPKI DER).

    Built from a PEM public key or from ``sha256:<64 hex>``.
    """

    key_id: str

    @classmethod
    def parse(cls, text: str, what: str) -> KeyPin:
        """From the plan's ``public_key`` field.

        Raises:
            KeyFileError: neither a PEM P-384 public key nor ``sha256:<64 hex>``.
        """
        stripped = text.strip()
        if stripped.startswith("sha256:"):
            value = stripped[len("sha256:") :].lower()
            if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
                raise KeyFileError(f"{what}: a sha256 pin is 64 hex characters")
            return cls(value)
        return cls(key_id(_load_public_bytes(stripped.encode(), what)))

    def matches(self, other_key_id: str) -> bool:
        """Constant-time comparison with another key id."""
        return hmac.compare_digest(self.key_id.encode(), other_key_id.encode())


def envelope_signing_input(transcript_hash: bytes, answer: bytes, trusted_with: bytes) -> bytes:
    """``label || transcript_hash || SHA-256(answer) || SHA-256(trusted_with)``: what the
    holder signs (``trusted_with`` is the canonical JSON of the release's trust record)."""
    if len(transcript_hash) != 48:
        raise ValueError("a transcript hash is 48 bytes")
    return (
        ENVELOPE_LABEL
        + transcript_hash
        + hashlib.sha256(answer).digest()
        + hashlib.sha256(trusted_with).digest()
    )


@dataclass(frozen=True)
class Envelope:
    """A signed answer, with what the holder's release trusted.

    Attributes:
        answer: the protocol answer bytes (``gpucc.session-answer/v1`` JSON), unchanged.
        holder_public_key: the signer's SPKI DER.
        signature: DER ECDSA-P384-SHA384 over :func:`envelope_signing_input`.
        trusted_with: the holder's trust record for this release
            (``gpucc.assembly.record.TrustRecord.to_dict``): the policy relaxations it used,
            its verification time, whose roots; signed with the answer.
    """

    answer: bytes = field(repr=False)
    holder_public_key: bytes
    signature: bytes
    trusted_with: dict[str, Any] = field(default_factory=dict)

    @property
    def holder_key_id(self) -> str:
        """SHA-256 of the signer's SPKI DER, hex."""
        return hashlib.sha256(self.holder_public_key).hexdigest()

    def to_json(self) -> bytes:
        """The envelope document."""
        return canonical_json(
            {
                "schema": ENVELOPE_SCHEMA,
                "answer": base64.b64encode(self.answer).decode(),
                "holder_public_key": base64.b64encode(self.holder_public_key).decode(),
                "holder_key_id": self.holder_key_id,
                "signature": base64.b64encode(self.signature).decode(),
                "trusted_with": self.trusted_with,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> Envelope:
        """Parse strictly.

        Raises:
            MalformedEnvelopeError: too large, not JSON, missing or unknown keys, bad base64,
                a trust record that is not an object, or a key id that does not name the
                enclosed key.
        """
        doc = loads_untrusted(
            data, what="answer envelope", error=MalformedEnvelopeError, max_bytes=MAX_ENVELOPE_BYTES
        )
        keys = {"schema", "answer", "holder_public_key", "holder_key_id", "signature"}
        keys.add("trusted_with")
        if not isinstance(doc, dict) or set(doc) != keys or doc["schema"] != ENVELOPE_SCHEMA:
            raise MalformedEnvelopeError(f"not a {ENVELOPE_SCHEMA} document")
        try:
            fields = {
                k: base64.b64decode(doc[k], validate=True)
                for k in ("answer", "holder_public_key", "signature")
            }
        except (binascii.Error, ValueError, TypeError):
            raise MalformedEnvelopeError(
                "the answer envelope has a field that is not base64"
            ) from None
        if not isinstance(doc["trusted_with"], dict):
            raise MalformedEnvelopeError("the envelope's trust record is not an object")
        env = cls(
            fields["answer"], fields["holder_public_key"], fields["signature"], doc["trusted_with"]
        )
        if not isinstance(doc["holder_key_id"], str) or doc["holder_key_id"] != env.holder_key_id:
            raise MalformedEnvelopeError("the envelope's key id does not name its key")
        return env

    def verify(self, pin: KeyPin, transcript_hash: bytes) -> None:
        """Check the signer against ``pin`` and the signature over ``transcript_hash``.

        Raises:
            HolderAuthenticationError: another key than the pinned one, or a bad signature.
        """
        if not pin.matches(self.holder_key_id):
            raise HolderAuthenticationError(
                f"the answer is signed by key {self.holder_key_id[:16]}…, not by the pinned "
                f"holder key {pin.key_id[:16]}…"
            )
        try:
            key = _load_public_bytes(self.holder_public_key, "the envelope key")
            key.verify(
                self.signature,
                envelope_signing_input(
                    transcript_hash, self.answer, canonical_json(self.trusted_with)
                ),
                ec.ECDSA(hashes.SHA384()),
            )
        except (InvalidSignature, KeyFileError, ValueError):
            raise HolderAuthenticationError(
                "the answer's signature does not verify under the pinned holder key"
            ) from None


def sign_answer(
    key: ec.EllipticCurvePrivateKey,
    answer: bytes,
    transcript_hash: bytes,
    trusted_with: dict[str, Any] | None = None,
) -> Envelope:
    """The holder's signed envelope for ``answer`` (made for ``transcript_hash``), with the
    release's trust record."""
    record = dict(trusted_with or {})
    signing_input = envelope_signing_input(transcript_hash, answer, canonical_json(record))
    signature = key.sign(signing_input, ec.ECDSA(hashes.SHA384()))
    return Envelope(
        answer=answer,
        holder_public_key=_spki_der(key.public_key()),
        signature=signature,
        trusted_with=record,
    )
