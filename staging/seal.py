"""Sealing: plaintext in, a sealed dataset (``docs/FORMAT.md``) out.

:func:`seal_file` streams the source through a bounded window of chunk buffers (two per
thread), encrypts chunks in parallel with ``AESGCM.encrypt_into`` into those preallocated
buffers, and writes each chunk at its fixed offset in a temporary file beside the
destination. Only a complete, flushed file gets the destination's name, exclusively unless
asked to replace (:func:`gpuattest.files.exclusive_output`); on any error or signal the
temporary file is removed, so a half-written dataset never exists under its name.

Memory: :func:`seal_bytes` returns memory the caller owns outright unless given ``out=`` or
``arena=`` (a :class:`~staging.arena.HostArena`, which lends it and reuses its pages once it
comes back); :func:`seal_file`'s chunk buffers are the call's own, or lent by ``arena``, and
the ones that held plaintext are zeroed before it returns.
"""

from __future__ import annotations

import errno
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from gpucc.core.errors import MalformedInputError
from gpucc.core.files import (
    exclusive_output,
    open_regular,
    refuse_inputs_as_output,
    write_all,
)

from ._pipeline import ChunkFailure, run_chunks, window_for
from .arena import HostArena, owned_view
from .chunks import ChunkCipher, zero
from .dataset import SealedDataset, io_error, open_sealed, read_exact
from .format import (
    DEFAULT_CHUNK_SIZE,
    KEY_SIZE,
    NONCE_SIZE,
    TAG_SIZE,
    Header,
    StrPath,
    WrapKind,
    WrapRecord,
    key_id,
    new_dataset_key,
    wrap_key,
)

__all__ = [
    "ProgressCallback",
    "SealResult",
    "WrapSpec",
    "default_threads",
    "plan_seal",
    "rewrap",
    "seal_bytes",
    "seal_chunks",
    "seal_file",
]

#: ``progress(done_bytes, total_bytes)``, called in the calling thread as chunks complete.
ProgressCallback = Callable[[int, int], None]


def default_threads() -> int:
    """``os.cpu_count()``, at least 1."""
    return os.cpu_count() or 1


@dataclass(frozen=True)
class WrapSpec:
    """Who a newly sealed dataset's key is wrapped for.

    Use :meth:`key_file` or :meth:`session` rather than the constructor.
    """

    kind: WrapKind
    kek: bytes = field(repr=False)
    context: bytes

    @classmethod
    def key_file(cls, kek: bytes) -> WrapSpec:
        """Wrap for a key file's key (record kind 1, context = its key id)."""
        if len(kek) != KEY_SIZE:
            raise ValueError("a key-file key is 32 bytes")
        return cls(kind=WrapKind.KEY_FILE, kek=kek, context=key_id(kek))

    @classmethod
    def session(cls, session_key: bytes, transcript_hash: bytes) -> WrapSpec:
        """Wrap for an attested session (record kind 2, context = transcript hash)."""
        if len(session_key) != KEY_SIZE or len(transcript_hash) != 48:
            raise ValueError("a session key is 32 bytes and a transcript hash 48")
        return cls(kind=WrapKind.SESSION, kek=session_key, context=transcript_hash)

    @property
    def record_length(self) -> int:
        """Bytes the wrap record takes in a file's wrap section."""
        return 4 + len(self.context) + NONCE_SIZE + KEY_SIZE + TAG_SIZE

    def wrap(
        self, dataset_key: bytes, header_digest: bytes, *, wrap_nonce: bytes | None = None
    ) -> WrapRecord:
        """The wrap record of ``dataset_key`` for this recipient and dataset."""
        return wrap_key(
            self.kek, dataset_key, header_digest, self.kind, self.context, wrap_nonce=wrap_nonce
        )


