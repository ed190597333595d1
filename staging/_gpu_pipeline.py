"""The GPU staging pipeline of one device: sources fill a pinned ring, streams move and open it.

See :mod:`staging.gpu` for the design; ``docs/GPU.md`` for the kernels.
"""

from __future__ import annotations

import os
import stat
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpucc.core.errors import MalformedInputError

from . import _gpu_runtime as rt
from ._gpu_runtime import (
    READ_PIECE,
    GcmDevice,
)
from .chunks import ChunkCipher
from .dataset import SealedDataset, io_error, read_exact
from .errors import ChunkAuthenticationError, MalformedDatasetError
from .format import (
    TAG_SIZE,
    Header,
    StrPath,
    new_dataset_key,
)

__all__ = ["Failure", "PlaintextSource", "SealedSource", "Source", "Stopped", "run_device"]

# --- sources: what fills a pinned slot with sealed records ----------------------------------------


class Source:
    """Fills host memory with the sealed records ``ct_i || tag_i`` of a range of chunks."""

    header: Header

    def tasks(self, first: int, count: int, dst: memoryview) -> list[Callable[[], None]]:
        """Independent pieces of work that together write chunks [first, first+count)."""
        raise NotImplementedError

    def gds_path(self) -> Path | None:
        """The sealed file, when records may be read straight into device memory."""
        return None

    def close(self) -> None:
        """Release files and scratch."""


def _records_span(header: Header, first: int, count: int) -> tuple[int, int]:
    """File offset and length of the records of chunks [first, first + count)."""
    start = header.chunk_offset(first)
    last = first + count - 1
    end = header.chunk_offset(last) + header.chunk_length(last) + TAG_SIZE
    return start, end - start


