"""Dataset-key release bound to GPU and CVM attestation (``docs/PROTOCOL.md``).

Protocol version 2 adds the confidential VM to version 1's GPU binding: the host's CVM
evidence carries report data ``SHA-512(label || nonce || SHA-256(Q_H))`` and the transcript
its digest, so the holder knows ``Q_H`` was made inside that attested CVM. A version-1
(GPU-only) offer is accepted only when the holder sets the named relaxation
``allow_gpu_only``; no version-2 offer is ever silently treated as version 1.

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
private key: see PROTOCOL.md, "Security model". The derivations and the message formats
live in :mod:`keyrelease.messages`, the record of answered challenges in
:mod:`keyrelease.replay`; their names are re-exported here.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.staging.errors import (
    DatasetKeyMismatchError,
    MalformedSessionMessageError,
    ProtocolError,
)
from gpucc.staging.format import WrapKind, unwrap_key, wrap_key

from .cvm import CollectedCvmEvidence, CvmAttester, CvmOutcome, check_cvm
from .messages import (
    CHALLENGE_SIZE,
    CURVE,
    GPU_ONLY_VERSION,
    MAX_ANSWER_BYTES,
    MAX_GPUS,
    MAX_OFFER_BYTES,
    PROTOCOL_VERSION,
    VERSIONS,
    Answer,
    HostKey,
    Offer,
    SessionWrap,
    check_length,
    cvm_report_data,
    decode_public_key,
    derive_session_key,
    encode_public_key,
    encode_transcript,
    new_challenge,
    private_key_from_scalar,
    scalar_of,
    session_nonce,
    transcript_hash,
)
from .replay import (
    ChallengeReplayError,
    FileReplayStore,
    MemoryReplayStore,
    ReplayStore,
    claim_device_reports,
)

__all__ = [
    "CHALLENGE_SIZE",
    "MAX_ANSWER_BYTES",
    "MAX_OFFER_BYTES",
    "PROTOCOL_VERSION",
    "Answer",
    "AttestationOutcome",
    "Attester",
    "ChallengeReplayError",
    "CollectedCvmEvidence",
    "CollectedEvidence",
    "CvmAttester",
    "CvmOutcome",
    "DataHolder",
    "DatasetKey",
    "EvidenceLoader",
    "FileReplayStore",
    "GpuOutcome",
    "HolderSession",
    "HostKey",
    "HostSession",
    "LocalSession",
    "MemoryReplayStore",
    "MalformedSessionMessageError",
    "Offer",
    "ReplayStore",
    "SessionWrap",
    "accept_offer",
    "create_offer",
    "cvm_report_data",
    "derive_session_key",
    "encode_public_key",
    "encode_transcript",
    "local_session",
    "new_challenge",
    "open_answer",
    "session_nonce",
    "transcript_hash",
]


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
        from gpucc.gpuattest.evidence import dump_evidence_json

        return cls(
            evidence_json=dump_evidence_json(evidence),
            reports=tuple(gpu.report for gpu in evidence.gpus),
        )

    @property
    def report_digests(self) -> tuple[bytes, ...]:
        """SHA-256 of each raw report."""
        return tuple(hashlib.sha256(r).digest() for r in self.reports)


def _default_loader(evidence_json: bytes) -> Any:
    from gpucc.gpuattest.evidence import load_evidence_json

    return load_evidence_json(evidence_json)


# --- the three steps ------------------------------------------------------------


def create_offer(
    challenge: bytes,
    collect: Callable[[bytes], CollectedEvidence],
    *,
    private_key: ec.EllipticCurvePrivateKey | None = None,
    collect_cvm: Callable[[bytes], CollectedCvmEvidence] | None = None,
) -> tuple[Offer, HostKey]:
    """Host, step 1: make an ephemeral key, collect evidence bound to it, build the offer.

    Args:
        challenge: the data holder's 32-byte challenge.
        collect: ``collect(nonce)`` collects GPU evidence carrying ``nonce``.
        private_key: a fixed key (known-answer tests only); fresh by default.
        collect_cvm: ``collect_cvm(report_data)`` gets the CVM's quote or report over
            ``report_data`` (a version-2 offer); None makes a GPU-only (version 1) offer.

    Returns:
        The offer to send, and the host key to keep (write it with :meth:`HostKey.write`).
    """
    check_length(challenge, CHALLENGE_SIZE, "a challenge")
    key = private_key or ec.generate_private_key(CURVE)
    public = encode_public_key(key.public_key())
    collected = collect(session_nonce(challenge, public))
    if not collected.reports:
        raise ProtocolError("evidence collection returned no GPU")
    cvm = None
    if collect_cvm is not None:
        cvm = collect_cvm(cvm_report_data(session_nonce(challenge, public), public))
        if not cvm.evidence:
            raise ProtocolError("CVM evidence collection returned nothing")
    offer = Offer(
        challenge=challenge,
        host_public_key=public,
        evidence_json=collected.evidence_json,
        version=GPU_ONLY_VERSION if cvm is None else PROTOCOL_VERSION,
        cvm_evidence=None if cvm is None else cvm.evidence,
        cvm_collateral=None if cvm is None else cvm.collateral,
        cvm_event_log=None if cvm is None else cvm.event_log,
    )
    host_key = HostKey(
        private_key=scalar_of(key),
        challenge=challenge,
        report_digests=collected.report_digests,
        cvm_evidence_digest=None if cvm is None else hashlib.sha256(cvm.evidence).digest(),
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
    version: int = GPU_ONLY_VERSION

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
            version=self.version,
        )


def accept_offer(
    offer: Offer,
    *,
    challenge: bytes,
    attest: Attester,
    load_evidence: EvidenceLoader | None = None,
    private_key: ec.EllipticCurvePrivateKey | None = None,
    replay: ReplayStore | None = None,
    attest_cvm: CvmAttester | None = None,
    allow_gpu_only: bool = False,
) -> HolderSession:
    """Data holder, step 2: verify the offer and derive the session key.

    Steps, each failing closed:

    1. The offer answers *this* holder's ``challenge`` (else: replayed or misdirected), and
       carries CVM evidence (version 2) unless ``allow_gpu_only`` (the named relaxation that
       accepts version-1, GPU-only offers).
    2. The nonce is recomputed from the holder's own challenge and the offered key.
    3. ``attest(evidence, nonce)`` must be trusted: full verification and policy, with
       every report carrying that nonce, which binds the offered key to the GPU.
    3b. Version 2: ``attest_cvm(cvm_evidence, cvm_collateral, report_data)`` must be trusted,
       with ``report_data`` recomputed from the nonce and the offered key: the key was made
       inside that CVM, and the CVM's and the GPU's evidence belong to one session.
    4. The transcript (version, nonce, report digests, both keys, the CVM evidence digest)
       feeds HKDF.

    With ``replay``, the challenge is claimed once the attestation is trusted: an offer
    to a challenge this holder already answered is refused (offers are single-use); then
    each device's report over the nonce (:func:`~.replay.claim_device_reports`): a report
    this holder accepted before, or one device's report twice in one offer, is refused. The
    function alone keeps no state; :class:`DataHolder` keeps a store for its caller.

    Raises:
        ChallengeReplayError: ``replay`` holds this challenge already.
        DeviceReportReplayError: ``replay`` holds a device's report over this nonce.
        ProtocolError: another challenge, evidence not trusted (its reasons are in the
            message), or a verdict without GPUs.
        MalformedInputError: the evidence cannot be parsed.
    """
    check_length(challenge, CHALLENGE_SIZE, "a challenge")
    # (1) The offer must answer our challenge, and carry CVM evidence unless relaxed.
    if type(offer.version) is not int or offer.version not in VERSIONS:
        raise ProtocolError(f"offer protocol version {offer.version} is not supported")
    if offer.version == GPU_ONLY_VERSION and not allow_gpu_only:
        raise ProtocolError(
            "the offer is GPU-only (protocol version 1, no CVM evidence): nothing proves the "
            "session key was made inside a confidential VM; it is accepted only under the "
            "named relaxation allow_gpu_only"
        )
    if offer.version == PROTOCOL_VERSION and not offer.cvm_evidence:
        raise ProtocolError("a version-2 offer must carry CVM evidence")
    if not hmac.compare_digest(offer.challenge, challenge):
        raise ProtocolError(
            "the offer answers another challenge (replayed, or meant for another data holder)"
        )
    host_key = decode_public_key(offer.host_public_key, "host")
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
    cvm_digest = check_cvm(offer, nonce, attest_cvm)
    if replay is not None:
        replay.claim(challenge)
        claim_device_reports(replay, offer_devices(result.gpus), nonce)
    # (4) ECDH and the transcript-bound key.
    holder = private_key or ec.generate_private_key(CURVE)
    holder_public = encode_public_key(holder.public_key())
    transcript = encode_transcript(
        nonce=nonce,
        report_digests=digests,
        host_public_key=offer.host_public_key,
        holder_public_key=holder_public,
        version=offer.version,
        cvm_evidence_digest=cvm_digest,
    )
    shared = holder.exchange(ec.ECDH(), host_key)
    return HolderSession(
        version=offer.version,
        nonce=nonce,
        report_digests=digests,
        host_public_key=offer.host_public_key,
        holder_public_key=holder_public,
        transcript=transcript,
        transcript_hash=transcript_hash(transcript),
        session_key=derive_session_key(shared, nonce=nonce, transcript=transcript),
    )


def offer_devices(devices: Iterable[GpuOutcome]) -> list[str]:
    """The identities of the devices an accepted verdict names, in offer order: each
    one's ``ueid`` claim (its leaf certificate's serial), else its report's digest."""
    out = []
    for gpu in devices:
        claims = getattr(gpu, "claims", None)
        ueid = claims.get("ueid") if isinstance(claims, dict) else None
        out.append(str(ueid) if ueid else bytes(gpu.report_digest).hex())
    return out