@dataclass(frozen=True)
class SealResult:
    """What sealing produced.

    Attributes:
        header: the dataset's header.
        header_tag: its tag.
        wrap: the wrap record embedded in the file, if any.
        dataset_key: the dataset key (keep it secret; it is not in the repr).
        seconds: wall time spent.
    """

    header: Header
    header_tag: bytes
    wrap: WrapRecord | None
    dataset_key: bytes = field(repr=False)
    seconds: float

    #: the schema of :meth:`to_dict`'s document
    SCHEMA: ClassVar[str] = "gpucc.seal/v1"

    def to_dict(
        self, src: StrPath, dst: StrPath, *, key_id: bytes, seconds: float | None = None
    ) -> dict[str, Any]:
        """The ``gpucc.seal/v1`` document (``gpucc seal -f json``): ``src`` sealed into
        ``dst`` for the key-file key of id ``key_id``, in ``seconds`` (this result's own
        time when not given)."""
        seconds = self.seconds if seconds is None else seconds
        header = self.header
        return {
            "schema": self.SCHEMA,
            "input": str(src),
            "output": str(dst),
            "dataset_id": header.dataset_id.hex(),
            "bytes": header.plaintext_length,
            "sealed_bytes": header.file_size,
            "chunks": header.chunk_count,
            "chunk_size": header.chunk_size,
            "key_id": key_id.hex(),
            "seconds": round(seconds, 6),
            "gb_per_s": round(header.plaintext_length / seconds / 1e9, 3) if seconds > 0 else None,
        }


def plan_seal(
    plaintext_length: int,
    *,
    kek: bytes | None,
    wrap: WrapSpec | None,
    dataset_key: bytes | None,
    chunk_size: int,
    dataset_id: bytes | None,
) -> tuple[Header, bytes, WrapRecord | None]:
    """Header, dataset key and wrap record of a dataset about to be sealed.

    The one place that decides them, for sealing on the CPU and on the GPU alike.

    Raises:
        ValueError: inconsistent key arguments, or a dataset key that is not 32 bytes.
        MalformedDatasetError: a chunk size the format does not allow.
    """
    if kek is not None and wrap is not None:
        raise ValueError("give either kek or wrap, not both")
    spec = WrapSpec.key_file(kek) if kek is not None else wrap
    if spec is None and dataset_key is None:
        raise ValueError("without kek or wrap, pass the dataset_key to use (or nobody can open it)")
    key = new_dataset_key() if dataset_key is None else dataset_key
    if len(key) != KEY_SIZE:
        raise ValueError("a dataset key is 32 bytes")
    header = Header(
        chunk_size=chunk_size,
        dataset_id=secrets.token_bytes(16) if dataset_id is None else dataset_id,
        plaintext_length=plaintext_length,
        wrap_length=0 if spec is None else spec.record_length,
    )
    record = None if spec is None else spec.wrap(key, header.digest)
    return header, key, record


def _prefix(cipher: ChunkCipher, record: WrapRecord | None) -> tuple[bytes, bytes]:
    tag = cipher.header_tag()
    wrap_bytes = b"" if record is None else record.to_bytes()
    return tag, cipher.header.to_bytes() + tag + wrap_bytes


def seal_bytes(
    data: bytes | bytearray | memoryview,
    *,
    kek: bytes | None = None,
    wrap: WrapSpec | None = None,
    dataset_key: bytes | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    threads: int | None = None,
    dataset_id: bytes | None = None,
    out: bytearray | memoryview | None = None,
    arena: HostArena | None = None,
) -> memoryview:
    """Seal an in-memory plaintext and return the sealed dataset, as a writable view.

    Exactly the format :func:`seal_file` writes. Pass ``kek`` (a key-file key), ``wrap`` (a
    :class:`WrapSpec`), or only ``dataset_key`` for a dataset without a wrap record.
    ``dataset_id`` is random unless given (tests only). Where the result lives:

    * ``out``: exactly :func:`~staging.format.sealed_size` writable bytes of the caller's;
      it is filled and a view of it is returned;
    * ``arena``: a buffer lent by the caller's :class:`~staging.arena.HostArena`; when the
      view and every slice of it are gone the arena zeroes it and lends its pages again
      (no fresh pages for the next call), and closing the arena zeroes it in any case;
    * neither: memory the caller owns outright (a large result is a mapping of its own,
      huge pages advised), which nothing else in the process reuses; it is freed with the
      view's last slice.

    The view compares and slices like ``bytes``; ``bytes(view)`` makes a copy.
    """
    src = memoryview(data).cast("B")
    header, key, record = plan_seal(
        len(src),
        kek=kek,
        wrap=wrap,
        dataset_key=dataset_key,
        chunk_size=chunk_size,
        dataset_id=dataset_id,
    )
    cipher = ChunkCipher(key, header)
    _, prefix = _prefix(cipher, record)
    if header.chunk_offset(0) != len(prefix):  # pragma: no cover - format invariant
        raise AssertionError("the prefix and the chunks must cover the sealed dataset")
    if out is None:
        # Zeros from the kernel or the arena, without a zero-fill pass of its own; the
        # prefix and the chunks below write every byte.
        result = owned_view(header.file_size) if arena is None else arena.view(header.file_size)
    else:
        result = memoryview(out).cast("B")
        if len(result) != header.file_size or result.readonly:
            raise ValueError(f"out must be {header.file_size} writable bytes")
    result[: len(prefix)] = prefix
    view = result[:]
    size = header.chunk_size

    def work(index: int, _slot: int) -> None:
        length = header.chunk_length(index)
        start = header.chunk_offset(index)
        cipher.encrypt_into(
            index,
            src[index * size : index * size + length],
            view[start : start + length + TAG_SIZE],
        )

    try:
        run_chunks(header.chunk_count, work, threads=threads or default_threads())
    except ChunkFailure as failure:
        raise failure.cause from None
    finally:
        view.release()
    return result


