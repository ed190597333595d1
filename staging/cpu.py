"""Staging into host memory: decrypt and verify chunk by chunk into one NumPy buffer.

The ciphertext is read with ``pread`` into private scratch buffers (one per thread) and
decrypted from there with ``AESGCM.decrypt_into`` straight into the destination. The file is
deliberately not memory-mapped: with a mapping, whoever can write the file (in confidential
computing, possibly the untrusted host's storage) could change the bytes between the moment
GCM authenticates them and the moment it decrypts them, and a truncation would kill the
process with SIGBUS. The private copy costs one memory pass.

No plaintext of an unverified chunk survives a failure: ``decrypt_into`` writes plaintext
before it checks the tag, so the failing chunk is zeroed, the chunks in flight are allowed
to finish, and then everything from the first failing chunk to the end of the buffer is
zeroed before the error is raised.

Memory: by default the destination is an array the caller owns outright and the scratch
buffers belong to the call (zeroed before it returns); with ``arena=`` (a
:class:`~staging.arena.HostArena`) both are lent by the caller's arena, which zeroes them as
they come back and reuses their pages (:mod:`staging.arena`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from gpucc.core.errors import MalformedInputError

from ._pipeline import ChunkFailure, run_chunks, window_for
from .arena import HostArena, owned_array, owned_view
from .chunks import ChunkCipher, zero
from .dataset import SealedDataset, io_error, open_sealed, read_exact
from .errors import MalformedDatasetError
from .format import (
    DEFAULT_CHUNK_SIZE,
    HEADER_SIZE,
    PREFIX_SIZE,
    TAG_SIZE,
    Header,
    StrPath,
    new_dataset_key,
    parse_wrap_section,
)
from .seal import ProgressCallback, default_threads

__all__ = [
    "Buffer",
    "chunk_progress",
    "SealedDataset",
    "open_sealed",
    "check_plaintext_unchanged",
    "open_plaintext",
    "open_unchanged",
    "read_chunk",
    "read_plaintext",
    "scratch_buffers",
    "scrub",
    "stage_bytes",
    "stage_cpu",
    "stage_plaintext_cpu",
]

#: The host buffer staging returns: one-dimensional, C-contiguous ``uint8``.
Buffer = npt.NDArray[np.uint8]


def scrub(buf: Buffer) -> None:
    """Zero a staged buffer in place (what every staging API does on exit)."""
    buf.fill(0)


def _destination(length: int, out: Buffer | None, arena: HostArena | None) -> Buffer:
    if out is None:
        # Zeros either way: memory of the caller's own (huge pages advised) or lent by the
        # caller's arena. On success every byte is written by a verified chunk; every
        # failure path zeroes the whole buffer (owned=True).
        return owned_array(length) if arena is None else arena.array(length)
    if (
        out.dtype != np.uint8
        or out.ndim != 1
        or out.size != length
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        raise ValueError(f"out must be a writable, contiguous uint8 array of {length} bytes")
    return out


def _decrypt_all(
    header: Header,
    decrypt: Callable[[int, int, memoryview], None],
    dst: Buffer,
    *,
    threads: int,
    progress: ProgressCallback | None,
    owned: bool,
) -> None:
    """Verify every chunk into ``dst``; on failure zero all unverified bytes and raise.

    ``decrypt(index, slot, out)`` leaves chunk ``index``'s verified plaintext in ``out``
    (its place in ``dst``) or raises; ``slot`` names the worker's scratch memory, which no
    other chunk uses meanwhile (:func:`~staging._pipeline.run_chunks`). Progress is
    reported in chunk order. When chunks fail, the lowest one's error is raised once the
    chunks in flight have finished, with ``dst`` zero from that chunk on (entirely if
    ``owned``: staging allocated it). Anything else raised (an interrupt, a failing
    ``progress``) zeroes all of ``dst``.
    """
    size = header.chunk_size
    view = dst.data.cast("B")

    def work(index: int, slot: int) -> None:
        decrypt(index, slot, view[index * size : index * size + header.chunk_length(index)])

    try:
        run_chunks(
            header.chunk_count, work, threads=threads, on_done=chunk_progress(header, progress)
        )
    except ChunkFailure as failure:
        # Every chunk below failure.index verified; nothing from there on is trusted.
        dst[0 if owned else failure.index * size :] = 0
        raise failure.cause from None
    except BaseException:
        dst[:] = 0
        raise
    finally:
        view.release()


def open_unchanged(dataset: SealedDataset) -> int:
    """Open the dataset's file again and check it is still the file :func:`open_sealed` read
    (same size, same header, tag and wrap section); the caller closes the descriptor.

    Raises:
        StagingIOError: the file cannot be opened or read.
        MalformedDatasetError: it changed since it was opened.
    """
    try:
        fd = os.open(dataset.path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise io_error("read", dataset.path, exc) from None
    try:
        size = os.fstat(fd).st_size
        prefix = os.pread(fd, len(dataset.prefix), 0)
    except OSError as exc:
        os.close(fd)
        raise io_error("read", dataset.path, exc) from None
    if size != dataset.header.file_size or prefix != dataset.prefix:
        os.close(fd)
        raise MalformedDatasetError(f"{dataset.path} changed after it was opened")
    return fd


def read_chunk(dataset: SealedDataset, fd: int, index: int, buf: memoryview) -> None:
    """Read ``ct_i || tag_i`` of chunk ``index`` into ``buf`` (private memory).

    Raises:
        StagingIOError: the read failed.
        MalformedDatasetError: the file ended early.
    """
    try:
        read_exact(fd, buf, dataset.header.chunk_offset(index))
    except OSError as exc:
        raise io_error("read", dataset.path, exc) from None


def chunk_progress(
    header: Header, progress: ProgressCallback | None
) -> Callable[[int], None] | None:
    """``run_chunks``' ``on_done`` that reports ``progress(done_bytes, total_bytes)``."""
    if progress is None:
        return None
    report = progress
    total, size = header.plaintext_length, header.chunk_size

    def on_done(index: int) -> None:
        report(min(total, (index + 1) * size), total)

    return on_done


