"""Session keys bound to GPU attestation: protocol v1 (``docs/PROTOCOL.md``).

Two parties: the **host** (the confidential VM that owns the GPU) and the **data holder**
(who has the dataset keys). The holder releases a dataset key only to a session whose GPU
evidence it verified, and only through a key that evidence is bound to::

    holder                                   host
    challenge (32 random bytes)  ─────────▶  ephemeral P-384 key pair (d_H, Q_H)
                                             nonce = SHA-256(label ‖ challenge ‖ SHA-256(Q_H))
                                             evidence = collect(nonce)
                                 ◀─────────  OFFER {challenge, Q_H, evidence}
    nonce' from ITS challenge and Q_H
    attest(evidence, nonce')  (full verification and policy; the report must carry nonce')
    ephemeral (d_D, Q_D); Z = ECDH(d_D, Q_H)
    transcript T (version, nonce', report digests, Q_H, Q_D); K = HKDF-SHA-384(Z, nonce', T)
    wrap dataset keys under K (wrap records kind 2, context SHA-384(T))
                                 ─────────▶  ANSWER {Q_D, SHA-384(T), wraps}
                                             rebuild T from its own nonce, digests and Q_H,
                                             check SHA-384(T), K = HKDF(ECDH(d_H, Q_D), ...),
                                             unwrap

The evidence check is injected (``attest``), so this module depends on no verifier: in
production it is :func:`gpuattest.verifier.verify` with the caller's roots, collateral and
policy. ``attest`` must check that every report carries ``expected_nonce``; that check is
what ties the offered public key to the GPU.

What it does not do: it does not authenticate the data holder to the host (anyone can
answer an offer), and GPU attestation alone does not prove which process holds the host's
private key: see PROTOCOL.md, "Security model".
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gpucc.staging.format import (
    KEY_SIZE,
    StrPath,
    WrapKind,
    WrapRecord,
    read_secret_file,
    unwrap_key,
    wrap_key,
    write_secret_file,
)

from .errors import KeyFileError, KeyUnwrapError, MalformedInputError, ProtocolError

__all__ = [
    "CHALLENGE_SIZE",
    "PROTOCOL_VERSION",
    "Answer",
    "AttestationOutcome",
    "CollectedEvidence",
    "DatasetKey",
    "GpuOutcome",
    "HolderSession",
    "HostKey",
    "HostSession",
    "LocalSession",
    "MalformedSessionMessageError",
    "Offer",
    "SessionWrap",
    "accept_offer",
    "create_offer",
    "derive_session_key",
    "encode_public_key",
    "encode_transcript",
    "local_session",
    "new_challenge",
    "open_answer",
    "session_nonce",
    "transcript_hash",
]

PROTOCOL_VERSION = 1
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
OFFER_SCHEMA = "gpucc.session-offer/v1"
ANSWER_SCHEMA = "gpucc.session-answer/v1"
_HOST_KEY_MAGIC = "gpucc-session-host-key v1"
_CURVE = ec.SECP384R1()


class MalformedSessionMessageError(MalformedInputError):
    """An offer, answer or host key file cannot be parsed."""


# --- the injected attestation ---------------------------------------------------


class GpuOutcome(Protocol):
    """What the protocol needs to know about one verified GPU."""

    @property
    def report_digest(self) -> bytes:
        """SHA-256 of the raw attestation report."""
        ...


class AttestationOutcome(Protocol):
    """The verdict ``attest`` returns (``gpuattest.verifier.AttestationResult`` fits)."""

    @property
    def trusted(self) -> bool:
        """Every GPU passed every check the policy requires, nonce included."""
        ...

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why not, when not trusted."""
        ...

    @property
    def gpus(self) -> Sequence[GpuOutcome]:
        """Per GPU, in evidence order."""
        ...


#: ``attest(evidence_set, expected_nonce) -> outcome``. It must require every report to
#: carry ``expected_nonce``.
Attester = Callable[[Any, bytes], AttestationOutcome]
#: ``load_evidence(evidence_json) -> evidence_set`` (default: gpuattest.evidence).
EvidenceLoader = Callable[[bytes], Any]