class DataHolder:
    """A data holder that answers each challenge at most once (in memory by default).

    ``DataHolder(attest).accept(offer, challenge)`` is :func:`accept_offer` with this
    holder's replay store; pass a :class:`FileReplayStore` to remember across processes.
    """

    def __init__(
        self,
        attest: Attester,
        *,
        replay: ReplayStore | None = None,
        load_evidence: EvidenceLoader | None = None,
        attest_cvm: CvmAttester | None = None,
        allow_gpu_only: bool = False,
    ) -> None:
        self.attest = attest
        self.replay: ReplayStore = MemoryReplayStore() if replay is None else replay
        self.load_evidence = load_evidence
        self.attest_cvm = attest_cvm
        self.allow_gpu_only = allow_gpu_only

    def accept(self, offer: Offer, challenge: bytes) -> HolderSession:
        """Verify ``offer`` for ``challenge`` and claim the challenge (see :func:`accept_offer`).

        Raises:
            ChallengeReplayError: this holder already answered ``challenge``.
            ProtocolError, MalformedInputError: as :func:`accept_offer`.
        """
        return accept_offer(
            offer,
            challenge=challenge,
            attest=self.attest,
            load_evidence=self.load_evidence,
            replay=self.replay,
            attest_cvm=self.attest_cvm,
            allow_gpu_only=self.allow_gpu_only,
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
            DatasetKeyMismatchError: the answer holds no wrap for that dataset.
            KeyUnwrapError: the wrap does not unwrap (another session, or tampered).
        """
        for wrap in self.wraps:
            if hmac.compare_digest(wrap.header_digest, header_digest):
                return unwrap_key(self.session_key, wrap.record, header_digest)
        raise DatasetKeyMismatchError("the session answer holds no key for this dataset")


def open_answer(answer: Answer, host_key: HostKey) -> HostSession:
    """Host, step 3: check the answer against the host's own offer and derive the key.

    The transcript is rebuilt from what the host itself sent (its challenge, nonce, report
    digests and public key) plus the holder's key, and its hash must equal the answer's.

    Raises:
        ProtocolError: the transcript does not match (an answer to another offer, or a
            holder that verified something else), or a wrap is for another session.
    """
    if type(answer.version) is not int or answer.version != host_key.version:
        raise ProtocolError(
            f"answer protocol version {answer.version} does not match the offer's "
            f"({host_key.version})"
        )
    holder_key = decode_public_key(answer.holder_public_key, "holder")
    private = private_key_from_scalar(host_key.private_key)
    host_public = encode_public_key(private.public_key())
    nonce = session_nonce(host_key.challenge, host_public)
    transcript = encode_transcript(
        nonce=nonce,
        report_digests=host_key.report_digests,
        host_public_key=host_public,
        holder_public_key=answer.holder_public_key,
        version=host_key.version,
        cvm_evidence_digest=host_key.cvm_evidence_digest,
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
    collect_cvm: Callable[[bytes], CollectedCvmEvidence] | None = None,
    attest_cvm: CvmAttester | None = None,
    allow_gpu_only: bool = False,
) -> LocalSession:
    """Release dataset keys to this machine's GPU session after verifying it, in one call.

    Runs the full protocol with a fresh challenge: the keys are released only if the
    local GPU's evidence, bound to a fresh session key, passes ``attest``.

    Raises:
        ProtocolError: the evidence is not trusted, or any protocol check fails.
    """
    challenge = new_challenge()
    offer, host_key = create_offer(challenge, collect, collect_cvm=collect_cvm)
    holder = accept_offer(
        offer,
        challenge=challenge,
        attest=attest,
        load_evidence=load_evidence,
        attest_cvm=attest_cvm,
        allow_gpu_only=allow_gpu_only,
    )
    answer = holder.answer([holder.wrap(d) for d in datasets])
    return LocalSession(
        offer=offer, answer=answer, host_key=host_key, session=open_answer(answer, host_key)
    )