def scratch_buffers(
    header: Header, slots: int, arena: HostArena | None, *, sealed: bool = True
) -> list[memoryview]:
    """One buffer per worker of ``chunk size + 16`` bytes (``sealed``: a chunk's
    ``ct || tag``) or of ``chunk size`` (a chunk's plaintext); the caller zeroes them at
    the end.

    Lent by ``arena`` (its pages reused from call to call: a fresh page costs a fault and
    the kernel's clearing on first touch), else the call's own (huge pages advised).
    """
    length = min(header.chunk_size, header.plaintext_length) + (TAG_SIZE if sealed else 0)
    if arena is None:
        return [owned_view(length) for _ in range(slots)]
    return [arena.view(length) for _ in range(slots)]


def stage_cpu(
    dataset: SealedDataset,
    dataset_key: bytes,
    *,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    out: Buffer | None = None,
    arena: HostArena | None = None,
) -> Buffer:
    """Decrypt and verify a sealed dataset into host memory.

    Args:
        dataset: from :func:`open_sealed`.
        dataset_key: the unwrapped dataset key.
        threads: worker threads (default ``os.cpu_count()``).
        progress: ``progress(done_bytes, total_bytes)`` as chunks verify, in order.
        out: a destination to fill (e.g. pinned memory); by default a new array that
            the caller owns outright (or one lent by ``arena``).
        arena: a :class:`~staging.arena.HostArena` to lend the result (unless ``out``) and
            the per-thread chunk buffers; by default they are the call's own.

    Returns:
        The plaintext, every byte of it verified.

    Raises:
        HeaderAuthenticationError: wrong key or altered header (nothing decrypted).
        ChunkAuthenticationError: a chunk failed; it and every byte after it are zero in
            ``out`` (a buffer staging allocated itself is zeroed entirely).
        MalformedDatasetError: the file changed since it was opened.
        StagingIOError: the file cannot be read.
    """
    if dataset.source is not None:
        from gpucc.core.errors import UsageError

        raise UsageError(
            f"{dataset.name} is read from a store or a stream: stage it with staging.stage "
            "or staging.plan_stage"
        )
    threads = threads or default_threads()
    header = dataset.header
    cipher = dataset.check_key(dataset_key)
    dst = _destination(header.plaintext_length, out, arena)
    try:
        fd = open_unchanged(dataset)
    except BaseException:
        dst[:] = 0
        raise
    try:
        slots = scratch_buffers(header, window_for(threads, header.chunk_count), arena)

        def decrypt(index: int, slot: int, plain: memoryview) -> None:
            sealed = slots[slot][: len(plain) + TAG_SIZE]
            read_chunk(dataset, fd, index, sealed)
            cipher.decrypt_into(index, sealed, plain)

        try:
            _decrypt_all(
                header, decrypt, dst, threads=threads, progress=progress, owned=out is None
            )
        finally:
            for buf in slots:  # ciphertext only, but nothing of the call outlives it
                zero(buf)
    finally:
        os.close(fd)
    return dst


