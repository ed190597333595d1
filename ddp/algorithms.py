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

import numpy as np

from .errors import GradientAuthenticationError
from .keys import GroupKeys
from .messages import TAG_SIZE, MessageId, Phase

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

__all__ = ["Exchange", "Tamper", "all_to_all_reduce", "exchange_verdicts", "ring_reduce"]

#: Test-only fault injection on the receiving side: ``tamper(msg, frame, round)`` returns
#: the frame to open in place of ``frame``; ``round`` maps each sender of the same round
#: to the frame received from it.
Frames = dict[int, bytes]
Tamper = Callable[[MessageId, bytes, Frames], bytes]


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

    def seal_into(self, msg: MessageId, plaintext: np.ndarray, out: np.ndarray) -> None:
        t0 = time.perf_counter()
        self.keys.seal_into(msg, plaintext, out)
        self.crypto_seconds += time.perf_counter() - t0
        self.sealed_bytes += msg.length

    def open_into(
        self, msg: MessageId, frame: np.ndarray, out: np.ndarray, round_frames: Callable[[], Frames]
    ) -> bool:
        """Open ``frame`` into ``out``; False (``out`` zeroed, failure recorded) if it fails."""
        source: np.ndarray | bytes = frame
        if self.tamper is not None:
            source = self.tamper(msg, frame.tobytes(), round_frames())
        t0 = time.perf_counter()
        try:
            self.keys.open_into(msg, source, out)
            return True
        except GradientAuthenticationError as exc:
            self.failures.append(exc)
            return False
        finally:
            self.crypto_seconds += time.perf_counter() - t0


def _u8(t: torch.Tensor) -> np.ndarray:
    """A writable uint8 NumPy view of a contiguous CPU tensor (no copy)."""
    import torch

    return t.view(torch.uint8).numpy()


