"""Key-release protocol (``docs/PROTOCOL.md``): constants, derivations and messages.

Version 1 binds the session to GPU evidence only. Version 2 adds the confidential VM's
evidence: its report data commits to the session (:func:`cvm_report_data`) and the
transcript carries the evidence's digest. A version-1 offer is a GPU-only offer.

The pure parts of :mod:`keyrelease.protocol`: the nonce, transcript and session-key
derivations, and the offer, answer and host key file with their strict parsers. Nothing
here verifies evidence; :mod:`keyrelease.protocol` runs the protocol steps.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gpucc.core.errors import MalformedInputError
from gpucc.core.jsonio import loads_untrusted
from gpucc.staging.errors import KeyFileError, MalformedSessionMessageError, ProtocolError
from gpucc.staging.format import KEY_SIZE, StrPath, WrapRecord, read_secret_file, write_secret_file

__all__ = [
    "ANSWER_SCHEMA",
    "CHALLENGE_SIZE",
    "MAX_ANSWER_BYTES",
    "MAX_GPUS",
    "MAX_OFFER_BYTES",
    "OFFER_SCHEMA",
    "GPU_ONLY_VERSION",
    "PROTOCOL_VERSION",
    "PUBLIC_KEY_SIZE",
    "Answer",
    "HostKey",
    "Offer",
    "SessionWrap",
    "cvm_report_data",
    "derive_session_key",
    "encode_public_key",
    "encode_transcript",
    "new_challenge",
    "session_nonce",
    "transcript_hash",
]

PROTOCOL_VERSION = 2  # GPU and CVM evidence
GPU_ONLY_VERSION = 1  # GPU evidence only: accepted by a holder only under a named relaxation
VERSIONS = (GPU_ONLY_VERSION, PROTOCOL_VERSION)
MAX_CVM_EVIDENCE_BYTES = 64 * 1024
MAX_CVM_COLLATERAL_BYTES = 4 * 1024 * 1024
MAX_CVM_EVENT_LOG_BYTES = 2 * 1024 * 1024  # a CCEL log up to its end, padding left out
CHALLENGE_SIZE = 32
PUBLIC_KEY_SIZE = 97  # uncompressed SEC1 P-384 point: 0x04 || X || Y
PRIVATE_KEY_SIZE = 48
REPORT_DIGEST_SIZE = 32
TRANSCRIPT_HASH_SIZE = 48
MAX_GPUS = 64
MAX_WRAPS = 4096
MAX_OFFER_BYTES = 8 * 1024 * 1024
MAX_ANSWER_BYTES = 4 * 1024 * 1024

NONCE_LABEL = b"gpucc/session/v1/nonce"
TRANSCRIPT_LABEL = b"gpucc/session/v1/transcript"
TRANSCRIPT_LABEL_V2 = b"gpucc/session/v2/transcript"
CVM_REPORT_DATA_LABEL = b"gpucc/session/v2/cvm-report-data"
OFFER_SCHEMA = "gpucc.session-offer/v1"
ANSWER_SCHEMA = "gpucc.session-answer/v1"
_HOST_KEY_MAGIC = "gpucc-session-host-key v1"
CURVE = ec.SECP384R1()


# --- the derivations (pure; docs/PROTOCOL.md gives test vectors) ----------------


def new_challenge() -> bytes:
    """32 random bytes, made by the data holder for one session."""
    return secrets.token_bytes(CHALLENGE_SIZE)


def encode_public_key(key: ec.EllipticCurvePublicKey) -> bytes:
    """The uncompressed SEC1 encoding (97 bytes for P-384)."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return key.public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)


def decode_public_key(data: bytes, who: str) -> ec.EllipticCurvePublicKey:
    if len(data) != PUBLIC_KEY_SIZE or data[0] != 0x04:
        raise MalformedSessionMessageError(
            f"the {who} public key is not an uncompressed P-384 point"
        )
    try:
        return ec.EllipticCurvePublicKey.from_encoded_point(CURVE, data)
    except ValueError:
        raise MalformedSessionMessageError(
            f"the {who} public key is not a point on P-384"
        ) from None