def seal_file(
    src: StrPath,
    dst: StrPath,
    *,
    kek: bytes | None = None,
    wrap: WrapSpec | None = None,
    dataset_key: bytes | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    force: bool = False,
    arena: HostArena | None = None,
) -> SealResult:
    """Seal the regular file ``src`` into ``dst``, atomically.

    Args:
        src: plaintext file (its size must not change while it is sealed).
        dst: destination, created only once the new file is complete and flushed; an
            existing file is replaced only with ``force``, and never when it is ``src``.
        kek: wrap the dataset key for this key-file key (record kind 1), or
        wrap: wrap it for another recipient, or neither with
        dataset_key: the dataset key to use (random by default).
        chunk_size: plaintext bytes per chunk (default 4 MiB, see ``DEFAULT_CHUNK_SIZE``).
        threads: worker threads (default ``os.cpu_count()``).
        progress: ``progress(done_bytes, total_bytes)`` as chunks complete.
        force: replace an existing ``dst`` (atomically).
        arena: a :class:`~staging.arena.HostArena` to lend the per-thread chunk buffers
            (by default they are the call's own); either way the ones that held
            plaintext are zeroed before the call returns.

    Raises:
        OutputExistsError: ``dst`` exists (without ``force``) or is ``src``.
        MalformedDatasetError: ``chunk_size`` is out of range.
        MalformedInputError: ``src`` is not a regular file or changed size while sealing.
        StagingIOError: a file cannot be read or written (nothing is left at ``dst``).
    """
    started = time.perf_counter()
    src = Path(src)
    dst = Path(dst)
    threads = threads or default_threads()
    src_fd = open_regular(src, what="plaintext file")
    try:
        refuse_inputs_as_output(dst, [src])
        st = os.fstat(src_fd)
        header, key, record = plan_seal(
            st.st_size,
            kek=kek,
            wrap=wrap,
            dataset_key=dataset_key,
            chunk_size=chunk_size,
            dataset_id=None,
        )
        cipher = ChunkCipher(key, header)
        tag, prefix = _prefix(cipher, record)
        _write_sealed(src_fd, src, dst, cipher, prefix, threads, progress, force, arena)
    finally:
        os.close(src_fd)
    return SealResult(
        header=header,
        header_tag=tag,
        wrap=record,
        dataset_key=key,
        seconds=time.perf_counter() - started,
    )


def _write_sealed(
    src_fd: int,
    src: Path,
    dst: Path,
    cipher: ChunkCipher,
    prefix: bytes,
    threads: int,
    progress: ProgressCallback | None,
    force: bool,
    arena: HostArena | None,
) -> None:
    header = cipher.header
    with exclusive_output(dst, mode=0o644, force=force, what="sealed dataset") as out_fd:
        try:
            _reserve(out_fd, header.file_size)
            os.pwrite(out_fd, prefix, 0)
        except OSError as exc:
            raise io_error("write", dst, exc) from None
        seal_chunks(
            src_fd, src, out_fd, dst, cipher, threads=threads, progress=progress, arena=arena
        )
        try:
            if os.fstat(src_fd).st_size != header.plaintext_length:
                raise MalformedInputError(f"{src} changed size while it was being sealed")
        except OSError as exc:
            raise io_error("read", src, exc) from None


