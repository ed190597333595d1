"""The iterable PyTorch dataset over sealed chunks: :class:`SealedChunkStream`.

Every tensor the stream yields owns its memory. On the CPU, ``threads`` workers verify the
chunks ahead of the consumer, each into a buffer that no tensor views: a buffer becomes a
tensor only once its tag verified, and it returns to the stream's pool (to be reused) only
when the last tensor viewing it is freed. So no yielded tensor, whatever a DataLoader does
with it (collation after later items were produced, a pin-memory thread, a worker's queue),
ever reads memory that is being rewritten, nor plaintext whose tag has not verified.

Scrubbing: a buffer that failed, or was verified ahead of a failure, is zeroed before it is
released; the pool's free buffers are zeroed when an iteration ends, fails or is closed, and
a buffer freed after that is zeroed as it comes back. Tensors the consumer still holds are
the consumer's (as copies would be). On the GPU each chunk is verified into a device array
of its own from CuPy's memory pool, exposed through DLPack.

Memory: the CPU buffers are lent by a :class:`~staging.arena.HostArena`, the caller's
(``arena=``) or one the stream makes in each process and closes in :meth:`close` (at once,
or when the last tensor still held is freed): then every page that held plaintext is zero.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.dlpack
from torch.utils.data import IterableDataset, get_worker_info

from gpucc.core.errors import UsageError

from .arena import HostArena
from .format import TAG_SIZE, StrPath
from .seal import default_threads
from .torch_read import (
    CpuReader,
    GpuReader,
    Source,
    as_items,
    device_index,
    open_source,
    record_shape,
)
from .torch_split import assign_chunks, rank_and_world

__all__ = ["SealedChunkStream"]

Buffer = np.ndarray[Any, np.dtype[np.uint8]]


class _Pool:
    """Chunk-sized host buffers; a buffer is reused only after its last tensor was freed.

    While an iteration is open, buffers coming back keep their (verified, consumed)
    plaintext until they are reused or the iteration ends; otherwise they are zeroed as
    they come back. The pool keeps as many free buffers as were out at once (collation
    holds a batch of them), between ``keep`` and ``keep + SPARE``; it zeroes any other
    before letting it go.

    The buffers are lent by ``arena``; without one the pool makes its own and closes it
    once :meth:`close` was called and no buffer is out any more.
    """

    SPARE = 8

    def __init__(self, size: int, arena: HostArena | None = None) -> None:
        self.size = size
        self.owns_arena = arena is None
        self.arena = HostArena() if arena is None else arena
        self.closing = False
        self.keep = 0
        self.lock = threading.RLock()  # a tensor may be freed (calling give) under the lock
        self.free: list[Buffer] = []
        self.open = 0
        self.out = 0  # buffers taken and not given back
        self.high = 0  # the most buffers out at once

    def take(self) -> Buffer:
        with self.lock:
            self.out += 1
            self.high = max(self.high, self.out)
            if self.free:
                return self.free.pop()
        try:
            return self.arena.array(self.size)
        except BaseException:
            with self.lock:
                self.out -= 1
            raise

    def give(self, buf: Buffer) -> None:
        """Take back a buffer nothing views any more."""
        with self.lock:
            self.out -= 1
            if self.closing:
                buf.fill(0)
                self._close_arena_when_idle()
                return
            room = len(self.free) < min(max(self.keep, self.high), self.keep + self.SPARE)
            if not self.open or not room:
                buf.fill(0)
            if room:
                self.free.append(buf)

    def export(self, buf: Buffer, length: int) -> torch.Tensor:
        """A tensor of ``buf[:length]`` that owns ``buf``: freeing it gives ``buf`` back."""
        view = buf[:length]
        weakref.finalize(view, self.give, buf)
        return torch.from_numpy(view)

    def begin(self, keep: int) -> None:
        with self.lock:
            self.open += 1
            self.keep = max(self.keep, keep)

    def end(self) -> None:
        """An iteration ended: zero every free buffer."""
        with self.lock:
            self.open -= 1
            for buf in self.free:
                buf.fill(0)

    def close(self) -> None:
        """Let every free buffer go (zeroed), and close the pool's own arena now or when the
        last buffer out comes back."""
        with self.lock:
            self.closing = True
            for buf in self.free:
                buf.fill(0)
            self.free.clear()
            self._close_arena_when_idle()

    def _close_arena_when_idle(self) -> None:
        if self.owns_arena and self.out == 0:
            self.arena.close()


class _Ring:
    """The CPU workers of one pass: they claim items in order and verify each into a buffer.

    Item ``n`` may be claimed once the consumer asked for item ``n - depth + 1``: at most
    ``depth`` items are verified ahead. The workers hold this object, not the iterator, so
    an abandoned iterator is collected (and closes the ring) while they wait.
    """

    def __init__(
        self, reader: CpuReader, chunks: list[int], pool: _Pool, depth: int, threads: int
    ) -> None:
        self.reader = reader
        self.chunks = chunks
        self.pool = pool
        self.depth = depth
        self.cond = threading.Condition()
        self.claim = 0
        self.released = 0
        self.done: dict[int, tuple[Buffer | None, int, BaseException | None]] = {}
        self.stop = False
        self.workers = [
            threading.Thread(target=self.work, args=(i,), name=f"gpucc-stream-{i}", daemon=True)
            for i in range(max(1, min(threads, depth)))
        ]
        for worker in self.workers:
            worker.start()

    def work(self, index: int) -> None:
        """A worker: claim the next item, verify it into a buffer of its own."""
        cond = self.cond
        size = self.reader.shards.chunk_size
        scratch = bytearray(size + TAG_SIZE)
        total = len(self.chunks)
        while True:
            with cond:
                while not self.stop and total > self.claim >= self.released + self.depth:
                    cond.wait()
                if self.stop or self.claim >= total:
                    return
                n = self.claim
                self.claim += 1
            buf: Buffer | None = None
            length = 0
            error: BaseException | None = None
            try:
                buf = self.pool.take()
                length = self.reader.decrypt_one(self.chunks[n], buf.data, scratch)
            except BaseException as exc:
                error = exc
                if buf is not None:  # zeroed by the cipher on a bad tag; zero it anyway
                    buf.fill(0)
                    self.pool.give(buf)
                buf = None
            with cond:
                self.done[n] = (buf, length, error)
                if error is not None:
                    self.stop = True  # claim nothing more
                cond.notify_all()

    def wait(self, n: int) -> tuple[Buffer, int] | None:
        """Release items before ``n``; item ``n``'s buffer and length once it verified.

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
            buf, length, error = self.done.pop(n)
        if error is not None:
            raise error
        assert buf is not None
        return buf, length

    def stop_workers(self) -> None:
        """Stop the workers, then zero and give back what they verified ahead."""
        with self.cond:
            self.stop = True
            self.cond.notify_all()
        for worker in self.workers:
            if worker is not threading.current_thread():
                worker.join()
        self.reader.close()
        with self.cond:
            ahead, self.done = self.done, {}
        for buf, _, _ in ahead.values():
            if buf is not None:
                buf.fill(0)
                self.pool.give(buf)