def stage_bytes(
    data: bytes | bytearray | memoryview,
    dataset_key: bytes,
    *,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    out: Buffer | None = None,
    arena: HostArena | None = None,
) -> Buffer:
    """Decrypt and verify a sealed dataset held in memory (e.g. from ``seal_bytes``).

    Chunks are decrypted straight from ``data``, without a copy, so ``data`` must be private
    memory that nothing else writes while staging runs (not a shared mapping of a file).
    The same checks, the same zeroing and the same ``out`` and ``arena`` as :func:`stage_cpu`.

    Raises:
        MalformedDatasetError: bad framing or a length that does not match the header.
        HeaderAuthenticationError: wrong key or altered header (nothing decrypted).
        ChunkAuthenticationError: a chunk failed (see :func:`stage_cpu` for what is zeroed).
    """
    threads = threads or default_threads()
    view = memoryview(data).cast("B")
    if len(view) < PREFIX_SIZE:
        raise MalformedDatasetError(f"sealed data is {len(view)} bytes, too short")
    header = Header.parse(bytes(view[:HEADER_SIZE]))
    wrap_end = PREFIX_SIZE + header.wrap_length
    if len(view) < wrap_end:
        raise MalformedDatasetError("sealed data ends inside its wrap section")
    parse_wrap_section(bytes(view[PREFIX_SIZE:wrap_end]))
    if len(view) != header.file_size:
        raise MalformedDatasetError(
            f"sealed data is {len(view)} bytes but its header describes {header.file_size}"
        )
    cipher = ChunkCipher(dataset_key, header)
    cipher.verify_header(bytes(view[HEADER_SIZE:PREFIX_SIZE]))
    dst = _destination(header.plaintext_length, out, arena)

    def decrypt(index: int, _slot: int, plain: memoryview) -> None:
        start = header.chunk_offset(index)
        cipher.decrypt_into(index, view[start : start + len(plain) + TAG_SIZE], plain)

    _decrypt_all(header, decrypt, dst, threads=threads, progress=progress, owned=out is None)
    return dst


def stage_plaintext_cpu(
    path: StrPath,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    out: Buffer | None = None,
    arena: HostArena | None = None,
) -> Buffer:
    """Stage a plaintext file the way confidential computing moves it: sealed in transit.

    A fresh random dataset key is made for this call only. Each chunk is read, encrypted on
    the host exactly as the sealed format prescribes (the bounce-buffer model: the host
    encrypts, the device decrypts), then decrypted and verified into the destination with
    the same code that stages a sealed file. On the CPU this is a round trip; on the GPU the
    second half runs on the device. ``out`` and ``arena`` as in :func:`stage_cpu`.

    Raises:
        MalformedInputError: ``path`` is not a regular file or changed size.
        ChunkAuthenticationError: a chunk did not verify (memory corruption).
        StagingIOError: the file cannot be read.
    """
    threads = threads or default_threads()
    fd, header = open_plaintext(path, chunk_size)
    try:
        cipher = ChunkCipher(new_dataset_key(), header)
        dst = _destination(header.plaintext_length, out, arena)
        window = window_for(threads, header.chunk_count)
        sealed = scratch_buffers(header, window, arena)
        read = scratch_buffers(header, window, arena, sealed=False)

        def decrypt(index: int, slot: int, plain: memoryview) -> None:
            # Read into the slot's plaintext buffer, encrypt into its sealed one, and decrypt
            # from there into the destination: AES-GCM never works in place, and the
            # destination holds only what decrypt_into verified. The plaintext is read once
            # into memory that is zeroed at the end.
            length = len(plain)
            pt, ct = read[slot][:length], sealed[slot][: length + TAG_SIZE]
            read_plaintext(fd, path, index * chunk_size, pt)
            cipher.encrypt_into(index, pt, ct)
            cipher.decrypt_into(index, ct, plain)

        try:
            _decrypt_all(
                header, decrypt, dst, threads=threads, progress=progress, owned=out is None
            )
        finally:
            for buf in sealed + read:
                zero(buf)
        try:
            check_plaintext_unchanged(fd, path, header)
        except BaseException:  # a changed file, an unreadable one, an interrupt: keep nothing
            dst[:] = 0
            raise
    finally:
        os.close(fd)
    return dst


def open_plaintext(path: StrPath, chunk_size: int) -> tuple[int, Header]:
    """Open a plaintext file to seal in transit and frame it (the caller closes the
    descriptor).

    Raises:
        StagingIOError: the file cannot be opened.
        MalformedInputError: it is not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise io_error("read", path, exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise MalformedInputError(f"{path} is not a regular file")
        return fd, Header.new(st.st_size, chunk_size=chunk_size)
    except BaseException:
        os.close(fd)
        raise


def read_plaintext(fd: int, path: StrPath, offset: int, buf: memoryview) -> None:
    """Fill ``buf`` from a plaintext file being sealed in transit.

    Raises:
        MalformedInputError: the file shrank.
        StagingIOError: the read failed.
    """
    try:
        read_exact(fd, buf, offset)
    except MalformedDatasetError:
        raise MalformedInputError(f"{path} shrank while it was staged") from None
    except OSError as exc:
        raise io_error("read", path, exc) from None


def check_plaintext_unchanged(fd: int, path: StrPath, header: Header) -> None:
    """Raises MalformedInputError if the file's size is no longer the one it was framed at,
    StagingIOError if it cannot be looked at."""
    try:
        size = os.fstat(fd).st_size
    except OSError as exc:
        raise io_error("examine", path, exc) from None
    if size != header.plaintext_length:
        raise MalformedInputError(f"{path} changed size while it was staged")
