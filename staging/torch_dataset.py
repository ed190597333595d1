"""Sealed datasets as PyTorch data sources, from one process to many ranks under ``torchrun``.

Two datasets over a sealed dataset or a shard set (:mod:`staging.shards`):

* :class:`SealedChunkDataset` (map-style): item ``i`` is a fixed-size record (``record_size``
  bytes, which may span chunks) or, without ``record_size``, chunk ``i``. Every item is
  decrypted and verified from its covering chunk(s) and returned as a tensor the caller
  owns (a copy).
* :class:`SealedChunkStream` (iterable): streams this process's share of the chunks, a
  verified chunk per item, as a view into a buffer the stream owns (on the GPU through
  DLPack, without a copy). The buffer is zeroed when the iteration ends, fails or is closed.

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
and the stream's buffer is zeroed. The chunks before it in this process's order were
yielded (each verified on its own, as the format allows).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import numpy as np
import torch
import torch.utils.dlpack
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from gpucc.gpuattest.errors import UsageError

from ._pipeline import ChunkFailure, run_chunks
from .chunks import ChunkCipher
from .dataset import io_error, read_exact
from .errors import ChunkAuthenticationError, MalformedDatasetError
from .format import TAG_SIZE, StrPath
from .seal import default_threads
from .shards import ShardSet, open_shard_set
from .torch_split import (
    KeySharingError,
    assign_chunks,
    host_shared_key,
    order_seed,
    rank_and_world,
)

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

#: What the datasets read: a sealed file, the files of a shard set in order, or an opened set.
Source = StrPath | Sequence[StrPath] | ShardSet
TorchDevice = Literal["cpu", "cuda"]


def _open_source(
    source: Source,
    key: bytes | None,
    kek: bytes | None,
    key_file: StrPath | None,
    key_for: Callable[[bytes], bytes] | None,
) -> ShardSet:
    if isinstance(source, ShardSet):
        if any(x is not None for x in (key, kek, key_file, key_for)):
            raise UsageError("an opened shard set carries its key: give no key arguments")
        return source
    return open_shard_set(source, key=key, kek=kek, key_file=key_file, key_for=key_for)


# --- reading chunks -----------------------------------------------------------------------


class _CpuReader:
    """Reads and verifies global chunks of a shard set into host memory (one process)."""

    def __init__(self, shards: ShardSet, threads: int) -> None:
        self.shards = shards
        self.threads = threads
        self._fds: list[int] = []
        try:
            for part in shards.parts:
                try:
                    fd = os.open(part.path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError as exc:
                    raise io_error("read", part.path, exc) from None
                self._fds.append(fd)
                try:
                    size = os.fstat(fd).st_size
                    prefix = os.pread(fd, len(part.prefix), 0)
                except OSError as exc:
                    raise io_error("read", part.path, exc) from None
                if size != part.header.file_size or prefix != part.prefix:
                    raise MalformedDatasetError(f"{part.path} changed after it was opened")
        except BaseException:
            self.close()
            raise
        self._ciphers = [ChunkCipher(shards.dataset_key, p.header) for p in shards.parts]
        self._scratch = [bytearray(shards.chunk_size + TAG_SIZE) for _ in range(threads)]

    def decrypt_one(self, chunk: int, out: memoryview, scratch: bytearray) -> int:
        """Verify global chunk ``chunk`` into ``out``, reading through ``scratch``.

        Returns its plaintext length.

        Raises:
            ChunkAuthenticationError: with the global index; ``out`` is zeroed.
        """
        part, local = self.shards.locate(chunk)
        dataset = self.shards.parts[part]
        header = dataset.header
        length = header.chunk_length(local)
        sealed = memoryview(scratch)[: length + TAG_SIZE]
        try:
            read_exact(self._fds[part], sealed, header.chunk_offset(local))
        except OSError as exc:
            raise io_error("read", dataset.path, exc) from None
        try:
            self._ciphers[part].decrypt_into(local, sealed, out[:length])
        except ChunkAuthenticationError:
            raise ChunkAuthenticationError(chunk, f"{dataset.path}, chunk {local}") from None
        return length

    def decrypt(self, chunks: Sequence[int], out: np.ndarray[Any, np.dtype[np.uint8]]) -> None:
        """Verify ``chunks`` into ``out`` back to back, each at ``j * chunk_size``.

        Raises:
            ChunkAuthenticationError: the first failing chunk (its global index); ``out``
                is zeroed.
        """
        size = self.shards.chunk_size
        view = out.data.cast("B")

        def work(j: int, slot: int) -> None:
            self.decrypt_one(chunks[j], view[j * size : (j + 1) * size], self._scratch[slot])

        try:
            run_chunks(len(chunks), work, threads=min(self.threads, max(1, len(chunks))))
        except ChunkFailure as failure:
            out.fill(0)
            raise failure.cause from None
        except BaseException:
            out.fill(0)
            raise
        finally:
            view.release()

    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)


class _GpuReader:
    """Reads sealed chunks into private host memory and opens them on the GPU."""

    def __init__(self, shards: ShardSet, device: int) -> None:
        from . import _gpu_runtime, gpu

        gpu.require_gpu(device)
        self._gpu = gpu
        self.cupy: Any = _gpu_runtime.import_cupy()
        self.device = device
        self.cpu = _CpuReader(shards, 1)
        self.shards = shards

    def decrypt(self, chunks: Sequence[int], out: Any) -> None:
        """Verify ``chunks`` into the device array ``out`` back to back (see CPU reader)."""
        size = self.shards.chunk_size
        cupy = self.cupy
        try:
            with cupy.cuda.Device(self.device):
                for j, chunk in enumerate(chunks):
                    part, local = self.shards.locate(chunk)
                    dataset = self.shards.parts[part]
                    header = dataset.header
                    length = header.chunk_length(local)
                    sealed = bytearray(length + TAG_SIZE)
                    read_exact(self.cpu._fds[part], memoryview(sealed), header.chunk_offset(local))
                    records = cupy.asarray(np.frombuffer(sealed, dtype=np.uint8))
                    try:
                        self._gpu.decrypt_records_gpu(
                            records,
                            header,
                            self.shards.dataset_key,
                            out=out[j * size : j * size + length],
                            first_chunk=local,
                        )
                    except ChunkAuthenticationError:
                        path = dataset.path
                        raise ChunkAuthenticationError(chunk, f"{path}, chunk {local}") from None
        except BaseException:
            out.fill(0)
            cupy.cuda.Device(self.device).synchronize()
            raise

    def close(self) -> None:
        self.cpu.close()


def _device_index(device: str) -> tuple[TorchDevice, int]:
    if device == "cpu":
        return "cpu", 0
    kind, _, index = device.partition(":")
    if kind in ("cuda", "gpu"):
        return "cuda", int(index or "0")
    raise UsageError(f"unknown device {device!r} (expected cpu, cuda or cuda:N)")


def _as_items(
    flat: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...] | None, record_size: int | None
) -> torch.Tensor:
    typed = flat.view(dtype) if dtype != torch.uint8 else flat
    if record_size is None and shape is None:
        return typed
    return typed.reshape(-1, *(shape or ()))


def _record_shape(
    record_size: int | None, dtype: torch.dtype, shape: Sequence[int] | None
) -> tuple[int, ...] | None:
    itemsize = torch.empty((), dtype=dtype).element_size()
    if shape is not None:
        shape = tuple(int(s) for s in shape)
        elements = int(np.prod(shape)) if shape else 1
        if record_size is not None and elements * itemsize != record_size:
            raise UsageError(f"shape {shape} of {dtype} is not {record_size} bytes")
        return shape
    if record_size is None:
        return None
    if record_size % itemsize:
        raise UsageError(f"record_size {record_size} is not a multiple of {dtype}'s size")
    return (record_size // itemsize,)


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
        self.shards = _open_source(source, key, kek, key_file, key_for)
        length = self.shards.plaintext_length
        if record_size is not None and (record_size < 1 or length % record_size):
            raise UsageError(f"record_size {record_size} does not divide {length} bytes")
        self.record_size = record_size
        self.dtype = dtype
        self.shape = _record_shape(record_size, dtype, shape)
        self.threads = threads or min(2, default_threads())
        self._reader: _CpuReader | None = None
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

    def _get_reader(self) -> _CpuReader:
        if self._reader is None or self._pid != os.getpid():
            self._reader = _CpuReader(self.shards, self.threads)
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


# --- iterable ----------------------------------------------------------------------------


class SealedChunkStream(IterableDataset[torch.Tensor]):
    """Iterable: this (rank, worker)'s chunks, verified, as views into a scrubbed buffer.

    Args:
        source, key, kek, key_file, key_for: as :class:`SealedChunkDataset`.
        device: ``"cpu"``, or ``"cuda"`` / ``"cuda:N"``: chunks are opened and verified on
            the GPU (staging's kernels; needs CuPy) and yielded through DLPack without a
            copy. ``"cuda"`` needs ``num_workers=0`` in the DataLoader.
        shuffle, seed, pad: the chunk split (module documentation, :func:`assign_chunks`).
        record_size, dtype, shape: yield each chunk as a batch of records, a tensor of
            shape ``(records, *shape)``; ``record_size`` must divide the chunk size and the
            plaintext length. Without them each chunk is one 1-D tensor of ``dtype``.
        copy: yield tensors of their own instead of views.
        threads: threads verifying chunks on the CPU (default: up to 2).
        prefetch: chunks in the ring on the CPU (default ``threads + 1``): verified ahead
            of the consumer; memory is ``prefetch`` chunks of plaintext and as much of
            ciphertext scratch, kept (zeroed) from one pass to the next.
        rank, world_size: override what :func:`rank_and_world` finds (fixed at
            construction, in the main process).

    A yielded view is valid until the next item is requested: the next request may overwrite
    it, and the buffer is zeroed when the iteration ends, raises, or is closed (the
    iterator's ``close()``, leaving its ``with`` block, or :meth:`close` on the stream).
    Copy what you keep, or pass ``copy=True`` (the default DataLoader collation with
    ``batch_size=None`` passes the views through; with a ``batch_size`` use ``copy=True``,
    since collation reads items after later ones were produced). In DataLoader worker
    processes tensors are always copies: they travel to the main process in shared memory,
    which the stream cannot scrub.
    """

    def __init__(
        self,
        source: Source,
        *,
        key: bytes | None = None,
        kek: bytes | None = None,
        key_file: StrPath | None = None,
        key_for: Callable[[bytes], bytes] | None = None,
        device: str = "cpu",
        shuffle: bool = True,
        seed: int = 0,
        pad: bool = False,
        record_size: int | None = None,
        dtype: torch.dtype = torch.uint8,
        shape: Sequence[int] | None = None,
        copy: bool = False,
        threads: int | None = None,
        prefetch: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.device, self.device_index = _device_index(device)
        self.shards = _open_source(source, key, kek, key_file, key_for)
        size = self.shards.chunk_size
        length = self.shards.plaintext_length
        if record_size is not None and (
            record_size < 1 or size % record_size or length % record_size
        ):
            raise UsageError(
                f"record_size {record_size} must divide the chunk size {size} and the "
                f"plaintext length {length}"
            )
        self.record_size = record_size
        self.dtype = dtype
        self.shape = _record_shape(record_size, dtype, shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if size % itemsize or length % itemsize:
            raise UsageError(f"the chunks are not a whole number of {dtype} elements")
        self.copy = copy
        self.shuffle = shuffle
        self.seed = seed
        self.pad = pad
        self.threads = threads or min(2, default_threads())
        self.prefetch = prefetch or self.threads + 1
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.epoch = 0
        self._live: weakref.WeakSet[_StreamIterator] = weakref.WeakSet()
        self._spare: tuple[torch.Tensor, list[bytearray]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_live"] = None
        state["_spare"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._live = weakref.WeakSet()

    def _take_ring(self, nbytes: int, slots: int) -> tuple[torch.Tensor, list[bytearray]]:
        """A zeroed ring and its ciphertext scratch: the one the last pass left, else new.

        Reusing them spares every epoch the page faults of fresh memory.
        """
        spare, self._spare = self._spare, None
        if spare is not None and spare[0].numel() == nbytes and len(spare[1]) == slots:
            return spare
        size = self.shards.chunk_size + TAG_SIZE
        return torch.zeros(nbytes, dtype=torch.uint8), [bytearray(size) for _ in range(slots)]

    def _give_ring(self, ring: torch.Tensor, scratch: list[bytearray]) -> None:
        """Keep a ring (already zeroed) for the next pass."""
        self._spare = (ring, scratch)

    def set_epoch(self, epoch: int) -> None:
        """Use the permutation of ``epoch`` from the next iteration on (call it every epoch)."""
        self.epoch = epoch

    def chunks(self, worker: int = 0, num_workers: int = 1) -> list[int]:
        """The global chunk indices this rank's ``worker`` reads this epoch, in order."""
        return assign_chunks(
            self.shards.chunk_count,
            rank=self.rank,
            world_size=self.world_size,
            epoch=self.epoch,
            seed=self.seed,
            shuffle=self.shuffle,
            pad=self.pad,
            worker=worker,
            num_workers=num_workers,
        )

    def __iter__(self) -> _StreamIterator:
        info = get_worker_info()
        if info is not None and self.device == "cuda":
            raise UsageError(
                "device cuda decrypts in the main process: use DataLoader(num_workers=0)"
            )
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        iterator = _StreamIterator(self, self.chunks(worker, workers), force_copy=info is not None)
        self._live.add(iterator)
        return iterator

    def iterate(self) -> _StreamIterator:
        """``iter(self)``, for ``with stream.iterate() as chunks: ...``."""
        return self.__iter__()

    def close(self) -> None:
        """Zero the buffers of every iteration still open."""
        for iterator in list(self._live):
            iterator.close()


class _Ring:
    """The CPU ring of one pass: workers claim items in order and verify them into slots.

    Item ``n`` lives in slot ``n % depth`` and may be claimed once the consumer has released
    every item up to ``n - depth``. The workers hold this object, not the iterator, so an
    abandoned iterator is collected (and closes the ring) while they wait.
    """

    def __init__(
        self,
        reader: _CpuReader,
        chunks: list[int],
        host: memoryview,
        scratch: list[bytearray],
        depth: int,
        threads: int,
    ) -> None:
        self.reader = reader
        self.chunks = chunks
        self.host = host
        self.scratch = scratch
        self.depth = depth
        self.cond = threading.Condition()
        self.claim = 0
        self.released = 0
        self.done: dict[int, BaseException | None] = {}
        self.stop = False
        self.workers = [
            threading.Thread(target=self.work, name=f"gpucc-stream-{i}", daemon=True)
            for i in range(max(1, min(threads, depth)))
        ]
        for worker in self.workers:
            worker.start()

    def work(self) -> None:
        """A worker: claim the next item whose slot is free, verify it into its slot."""
        cond = self.cond
        size = self.reader.shards.chunk_size
        total = len(self.chunks)
        while True:
            with cond:
                while not self.stop and total > self.claim >= self.released + self.depth:
                    cond.wait()
                if self.stop or self.claim >= total:
                    return
                n = self.claim
                self.claim += 1
            slot = n % self.depth
            error: BaseException | None = None
            try:
                out = self.host[slot * size : (slot + 1) * size]
                self.reader.decrypt_one(self.chunks[n], out, self.scratch[slot])
            except BaseException as exc:
                error = exc
            with cond:
                self.done[n] = error
                if error is not None:
                    self.stop = True  # claim nothing more
                cond.notify_all()

    def wait(self, n: int) -> int | None:
        """Release items before ``n``; the slot of item ``n`` once it verified.

        Raises what verifying it raised; ``None`` when the ring was stopped first.
        """
        cond = self.cond
        with cond:
            self.released = n
            cond.notify_all()
            while n not in self.done:
                if self.stop and n >= self.claim:
                    return None
                cond.wait()
            error = self.done.pop(n)
        if error is not None:
            raise error
        return n % self.depth

    def stop_workers(self) -> None:
        """Stop claiming and wait for the workers: nothing writes to the ring after this."""
        with self.cond:
            self.stop = True
            self.cond.notify_all()
        for worker in self.workers:
            if worker is not threading.current_thread():
                worker.join()
        self.reader.close()


class _StreamIterator(Iterator[torch.Tensor]):
    """One pass over a share of chunks; owns (and zeroes) the ring its tensors view.

    CPU: a :class:`_Ring` of ``prefetch`` slots filled ahead by ``threads`` workers; a slot
    is refilled only once the next item is requested, so a yielded view stays intact until
    then. GPU: one slot, each chunk verified on the device when it is requested.
    """

    def __init__(self, stream: SealedChunkStream, chunks: list[int], *, force_copy: bool) -> None:
        self._stream = stream
        self._chunks = chunks
        self._copy = stream.copy or force_copy
        gpu = stream.device == "cuda"
        self._depth = 1 if gpu else max(1, min(stream.prefetch, len(chunks)))
        self._pos = 0
        self._closed = False
        self._opened = False
        self._ring: _Ring | None = None
        self._gpu: _GpuReader | None = None
        self._scratch: list[bytearray] = []
        self._device_buf: Any = None
        self._tensor: torch.Tensor | None = None

    def _open(self) -> None:
        self._opened = True
        stream = self._stream
        nbytes = self._depth * stream.shards.chunk_size
        if stream.device == "cuda":
            self._gpu = reader = _GpuReader(stream.shards, stream.device_index)
            with reader.cupy.cuda.Device(stream.device_index):
                self._device_buf = reader.cupy.zeros(nbytes, dtype=reader.cupy.uint8)
            self._tensor = torch.utils.dlpack.from_dlpack(self._device_buf)
            return
        cpu = _CpuReader(stream.shards, 1)
        try:
            self._tensor, self._scratch = stream._take_ring(nbytes, self._depth)
        except BaseException:
            cpu.close()
            raise
        host = self._tensor.numpy().data.cast("B")
        self._ring = _Ring(cpu, self._chunks, host, self._scratch, self._depth, stream.threads)

    def _verified(self, n: int) -> int | None:
        if self._gpu is not None:
            self._gpu.decrypt([self._chunks[n]], self._device_buf)
            return 0
        if self._ring is None:  # pragma: no cover - opened before
            return None
        return self._ring.wait(n)

    def __next__(self) -> torch.Tensor:
        n = self._pos
        if self._closed or n >= len(self._chunks):
            self.close()
            raise StopIteration
        try:
            if not self._opened:
                self._open()
            slot = self._verified(n)
        except BaseException:
            self.close()
            raise
        if slot is None:
            self.close()
            raise StopIteration
        self._pos = n + 1
        stream = self._stream
        size = stream.shards.chunk_size
        assert self._tensor is not None
        flat = self._tensor[slot * size : slot * size + stream.shards.chunk_length(self._chunks[n])]
        item = _as_items(flat, stream.dtype, stream.shape, stream.record_size)
        return item.clone() if self._copy else item

    def close(self) -> None:
        """Zero the ring (every view yielded so far reads zeros) and close the files."""
        self._closed = True
        ring, self._ring = self._ring, None
        if ring is not None:
            ring.stop_workers()  # no worker writes after this
        tensor, self._tensor = self._tensor, None
        if tensor is not None:
            tensor.zero_()
            if self._gpu is not None:
                self._gpu.cupy.cuda.Device(self._gpu.device).synchronize()
            else:
                self._stream._give_ring(tensor, self._scratch)
        gpu, self._gpu = self._gpu, None
        if gpu is not None:
            gpu.close()

    def __enter__(self) -> _StreamIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: S110 - interpreter shutdown: nothing left to report to
            pass
