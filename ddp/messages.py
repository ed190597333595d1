"""Encrypted DDP v1: the pure parts (``docs/DDP.md`` gives known-answer vectors).

* The group challenge every rank's evidence is collected for.
* The group transcript (every offer in rank order, the group size, the epoch).
* The directed key of each (sender, receiver, epoch).
* The 96-bit GCM nonce and the associated data of each gradient message, both computed
  by sender and receiver from the message schedule; nothing of either is sent.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gpucc.core.errors import UsageError

__all__ = [
    "AAD_SIZE",
    "KEY_SIZE",
    "MAX_BUCKETS",
    "MAX_EPOCH",
    "MAX_HOPS",
    "MAX_STEP",
    "NONCE_SIZE",
    "PROTOCOL_VERSION",
    "TAG_SIZE",
    "MessageId",
    "Phase",
    "derive_edge_key",
    "encode_group_transcript",
    "group_challenge",
    "group_transcript_hash",
]

PROTOCOL_VERSION = 1
KEY_SIZE = 32
NONCE_SIZE = 12
TAG_SIZE = 16
CHALLENGE_LABEL = b"gpucc/ddp/v1/challenge"
TRANSCRIPT_LABEL = b"gpucc/ddp/v1/transcript"
EDGE_KEY_LABEL = b"gpucc/ddp/v1/edge-key"
AAD_LABEL = b"gpucc/ddp/v1/aad"
CONTRIBUTION_SIZE = 32

# Nonce fields: epoch (24 bits) | step (32) | bucket (16) | phase (8) | hop (16).
MAX_EPOCH = (1 << 24) - 1
MAX_STEP = (1 << 32) - 1
MAX_BUCKETS = 1 << 16
MAX_HOPS = 1 << 16
MAX_RANKS = 1 << 16
AAD_SIZE = len(AAD_LABEL) + 1 + 4 + 8 + 4 + 1 + 2 + 4 + 4 + 8


class Phase(enum.IntEnum):
    """Which exchange a message belongs to (one value per algorithm and round)."""

    A2A_SCATTER = 1
    A2A_GATHER = 2
    RING_SCATTER = 3
    RING_GATHER = 4
    VERDICT = 5

    @property
    def label(self) -> str:
        """The name used in errors and docs (``a2a-scatter`` ...)."""
        return self.name.lower().replace("_", "-")


@dataclass(frozen=True)
class MessageId:
    """Where a message sits in the schedule: everything its nonce and AAD bind.

    Attributes:
        epoch: the key epoch (the key itself is per epoch too).
        step: the step counter within the epoch.
        bucket: the DDP bucket index.
        phase: the exchange.
        hop: the hop within the phase (0 for all-to-all).
        sender: the sending rank.
        receiver: the receiving rank.
        length: the sealed plaintext length in bytes.
    """

    epoch: int
    step: int
    bucket: int
    phase: Phase
    hop: int
    sender: int
    receiver: int
    length: int

    def __post_init__(self) -> None:
        limits = (
            ("epoch", self.epoch, MAX_EPOCH + 1),
            ("step", self.step, MAX_STEP + 1),
            ("bucket", self.bucket, MAX_BUCKETS),
            ("hop", self.hop, MAX_HOPS),
            ("sender", self.sender, MAX_RANKS),
            ("receiver", self.receiver, MAX_RANKS),
            ("length", self.length, 1 << 36),
        )
        for name, value, bound in limits:
            if not 0 <= value < bound:
                raise UsageError(f"message {name} {value} is outside the schedule (< {bound})")
        if self.sender == self.receiver:
            raise UsageError("a rank does not send gradient messages to itself")

    @property
    def nonce(self) -> bytes:
        """The 96-bit GCM nonce: epoch u24 | step u32 | bucket u16 | phase u8 | hop u16."""
        return (
            self.epoch.to_bytes(3, "big")
            + self.step.to_bytes(4, "big")
            + self.bucket.to_bytes(2, "big")
            + int(self.phase).to_bytes(1, "big")
            + self.hop.to_bytes(2, "big")
        )

    @property
    def aad(self) -> bytes:
        """The associated data (52 bytes, big-endian fields after the label).

        ``label | version u8 | epoch u32 | step u64 | bucket u32 | phase u8 | hop u16 |
        sender u32 | receiver u32 | length u64``
        """
        return b"".join(
            (
                AAD_LABEL,
                PROTOCOL_VERSION.to_bytes(1, "big"),
                self.epoch.to_bytes(4, "big"),
                self.step.to_bytes(8, "big"),
                self.bucket.to_bytes(4, "big"),
                int(self.phase).to_bytes(1, "big"),
                self.hop.to_bytes(2, "big"),
                self.sender.to_bytes(4, "big"),
                self.receiver.to_bytes(4, "big"),
                self.length.to_bytes(8, "big"),
            )
        )


def _field(value: bytes) -> bytes:
    return len(value).to_bytes(4, "big") + value


def group_challenge(contributions: Sequence[bytes], *, epoch: int) -> bytes:
    """``SHA-256(label | u32 size | u64 epoch | contribution_0 | ... )``, 32 bytes each."""
    for c in contributions:
        if len(c) != CONTRIBUTION_SIZE:
            raise UsageError(f"a challenge contribution is {CONTRIBUTION_SIZE} bytes")
    return hashlib.sha256(
        CHALLENGE_LABEL
        + len(contributions).to_bytes(4, "big")
        + epoch.to_bytes(8, "big")
        + b"".join(contributions)
    ).digest()


def encode_group_transcript(offers: Sequence[bytes], *, challenge: bytes, epoch: int) -> bytes:
    """Length-prefixed fields: label, u16 version, u32 group size, u64 epoch, the group
    challenge, then every rank's offer (its exact bytes) in rank order."""
    head = (
        TRANSCRIPT_LABEL,
        PROTOCOL_VERSION.to_bytes(2, "big"),
        len(offers).to_bytes(4, "big"),
        epoch.to_bytes(8, "big"),
        challenge,
    )
    return b"".join(_field(v) for v in (*head, *offers))


def group_transcript_hash(transcript: bytes) -> bytes:
    """SHA-384 of the group transcript (48 bytes): the HKDF salt of every edge key."""
    return hashlib.sha384(transcript).digest()


def derive_edge_key(
    shared_secret: bytes,
    *,
    transcript_hash: bytes,
    sender: int,
    receiver: int,
    world_size: int,
    epoch: int,
) -> bytes:
    """``K = HKDF-SHA-384(IKM = ECDH x-coordinate, salt = transcript hash,
    info = label | u32 sender | u32 receiver | u32 size | u64 epoch, L = 32)``."""
    if len(shared_secret) != 48 or len(transcript_hash) != 48:
        raise UsageError("an edge key needs a P-384 shared secret and a SHA-384 hash")
    if sender == receiver or not (0 <= sender < world_size and 0 <= receiver < world_size):
        raise UsageError("an edge key joins two different ranks of the group")
    if not 0 <= epoch <= MAX_EPOCH:
        raise UsageError(f"key epoch {epoch} is outside 0..{MAX_EPOCH}")
    info = (
        EDGE_KEY_LABEL
        + sender.to_bytes(4, "big")
        + receiver.to_bytes(4, "big")
        + world_size.to_bytes(4, "big")
        + epoch.to_bytes(8, "big")
    )
    return HKDF(algorithm=hashes.SHA384(), length=KEY_SIZE, salt=transcript_hash, info=info).derive(
        shared_secret
    )
