"""Group keys: one AES-256-GCM key per (sender, receiver, epoch), with usage limits.

:meth:`GroupKeys.establish` runs the attested setup (:mod:`gpucc.ddp.setup`); the object it
returns seals and opens gradient messages, counts what each key protected, and rotates to
the next epoch before a limit is near.

Usage limits (per directed key; both ends count the same messages):

* invocations: rotate after 2**27, refuse past 2**28 (the AES-GCM bound for 96-bit nonces
  is 2**32 invocations; nonces here are unique by construction, the cap is for margin);
* bytes: rotate after 2**35 (32 GiB), refuse past 2**36 (64 GiB = 2**32 blocks, a
  distinguishing advantage below 2**-64).

Rotation must happen at the same point on every rank, so it is decided from a value
every rank computes identically: an upper bound of what any one key protected, charged
per bucket from the bucket size and the algorithm (:meth:`GroupKeys.charge`). The exact
per-key counters only enforce the hard limits.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpucc.core.errors import UsageError

from .errors import GradientAuthenticationError, KeyUsageExceededError
from .messages import MAX_EPOCH, MAX_STEP, TAG_SIZE, MessageId, derive_edge_key

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from gpucc.assembly import Platform
    from gpucc.keyrelease.protocol import (
        Attester,
        CollectedCvmEvidence,
        CollectedEvidence,
        CvmAttester,
        EvidenceLoader,
    )

__all__ = ["Buffer", "GroupKeys", "KeyUsage", "UsageLimits"]

#: Contiguous bytes: ``bytes``, ``bytearray``, ``memoryview`` or a NumPy array view.
Buffer = bytes | bytearray | memoryview | np.ndarray


def _view(data: Buffer) -> memoryview:
    return (data.data if isinstance(data, np.ndarray) else memoryview(data)).cast("B")


HARD_INVOCATIONS = 1 << 28
HARD_BYTES = 1 << 36


@dataclass(frozen=True)
class UsageLimits:
    """Per-key limits. Lower values are allowed (tests use them); higher ones are not.

    Attributes:
        rotate_invocations: rotate at the next step once a key may have reached this.
        rotate_bytes: likewise for plaintext bytes.
        max_invocations: refuse to seal or open past this.
        max_bytes: likewise for bytes.
    """

    rotate_invocations: int = 1 << 27
    rotate_bytes: int = 1 << 35
    max_invocations: int = HARD_INVOCATIONS
    max_bytes: int = HARD_BYTES

    def __post_init__(self) -> None:
        if not 0 < self.rotate_invocations <= self.max_invocations <= HARD_INVOCATIONS:
            raise UsageError("invocation limits must satisfy 0 < rotate <= max <= 2**28")
        if not 0 < self.rotate_bytes <= self.max_bytes <= HARD_BYTES:
            raise UsageError("byte limits must satisfy 0 < rotate <= max <= 2**36")


@dataclass
class KeyUsage:
    """What one directed key has protected in the current epoch."""

    invocations: int = 0
    bytes: int = 0


@dataclass
class _Edge:
    aead: AESGCM = field(repr=False)
    key: bytes = field(repr=False)
    usage: KeyUsage = field(default_factory=KeyUsage)


class GroupKeys:
    """This rank's directed keys for one group: to and from every peer, current epoch.

    Do not build directly; use :meth:`establish`. Secrets are never in a repr.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        shared_secrets: Mapping[int, bytes],
        transcript_hash: bytes,
        epoch: int = 0,
        limits: UsageLimits | None = None,
    ) -> None:
        if set(shared_secrets) != set(range(world_size)) - {rank}:
            raise UsageError("group keys need one shared secret per peer")
        self.rank = rank
        #: named policy relaxations the setup used (``cvm.allow_gpu_only: true`` when a peer
        #: was accepted on GPU evidence alone); empty when none was needed
        self.relaxations: tuple[str, ...] = ()
        self.world_size = world_size
        self.transcript_hash = transcript_hash
        self.limits = limits or UsageLimits()
        self._secrets = dict(shared_secrets)
        self._epoch = -1
        self._edges: dict[tuple[int, int], _Edge] = {}
        self._next_step = 0
        self._bound = KeyUsage()
        self._derive(epoch)

    def __repr__(self) -> str:
        return (
            f"GroupKeys(rank={self.rank}, world_size={self.world_size}, epoch={self._epoch}, "
            f"transcript_hash={self.transcript_hash.hex()[:16]}...)"
        )

    @classmethod
    def establish(
        cls,
        process_group: ProcessGroup | None = None,
        *,
        collect: Callable[[bytes], CollectedEvidence] | None = None,
        attest: Attester | None = None,
        epoch: int = 0,
        timeout: dt.timedelta = dt.timedelta(seconds=120),
        limits: UsageLimits | None = None,
        load_evidence: EvidenceLoader | None = None,
        collect_cvm: Callable[[bytes], CollectedCvmEvidence] | None = None,
        attest_cvm: CvmAttester | None = None,
        platform: Platform | None = None,
        allow_gpu_only: bool = False,
    ) -> GroupKeys:
        """Attested key setup over ``process_group`` (the default group when None).

        Every rank contributes to a group challenge, makes a session offer (fresh
        ephemeral P-384 key, evidence from ``collect`` for the offer's nonce), the offers
        are exchanged, and every rank verifies every peer's offer with ``attest`` (the
        caller's verifier and policy; it must require the nonce). The verdicts are
        exchanged too, so every rank learns about every refusal.

        With ``collect_cvm`` and ``attest_cvm`` the ranks use key release's version-2 binding:
        each offer carries its CVM's evidence over report data bound to the offer's nonce and
        key, and every peer must offer such evidence that ``attest_cvm`` trusts. Without
        ``attest_cvm`` the group binds to GPU evidence only (protocol version 1).

        ``platform`` (:func:`gpucc.assembly.assemble`) supplies all four instead: this
        machine's evidence source and the one platform verifier.

        Like every key-release path, setup requires each peer's CVM evidence. A group that
        binds to GPU evidence only (no ``attest_cvm``, or peers that offer none) needs the
        named relaxation: ``allow_gpu_only=True``, or ``cvm.allow_gpu_only: true`` in the
        platform's policy. When a peer was accepted under it, :attr:`relaxations` says so
        and a warning is logged (``gpucc.ddp``).

        Raises (also):
            UsageError: no CVM verifier and no ``allow_gpu_only`` relaxation.

        Raises:
            PeerNotTrustedError: some rank's evidence was refused (on every rank).
            GroupSetupError: the ranks saw different offers, or an offer is oversized.
        """
        from .setup import establish_group

        if platform is not None:
            if any(x is not None for x in (collect, attest, collect_cvm, attest_cvm)):
                raise UsageError("give platform, or collect and attest, not both")
            collect, collect_cvm = platform.collect(), platform.collect_cvm()
            attest = platform.verifier.gpu_attester()
            attest_cvm = platform.verifier.cvm_attester()
            allow_gpu_only = allow_gpu_only or platform.verifier.allow_gpu_only
        if collect is None or attest is None:
            raise UsageError("attested group setup needs platform, or collect and attest")
        if attest_cvm is None and not allow_gpu_only:
            raise UsageError(
                "attested group setup requires every peer's CVM evidence (collect_cvm and "
                "attest_cvm, or platform=); a group bound to GPU evidence only needs the named "
                "relaxation allow_gpu_only=True"
            )
        found = establish_group(
            process_group,
            collect=collect,
            attest=attest,
            epoch=epoch,
            timeout=timeout,
            load_evidence=load_evidence,
            collect_cvm=collect_cvm,
            attest_cvm=attest_cvm,
            allow_gpu_only=allow_gpu_only,
        )
        keys = cls(
            rank=found.rank,
            world_size=found.world_size,
            shared_secrets=found.shared_secrets,
            transcript_hash=found.transcript_hash,
            epoch=epoch,
            limits=limits,
        )
        if found.gpu_only_peers:
            keys.relaxations = ("cvm.allow_gpu_only: true",)
            import logging

            logging.getLogger("gpucc.ddp").warning(
                "policy relaxation cvm.allow_gpu_only: true used: rank(s) %s offered GPU "
                "evidence only (no CVM evidence)",
                ", ".join(map(str, found.gpu_only_peers)),
            )
        return keys

    # --- epochs ---------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The current key epoch."""
        return self._epoch

    def _derive(self, epoch: int) -> None:
        if not 0 <= epoch <= MAX_EPOCH:
            raise KeyUsageExceededError(f"key epoch {epoch} is past {MAX_EPOCH}; re-establish")
        edges: dict[tuple[int, int], _Edge] = {}
        for peer, secret in self._secrets.items():
            for s, r in ((self.rank, peer), (peer, self.rank)):
                key = derive_edge_key(
                    secret,
                    transcript_hash=self.transcript_hash,
                    sender=s,
                    receiver=r,
                    world_size=self.world_size,
                    epoch=epoch,
                )
                edges[(s, r)] = _Edge(AESGCM(key), key)
        self._edges = edges
        self._epoch = epoch
        self._next_step = 0
        self._bound = KeyUsage()

    def rotate(self, epoch: int | None = None) -> int:
        """Switch every key to ``epoch`` (the next one by default); returns it.

        Every rank must rotate at the same point of the schedule (the hook does, from the
        usage bound; call it yourself at the same place on every rank, e.g. per
        training epoch). Epochs only move forward.
        """
        target = self._epoch + 1 if epoch is None else epoch
        if target <= self._epoch:
            raise UsageError(f"key epochs only move forward ({self._epoch} -> {target})")
        self._derive(target)
        return target

    def usage(self, sender: int, receiver: int) -> KeyUsage:
        """A copy of the counters of one directed key of this rank."""
        u = self._edges[(sender, receiver)].usage
        return KeyUsage(u.invocations, u.bytes)

    # --- steps ----------------------------------------------------------------------

    def claim_step(self) -> tuple[int, int]:
        """``(epoch, step)`` for a new all-reduce step; rotates first when due."""
        b = self._bound
        lim = self.limits
        if (
            b.invocations >= lim.rotate_invocations
            or b.bytes >= lim.rotate_bytes
            or self._next_step > MAX_STEP
        ):
            self.rotate()
        step = self._next_step
        self._next_step += 1
        return self._epoch, step

    def charge(self, *, invocations: int, nbytes: int) -> None:
        """Add a per-key upper bound of one bucket's use (identical on every rank)."""
        self._bound.invocations += invocations
        self._bound.bytes += nbytes

    # --- messages -------------------------------------------------------------------

    def _edge(self, msg: MessageId) -> _Edge:
        if msg.epoch != self._epoch:
            raise UsageError(f"message epoch {msg.epoch} is not the current {self._epoch}")
        edge = self._edges.get((msg.sender, msg.receiver))
        if edge is None or self.rank not in (msg.sender, msg.receiver):
            raise UsageError(f"rank {self.rank} holds no key {msg.sender} -> {msg.receiver}")
        u = edge.usage
        if u.invocations + 1 > self.limits.max_invocations or (
            u.bytes + msg.length > self.limits.max_bytes
        ):
            raise KeyUsageExceededError(
                f"key {msg.sender} -> {msg.receiver} of epoch {msg.epoch} reached its usage "
                "limit; rotate keys"
            )
        u.invocations += 1
        u.bytes += msg.length
        return edge

    def reserve(self, msg: MessageId, *, sending: bool) -> None:
        """Count one message sealed (``sending``) or opened elsewhere, as :meth:`seal_into`
        and :meth:`open_into` do: the GPU path seals and opens with :meth:`edge_keys` on the
        device and accounts for every message here first.

        Raises:
            KeyUsageExceededError: the key reached its hard limit.
            UsageError: this rank is not the message's sender (or receiver).
        """
        if (msg.sender if sending else msg.receiver) != self.rank:
            raise UsageError("a rank seals only messages it sends and opens those sent to it")
        self._edge(msg)

    def edge_keys(self) -> dict[tuple[int, int], bytes]:
        """This rank's directed keys of the current epoch, by (sender, receiver).

        Key material: for :class:`gpucc.staging.gpu_messages.DeviceKeyring` only, never for
        logs or files.
        """
        return {pair: edge.key for pair, edge in self._edges.items()}

    def failure(self, msg: MessageId) -> GradientAuthenticationError:
        """The typed error for a message of ``msg``'s position that did not open here."""
        return self._failure(msg)

    def seal(self, msg: MessageId, plaintext: bytes | memoryview) -> bytes:
        """``ciphertext || tag`` of one message this rank sends."""
        if msg.sender != self.rank:
            raise UsageError("a rank seals only messages it sends")
        if len(plaintext) != msg.length:
            raise UsageError(f"plaintext is {len(plaintext)} bytes, the schedule says {msg.length}")
        return self._edge(msg).aead.encrypt(msg.nonce, plaintext, msg.aad)

    def seal_into(self, msg: MessageId, plaintext: Buffer, out: Buffer) -> None:
        """Seal into ``out`` (``msg.length + 16`` bytes, writable) without extra copies."""
        if msg.sender != self.rank:
            raise UsageError("a rank seals only messages it sends")
        data = _view(plaintext)
        if len(data) != msg.length:
            raise UsageError("plaintext length differs from the schedule")
        self._edge(msg).aead.encrypt_into(msg.nonce, data, msg.aad, _view(out))

    def open_into(self, msg: MessageId, frame: Buffer, out: Buffer) -> None:
        """Open ``frame`` into ``out`` (``msg.length`` bytes); ``out`` is zeroed on failure.

        Raises:
            GradientAuthenticationError: as :meth:`open`.
        """
        view = _view(out)
        if msg.receiver != self.rank:
            raise UsageError("a rank opens only messages sent to it")
        edge = self._edge(msg)
        data = _view(frame)
        try:
            if len(data) != msg.length + TAG_SIZE or len(view) != msg.length:
                raise InvalidTag
            edge.aead.decrypt_into(msg.nonce, data, msg.aad, view)
        except InvalidTag:
            view[:] = bytes(len(view))
            raise self._failure(msg) from None

    def _failure(self, msg: MessageId) -> GradientAuthenticationError:
        return GradientAuthenticationError(
            sender=msg.sender,
            receiver=msg.receiver,
            epoch=msg.epoch,
            step=msg.step,
            bucket=msg.bucket,
            phase=msg.phase.label,
            hop=msg.hop,
        )

    def open(self, msg: MessageId, frame: bytes | memoryview) -> bytes:
        """The plaintext of one message this rank receives, or a typed error.

        Raises:
            GradientAuthenticationError: the frame does not open under the key, nonce and
                AAD the schedule gives for ``msg``.
        """
        if msg.receiver != self.rank:
            raise UsageError("a rank opens only messages sent to it")
        edge = self._edge(msg)
        try:
            if len(frame) != msg.length + TAG_SIZE:
                raise InvalidTag
            return edge.aead.decrypt(msg.nonce, frame, msg.aad)
        except InvalidTag:
            raise self._failure(msg) from None