def all_to_all_reduce(flat: torch.Tensor, ex: Exchange) -> None:
    """Sum ``flat`` (1-D, CPU) over the group in place with two sealed ``all_to_all``."""
    import torch
    import torch.distributed as dist

    rank, size = ex.keys.rank, ex.keys.world_size
    n = flat.numel()
    per = -(-n // size)
    length = per * flat.element_size()
    frame_len = length + TAG_SIZE
    if per * size == n:
        padded = flat
    else:
        padded = torch.zeros(per * size, dtype=flat.dtype)
        padded[:n] = flat
    pieces = _u8(padded).reshape(size, length)
    send = torch.zeros(size * frame_len, dtype=torch.uint8)
    recv = torch.empty_like(send)
    send_np, recv_np = send.numpy(), recv.numpy()

    def slot(buf: np.ndarray, peer: int) -> np.ndarray:
        return buf[peer * frame_len : (peer + 1) * frame_len]

    def frames() -> Frames:
        return {p: slot(recv_np, p).tobytes() for p in range(size) if p != rank}

    def exchange(phase: Phase, payload: Callable[[int], np.ndarray]) -> None:
        for peer in range(size):
            if peer != rank:
                msg = ex.msg(phase, 0, rank, peer, length)
                ex.seal_into(msg, payload(peer), slot(send_np, peer))
        dist.all_to_all_single(recv, send, group=ex.group)

    # reduce-scatter: piece j goes to rank j; this rank sums the pieces sent to it
    exchange(Phase.A2A_SCATTER, lambda peer: pieces[peer])
    mine = padded.view(size, per)[rank]
    scratch = torch.empty(per, dtype=flat.dtype)
    for peer in range(size):
        if peer != rank:
            msg = ex.msg(Phase.A2A_SCATTER, 0, peer, rank, length)
            if ex.open_into(msg, slot(recv_np, peer), _u8(scratch), frames):
                mine += scratch
    # all-gather: every rank sends its reduced piece to every peer, sealed per receiver
    exchange(Phase.A2A_GATHER, lambda peer: pieces[rank])
    for peer in range(size):
        if peer != rank:
            msg = ex.msg(Phase.A2A_GATHER, 0, peer, rank, length)
            ex.open_into(msg, slot(recv_np, peer), pieces[peer], frames)
    if padded is not flat:
        flat.copy_(padded[:n])


def exchange_verdicts(failed: bool, ex: Exchange) -> tuple[int, ...]:
    """Tell every peer, sealed, whether this rank rejected a message of the step.

    Returns the ranks that reported a failure. A verdict that does not open is recorded in
    ``ex.failures`` like any other message.
    """
    import torch
    import torch.distributed as dist

    rank, size = ex.keys.rank, ex.keys.world_size
    frame_len = 1 + TAG_SIZE
    send = torch.zeros(size * frame_len, dtype=torch.uint8)
    recv = torch.empty_like(send)
    send_np, recv_np = send.numpy(), recv.numpy()
    flag = np.array([1 if failed else 0], dtype=np.uint8)
    for peer in range(size):
        if peer != rank:
            msg = ex.msg(Phase.VERDICT, 0, rank, peer, 1)
            ex.seal_into(msg, flag, send_np[peer * frame_len : (peer + 1) * frame_len])
    dist.all_to_all_single(recv, send, group=ex.group)
    bad = [rank] if failed else []
    for peer in range(size):
        if peer != rank:
            got = np.zeros(1, dtype=np.uint8)
            frame = recv_np[peer * frame_len : (peer + 1) * frame_len]
            msg = ex.msg(Phase.VERDICT, 0, peer, rank, 1)
            if ex.open_into(msg, frame, got, lambda: {}) and got[0] != 0:
                bad.append(peer)
    return tuple(sorted(bad))


def ring_reduce(flat: torch.Tensor, ex: Exchange) -> None:
    """Sum ``flat`` (1-D, CPU) over the group in place with a sealed ring."""
    import torch
    import torch.distributed as dist

    rank, size = ex.keys.rank, ex.keys.world_size
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    chunks = list(torch.tensor_split(flat, size))
    esize = flat.element_size()
    biggest = max(c.numel() for c in chunks)
    send_buf = torch.empty(biggest * esize + TAG_SIZE, dtype=torch.uint8)
    recv_buf = torch.empty_like(send_buf)
    scratch = torch.empty(biggest, dtype=flat.dtype)

    def hop(phase: Phase, h: int, send_idx: int, recv_idx: int, out: torch.Tensor) -> bool:
        out_len = chunks[send_idx].numel() * esize
        in_len = chunks[recv_idx].numel() * esize
        send = send_buf[: out_len + TAG_SIZE]
        recv = recv_buf[: in_len + TAG_SIZE]
        ex.seal_into(ex.msg(phase, h, rank, nxt, out_len), _u8(chunks[send_idx]), send.numpy())
        reqs = [
            dist.isend(send, _global(nxt, ex.group), group=ex.group),
            dist.irecv(recv, _global(prv, ex.group), group=ex.group),
        ]
        for req in reqs:
            if req is not None:
                req.wait()
        raw = recv.numpy()
        msg = ex.msg(phase, h, prv, rank, in_len)
        return ex.open_into(msg, raw, _u8(out), lambda: {prv: raw.tobytes()})

    for h in range(size - 1):
        recv_idx = (rank - h - 1) % size
        part = scratch[: chunks[recv_idx].numel()]
        if hop(Phase.RING_SCATTER, h, (rank - h) % size, recv_idx, part):
            chunks[recv_idx] += part
    for h in range(size - 1):
        recv_idx = (rank - h) % size
        hop(Phase.RING_GATHER, h, (rank + 1 - h) % size, recv_idx, chunks[recv_idx])


def _global(rank: int, group: ProcessGroup | None) -> int:
    import torch.distributed as dist

    return rank if group is None else dist.get_global_rank(group, rank)
