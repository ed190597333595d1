"""Encrypted all-reduce of one flat CPU tensor: all-to-all and ring.

Both sum the tensor over the group in place. Every piece that crosses ranks is sealed by
its sender for its receiver (:meth:`GroupKeys.seal`) and opened by the receiver; a piece
that does not open is replaced by zeros, the failure is recorded, and the exchange goes
on so that no rank waits for a peer that stopped (the hook turns recorded failures into
errors on every rank before ``backward`` returns).

* ``a2a``: reduce-scatter with one ``all_to_all`` (pieces padded to equal size, as gloo
  requires; the padding is sealed too), then all-gather with a second ``all_to_all``:
  2 rounds, ``2 (N-1)`` seals per rank.
* ``ring``: ``N-1`` reduce-scatter hops and ``N-1`` all-gather hops with ``isend`` and
  ``irecv`` to the neighbours: ``2 (N-1)`` rounds, ``2 (N-1)`` seals per rank, each
  of ``1/N`` of the tensor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import GradientAuthenticationError
from .keys import GroupKeys
from .messages import TAG_SIZE, MessageId, Phase

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

__all__ = ["Exchange", "Tamper", "all_to_all_reduce", "ring_reduce"]

#: Test-only fault injection on the receiving side: ``tamper(msg, frame, round)`` returns
#: the frame to open in place of ``frame``; ``round`` maps each sender of the same round
#: to the frame received from it.
Tamper = Callable[[MessageId, bytes, dict[int, bytes]], bytes]


@dataclass
class Exchange:
    """One bucket's exchange context and what it measured.

    Attributes:
        keys: the group keys.
        group: the process group (None: default).
        epoch, step, bucket: the schedule position.
        tamper: test-only receive-side fault injection.
        failures: authentication failures seen by this rank in this exchange.
        crypto_seconds: time spent sealing and opening.
        sealed_bytes: plaintext bytes sealed by this rank.
    """

    keys: GroupKeys
    group: ProcessGroup | None
    epoch: int
    step: int
    bucket: int
    tamper: Tamper | None = None
    failures: list[GradientAuthenticationError] = field(default_factory=list)
    crypto_seconds: float = 0.0
    sealed_bytes: int = 0

    def msg(self, phase: Phase, hop: int, sender: int, receiver: int, length: int) -> MessageId:
        return MessageId(
            epoch=self.epoch,
            step=self.step,
            bucket=self.bucket,
            phase=phase,
            hop=hop,
            sender=sender,
            receiver=receiver,
            length=length,
        )

    def seal(self, msg: MessageId, plaintext: bytes) -> bytes:
        t0 = time.perf_counter()
        frame = self.keys.seal(msg, plaintext)
        self.crypto_seconds += time.perf_counter() - t0
        self.sealed_bytes += len(plaintext)
        return frame

    def open(self, msg: MessageId, frame: bytes, round_frames: dict[int, bytes]) -> bytes | None:
        if self.tamper is not None:
            frame = self.tamper(msg, frame, round_frames)
        t0 = time.perf_counter()
        try:
            return self.keys.open(msg, frame)
        except GradientAuthenticationError as exc:
            self.failures.append(exc)
            return None
        finally:
            self.crypto_seconds += time.perf_counter() - t0


def _bytes_of(t: torch.Tensor) -> bytes:
    import torch

    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def _tensor_of(data: bytes, like: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(like.dtype)


def all_to_all_reduce(flat: torch.Tensor, ex: Exchange) -> None:
    """Sum ``flat`` (1-D, CPU) over the group in place with two sealed ``all_to_all``."""
    import torch
    import torch.distributed as dist

    rank, size = ex.keys.rank, ex.keys.world_size
    n = flat.numel()
    per = -(-n // size)
    esize = flat.element_size()
    length = per * esize
    frame_len = length + TAG_SIZE
    padded = torch.zeros(per * size, dtype=flat.dtype)
    padded[:n] = flat
    pieces = padded.view(size, per)

    def exchange(phase: Phase, payload: Callable[[int], torch.Tensor]) -> dict[int, bytes]:
        send = torch.zeros(size * frame_len, dtype=torch.uint8)
        for peer in range(size):
            if peer != rank:
                frame = ex.seal(ex.msg(phase, 0, rank, peer, length), _bytes_of(payload(peer)))
                send[peer * frame_len : (peer + 1) * frame_len] = torch.frombuffer(
                    bytearray(frame), dtype=torch.uint8
                )
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=ex.group)
        raw = recv.numpy().tobytes()
        return {p: raw[p * frame_len : (p + 1) * frame_len] for p in range(size) if p != rank}

    # reduce-scatter: piece j goes to rank j; this rank sums the pieces sent to it
    received = exchange(Phase.A2A_SCATTER, lambda peer: pieces[peer])
    mine = pieces[rank].clone()
    for peer in range(size):
        if peer == rank:
            continue
        pt = ex.open(ex.msg(Phase.A2A_SCATTER, 0, peer, rank, length), received[peer], received)
        if pt is not None:
            mine += _tensor_of(pt, mine)
    # all-gather: every rank sends its reduced piece to every peer
    received = exchange(Phase.A2A_GATHER, lambda peer: mine)
    pieces[rank] = mine
    for peer in range(size):
        if peer == rank:
            continue
        pt = ex.open(ex.msg(Phase.A2A_GATHER, 0, peer, rank, length), received[peer], received)
        pieces[peer] = 0 if pt is None else _tensor_of(pt, mine)
    flat.copy_(padded[:n])


def ring_reduce(flat: torch.Tensor, ex: Exchange) -> None:
    """Sum ``flat`` (1-D, CPU) over the group in place with a sealed ring."""
    import torch
    import torch.distributed as dist

    rank, size = ex.keys.rank, ex.keys.world_size
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    chunks = list(torch.tensor_split(flat, size))
    esize = flat.element_size()

    def hop(phase: Phase, h: int, send_idx: int, recv_idx: int) -> bytes | None:
        out_len = chunks[send_idx].numel() * esize
        in_len = chunks[recv_idx].numel() * esize
        frame = ex.seal(ex.msg(phase, h, rank, nxt, out_len), _bytes_of(chunks[send_idx]))
        send = torch.frombuffer(bytearray(frame), dtype=torch.uint8)
        recv = torch.empty(in_len + TAG_SIZE, dtype=torch.uint8)
        reqs = [
            dist.isend(send, _global(nxt, ex.group), group=ex.group),
            dist.irecv(recv, _global(prv, ex.group), group=ex.group),
        ]
        for req in reqs:
            if req is not None:
                req.wait()
        raw = recv.numpy().tobytes()
        return ex.open(ex.msg(phase, h, prv, rank, in_len), raw, {prv: raw})

    for h in range(size - 1):
        recv_idx = (rank - h - 1) % size
        pt = hop(Phase.RING_SCATTER, h, (rank - h) % size, recv_idx)
        if pt is not None and chunks[recv_idx].numel():
            chunks[recv_idx] += _tensor_of(pt, flat)
    for h in range(size - 1):
        recv_idx = (rank - h) % size
        pt = hop(Phase.RING_GATHER, h, (rank + 1 - h) % size, recv_idx)
        if pt is None:
            chunks[recv_idx].zero_()
        elif chunks[recv_idx].numel():
            chunks[recv_idx].copy_(_tensor_of(pt, flat))


def _global(rank: int, group: ProcessGroup | None) -> int:
    import torch.distributed as dist

    return rank if group is None else dist.get_global_rank(group, rank)
