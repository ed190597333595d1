"""Records that name their own chunk and position, and an exact check of what a DataLoader
delivered from a :class:`~gpucc.staging.torch_dataset.SealedChunkStream` over them.

Record ``p`` of chunk ``g`` is ``uint32_le(g) || uint32_le(p) || uint64_le(global index)``
followed by SHAKE-128 of those 16 bytes: any byte out of place (a row of another chunk, a
stale or half-written buffer, a tampered chunk's unverified plaintext) is caught.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

RECORD = 64


def record(chunk: int, position: int, per_chunk: int) -> bytes:
    head = struct.pack("<IIQ", chunk, position, chunk * per_chunk + position)
    return head + hashlib.shake_128(head).digest(RECORD - len(head))


def plaintext(chunks: int, chunk_size: int, tail_records: int | None = None) -> bytes:
    """``chunks`` chunks of records; the last holds ``tail_records`` of them if given."""
    per = chunk_size // RECORD
    counts = [per] * chunks
    if tail_records is not None:
        counts[-1] = tail_records
    return b"".join(record(g, p, per) for g, n in enumerate(counts) for p in range(n))


def chunk_bytes(data: bytes, chunk: int, chunk_size: int) -> bytes:
    return data[chunk * chunk_size : (chunk + 1) * chunk_size]


def rows(batch: Any) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """A delivered batch (any collation of ``(records, RECORD)`` items) as rows of bytes."""
    if isinstance(batch, torch.Tensor):
        flat = batch.detach().cpu().contiguous().reshape(-1, RECORD)
        return np.ascontiguousarray(flat.numpy())
    return np.concatenate([rows(b) for b in batch])


def chunks_of(batch: Any, data: bytes, chunk_size: int) -> list[int]:
    """The chunks a batch holds, in order, each checked complete and byte for byte.

    Raises:
        AssertionError: a row out of place, a partial chunk, or any wrong byte.
    """
    got = rows(batch)
    out: list[int] = []
    i = 0
    while i < len(got):
        chunk = int(struct.unpack_from("<I", got[i])[0])
        want = chunk_bytes(data, chunk, chunk_size)
        n = len(want) // RECORD
        piece = got[i : i + n].tobytes()
        assert piece == want, f"rows {i}..{i + n} are not chunk {chunk} byte for byte"
        out.append(chunk)
        i += n
    return out


def check_delivery(
    batches: Sequence[Any],
    shares: Sequence[Sequence[int]],
    batch_size: int | None,
    data: bytes,
    chunk_size: int,
) -> None:
    """Batches delivered by a DataLoader whose workers read ``shares`` (one list per worker).

    Every batch holds ``batch_size`` consecutive chunks (fewer at the end of a worker's
    share) of one worker's share, byte for byte; each worker's batches come in its order;
    together they are exactly the shares.
    """
    size = batch_size or 1
    expected = {
        w: [list(s[i : i + size]) for i in range(0, len(s), size)] for w, s in enumerate(shares)
    }
    owner = {g: w for w, s in enumerate(shares) for g in s}
    progress = dict.fromkeys(expected, 0)
    for batch in batches:
        got = chunks_of(batch, data, chunk_size)
        assert got, "an empty batch"
        w = owner.get(got[0])
        assert w is not None, f"chunk {got[0]} is not this rank's"
        k = progress[w]
        assert k < len(expected[w]) and got == expected[w][k], (
            f"worker {w}'s batch {k} is {got}, expected {expected[w][k : k + 1]}"
        )
        progress[w] = k + 1
    assert progress == {w: len(b) for w, b in expected.items()}, "batches missing"


def tamper(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 4
    path.write_bytes(bytes(raw))


def cat_collate(items: list[torch.Tensor]) -> torch.Tensor:
    """A custom ``collate_fn``: records of the items end to end (chunks may differ in size)."""
    return torch.cat(items)


Collate = Callable[[list[torch.Tensor]], Any] | None
