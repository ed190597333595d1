"""Encrypted all-reduce of one flat tensor: all-to-all and ring, on CPU or GPU tensors.

Both sum the tensor over the group in place. Every piece that crosses ranks is sealed by
its sender for its receiver and opened by the receiver, through the exchange's crypt
(:mod:`gpucc.ddp.crypt`: on the host for CPU tensors, on the GPU for CUDA tensors); a
piece that does not open is replaced by zeros, the failure is recorded, and the exchange
goes on so that no rank waits for a peer that stopped (the hook turns recorded failures
into errors on every rank before ``backward`` returns).

Pieces: ``per = ceil(n / N)`` elements rounded up to whole 16-byte blocks; piece ``i``
covers elements ``[i * per, (i + 1) * per)`` clipped to the tensor (the last ones may be
short or empty), so every piece starts on a 16-byte boundary, as the GPU kernels need.

* ``a2a``: reduce-scatter with one ``all_to_all`` (pieces padded to ``per`` elements, as
  gloo requires; the padding is sealed too), then all-gather with a second ``all_to_all``:
  2 rounds, ``2 (N-1)`` seals per rank, each round's pieces in one batch.
* ``ring``: ``N-1`` reduce-scatter hops and ``N-1`` all-gather hops with ``isend`` and
  ``irecv`` to the neighbours: ``2 (N-1)`` rounds, ``2 (N-1)`` seals per rank.

Frames go over the wire as they are when the backend takes tensors of their device
(``wire``); otherwise (CUDA tensors on gloo) the sealed frames are copied to the host and
back: only ciphertext crosses PCIe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .crypt import DeviceCrypt, HostCrypt, Piece
from .errors import GradientAuthenticationError
from .keys import GroupKeys
from .messages import TAG_SIZE, MessageId, Phase

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

__all__ = [
    "Exchange",
    "Tamper",
    "all_to_all_reduce",
    "exchange_verdicts",
    "piece_elements",
    "ring_reduce",
]

#: Test-only fault injection on the receiving side: ``tamper(msg, frame, round)`` returns
#: the frame to open in place of ``frame``; ``round`` maps each sender of the same round
#: to the frame received from it. A replacement of another length fails authentication.
Frames = dict[int, bytes]
Tamper = Callable[[MessageId, bytes, Frames], bytes]


def piece_elements(numel: int, element_size: int, size: int) -> int:
    """Elements per piece: ``ceil(numel / size)`` rounded up to whole 16-byte blocks."""
    align = max(1, 16 // element_size)
    per = -(-numel // size)
    return -(-per // align) * align


@dataclass
class Exchange:
    """One bucket's exchange context and what it measured.

    Attributes:
        keys: the group keys.
        crypt: seals and opens the pieces (host or device).
        group: the process group (None: default).
        wire: the device the backend takes tensors on (None: the tensors' own).
        epoch, step, bucket: the schedule position.
        tamper: test-only receive-side fault injection.
        failures: authentication failures seen by this rank in this exchange (the device
            crypt reports its own when the step ends).
        sealed_bytes: plaintext bytes sealed by this rank.
    """

    keys: GroupKeys
    crypt: HostCrypt | DeviceCrypt
    group: ProcessGroup | None
    wire: torch.device | None
    epoch: int
    step: int
    bucket: int
    tamper: Tamper | None = None
    failures: list[GradientAuthenticationError] = field(default_factory=list)
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

    def seal(self, pieces: Sequence[Piece], src: torch.Tensor, dst: torch.Tensor) -> None:
        self.crypt.seal(pieces, src, dst)
        self.sealed_bytes += sum(p.msg.length for p in pieces)

    def open(self, pieces: Sequence[Piece], src: torch.Tensor, dst: torch.Tensor) -> list[bool]:
        """Open ``pieces`` (frames in ``src``); False where one was rejected at once."""
        if self.tamper is not None:
            self._tamper(pieces, src)
        return self.crypt.open(pieces, src, dst, self.failures)

    def _tamper(self, pieces: Sequence[Piece], src: torch.Tensor) -> None:
        import torch

        def frame(p: Piece) -> bytes:
            n = p.msg.length + TAG_SIZE
            return bytes(src[p.src : p.src + n].cpu().numpy().tobytes())

        assert self.tamper is not None
        round_frames = {p.msg.sender: frame(p) for p in pieces}
        for p in pieces:
            old = round_frames[p.msg.sender]
            new = self.tamper(p.msg, old, round_frames)
            if new != old:
                if len(new) != len(old):
                    new = bytes(len(old))  # a frame of another length: never authentic
                host = torch.frombuffer(bytearray(new), dtype=torch.uint8)
                src[p.src : p.src + len(old)].copy_(host)

    def to_wire(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.wire is None or t.device == self.wire else t.to(self.wire)

    def all_to_all(self, recv: torch.Tensor, send: torch.Tensor) -> None:
        import torch
        import torch.distributed as dist

        out = self.to_wire(send)
        into = recv if out is send else torch.empty_like(out)
        dist.all_to_all_single(into, out, group=self.group)
        if into is not recv:
            recv.copy_(into)

    def send_recv(self, send: torch.Tensor, recv: torch.Tensor, nxt: int, prv: int) -> None:
        import torch
        import torch.distributed as dist

        out = self.to_wire(send)
        into = recv if out is send else torch.empty(recv.shape, dtype=recv.dtype, device=out.device)
        reqs = [
            dist.isend(out, _global(nxt, self.group), group=self.group),
            dist.irecv(into, _global(prv, self.group), group=self.group),
        ]
        for req in reqs:
            if req is not None:
                req.wait()
        if into is not recv:
            recv.copy_(into)


def _u8(t: torch.Tensor) -> torch.Tensor:
    import torch

    return t.view(torch.uint8)


def all_to_all_reduce(flat: torch.Tensor, ex: Exchange) -> None:
    """Sum ``flat`` (1-D) over the group in place with two sealed ``all_to_all``."""
    import torch

    rank, size = ex.keys.rank, ex.keys.world_size
    n, esize = flat.numel(), flat.element_size()
    per = piece_elements(n, esize, size)
    length = per * esize
    frame_len = length + TAG_SIZE
    if per * size == n:
        padded = flat
    else:
        padded = torch.zeros(per * size, dtype=flat.dtype, device=flat.device)
        padded[:n] = flat
    data = _u8(padded)
    send = torch.zeros(size * frame_len, dtype=torch.uint8, device=flat.device)
    recv = torch.empty_like(send)
    peers = [p for p in range(size) if p != rank]

    def sealed(phase: Phase, piece: Callable[[int], int]) -> list[Piece]:
        return [
            Piece(ex.msg(phase, 0, rank, p, length), src=piece(p) * length, dst=p * frame_len)
            for p in peers
        ]

    def received(phase: Phase) -> list[Piece]:
        return [
            Piece(ex.msg(phase, 0, p, rank, length), src=p * frame_len, dst=p * length)
            for p in peers
        ]

    # reduce-scatter: piece j goes to rank j; this rank sums the pieces sent to it
    ex.seal(sealed(Phase.A2A_SCATTER, lambda p: p), data, send)
    ex.all_to_all(recv, send)
    scratch = torch.empty((size, per), dtype=flat.dtype, device=flat.device)
    ok = ex.open(received(Phase.A2A_SCATTER), recv, _u8(scratch).view(-1))
    mine = padded.view(size, per)[rank]
    for p, good in zip(peers, ok, strict=True):
        if good:
            mine += scratch[p]
    # all-gather: every rank sends its reduced piece to every peer, sealed per receiver
    ex.seal(sealed(Phase.A2A_GATHER, lambda _p: rank), data, send)
    ex.all_to_all(recv, send)
    ex.open(received(Phase.A2A_GATHER), recv, data)
    if padded is not flat:
        flat.copy_(padded[:n])


def exchange_verdicts(failed: bool, ex: Exchange) -> tuple[int, ...]:
    """Tell every peer, sealed on the host, whether this rank rejected a message of the step.

    Returns the ranks that reported a failure. A verdict that does not open is recorded in
    ``ex.failures`` like any other message.
    """
    import torch

    rank, size = ex.keys.rank, ex.keys.world_size
    frame_len = 1 + TAG_SIZE
    send = torch.zeros(size * frame_len, dtype=torch.uint8)
    recv = torch.empty_like(send)
    flag = torch.tensor([1 if failed else 0], dtype=torch.uint8)
    peers = [p for p in range(size) if p != rank]
    ex.seal(
        [Piece(ex.msg(Phase.VERDICT, 0, rank, p, 1), 0, p * frame_len) for p in peers], flag, send
    )
    ex.all_to_all(recv, send)
    got = torch.zeros(size, dtype=torch.uint8)
    pieces = [Piece(ex.msg(Phase.VERDICT, 0, p, rank, 1), p * frame_len, p) for p in peers]
    ok = ex.open(pieces, recv, got)
    bad = [rank] if failed else []
    bad += [p for p, good in zip(peers, ok, strict=True) if good and got[p] != 0]
    return tuple(sorted(bad))


def ring_reduce(flat: torch.Tensor, ex: Exchange) -> None:
    """Sum ``flat`` (1-D) over the group in place with a sealed ring."""
    import torch

    rank, size = ex.keys.rank, ex.keys.world_size
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    n, esize = flat.numel(), flat.element_size()
    per = piece_elements(n, esize, size)
    starts = [min(i * per, n) for i in range(size + 1)]
    counts = [starts[i + 1] - starts[i] for i in range(size)]
    data = _u8(flat)
    send_buf = torch.empty(per * esize + TAG_SIZE, dtype=torch.uint8, device=flat.device)
    recv_buf = torch.empty_like(send_buf)
    scratch = torch.empty(per, dtype=flat.dtype, device=flat.device)

    def hop(phase: Phase, h: int, out_idx: int, in_idx: int, into: torch.Tensor, at: int) -> bool:
        out_len, in_len = counts[out_idx] * esize, counts[in_idx] * esize
        msg = ex.msg(phase, h, rank, nxt, out_len)
        ex.seal([Piece(msg, starts[out_idx] * esize, 0)], data, send_buf)
        recv = recv_buf[: in_len + TAG_SIZE]
        ex.send_recv(send_buf[: out_len + TAG_SIZE], recv, nxt, prv)
        return ex.open([Piece(ex.msg(phase, h, prv, rank, in_len), 0, at)], recv, into)[0]

    for h in range(size - 1):
        idx = (rank - h - 1) % size
        if hop(Phase.RING_SCATTER, h, (rank - h) % size, idx, _u8(scratch), 0):
            flat[starts[idx] : starts[idx + 1]] += scratch[: counts[idx]]
    for h in range(size - 1):
        idx = (rank - h) % size
        hop(Phase.RING_GATHER, h, (rank + 1 - h) % size, idx, data, starts[idx] * esize)


def _global(rank: int, group: ProcessGroup | None) -> int:
    import torch.distributed as dist

    return rank if group is None else dist.get_global_rank(group, rank)