class SealedChunkStream(IterableDataset[torch.Tensor]):
    """Iterable: this (rank, worker)'s chunks, verified, one tensor of its own per chunk.

    Args:
        source, key, kek, key_file, key_for: as
            :class:`~staging.torch_dataset.SealedChunkDataset`.
        device: ``"cpu"``, or ``"cuda"`` / ``"cuda:N"``: chunks are opened and verified on
            the GPU (staging's kernels; needs CuPy), each into device memory of its own,
            and yielded through DLPack. ``"cuda"`` needs ``num_workers=0`` in the DataLoader.
        shuffle, seed, pad: the chunk split (:func:`~staging.torch_split.assign_chunks`).
        record_size, dtype, shape: yield each chunk as a batch of records, a tensor of
            shape ``(records, *shape)``; ``record_size`` must divide the chunk size and the
            plaintext length. Without them each chunk is one 1-D tensor of ``dtype``.
        threads: threads verifying chunks on the CPU (default: up to 2).
        prefetch: chunks verified ahead of the consumer on the CPU (default
            ``threads + 1``).
        rank, world_size: override what :func:`rank_and_world` finds (fixed at
            construction, in the main process).
        arena: a :class:`~staging.arena.HostArena` that lends the CPU buffers in this
            process (the caller closes it: tensors still held then read as zeros). By
            default the stream makes one per process and closes it in :meth:`close`; a
            DataLoader worker process always makes its own.

    A yielded tensor stays valid as long as it is referenced, in any DataLoader setting
    (``batch_size`` None or N, any ``collate_fn``, workers, ``pin_memory``). On the CPU its
    memory returns to the stream's pool when it is freed, and is zeroed when the
    iteration ends (or as it comes back, after that); every page is zero once the stream
    is closed and the tensors it yielded are freed. The epoch (:meth:`set_epoch`) lives
    in shared memory, so DataLoader workers, persistent ones included, follow it.
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
        threads: int | None = None,
        prefetch: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        arena: HostArena | None = None,
    ) -> None:
        self.device, self.device_index = device_index(device)
        self.shards = open_source(source, key, kek, key_file, key_for)
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
        self.shape = record_shape(record_size, dtype, shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if size % itemsize or length % itemsize:
            raise UsageError(f"the chunks are not a whole number of {dtype} elements")
        self.shuffle = shuffle
        self.seed = seed
        self.pad = pad
        self.threads = threads or min(2, default_threads())
        self.prefetch = prefetch or self.threads + 1
        self.rank, self.world_size = rank_and_world(rank, world_size)
        # shared memory: DataLoader workers (forked, spawned, persistent) see set_epoch
        self._epoch = torch.zeros(1, dtype=torch.int64)
        self._epoch.share_memory_()  # type: ignore[no-untyped-call]
        self._live: weakref.WeakSet[_StreamIterator] = weakref.WeakSet()
        self._pool: _Pool | None = None
        self._pool_pid = -1
        self._arena = arena
        self._arena_pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_live"] = None
        state["_pool"] = None
        state["_arena"] = None  # the caller's memory stays in the caller's process
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._live = weakref.WeakSet()

    @property
    def epoch(self) -> int:
        """The epoch whose order the next iteration reads (shared with DataLoader workers)."""
        return int(self._epoch[0])

    def set_epoch(self, epoch: int) -> None:
        """Use the permutation of ``epoch`` from the next iteration on (call it every epoch,
        before ``iter(loader)``). DataLoader workers, persistent ones included, follow it."""
        self._epoch[0] = epoch

    def pool(self) -> _Pool:
        """This process's pool (a forked DataLoader worker makes its own: the parent's
        lock may have been held by a thread the fork did not copy)."""
        pid = os.getpid()
        if self._pool is None or self._pool_pid != pid:
            arena = self._arena if self._arena_pid == pid else None
            self._pool = _Pool(self.shards.chunk_size, arena)
            self._pool_pid = pid
        return self._pool

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
        iterator = _StreamIterator(self, self.chunks(worker, workers))
        self._live.add(iterator)
        return iterator

    def iterate(self) -> _StreamIterator:
        """``iter(self)``, for ``with stream.iterate() as chunks: ...``."""
        return self.__iter__()

    def close(self) -> None:
        """End every iteration still open (zeroing what it verified ahead), and close this
        process's pool: its free buffers are zeroed and let go, and the arena the stream
        made is closed once no tensor it yielded is held any more. A later iteration starts
        a new pool."""
        for iterator in list(self._live or ()):
            iterator.close()
        pool, self._pool = self._pool, None
        if pool is not None and self._pool_pid == os.getpid():
            pool.close()


class _StreamIterator(Iterator[torch.Tensor]):
    """One pass over a share of chunks.

    CPU: a :class:`_Ring` of ``threads`` workers verifying up to ``prefetch`` items ahead,
    into buffers of the stream's pool. GPU: each chunk verified on the device when it is
    requested, into an array of its own.
    """

    def __init__(self, stream: SealedChunkStream, chunks: list[int]) -> None:
        self._stream = stream
        self._chunks = chunks
        gpu = stream.device == "cuda"
        self._depth = 1 if gpu else max(1, min(stream.prefetch, len(chunks)))
        self._pos = 0
        self._closed = False
        self._opened = False
        self._ring: _Ring | None = None
        self._pool: _Pool | None = None
        self._gpu: GpuReader | None = None

    def _open(self) -> None:
        self._opened = True
        stream = self._stream
        if stream.device == "cuda":
            self._gpu = GpuReader(stream.shards, stream.device_index)
            return
        cpu = CpuReader(stream.shards, 1)
        try:
            # Remote shards are opened here, not in the ring's threads: a thread that made
            # TLS contexts and is still ending when a DataLoader forks its workers can leave
            # OpenSSL's lock held in them.
            cpu.open_for(self._chunks)
        except BaseException:
            cpu.close()
            raise
        pool = stream.pool()
        pool.begin(keep=self._depth + 2)
        self._pool = pool
        try:
            self._ring = _Ring(cpu, self._chunks, pool, self._depth, stream.threads)
        except BaseException:
            cpu.close()
            raise

    def _verified(self, n: int) -> torch.Tensor | None:
        if self._gpu is not None:
            return torch.utils.dlpack.from_dlpack(self._gpu.open_chunk(self._chunks[n]))
        if self._ring is None or self._pool is None:  # pragma: no cover - opened before
            return None
        got = self._ring.wait(n)
        return None if got is None else self._pool.export(*got)

    def __next__(self) -> torch.Tensor:
        n = self._pos
        if self._closed or n >= len(self._chunks):
            self.close()
            raise StopIteration
        try:
            if not self._opened:
                self._open()
            flat = self._verified(n)
        except BaseException:
            self.close()
            raise
        if flat is None:
            self.close()
            raise StopIteration
        self._pos = n + 1
        stream = self._stream
        return as_items(flat, stream.dtype, stream.shape, stream.record_size)

    def close(self) -> None:
        """Stop the workers, zero what they verified ahead and the pool's free buffers."""
        self._closed = True
        ring, self._ring = self._ring, None
        if ring is not None:
            ring.stop_workers()  # no worker writes after this
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.end()
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
