"""Holder receipts: the orchestrator's signed statement of where a holder's visit sits in the log.

After a visit's log entry is written, the orchestrator signs a receipt and gives it to
that holder, which keeps it (``gpucc holder serve --receipt-dir``)::

    {"schema": "gpucc.travel-receipt/v2", "holder_id": ..., "seq": n,
     "entry_hash": SHA-256 of log line n, "transcript_hash": the visit's SHA-384(T),
     "holder_trusted_with": the holder's own signed record of what its release relied on,
     "orchestrator_public_key": base64 SPKI DER, "signature": base64 DER ECDSA-P384-SHA384}

The signature is over ``"gpucc/travel-receipt/v2" || 0x00 || canonical_json(receipt
without signature)``. ``holder_trusted_with`` is the record the log entry holds (and the
entry hash commits to): the relaxations, time and roots of the holder's decision, so the
receipt a holder keeps says what it released under. A log later cut back to before entry
``n``, or with another entry at ``n``, no longer matches the holder's receipt
(``gpucc travel verify-log --receipt``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.core.errors import KeyFileError
from gpucc.core.jsonio import loads_untrusted, require_int

from .errors import LogTamperedError, MalformedReceiptError
from .signing import canonical_json, load_public_key

__all__ = ["MAX_RECEIPT_BYTES", "RECEIPT_LABEL", "RECEIPT_SCHEMA", "Receipt", "make_receipt"]

RECEIPT_SCHEMA = "gpucc.travel-receipt/v2"
RECEIPT_LABEL = b"gpucc/travel-receipt/v2\x00"
MAX_RECEIPT_BYTES = 8 * 1024
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX96 = re.compile(r"^[0-9a-f]{96}$")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Receipt:
    """A holder's receipt for its visit (see the module docstring)."""

    holder_id: str
    seq: int
    entry_hash: str
    transcript_hash: str
    orchestrator_public_key: bytes
    signature: bytes
    trusted_with: dict[str, Any] = field(default_factory=dict)

    @property
    def orchestrator_key_id(self) -> str:
        """SHA-256 of the signer's SPKI DER, hex."""
        return hashlib.sha256(self.orchestrator_public_key).hexdigest()

    def body(self) -> dict[str, Any]:
        """The signed fields."""
        return {
            "schema": RECEIPT_SCHEMA,
            "holder_id": self.holder_id,
            "seq": self.seq,
            "entry_hash": self.entry_hash,
            "transcript_hash": self.transcript_hash,
            "holder_trusted_with": self.trusted_with,
            "orchestrator_public_key": base64.b64encode(self.orchestrator_public_key).decode(),
        }

    def to_json(self) -> bytes:
        """The receipt document (canonical JSON)."""
        return canonical_json(
            {**self.body(), "signature": base64.b64encode(self.signature).decode()}
        )

    @classmethod
    def from_json(cls, data: bytes) -> Receipt:
        """Parse strictly (the signature is not checked here: :meth:`verify`).

        Raises:
            MalformedReceiptError: not a receipt document.
        """
        doc = loads_untrusted(
            data, what="receipt", error=MalformedReceiptError, max_bytes=MAX_RECEIPT_BYTES
        )
        keys = {
            "schema",
            "holder_id",
            "seq",
            "entry_hash",
            "transcript_hash",
            "holder_trusted_with",
            "orchestrator_public_key",
            "signature",
        }
        if not isinstance(doc, dict) or set(doc) != keys or doc["schema"] != RECEIPT_SCHEMA:
            raise MalformedReceiptError(f"not a {RECEIPT_SCHEMA} document")
        seq = require_int(
            doc["seq"], "the receipt's seq", lo=0, hi=2**31, error=MalformedReceiptError
        )
        fields = (doc["holder_id"], doc["entry_hash"], doc["transcript_hash"])
        if not all(isinstance(f, str) for f in fields) or not (
            _ID.match(doc["holder_id"])
            and _HEX64.match(doc["entry_hash"])
            and _HEX96.match(doc["transcript_hash"])
        ):
            raise MalformedReceiptError("the receipt's holder id or hashes are malformed")
        try:
            pub = base64.b64decode(doc["orchestrator_public_key"], validate=True)
            sig = base64.b64decode(doc["signature"], validate=True)
        except (binascii.Error, ValueError, TypeError):
            raise MalformedReceiptError("the receipt has a field that is not base64") from None
        if not isinstance(doc["holder_trusted_with"], dict):
            raise MalformedReceiptError("the receipt's holder_trusted_with is not an object")
        return cls(
            doc["holder_id"],
            seq,
            doc["entry_hash"],
            doc["transcript_hash"],
            pub,
            sig,
            doc["holder_trusted_with"],
        )

    def verify(self, key: ec.EllipticCurvePublicKey | None = None) -> None:
        """Check the signature (with ``key`` when given, else with the enclosed key).

        Raises:
            LogTamperedError: another signer than ``key``, or a signature that does not check.
        """
        try:
            enclosed = load_public_key(self.orchestrator_public_key, "the receipt's key")
        except KeyFileError:
            raise LogTamperedError("the receipt's orchestrator key is not a P-384 key") from None
        if key is not None and _spki(key) != self.orchestrator_public_key:
            raise LogTamperedError("the receipt is not signed by this orchestrator key")
        try:
            enclosed.verify(
                self.signature,
                RECEIPT_LABEL + canonical_json(self.body()),
                ec.ECDSA(hashes.SHA384()),
            )
        except InvalidSignature:
            raise LogTamperedError("the receipt's signature does not verify") from None


def _spki(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def make_receipt(
    key: ec.EllipticCurvePrivateKey,
    *,
    holder_id: str,
    seq: int,
    entry_hash: str,
    transcript_hash: str,
    trusted_with: dict[str, Any] | None = None,
) -> Receipt:
    """The orchestrator's signed receipt for the visit logged as entry ``seq``, with the
    holder's record of what its release trusted (as the entry holds it)."""
    record = dict(trusted_with or {})
    spki = _spki(key.public_key())
    unsigned = Receipt(holder_id, seq, entry_hash, transcript_hash, spki, b"", record)
    signature = key.sign(RECEIPT_LABEL + canonical_json(unsigned.body()), ec.ECDSA(hashes.SHA384()))
    return Receipt(holder_id, seq, entry_hash, transcript_hash, spki, signature, record)