def check_length(value: bytes, size: int, what: str) -> None:
    if len(value) != size:
        raise ValueError(f"{what} must be {size} bytes, got {len(value)}")


def session_nonce(challenge: bytes, host_public_key: bytes) -> bytes:
    """The GPU nonce: ``SHA-256("gpucc/session/v1/nonce" || challenge || SHA-256(Q_H))``."""
    check_length(challenge, CHALLENGE_SIZE, "a challenge")
    check_length(host_public_key, PUBLIC_KEY_SIZE, "a public key")
    return hashlib.sha256(
        NONCE_LABEL + challenge + hashlib.sha256(host_public_key).digest()
    ).digest()


def cvm_report_data(nonce: bytes, host_public_key: bytes) -> bytes:
    """The CVM's report data (64 bytes) for a version-2 session:
    ``SHA-512("gpucc/session/v2/cvm-report-data" || nonce || SHA-256(Q_H))``.

    It ties the CVM's evidence to the GPU's (the same nonce) and to the host key (made inside
    that CVM): another VM's evidence, relayed, carries other report data.
    """
    check_length(nonce, 32, "a nonce")
    check_length(host_public_key, PUBLIC_KEY_SIZE, "a public key")
    return hashlib.sha512(
        CVM_REPORT_DATA_LABEL + nonce + hashlib.sha256(host_public_key).digest()
    ).digest()


def _field(value: bytes) -> bytes:
    return len(value).to_bytes(4, "big") + value


def encode_transcript(
    *,
    nonce: bytes,
    report_digests: Sequence[bytes],
    host_public_key: bytes,
    holder_public_key: bytes,
    version: int = GPU_ONLY_VERSION,
    cvm_evidence_digest: bytes | None = None,
) -> bytes:
    """The session transcript: length-prefixed fields (uint32 big-endian lengths).

    ``label || uint16_be(version) || nonce || digest_0 || ... || digest_{g-1} || Q_H || Q_D``,
    each field preceded by its length; the digests form one field of ``32 * g`` bytes.
    Version 2 uses the label ``gpucc/session/v2/transcript`` and appends a seventh field,
    the SHA-256 of the CVM evidence.
    """
    if version not in VERSIONS or (version == PROTOCOL_VERSION) != (
        cvm_evidence_digest is not None
    ):
        raise ValueError("version 2 transcripts, and only they, carry a CVM evidence digest")
    if cvm_evidence_digest is not None:
        check_length(cvm_evidence_digest, 32, "a CVM evidence digest")
    check_length(nonce, 32, "a nonce")
    if not 1 <= len(report_digests) <= MAX_GPUS:
        raise ValueError("a transcript covers 1 to 64 report digests")
    for digest in report_digests:
        check_length(digest, REPORT_DIGEST_SIZE, "a report digest")
    check_length(host_public_key, PUBLIC_KEY_SIZE, "a public key")
    check_length(holder_public_key, PUBLIC_KEY_SIZE, "a public key")
    fields = [
        TRANSCRIPT_LABEL if version == GPU_ONLY_VERSION else TRANSCRIPT_LABEL_V2,
        version.to_bytes(2, "big"),
        nonce,
        b"".join(report_digests),
        host_public_key,
        holder_public_key,
    ]
    if cvm_evidence_digest is not None:
        fields.append(cvm_evidence_digest)
    return b"".join(_field(value) for value in fields)


def transcript_hash(transcript: bytes) -> bytes:
    """SHA-384 of the transcript (48 bytes): the wrap context and the answer's check value."""
    return hashlib.sha384(transcript).digest()


def derive_session_key(shared_secret: bytes, *, nonce: bytes, transcript: bytes) -> bytes:
    """``K = HKDF-SHA-384(IKM = ECDH x-coordinate, salt = nonce, info = transcript, L = 32)``."""
    check_length(shared_secret, 48, "a P-384 shared secret")
    return HKDF(algorithm=hashes.SHA384(), length=KEY_SIZE, salt=nonce, info=transcript).derive(
        shared_secret
    )