@dataclass(frozen=True)
class CollectedEvidence:
    """What the host's collector returns for a nonce.

    Attributes:
        evidence_json: NVAT evidence JSON (``gpuattest.evidence.dump_evidence_json``).
        reports: the raw reports, in the same order, so the host can compute the digests
            the holder's verifier will report.
    """

    evidence_json: bytes = field(repr=False)
    reports: tuple[bytes, ...] = field(repr=False)

    @classmethod
    def from_evidence_set(cls, evidence: Any) -> CollectedEvidence:
        """From a ``gpuattest.evidence.EvidenceSet``."""
        from .evidence import dump_evidence_json

        return cls(
            evidence_json=dump_evidence_json(evidence),
            reports=tuple(gpu.report for gpu in evidence.gpus),
        )

    @property
    def report_digests(self) -> tuple[bytes, ...]:
        """SHA-256 of each raw report."""
        return tuple(hashlib.sha256(r).digest() for r in self.reports)


def _default_loader(evidence_json: bytes) -> Any:
    from .evidence import load_evidence_json

    return load_evidence_json(evidence_json)


# --- the derivations (pure; docs/PROTOCOL.md gives test vectors) ----------------


def new_challenge() -> bytes:
    """32 random bytes, made by the data holder for one session."""
    return secrets.token_bytes(CHALLENGE_SIZE)


def encode_public_key(key: ec.EllipticCurvePublicKey) -> bytes:
    """The uncompressed SEC1 encoding (97 bytes for P-384)."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return key.public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)


def _decode_public_key(data: bytes, who: str) -> ec.EllipticCurvePublicKey:
    if len(data) != PUBLIC_KEY_SIZE or data[0] != 0x04:
        raise MalformedSessionMessageError(
            f"the {who} public key is not an uncompressed P-384 point"
        )
    try:
        return ec.EllipticCurvePublicKey.from_encoded_point(_CURVE, data)
    except ValueError:
        raise MalformedSessionMessageError(
            f"the {who} public key is not a point on P-384"
        ) from None


def _check_len(value: bytes, size: int, what: str) -> None:
    if len(value) != size:
        raise ValueError(f"{what} must be {size} bytes, got {len(value)}")


def session_nonce(challenge: bytes, host_public_key: bytes) -> bytes:
    """The GPU nonce: ``SHA-256("gpucc/session/v1/nonce" || challenge || SHA-256(Q_H))``."""
    _check_len(challenge, CHALLENGE_SIZE, "a challenge")
    _check_len(host_public_key, PUBLIC_KEY_SIZE, "a public key")
    return hashlib.sha256(
        NONCE_LABEL + challenge + hashlib.sha256(host_public_key).digest()
    ).digest()


def _field(value: bytes) -> bytes:
    return len(value).to_bytes(4, "big") + value


def encode_transcript(
    *,
    nonce: bytes,
    report_digests: Sequence[bytes],
    host_public_key: bytes,
    holder_public_key: bytes,
    version: int = PROTOCOL_VERSION,
) -> bytes:
    """The session transcript: six length-prefixed fields (uint32 big-endian lengths).

    ``label || uint16_be(version) || nonce || digest_0 || ... || digest_{g-1} || Q_H || Q_D``,
    each field preceded by its length; the digests form one field of ``32 * g`` bytes.
    """
    _check_len(nonce, 32, "a nonce")
    if not 1 <= len(report_digests) <= MAX_GPUS:
        raise ValueError("a transcript covers 1 to 64 report digests")
    for digest in report_digests:
        _check_len(digest, REPORT_DIGEST_SIZE, "a report digest")
    _check_len(host_public_key, PUBLIC_KEY_SIZE, "a public key")
    _check_len(holder_public_key, PUBLIC_KEY_SIZE, "a public key")
    return b"".join(
        _field(value)
        for value in (
            TRANSCRIPT_LABEL,
            version.to_bytes(2, "big"),
            nonce,
            b"".join(report_digests),
            host_public_key,
            holder_public_key,
        )
    )


def transcript_hash(transcript: bytes) -> bytes:
    """SHA-384 of the transcript (48 bytes): the wrap context and the answer's check value."""
    return hashlib.sha384(transcript).digest()