def seal_chunks(
    src_fd: int,
    src: Path,
    out_fd: int,
    dst: Path,
    cipher: ChunkCipher,
    *,
    start: int = 0,
    threads: int,
    progress: ProgressCallback | None,
    arena: HostArena | None,
) -> None:
    """The sealing loop: every chunk of ``cipher.header`` read from ``src_fd`` (its plaintext
    at ``start`` on), encrypted and written at its place in ``out_fd``, ``threads`` at a time.

    Chunk buffers are lent by ``arena`` (else allocated) and the plaintext copies are zeroed
    however the loop ends. ``progress(done, total)`` counts this dataset's plaintext bytes.
    A whole file and each shard of a set are sealed by this one loop.

    Raises:
        MalformedInputError: ``src`` ended before a chunk (it shrank while it was sealed).
        StagingIOError: reading ``src`` or writing ``dst`` failed.
    """
    header = cipher.header
    size = header.chunk_size
    slots = window_for(threads, header.chunk_count)
    first = min(size, header.plaintext_length)
    plain = slot_buffers(first, slots, arena)
    sealed = slot_buffers(first + TAG_SIZE, slots, arena)
    total = header.plaintext_length

    def work(index: int, slot: int) -> None:
        length = header.chunk_length(index)
        pt = plain[slot][:length]
        ct = sealed[slot][: length + TAG_SIZE]
        try:
            read_exact(src_fd, pt, start + index * size)
        except OSError as exc:
            raise io_error("read", src, exc) from None
        cipher.encrypt_into(index, pt, ct)
        try:
            write_all(out_fd, ct, header.chunk_offset(index))
        except OSError as exc:
            raise io_error("write", dst, exc) from None

    def on_done(index: int) -> None:
        if progress is not None:
            progress(min(total, (index + 1) * size), total)

    try:
        run_chunks(header.chunk_count, work, threads=threads, on_done=on_done)
    except ChunkFailure as failure:
        if isinstance(failure.cause, MalformedInputError):
            raise MalformedInputError(f"{src} shrank while it was being sealed") from None
        raise failure.cause from None
    finally:
        for buf in plain:  # plaintext copies: do not leave them to the allocator
            zero(buf)


def slot_buffers(length: int, count: int, arena: HostArena | None) -> list[memoryview]:
    """``count`` chunk buffers of ``length`` bytes: lent by ``arena``, else the caller's own
    (ordinary ``bytearray`` memory: a handful of chunks, made once per call)."""
    if arena is None:
        return [memoryview(bytearray(length)) for _ in range(count)]
    return [arena.view(length) for _ in range(count)]


def _reserve(fd: int, size: int) -> None:
    """Allocate the output up front (early ENOSPC); fall back to setting the size."""
    if size and hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, size)
            return
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # the filesystem cannot
                raise
    os.ftruncate(fd, size)


def rewrap(
    dataset: SealedDataset | StrPath,
    *,
    kek: bytes,
    to: WrapSpec,
    wrap_nonce: bytes | None = None,
) -> WrapRecord:
    """A new wrap record for ``to`` from a dataset sealed for the key-file key ``kek``.

    The chunks are not read or changed: the record goes into a session answer (or any other
    carrier). ``wrap_nonce`` is random unless given (known-answer tests only).

    Raises:
        MalformedDatasetError: the file is not a valid sealed dataset.
        KeyUnwrapError: ``kek`` does not open the dataset's wrap record.
        HeaderAuthenticationError: the header does not verify under the unwrapped key.
    """
    sealed = dataset if isinstance(dataset, SealedDataset) else open_sealed(dataset)
    dataset_key = sealed.unwrap(kek)
    return to.wrap(dataset_key, sealed.header_digest, wrap_nonce=wrap_nonce)
