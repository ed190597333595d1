"""Sealed datasets as PyTorch data sources, from one process to many ranks under ``torchrun``.

Two datasets over a sealed dataset or a shard set (:mod:`staging.shards`):

* :class:`SealedChunkDataset` (map-style): item ``i`` is a fixed-size record (``record_size``
  bytes, which may span chunks) or, without ``record_size``, chunk ``i``. Every item is
  decrypted and verified from its covering chunk(s) and returned as a tensor the caller
  owns (a copy).
* :class:`SealedChunkStream` (iterable, :mod:`staging.torch_stream`): streams this process's
  share of the chunks, a verified chunk per item, as a tensor that owns its memory (on the
  GPU through DLPack, without a copy): it never changes under the caller, whatever a
  DataLoader does with it.

Work split under ``torchrun`` (see :func:`assign_chunks`): every epoch, the chunk indices are
permuted by ``torch.randperm`` under a generator seeded from ``(seed, epoch)`` (the same on
every rank, and distinct for distinct pairs, see :func:`order_seed`), rank ``r`` of ``W`` takes
positions ``r, r+W, r+2W, ...`` of the permutation and DataLoader worker ``w`` of ``K``
takes every ``K``-th of those. Every chunk is read exactly once per epoch by exactly one
(rank, worker); when ``W`` does not divide the chunk count, ranks below ``count % W`` read
one chunk more. ``pad=True`` instead repeats the first chunks of the permutation until
every rank has the same count (``DistributedSampler``'s rule), so a few chunks are read
twice.

Fail closed: a chunk whose tag does not verify raises
:class:`~staging.errors.ChunkAuthenticationError` (with its global chunk index) on the
process that reads it; nothing of it, nor of the chunks verified ahead of it, is yielded,
and their buffers are zeroed. The chunks before it in this process's order were
yielded (each verified on its own, as the format allows).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from gpucc.core.errors import UsageError

from .format import StrPath
from .seal import default_threads
from .torch_read import CpuReader, Source, open_source, record_shape
from .torch_split import (
    KeySharingError,
    assign_chunks,
    host_shared_key,
    order_seed,
    rank_and_world,
)
from .torch_stream import SealedChunkStream

__all__ = [
    "KeySharingError",
    "SealedChunkDataset",
    "SealedChunkStream",
    "Source",
    "assign_chunks",
    "host_shared_key",
    "order_seed",
    "rank_and_world",
]


# --- map-style ---------------------------------------------------------------------------


class SealedChunkDataset(Dataset[torch.Tensor]):
    """Map-style: fixed-size records (or chunks) of a sealed dataset or shard set.

    Args:
        source: a sealed file, the files of a shard set in index order, or a :class:`ShardSet`.
        key, kek, key_file, key_for: exactly one key source (see :func:`staging.plan_stage`);
            none for an opened :class:`ShardSet`.
        record_size: bytes per item; items may span chunks. The plaintext length must be a
            multiple of it. Without it, item ``i`` is chunk ``i``.
        dtype, shape: reinterpret each item's bytes (``shape`` excludes no dimension: an item
            is a tensor of ``shape``; default: one dimension).
        threads: threads that decrypt the chunks an item spans.

    Each item is verified before it is returned and returned as a tensor of its own. The
    last chunk(s) decrypted are kept (one item's span) to serve neighbouring records; they
    are zeroed by :meth:`close` (and when the dataset is collected). With DataLoader
    workers, each worker opens its own files and keeps its own cache.

    Raises (construction): see :func:`staging.shards.open_shard_set`; ``UsageError`` for a
    record size that does not divide the plaintext.
    """

    def __init__(
        self,
        source: Source,
        *,
        key: bytes | None = None,
        kek: bytes | None = None,
        key_file: StrPath | None = None,
        key_for: Callable[[bytes], bytes] | None = None,
        record_size: int | None = None,
        dtype: torch.dtype = torch.uint8,
        shape: Sequence[int] | None = None,
        threads: int | None = None,
    ) -> None:
        self.shards = open_source(source, key, kek, key_file, key_for)
        length = self.shards.plaintext_length
        if record_size is not None and (record_size < 1 or length % record_size):
            raise UsageError(f"record_size {record_size} does not divide {length} bytes")
        self.record_size = record_size
        self.dtype = dtype
        self.shape = record_shape(record_size, dtype, shape)
        self.threads = threads or min(2, default_threads())
        self._reader: CpuReader | None = None
        self._pid = -1
        self._cache: np.ndarray[Any, np.dtype[np.uint8]] | None = None
        self._cached: tuple[int, int] = (0, 0)

    def __len__(self) -> int:
        if self.record_size is None:
            return self.shards.chunk_count
        return self.shards.plaintext_length // self.record_size

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_reader=None, _pid=-1, _cache=None, _cached=(0, 0))
        return state

    def _get_reader(self) -> CpuReader:
        if self._reader is None or self._pid != os.getpid():
            self._reader = CpuReader(self.shards, self.threads)
            self._pid = os.getpid()
            self._cache, self._cached = None, (0, 0)
        return self._reader

    def __getitem__(self, index: int) -> torch.Tensor:
        count = len(self)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError(f"item {index} out of range 0..{count - 1}")
        size = self.shards.chunk_size
        if self.record_size is None:
            start, end = index * size, index * size + self.shards.chunk_length(index)
        else:
            start, end = index * self.record_size, (index + 1) * self.record_size
        first, last = start // size, max(start, end - 1) // size
        span = self._span(first, last)
        base = (first - self._cached[0]) * size
        item = torch.from_numpy(span[base + start - first * size : base + end - first * size])
        typed = item.clone().view(self.dtype) if self.dtype != torch.uint8 else item.clone()
        return typed if self.shape is None else typed.reshape(self.shape)

    def _span(self, first: int, last: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """Chunks ``first .. last`` verified in the cache (decrypted unless already there)."""
        lo, n = self._cached
        reader = self._get_reader()
        if self._cache is not None and lo <= first and last < lo + n:
            return self._cache
        need = last - first + 1
        size = self.shards.chunk_size
        if self._cache is None or self._cache.size < need * size:
            if self._cache is not None:
                self._cache.fill(0)
            self._cache = np.zeros(need * size, dtype=np.uint8)
        self._cached = (0, 0)
        try:
            reader.decrypt(range(first, last + 1), self._cache[: need * size])
        except BaseException:
            self._cache.fill(0)
            raise
        self._cached = (first, need)
        return self._cache

    def close(self) -> None:
        """Zero the cached plaintext and close the files (the dataset reopens on use)."""
        if self._cache is not None:
            self._cache.fill(0)
        self._cached = (0, 0)
        if self._reader is not None and self._pid == os.getpid():
            self._reader.close()
        self._reader = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: S110 - interpreter shutdown: nothing left to report to
            pass