def private_key_from_scalar(scalar: bytes) -> ec.EllipticCurvePrivateKey:
    try:
        return ec.derive_private_key(int.from_bytes(scalar, "big"), CURVE)
    except ValueError:
        raise KeyFileError("the session private key is out of range") from None


def scalar_of(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_numbers().private_value.to_bytes(PRIVATE_KEY_SIZE, "big")


# --- messages ------------------------------------------------------------------


def _hex(value: Any, size: int, what: str) -> bytes:
    if not isinstance(value, str) or len(value) != 2 * size:
        raise MalformedSessionMessageError(f"{what} must be {2 * size} hex characters")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise MalformedSessionMessageError(f"{what} is not hexadecimal") from None


def _load_json(data: bytes, limit: int, what: str) -> dict[str, Any]:
    if len(data) > limit:
        raise MalformedSessionMessageError(f"the {what} is larger than {limit} bytes")
    doc = loads_untrusted(data, what=what, error=MalformedSessionMessageError)
    if not isinstance(doc, dict):
        raise MalformedSessionMessageError(f"the {what} must be a JSON object")
    return doc


def _check_keys(doc: dict[str, Any], expected: set[str], schema: str, what: str) -> int:
    if doc.get("schema") != schema:
        found = doc.get("schema")
        said = f"schema {found}" if isinstance(found, str) else "no schema"
        raise MalformedSessionMessageError(f"not a {what} ({said})")
    version = doc.get("version")
    # bool is an int subclass and 1.0 == 1: only an integer is a version, and only 1 is ours.
    if type(version) is not int:
        raise MalformedSessionMessageError(
            f"the {what} version must be an integer, not {json.dumps(version)}"
        )
    if version not in VERSIONS:
        raise ProtocolError(
            f"the {what} uses protocol version {doc.get('version')!r}; gpucc speaks "
            f"versions {GPU_ONLY_VERSION} and {PROTOCOL_VERSION}"
        )
    missing = sorted(expected - doc.keys())
    unknown = sorted(doc.keys() - expected)
    if missing or unknown:
        raise MalformedSessionMessageError(
            f"the {what} has missing keys {missing} or unknown keys {unknown}"
        )
    return version


def _b64(value: Any, limit: int, what: str) -> bytes:
    if not isinstance(value, str) or len(value) > limit * 4 // 3 + 4:
        raise MalformedSessionMessageError(f"{what} must be base64 of at most {limit} bytes")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedSessionMessageError(f"{what} is not base64") from None


@dataclass(frozen=True)
class Offer:
    """The host's offer: its key, the holder's challenge, and evidence bound to both.

    Attributes:
        challenge: the data holder's challenge this offer answers.
        host_public_key: the host's ephemeral P-384 key, uncompressed SEC1.
        evidence_json: NVAT evidence JSON collected with :attr:`nonce`.
        version: 2 with CVM evidence, 1 (GPU only) without.
        cvm_evidence: version 2: the CVM's TDX quote or SEV-SNP report, over
            :func:`cvm_report_data`.
        cvm_collateral: version 2, optional: collateral for it (Intel's PCCS JSON, a VCEK),
            as signed by Intel or AMD; the holder checks it like its own.
        cvm_event_log: version 2, optional (key ``cvm_event_log``, absent when None): the
            CVM's CC event log, which the holder replays against the quote's RTMRs.
        requester_public_key, requester_signature: optional (key ``requester``, absent when
            None): the requester's SPKI DER and its signature over the offer's session
            (:mod:`gpucc.keyrelease.requester`); checked by a holder whose release policy names
            requesters.
    """

    challenge: bytes
    host_public_key: bytes
    evidence_json: bytes = field(repr=False)
    version: int = GPU_ONLY_VERSION
    cvm_evidence: bytes | None = field(default=None, repr=False)
    cvm_collateral: bytes | None = field(default=None, repr=False)
    cvm_event_log: bytes | None = field(default=None, repr=False)
    requester_public_key: bytes | None = field(default=None, repr=False)
    requester_signature: bytes | None = field(default=None, repr=False)

    @property
    def nonce(self) -> bytes:
        """The nonce the evidence claims to carry (recomputed by the holder anyway)."""
        return session_nonce(self.challenge, self.host_public_key)

    def to_json(self) -> bytes:
        """The offer file (``schema: gpucc.session-offer/v1``)."""
        doc = {
            "schema": OFFER_SCHEMA,
            "version": self.version,
            "challenge": self.challenge.hex(),
            "host_public_key": self.host_public_key.hex(),
            "evidence": json.loads(self.evidence_json),
        }
        if self.version == PROTOCOL_VERSION:
            if not self.cvm_evidence:
                raise ValueError("a version-2 offer carries CVM evidence")
            doc["cvm_evidence"] = base64.b64encode(self.cvm_evidence).decode()
            collateral = self.cvm_collateral
            doc["cvm_collateral"] = base64.b64encode(collateral).decode() if collateral else None
            if self.cvm_event_log is not None:
                doc["cvm_event_log"] = base64.b64encode(self.cvm_event_log).decode()
        if self.requester_public_key is not None and self.requester_signature is not None:
            doc["requester"] = {
                "public_key": base64.b64encode(self.requester_public_key).decode(),
                "signature": base64.b64encode(self.requester_signature).decode(),
            }
        return (json.dumps(doc, indent=2) + "\n").encode()

    @property
    def cvm_report_data(self) -> bytes:
        """The report data the CVM evidence claims to sign (recomputed by the holder anyway)."""
        return cvm_report_data(self.nonce, self.host_public_key)

    @classmethod
    def from_json(cls, data: bytes) -> Offer:
        """Parse an offer file strictly.

        Raises:
            MalformedSessionMessageError: not an offer, bad fields, an invalid key.
            ProtocolError: another protocol version.
        """
        doc = _load_json(data, MAX_OFFER_BYTES, "offer")
        keys = {"schema", "version", "challenge", "host_public_key", "evidence"}
        if doc.get("version") == PROTOCOL_VERSION:
            keys |= {"cvm_evidence", "cvm_collateral"}
            if "cvm_event_log" in doc:
                keys.add("cvm_event_log")
        if "requester" in doc:
            keys.add("requester")
        version = _check_keys(doc, keys, OFFER_SCHEMA, "session offer")
        requester = doc.get("requester")
        requester_key = requester_signature = None
        if "requester" in doc:  # present: a key and a signature (null is not absent)
            if not isinstance(requester, dict) or set(requester) != {"public_key", "signature"}:
                raise MalformedSessionMessageError(
                    "the offer's requester must be {public_key, signature}"
                )
            requester_key = _b64(requester["public_key"], 512, "the requester public key")
            requester_signature = _b64(requester["signature"], 256, "the requester signature")
        cvm_evidence = cvm_collateral = cvm_event_log = None
        if version == PROTOCOL_VERSION:
            cvm_evidence = _b64(doc["cvm_evidence"], MAX_CVM_EVIDENCE_BYTES, "the CVM evidence")
            if not cvm_evidence:
                raise MalformedSessionMessageError("the CVM evidence is empty")
            if doc["cvm_collateral"] is not None:
                cvm_collateral = _b64(
                    doc["cvm_collateral"], MAX_CVM_COLLATERAL_BYTES, "the CVM collateral"
                )
            if "cvm_event_log" in doc:
                cvm_event_log = _b64(
                    doc["cvm_event_log"], MAX_CVM_EVENT_LOG_BYTES, "the CVM event log"
                )
        challenge = _hex(doc["challenge"], CHALLENGE_SIZE, "the offer challenge")
        host_public_key = _hex(doc["host_public_key"], PUBLIC_KEY_SIZE, "the host public key")
        decode_public_key(host_public_key, "host")
        if not isinstance(doc["evidence"], list | dict):
            raise MalformedSessionMessageError("the offer evidence must be NVAT evidence JSON")
        return cls(
            challenge=challenge,
            host_public_key=host_public_key,
            evidence_json=json.dumps(doc["evidence"]).encode(),
            version=version,
            cvm_evidence=cvm_evidence,
            cvm_collateral=cvm_collateral,
            cvm_event_log=cvm_event_log,
            requester_public_key=requester_key,
            requester_signature=requester_signature,
        )


@dataclass(frozen=True)
class SessionWrap:
    """A dataset key wrapped for one session, and which dataset it opens.

    Attributes:
        dataset_id: the sealed dataset's id.
        header_digest: SHA-256 of its fixed header (bound into the wrap).
        record: the wrap record (kind 2, context = transcript hash).
    """

    dataset_id: bytes
    header_digest: bytes
    record: WrapRecord

    def to_dict(self) -> dict[str, str]:
        """JSON form."""
        return {
            "dataset_id": self.dataset_id.hex(),
            "header_digest": self.header_digest.hex(),
            "record": base64.b64encode(self.record.to_bytes()).decode(),
        }

    @classmethod
    def from_dict(cls, doc: Any, index: int) -> SessionWrap:
        """Parse one entry of an answer's ``wraps``."""
        where = f"answer wrap {index}"
        if not isinstance(doc, dict) or set(doc) != {"dataset_id", "header_digest", "record"}:
            raise MalformedSessionMessageError(
                f"{where} must hold dataset_id, header_digest and record"
            )
        if not isinstance(doc["record"], str):
            raise MalformedSessionMessageError(f"{where}: record must be base64")
        try:
            raw = base64.b64decode(doc["record"], validate=True)
        except (binascii.Error, ValueError):
            raise MalformedSessionMessageError(f"{where}: record is not base64") from None
        try:
            record = WrapRecord.parse(raw)
        except MalformedInputError as exc:
            raise MalformedSessionMessageError(f"{where}: {exc}") from None
        return cls(
            dataset_id=_hex(doc["dataset_id"], 16, f"{where} dataset_id"),
            header_digest=_hex(doc["header_digest"], 32, f"{where} header_digest"),
            record=record,
        )


@dataclass(frozen=True)
class Answer:
    """The data holder's answer: its key, the transcript hash, and the wrapped keys."""

    holder_public_key: bytes
    transcript_hash: bytes
    wraps: tuple[SessionWrap, ...]
    version: int = GPU_ONLY_VERSION

    def to_json(self) -> bytes:
        """The answer file (``schema: gpucc.session-answer/v1``)."""
        doc = {
            "schema": ANSWER_SCHEMA,
            "version": self.version,
            "holder_public_key": self.holder_public_key.hex(),
            "transcript_hash": self.transcript_hash.hex(),
            "wraps": [w.to_dict() for w in self.wraps],
        }
        return (json.dumps(doc, indent=2) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes) -> Answer:
        """Parse an answer file strictly.

        Raises:
            MalformedSessionMessageError: not an answer, bad fields, an invalid key.
            ProtocolError: another protocol version.
        """
        doc = _load_json(data, MAX_ANSWER_BYTES, "answer")
        version = _check_keys(
            doc,
            {"schema", "version", "holder_public_key", "transcript_hash", "wraps"},
            ANSWER_SCHEMA,
            "session answer",
        )
        holder = _hex(doc["holder_public_key"], PUBLIC_KEY_SIZE, "the holder public key")
        decode_public_key(holder, "holder")
        wraps = doc["wraps"]
        if not isinstance(wraps, list) or len(wraps) > MAX_WRAPS:
            raise MalformedSessionMessageError(f"answer wraps must be a list of <= {MAX_WRAPS}")
        return cls(
            holder_public_key=holder,
            transcript_hash=_hex(doc["transcript_hash"], TRANSCRIPT_HASH_SIZE, "transcript hash"),
            wraps=tuple(SessionWrap.from_dict(w, i) for i, w in enumerate(wraps)),
            version=version,
        )


# --- the host's secret state -----------------------------------------------------


@dataclass(frozen=True)
class HostKey:
    """The host's private half of one offer, kept in a 0600 file between offer and answer.

    Attributes:
        private_key: the 48-byte P-384 scalar (never in a repr, argv, JSON or log).
        challenge: the challenge the offer answered.
        report_digests: SHA-256 of each report the offer carried, in order.
        cvm_evidence_digest: SHA-256 of the CVM evidence a version-2 offer carried; None for
            a GPU-only (version 1) offer.
    """

    private_key: bytes = field(repr=False)
    challenge: bytes
    report_digests: tuple[bytes, ...]
    cvm_evidence_digest: bytes | None = None

    @property
    def version(self) -> int:
        """The protocol version of the offer this key belongs to."""
        return GPU_ONLY_VERSION if self.cvm_evidence_digest is None else PROTOCOL_VERSION

    @property
    def public_key(self) -> bytes:
        """The host public key (uncompressed SEC1)."""
        return encode_public_key(private_key_from_scalar(self.private_key).public_key())

    @property
    def nonce(self) -> bytes:
        """The nonce the host's evidence carries."""
        return session_nonce(self.challenge, self.public_key)

    def to_bytes(self) -> bytes:
        """The host key file: a header line, then ``name: hex`` lines."""
        lines = [_HOST_KEY_MAGIC, f"challenge: {self.challenge.hex()}"]
        lines += [f"report-digest: {d.hex()}" for d in self.report_digests]
        if self.cvm_evidence_digest is not None:
            lines.append(f"cvm-evidence-digest: {self.cvm_evidence_digest.hex()}")
        lines.append(f"private-key: {self.private_key.hex()}")
        return ("\n".join(lines) + "\n").encode()

    def write(self, path: StrPath, *, overwrite: bool = False) -> None:
        """Write the host key file with mode 0600, atomically.

        Raises:
            FileAccessError: the file exists (without ``overwrite``) or cannot be written.
        """
        write_secret_file(path, self.to_bytes(), overwrite=overwrite)

    @classmethod
    def read(cls, path: StrPath) -> HostKey:
        """Read a host key file (refused when group or others can access it).

        Raises:
            KeyFileError: missing, exposed or malformed.
        """
        data = read_secret_file(path, 16 * 1024, what="host key file")
        try:
            lines = data.decode("ascii").splitlines()
        except UnicodeDecodeError:
            raise KeyFileError(f"{path} is not a gpucc session host key file") from None
        if not lines or lines[0] != _HOST_KEY_MAGIC:
            raise KeyFileError(f"{path} is not a gpucc session host key file")
        values: dict[str, list[str]] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(": ")
            if not sep:
                raise KeyFileError(f"{path}: malformed line in the host key file")
            values.setdefault(name, []).append(value)
        try:
            (challenge,) = values.pop("challenge")
            (private,) = values.pop("private-key")
            digests = values.pop("report-digest")
            cvm = values.pop("cvm-evidence-digest", None)
            if values or (cvm is not None and len(cvm) != 1):
                raise ValueError
            key = cls(
                private_key=bytes.fromhex(private),
                challenge=bytes.fromhex(challenge),
                report_digests=tuple(bytes.fromhex(d) for d in digests),
                cvm_evidence_digest=bytes.fromhex(cvm[0]) if cvm else None,
            )
        except (KeyError, ValueError):
            raise KeyFileError(f"{path}: malformed host key file") from None
        if (
            len(key.private_key) != PRIVATE_KEY_SIZE
            or len(key.challenge) != CHALLENGE_SIZE
            or not 1 <= len(key.report_digests) <= MAX_GPUS
            or any(len(d) != REPORT_DIGEST_SIZE for d in key.report_digests)
            or (key.cvm_evidence_digest is not None and len(key.cvm_evidence_digest) != 32)
        ):
            raise KeyFileError(f"{path}: malformed host key file")
        private_key_from_scalar(key.private_key)
        return key