def derive_session_key(shared_secret: bytes, *, nonce: bytes, transcript: bytes) -> bytes:
    """``K = HKDF-SHA-384(IKM = ECDH x-coordinate, salt = nonce, info = transcript, L = 32)``."""
    _check_len(shared_secret, 48, "a P-384 shared secret")
    return HKDF(algorithm=hashes.SHA384(), length=KEY_SIZE, salt=nonce, info=transcript).derive(
        shared_secret
    )


def _private_key(scalar: bytes) -> ec.EllipticCurvePrivateKey:
    try:
        return ec.derive_private_key(int.from_bytes(scalar, "big"), _CURVE)
    except ValueError:
        raise KeyFileError("the session private key is out of range") from None


def _scalar(key: ec.EllipticCurvePrivateKey) -> bytes:
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
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MalformedSessionMessageError(f"the {what} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MalformedSessionMessageError(f"the {what} must be a JSON object")
    return doc


def _check_keys(doc: dict[str, Any], expected: set[str], schema: str, what: str) -> None:
    if doc.get("schema") != schema:
        raise MalformedSessionMessageError(f"not a {what} (schema {doc.get('schema')!r})")
    if doc.get("version") != PROTOCOL_VERSION:
        raise ProtocolError(
            f"the {what} uses protocol version {doc.get('version')!r}; gpucc speaks "
            f"version {PROTOCOL_VERSION}"
        )
    missing = sorted(expected - doc.keys())
    unknown = sorted(doc.keys() - expected)
    if missing or unknown:
        raise MalformedSessionMessageError(
            f"the {what} has missing keys {missing} or unknown keys {unknown}"
        )


@dataclass(frozen=True)
class Offer:
    """The host's offer: its key, the holder's challenge, and evidence bound to both.

    Attributes:
        challenge: the data holder's challenge this offer answers.
        host_public_key: the host's ephemeral P-384 key, uncompressed SEC1.
        evidence_json: NVAT evidence JSON collected with :attr:`nonce`.
    """

    challenge: bytes
    host_public_key: bytes
    evidence_json: bytes = field(repr=False)
    version: int = PROTOCOL_VERSION

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
        return (json.dumps(doc, indent=2) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes) -> Offer:
        """Parse an offer file strictly.

        Raises:
            MalformedSessionMessageError: not an offer, bad fields, an invalid key.
            ProtocolError: another protocol version.
        """
        doc = _load_json(data, MAX_OFFER_BYTES, "offer")
        _check_keys(
            doc,
            {"schema", "version", "challenge", "host_public_key", "evidence"},
            OFFER_SCHEMA,
            "session offer",
        )
        challenge = _hex(doc["challenge"], CHALLENGE_SIZE, "the offer challenge")
        host_public_key = _hex(doc["host_public_key"], PUBLIC_KEY_SIZE, "the host public key")
        _decode_public_key(host_public_key, "host")
        if not isinstance(doc["evidence"], list | dict):
            raise MalformedSessionMessageError("the offer evidence must be NVAT evidence JSON")
        return cls(
            challenge=challenge,
            host_public_key=host_public_key,
            evidence_json=json.dumps(doc["evidence"]).encode(),
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
    version: int = PROTOCOL_VERSION

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
        _check_keys(
            doc,
            {"schema", "version", "holder_public_key", "transcript_hash", "wraps"},
            ANSWER_SCHEMA,
            "session answer",
        )
        holder = _hex(doc["holder_public_key"], PUBLIC_KEY_SIZE, "the holder public key")
        _decode_public_key(holder, "holder")
        wraps = doc["wraps"]
        if not isinstance(wraps, list) or len(wraps) > MAX_WRAPS:
            raise MalformedSessionMessageError(f"answer wraps must be a list of <= {MAX_WRAPS}")
        return cls(
            holder_public_key=holder,
            transcript_hash=_hex(doc["transcript_hash"], TRANSCRIPT_HASH_SIZE, "transcript hash"),
            wraps=tuple(SessionWrap.from_dict(w, i) for i, w in enumerate(wraps)),
        )


# --- the host's secret state -----------------------------------------------------


@dataclass(frozen=True)
class HostKey:
    """The host's private half of one offer, kept in a 0600 file between offer and answer.

    Attributes:
        private_key: the 48-byte P-384 scalar (never in a repr, argv, JSON or log).
        challenge: the challenge the offer answered.
        report_digests: SHA-256 of each report the offer carried, in order.
    """

    private_key: bytes = field(repr=False)
    challenge: bytes
    report_digests: tuple[bytes, ...]

    @property
    def public_key(self) -> bytes:
        """The host public key (uncompressed SEC1)."""
        return encode_public_key(_private_key(self.private_key).public_key())

    @property
    def nonce(self) -> bytes:
        """The nonce the host's evidence carries."""
        return session_nonce(self.challenge, self.public_key)

    def to_bytes(self) -> bytes:
        """The host key file: a header line, then ``name: hex`` lines."""
        lines = [_HOST_KEY_MAGIC, f"challenge: {self.challenge.hex()}"]
        lines += [f"report-digest: {d.hex()}" for d in self.report_digests]
        lines.append(f"private-key: {self.private_key.hex()}")
        return ("\n".join(lines) + "\n").encode()

    def write(self, path: StrPath, *, overwrite: bool = False) -> None:
        """Write the host key file with mode 0600, atomically.

        Raises:
            KeyFileError: the file exists (without ``overwrite``) or cannot be written.
        """
        write_secret_file(path, self.to_bytes(), overwrite=overwrite)

    @classmethod
    def read(cls, path: StrPath) -> HostKey:
        """Read a host key file (refused when group or others can access it).

        Raises:
            KeyFileError: missing, exposed or malformed.
        """
        data = read_secret_file(path, 16 * 1024)
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
            if values:
                raise ValueError
            key = cls(
                private_key=bytes.fromhex(private),
                challenge=bytes.fromhex(challenge),
                report_digests=tuple(bytes.fromhex(d) for d in digests),
            )
        except (KeyError, ValueError):
            raise KeyFileError(f"{path}: malformed host key file") from None
        if (
            len(key.private_key) != PRIVATE_KEY_SIZE
            or len(key.challenge) != CHALLENGE_SIZE
            or not 1 <= len(key.report_digests) <= MAX_GPUS
            or any(len(d) != REPORT_DIGEST_SIZE for d in key.report_digests)
        ):
            raise KeyFileError(f"{path}: malformed host key file")
        _private_key(key.private_key)
        return key


# --- the three steps ------------------------------------------------------------


def create_offer(
    challenge: bytes,
    collect: Callable[[bytes], CollectedEvidence],
    *,
    private_key: ec.EllipticCurvePrivateKey | None = None,
) -> tuple[Offer, HostKey]:
    """Host, step 1: make an ephemeral key, collect evidence bound to it, build the offer.

    Args:
        challenge: the data holder's 32-byte challenge.
        collect: ``collect(nonce)`` collects GPU evidence carrying ``nonce``.
        private_key: a fixed key (known-answer tests only); fresh by default.

    Returns:
        The offer to send, and the host key to keep (write it with :meth:`HostKey.write`).
    """
    _check_len(challenge, CHALLENGE_SIZE, "a challenge")
    key = private_key or ec.generate_private_key(_CURVE)
    public = encode_public_key(key.public_key())
    collected = collect(session_nonce(challenge, public))
    if not collected.reports:
        raise ProtocolError("evidence collection returned no GPU")
    offer = Offer(
        challenge=challenge, host_public_key=public, evidence_json=collected.evidence_json
    )
    host_key = HostKey(
        private_key=_scalar(key), challenge=challenge, report_digests=collected.report_digests
    )
    return offer, host_key


def _nonce_diagnosis(offer: Offer, expected: bytes) -> str:
    """A hint for a refused offer whose evidence declares another nonce (not a check)."""
    try:
        doc = json.loads(offer.evidence_json)
        entries = doc.get("evidences", doc) if isinstance(doc, dict) else doc
        declared = {str(e.get("nonce", "")).lower() for e in entries if isinstance(e, dict)}
    except (ValueError, AttributeError, TypeError):
        return ""
    if declared and declared != {expected.hex()}:
        return (
            "; the evidence was collected for another nonce: the offer's public key or "
            "challenge was changed after attestation, or the offer is replayed"
        )
    return ""


@dataclass(frozen=True)
class DatasetKey:
    """A dataset key the holder is willing to release, and the dataset it opens."""

    dataset_id: bytes
    header_digest: bytes
    key: bytes = field(repr=False)


@dataclass(frozen=True)
class HolderSession:
    """The data holder's side of an accepted offer.

    Attributes:
        nonce: the nonce the holder derived and the evidence carried.
        report_digests: digests of the verified reports.
        host_public_key: the attested host key.
        holder_public_key: the holder's ephemeral key.
        transcript: the encoded transcript.
        transcript_hash: its SHA-384.
        session_key: the derived key (never in a repr).
    """

    nonce: bytes
    report_digests: tuple[bytes, ...]
    host_public_key: bytes
    holder_public_key: bytes
    transcript: bytes = field(repr=False)
    transcript_hash: bytes
    session_key: bytes = field(repr=False)

    def wrap(self, dataset: DatasetKey, *, wrap_nonce: bytes | None = None) -> SessionWrap:
        """Wrap a dataset key for this session (wrap record kind 2).

        ``wrap_nonce`` is random unless given (known-answer tests only).
        """
        record = wrap_key(
            self.session_key,
            dataset.key,
            dataset.header_digest,
            WrapKind.SESSION,
            self.transcript_hash,
            wrap_nonce=wrap_nonce,
        )
        return SessionWrap(
            dataset_id=dataset.dataset_id, header_digest=dataset.header_digest, record=record
        )

    def answer(self, wraps: Sequence[SessionWrap]) -> Answer:
        """The answer carrying ``wraps`` back to the host."""
        return Answer(
            holder_public_key=self.holder_public_key,
            transcript_hash=self.transcript_hash,
            wraps=tuple(wraps),
        )


def accept_offer(
    offer: Offer,
    *,
    challenge: bytes,
    attest: Attester,
    load_evidence: EvidenceLoader | None = None,
    private_key: ec.EllipticCurvePrivateKey | None = None,
) -> HolderSession:
    """Data holder, step 2: verify the offer and derive the session key.

    Steps, each failing closed:

    1. The offer answers *this* holder's ``challenge`` (else: replayed or misdirected).
    2. The nonce is recomputed from the holder's own challenge and the offered key.
    3. ``attest(evidence, nonce)`` must be trusted: full verification and policy, with
       every report carrying that nonce, which binds the offered key to the GPU.
    4. The transcript (version, nonce, report digests, both keys) feeds HKDF.

    Raises:
        ProtocolError: another challenge, evidence not trusted (its reasons are in the
            message), or a verdict without GPUs.
        MalformedInputError: the evidence cannot be parsed.
    """
    _check_len(challenge, CHALLENGE_SIZE, "a challenge")
    # (1) The offer must answer our challenge.
    if offer.version != PROTOCOL_VERSION:
        raise ProtocolError(f"offer protocol version {offer.version} is not supported")
    if not hmac.compare_digest(offer.challenge, challenge):
        raise ProtocolError(
            "the offer answers another challenge (replayed, or meant for another data holder)"
        )
    host_key = _decode_public_key(offer.host_public_key, "host")
    # (2) Our nonce, from our challenge and the key we would wrap to.
    nonce = session_nonce(challenge, offer.host_public_key)
    # (3) The evidence must verify, with that nonce, under the caller's policy.
    evidence = (load_evidence or _default_loader)(offer.evidence_json)
    result = attest(evidence, nonce)
    if not result.trusted:
        reasons = "; ".join(result.reasons) or "no reason given"
        raise ProtocolError(
            f"the offer's attestation is not trusted: {reasons}{_nonce_diagnosis(offer, nonce)}"
        )
    digests = tuple(bytes(g.report_digest) for g in result.gpus)
    if not 1 <= len(digests) <= MAX_GPUS or any(len(d) != 32 for d in digests):
        raise ProtocolError("the attestation verdict names no GPU report")
    # (4) ECDH and the transcript-bound key.
    holder = private_key or ec.generate_private_key(_CURVE)
    holder_public = encode_public_key(holder.public_key())
    transcript = encode_transcript(
        nonce=nonce,
        report_digests=digests,
        host_public_key=offer.host_public_key,
        holder_public_key=holder_public,
    )
    shared = holder.exchange(ec.ECDH(), host_key)
    return HolderSession(
        nonce=nonce,
        report_digests=digests,
        host_public_key=offer.host_public_key,
        holder_public_key=holder_public,
        transcript=transcript,
        transcript_hash=transcript_hash(transcript),
        session_key=derive_session_key(shared, nonce=nonce, transcript=transcript),
    )


@dataclass(frozen=True)
class HostSession:
    """The host's side of an answered offer: it can unwrap the dataset keys it was sent.

    Attributes:
        transcript_hash: the checked transcript hash.
        wraps: the wrapped keys from the answer.
        session_key: the derived key (never in a repr).
    """

    transcript_hash: bytes
    wraps: tuple[SessionWrap, ...]
    session_key: bytes = field(repr=False)

    @property
    def dataset_ids(self) -> tuple[bytes, ...]:
        """The datasets this session holds keys for."""
        return tuple(w.dataset_id for w in self.wraps)

    def dataset_key(self, header_digest: bytes) -> bytes:
        """Unwrap the key of the dataset whose fixed header has this digest.

        The caller still verifies the header tag under the key (staging does).

        Raises:
            KeyUnwrapError: no wrap for that dataset, or it does not unwrap (another
                session, another dataset, or tampered).
        """
        for wrap in self.wraps:
            if hmac.compare_digest(wrap.header_digest, header_digest):
                return unwrap_key(self.session_key, wrap.record, header_digest)
        raise KeyUnwrapError("the session answer holds no key for this dataset")


def open_answer(answer: Answer, host_key: HostKey) -> HostSession:
    """Host, step 3: check the answer against the host's own offer and derive the key.

    The transcript is rebuilt from what the host itself sent (its challenge, nonce, report
    digests and public key) plus the holder's key, and its hash must equal the answer's.

    Raises:
        ProtocolError: the transcript does not match (an answer to another offer, or a
            holder that verified something else), or a wrap is for another session.
    """
    if answer.version != PROTOCOL_VERSION:
        raise ProtocolError(f"answer protocol version {answer.version} is not supported")
    holder_key = _decode_public_key(answer.holder_public_key, "holder")
    private = _private_key(host_key.private_key)
    host_public = encode_public_key(private.public_key())
    nonce = session_nonce(host_key.challenge, host_public)
    transcript = encode_transcript(
        nonce=nonce,
        report_digests=host_key.report_digests,
        host_public_key=host_public,
        holder_public_key=answer.holder_public_key,
    )
    expected = transcript_hash(transcript)
    if not hmac.compare_digest(expected, answer.transcript_hash):
        raise ProtocolError(
            "transcript mismatch: the answer was made for another offer or session, or the "
            "data holder verified different evidence"
        )
    for i, wrap in enumerate(answer.wraps):
        if wrap.record.kind is not WrapKind.SESSION or not hmac.compare_digest(
            wrap.record.context, expected
        ):
            raise ProtocolError(f"answer wrap {i} is not bound to this session's transcript")
    shared = private.exchange(ec.ECDH(), holder_key)
    return HostSession(
        transcript_hash=expected,
        wraps=answer.wraps,
        session_key=derive_session_key(shared, nonce=nonce, transcript=transcript),
    )


@dataclass(frozen=True)
class LocalSession:
    """All three steps run by one party (host and data holder in one process).

    Attributes:
        offer: the offer (with the evidence that was verified).
        answer: the answer (with the wrapped keys).
        host_key: the host's secret state (never in a repr).
        session: the host side, ready to unwrap.
    """

    offer: Offer
    answer: Answer
    host_key: HostKey = field(repr=False)
    session: HostSession = field(repr=False)


def local_session(
    *,
    collect: Callable[[bytes], CollectedEvidence],
    attest: Attester,
    datasets: Sequence[DatasetKey],
    load_evidence: EvidenceLoader | None = None,
) -> LocalSession:
    """Release dataset keys to this machine's GPU session after verifying it, in one call.

    Runs the full protocol with a fresh challenge: the keys are released only if the
    local GPU's evidence, bound to a fresh session key, passes ``attest``.

    Raises:
        ProtocolError: the evidence is not trusted, or any protocol check fails.
    """
    challenge = new_challenge()
    offer, host_key = create_offer(challenge, collect)
    holder = accept_offer(offer, challenge=challenge, attest=attest, load_evidence=load_evidence)
    answer = holder.answer([holder.wrap(d) for d in datasets])
    return LocalSession(
        offer=offer, answer=answer, host_key=host_key, session=open_answer(answer, host_key)
    )
