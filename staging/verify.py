"""Verifying a dataset on the CPU without holding it: every chunk authenticated, none kept.

What ``gpucc stage`` does on the CPU when nothing else needs the plaintext (no model
manifest to hash it against). Each worker thread owns two buffers: one of ``ct_i || tag_i``,
which the chunk is read into, and one of plaintext, which it is decrypted and authenticated
into. Input and output never overlap: AES-GCM is never asked to work in place (cryptography
51 and later refuse it). So the memory used is ``threads x (2 x chunk size + 16)`` whatever
the dataset's size, no fresh page of memory is needed (a fresh page costs the kernel's
clearing, about as much as AES-GCM itself on a small machine), and the plaintext stays in
buffers reused chunk after chunk instead of going out to fresh memory. Every buffer is
zeroed when the call ends, on success and failure alike. The buffers are the call's own, or
lent by the caller's :class:`~staging.arena.HostArena` (``arena=``), which keeps their pages
mapped for the next call.

Reading goes through the same private-copy ``pread`` as :func:`staging.cpu.stage_cpu`, for
the same reasons (see there): the file is never memory-mapped.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._pipeline import ChunkFailure, run_chunks, window_for
from .arena import HostArena
from .chunks import ChunkCipher, zero
from .cpu import (
    check_plaintext_unchanged,
    chunk_progress,
    open_plaintext,
    open_unchanged,
    read_chunk,
    read_plaintext,
    scratch_buffers,
)
from .dataset import SealedDataset
from .format import DEFAULT_CHUNK_SIZE, TAG_SIZE, Header, StrPath, new_dataset_key
from .seal import ProgressCallback, default_threads

__all__ = ["Verified", "verify_cpu", "verify_plaintext_cpu"]


@dataclass(frozen=True)
class Verified:
    """What a verification found: every one of ``chunk_count`` chunks authenticated.

    Attributes:
        plaintext_length: bytes of plaintext authenticated.
        chunk_count: chunks authenticated.
        held_bytes: the most plaintext held in memory at once.
        scrubbed: every buffer that held plaintext read back as zeros at the end.
    """

    plaintext_length: int
    chunk_count: int
    held_bytes: int
    scrubbed: bool


def _verify_chunks(
    header: Header,
    threads: int,
    progress: ProgressCallback | None,
    work: Callable[[int, memoryview, memoryview], None],
    arena: HostArena | None,
    *,
    read: bool = True,
) -> Verified:
    """Run ``work(index, sealed, plain)`` for every chunk in a window of zeroed-at-the-end
    buffers.

    ``sealed`` (``chunk length + 16`` bytes, to read ``ct || tag`` into; empty unless
    ``read``) and ``plain`` (``chunk length`` bytes) are the slot's two buffers, which never
    overlap; ``work`` leaves the chunk's verified plaintext in ``plain`` or raises.
    """
    window = window_for(threads, header.chunk_count)
    sealed = scratch_buffers(header, window, arena) if read else []
    plains = scratch_buffers(header, window, arena, sealed=False)
    slots = sealed + plains
    nothing = memoryview(bytearray())

    def one(index: int, slot: int) -> None:
        length = header.chunk_length(index)
        ct = sealed[slot][: length + TAG_SIZE] if read else nothing
        work(index, ct, plains[slot][:length])

    try:
        run_chunks(
            header.chunk_count, one, threads=threads, on_done=chunk_progress(header, progress)
        )
    except ChunkFailure as failure:
        raise failure.cause from None
    finally:
        for buf in slots:
            zero(buf)
    return Verified(
        plaintext_length=header.plaintext_length,
        chunk_count=header.chunk_count,
        held_bytes=len(plains) * len(plains[0]),
        scrubbed=not any(bool(np.frombuffer(buf, dtype=np.uint8).any()) for buf in slots),
    )


def verify_cpu(
    dataset: SealedDataset,
    dataset_key: bytes,
    *,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    arena: HostArena | None = None,
) -> Verified:
    """Authenticate every chunk of a sealed dataset, keeping none of its plaintext.

    The same checks, in the same order, as :func:`staging.cpu.stage_cpu`: the header tag
    under the key, the file unchanged since it was opened, then every chunk (its content,
    position and dataset). ``progress(done_bytes, total_bytes)`` as chunks verify, in order.
    ``arena`` lends the per-thread buffers (by default they are the call's own).

    Raises:
        HeaderAuthenticationError: wrong key or altered header (nothing decrypted).
        ChunkAuthenticationError: the lowest-index chunk that failed.
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
    cipher = dataset.check_key(dataset_key)
    fd = open_unchanged(dataset)

    def work(index: int, sealed: memoryview, plain: memoryview) -> None:
        read_chunk(dataset, fd, index, sealed)
        cipher.decrypt_into(index, sealed, plain)

    try:
        return _verify_chunks(dataset.header, threads, progress, work, arena)
    finally:
        os.close(fd)


def verify_plaintext_cpu(
    path: StrPath,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    arena: HostArena | None = None,
) -> Verified:
    """Seal a plaintext file in transit under a fresh key and authenticate every chunk.

    The round trip :func:`staging.cpu.stage_plaintext_cpu` makes (read, encrypt as the
    format prescribes, decrypt and verify), chunk by chunk in each worker's two buffers
    (read into the plaintext one, encrypt into the sealed one, decrypt back), keeping nothing.
    ``arena`` as in :func:`verify_cpu`.

    Raises:
        MalformedInputError: ``path`` is not a regular file, or changed size.
        ChunkAuthenticationError: a chunk did not verify (memory corruption).
        StagingIOError: the file cannot be read.
    """
    threads = threads or default_threads()
    fd, header = open_plaintext(path, chunk_size)
    try:
        cipher = ChunkCipher(new_dataset_key(), header)

        def work(index: int, sealed: memoryview, plain: memoryview) -> None:
            read_plaintext(fd, path, index * chunk_size, plain)
            cipher.encrypt_into(index, plain, sealed)
            cipher.decrypt_into(index, sealed, plain)

        verified = _verify_chunks(header, threads, progress, work, arena)
        check_plaintext_unchanged(fd, path, header)
        return verified
    finally:
        os.close(fd)