class SealedSource(Source):
    def __init__(self, dataset: SealedDataset) -> None:
        self.header = dataset.header
        self.path = dataset.path
        try:
            self.fd = os.open(dataset.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise io_error("read", dataset.path, exc) from None
        try:
            size = os.fstat(self.fd).st_size
            prefix = os.pread(self.fd, len(dataset.prefix), 0)
        except OSError as exc:
            os.close(self.fd)
            raise io_error("read", dataset.path, exc) from None
        if size != self.header.file_size or prefix != dataset.prefix:
            os.close(self.fd)
            raise MalformedDatasetError(f"{dataset.path} changed after it was opened")

    def tasks(self, first: int, count: int, dst: memoryview) -> list[Callable[[], None]]:
        offset, length = _records_span(self.header, first, count)
        out: list[Callable[[], None]] = []
        for start in range(0, length, READ_PIECE):
            piece = dst[start : min(length, start + READ_PIECE)]

            def read(piece: memoryview = piece, at: int = offset + start) -> None:
                try:
                    read_exact(self.fd, piece, at)
                except OSError as exc:
                    raise io_error("read", self.path, exc) from None

            out.append(read)
        return out

    def gds_path(self) -> Path | None:
        return self.path

    def close(self) -> None:
        os.close(self.fd)


class PlaintextSource(Source):
    """Reads plaintext chunks and seals them on the host under a fresh random key."""

    def __init__(self, path: StrPath, chunk_size: int, threads: int) -> None:
        self.path = Path(path)
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise io_error("read", path, exc) from None
        try:
            st = os.fstat(self.fd)
            if not stat.S_ISREG(st.st_mode):
                raise MalformedInputError(f"{path} is not a regular file")
            self.header = Header.new(st.st_size, chunk_size=chunk_size)
        except BaseException:
            os.close(self.fd)
            raise
        self.dataset_key = new_dataset_key()
        self.cipher = ChunkCipher(self.dataset_key, self.header)
        scratch = min(chunk_size, max(1, self.header.plaintext_length))
        self._free: deque[bytearray] = deque(bytearray(scratch) for _ in range(max(1, threads)))
        self._all = list(self._free)
        self._lock = threading.Lock()

    def tasks(self, first: int, count: int, dst: memoryview) -> list[Callable[[], None]]:
        header = self.header
        base = header.chunk_offset(first)
        out: list[Callable[[], None]] = []
        for index in range(first, first + count):
            length = header.chunk_length(index)
            at = header.chunk_offset(index) - base
            record = dst[at : at + length + TAG_SIZE]

            def seal(index: int = index, length: int = length, record: memoryview = record) -> None:
                with self._lock:
                    scratch = self._free.popleft()
                try:
                    plain = memoryview(scratch)[:length]
                    try:
                        read_exact(self.fd, plain, index * header.chunk_size)
                    except MalformedDatasetError:
                        raise MalformedInputError(
                            f"{self.path} shrank while it was staged"
                        ) from None
                    except OSError as exc:
                        raise io_error("read", self.path, exc) from None
                    self.cipher.encrypt_into(index, plain, record)
                finally:
                    with self._lock:
                        self._free.append(scratch)

            out.append(seal)
        return out

    def check_unchanged(self) -> None:
        if os.fstat(self.fd).st_size != self.header.plaintext_length:
            raise MalformedInputError(f"{self.path} changed size while it was staged")

    def close(self) -> None:
        for buf in self._all:
            np.frombuffer(buf, dtype=np.uint8)[:] = 0  # plaintext scratch
        os.close(self.fd)


# --- GPUDirect Storage (optional) -----------------------------------------------------------------


def kvikio_usable() -> bool:
    """kvikio importable and running real GDS (not its POSIX compatibility mode)."""
    try:
        import kvikio
        import kvikio.defaults
    except Exception:  # noqa: BLE001 - not installed or broken: plain reads
        return False
    try:
        return not bool(kvikio.defaults.compat_mode())
    except Exception:  # noqa: BLE001 - API differences between kvikio versions
        _ = kvikio
        return False


# --- the per-device pipeline ----------------------------------------------------------------------


class Stopped(Exception):
    """Internal: another device's pipeline failed; this one stopped early."""


@dataclass
class Failure:
    """What the pipelines of one staging call share: the lowest failing chunk, and an abort.

    A pipeline stops issuing batches once a failure is known *below* its next batch (all
    of that will be zeroed anyway) and keeps going otherwise, so the chunks before the
    lowest failure are all verified and stay; ``aborted`` (any other error) stops them all.
    """

    lock: threading.Lock = field(default_factory=threading.Lock)
    index: int | None = None
    aborted: threading.Event = field(default_factory=threading.Event)

    def report(self, index: int) -> None:
        with self.lock:
            if self.index is None or index < self.index:
                self.index = index

    def lowest(self) -> int | None:
        with self.lock:
            return self.index


def run_device(
    *,
    device_id: int,
    source: Source,
    chunk_key: bytes,
    first: int,
    count: int,
    out: Any,
    pool: ThreadPoolExecutor,
    batch_bytes: int,
    slots: int,
    use_gds: bool,
    failure: Failure,
    on_verified: Callable[[int], None] | None,
) -> None:
    """Stage chunks [first, first + count) into ``out`` on one device.

    On a failing chunk: the whole pipeline drains, the failing chunk and everything after it
    in ``out`` are zeroed, and ChunkAuthenticationError is raised for the lowest one. On any
    other error ``out`` is zeroed entirely before the error propagates; a CUDA fault (a kernel
    that hit an illegal address, a failed launch or copy) is :class:`GpuKernelError` with
    ``stage="launch"``, and a chunk the kernels had already rejected before it is still
    reported (through ``failure``), never hidden behind the fault.
    """
    cupy = rt.import_cupy()
    try:
        _run_device(
            cupy,
            device_id=device_id,
            source=source,
            chunk_key=chunk_key,
            first=first,
            count=count,
            out=out,
            pool=pool,
            batch_bytes=batch_bytes,
            slots=slots,
            use_gds=use_gds,
            failure=failure,
            on_verified=on_verified,
        )
    except rt.device_faults(cupy) as exc:
        rt.zero_buffers(cupy, device_id, cupy.cuda.get_current_stream(), [out])
        raise rt.launch_fault(device_id, exc) from None


def _run_device(
    cupy: Any,
    *,
    device_id: int,
    source: Source,
    chunk_key: bytes,
    first: int,
    count: int,
    out: Any,
    pool: ThreadPoolExecutor,
    batch_bytes: int,
    slots: int,
    use_gds: bool,
    failure: Failure,
    on_verified: Callable[[int], None] | None,
) -> None:
    """:func:`run_device` with CuPy's errors as they come."""
    faults = rt.device_faults(cupy)
    header = source.header
    size = header.chunk_size
    stride = size + TAG_SIZE
    per_batch = max(1, min(count, batch_bytes // stride))
    batches = [
        (b, min(per_batch, first + count - b)) for b in range(first, first + count, per_batch)
    ]
    # Rows of the device ring stay 256-byte aligned: the kernels use 16-byte vector accesses.
    slot_bytes = -(-max(_records_span(header, b, n)[1] for b, n in batches) // 256) * 256
    nslots = max(1, min(slots, len(batches)))
    gds = use_gds and source.gds_path() is not None

    with cupy.cuda.Device(device_id):
        copy_stream = cupy.cuda.Stream(non_blocking=True)
        compute_stream = cupy.cuda.Stream(non_blocking=True)
        # The kernels' stream starts after what the caller queued (its writes to ``out``).
        gcm = GcmDevice(cupy, device_id, header, chunk_key, stream=compute_stream)
        d_ring = cupy.empty((nslots, slot_bytes), dtype=cupy.uint8)
        with compute_stream:
            status_d = cupy.zeros(count, dtype=cupy.uint32)
        status_mem = cupy.cuda.alloc_pinned_memory(max(4, 4 * count))
        status_h = np.frombuffer(status_mem, dtype=np.uint32, count=count)
        status_h[:] = 0
        h_mem: list[Any] = []
        h_ring: list[np.ndarray[Any, np.dtype[np.uint8]]] = []
        if not gds:
            for _ in range(nslots):
                mem = cupy.cuda.alloc_pinned_memory(slot_bytes)
                h_mem.append(mem)
                h_ring.append(np.frombuffer(mem, dtype=np.uint8, count=slot_bytes))
        copied = [cupy.cuda.Event(disable_timing=True) for _ in range(nslots)]
        consumed = [cupy.cuda.Event(disable_timing=True) for _ in range(nslots)]
        used = [False] * nslots
        gds_file: Any = None
        if gds:
            import kvikio

            gds_file = kvikio.CuFile(str(source.gds_path()), "r")

        reads: dict[int, list[Future[None]]] = {}

        def schedule_read(bi: int) -> None:
            b, n = batches[bi]
            slot = bi % nslots
            nbytes = _records_span(header, b, n)[1]
            if gds:
                offset = header.chunk_offset(b)

                def gds_read(slot: int = slot, nbytes: int = nbytes, offset: int = offset) -> None:
                    if used[slot]:
                        consumed[slot].synchronize()  # the kernels that read this slot are done
                    got = gds_file.pread(d_ring[slot, :nbytes], nbytes, offset).get()
                    if got != nbytes:
                        raise MalformedDatasetError(
                            "the file ended early (truncated while in use?)"
                        )

                reads[bi] = [pool.submit(gds_read)]
                return
            view = h_ring[slot].data[:nbytes]
            wait = copied[slot] if used[slot] else None

            def guarded(task: Callable[[], None], wait: Any = wait) -> Callable[[], None]:
                def run() -> None:
                    if wait is not None:
                        wait.synchronize()  # the previous H2D copy out of this pinned slot
                    task()

                return run

            reads[bi] = [pool.submit(guarded(t)) for t in source.tasks(b, n, view)]

        pending: deque[tuple[int, int, Any]] = deque()  # (local first, count, event)
        verified = 0

        def check(block: bool) -> None:
            nonlocal verified
            while pending and (block or pending[0][2].done):
                lo, n, ev = pending.popleft()
                ev.synchronize()
                bad = np.flatnonzero(status_h[lo : lo + n])
                if bad.size:
                    failure.report(first + lo + int(bad[0]))
                    return
                verified += n
                if on_verified is not None:
                    on_verified(n)

        issued = 0  # status words of the batches launched so far

        def rejected_before_a_fault() -> None:
            # The status words already copied back were written by kernels that completed
            # (stream order) before the one that faulted: a rejection among them stands.
            bad = np.flatnonzero(status_h[:issued])
            if bad.size:
                failure.report(first + int(bad[0]))

        def drain() -> None:
            _drain(reads, copy_stream, compute_stream)

        def scrub_status() -> None:
            with compute_stream:
                status_d.fill(0)
            compute_stream.synchronize()

        try:
            for bi in range(min(nslots, len(batches))):
                schedule_read(bi)
            for bi, (b, n) in enumerate(batches):
                if failure.aborted.is_set():
                    raise Stopped
                lowest = failure.lowest()
                if lowest is not None and lowest < b:
                    break
                slot = bi % nslots
                for fut in reads.pop(bi):
                    fut.result()
                nbytes = _records_span(header, b, n)[1]
                src = d_ring[slot, :nbytes]
                lo = b - first
                if not gds:
                    if used[slot]:
                        copy_stream.wait_event(consumed[slot])  # device slot free again
                    cupy.cuda.runtime.memcpyAsync(
                        src.data.ptr,
                        h_ring[slot].ctypes.data,
                        nbytes,
                        cupy.cuda.runtime.memcpyHostToDevice,
                        copy_stream.ptr,
                    )
                    copied[slot].record(copy_stream)
                    compute_stream.wait_event(copied[slot])
                dst = out[lo * size : lo * size + shard_bytes(header, b, n)]
                gcm.launch(b, n, src, dst, status_d[lo : lo + n], seal=False)
                cupy.cuda.runtime.memcpyAsync(
                    status_h.ctypes.data + 4 * lo,
                    status_d.data.ptr + 4 * lo,
                    4 * n,
                    cupy.cuda.runtime.memcpyDeviceToHost,
                    compute_stream.ptr,
                )
                consumed[slot].record(compute_stream)
                used[slot] = True
                pending.append((lo, n, consumed[slot]))
                issued = lo + n
                if bi + nslots < len(batches):
                    schedule_read(bi + nslots)
                check(block=False)
            compute_stream.synchronize()
            check(block=True)
        except BaseException as exc:
            if isinstance(exc, faults):
                rejected_before_a_fault()
            rt.scrub_quietly(faults, drain)
            rt.zero_buffers(cupy, device_id, compute_stream, [out])
            raise
        finally:
            cleanup_fault = rt.scrub_quietly(faults, drain, gcm.close, scrub_status)
            if gds_file is not None:
                gds_file.close()
        if cleanup_fault is not None:
            rt.zero_buffers(cupy, device_id, compute_stream, [out])
            raise cleanup_fault

        lowest = failure.lowest()
        if lowest is not None and lowest < first + count:
            # Nothing from the lowest failing chunk on is trusted (this device's part of it).
            cut = max(0, lowest - first) * size
            if cut < out.size:
                with compute_stream:
                    out[cut:].fill(0)
            compute_stream.synchronize()
            if lowest >= first:
                raise ChunkAuthenticationError(lowest)
            raise Stopped


def _drain(reads: dict[int, list[Future[None]]], *streams: Any) -> None:
    """Let every read in flight finish (none may write a buffer that is being freed)."""
    for futures in reads.values():
        for fut in futures:
            fut.cancel()
    for futures in reads.values():
        for fut in futures:
            if not fut.cancelled():
                try:
                    fut.result()
                except BaseException:  # noqa: BLE001, S110 - the first error is already raised
                    pass
    reads.clear()
    for s in streams:
        s.synchronize()


def shard_bytes(header: Header, first: int, count: int) -> int:
    last = first + count - 1
    return (count - 1) * header.chunk_size + header.chunk_length(last)
