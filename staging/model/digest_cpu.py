"""Hashing model resources on the CPU: SHA-256 (hashlib) and BLAKE3 (the ``blake3`` package).

Resources are hashed in parallel on a thread pool (both libraries release the GIL while they
hash large buffers). Every file is opened without following links, checked against what the
walk saw (same inode, size and modification time) before and after it is read; a file that
moved in between raises :class:`ModelChangedError`, so a verdict is never given on bytes that
were not stable.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Protocol

from .errors import HashUnavailableError, ModelChangedError, ModelTreeError
from .serialize import FileEntry, Item

__all__ = ["BLAKE3_READ_SIZE", "READ_SIZE", "default_threads", "hash_items", "new_hasher"]

READ_SIZE = 1024 * 1024  # SHA-256: fits in L2 between the copy and the hash
BLAKE3_READ_SIZE = 16 * 1024 * 1024  # BLAKE3: enough per update for its threads to share


class Hasher(Protocol):
    def update(self, data: Any, /) -> object: ...

    def digest(self) -> bytes: ...


def default_threads() -> int:
    """One worker per CPU this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def new_hasher(hash_type: str, *, threads: int = 1) -> Hasher:
    """A fresh streaming hasher.

    Raises:
        HashUnavailableError: BLAKE3 without the ``blake3`` package.
    """
    if hash_type == "sha256":
        return hashlib.sha256()
    if hash_type == "blake3":
        try:
            import blake3
        except ImportError:
            raise HashUnavailableError("BLAKE3 needs the blake3 package") from None
        h: Hasher = blake3.blake3(max_threads=threads if threads > 1 else 1)
        return h
    raise ValueError(f"unsupported hash {hash_type}")


def _check_same(entry: FileEntry, st: os.stat_result, when: str) -> None:
    if (st.st_dev, st.st_ino) != (entry.dev, entry.ino) or not stat.S_ISREG(st.st_mode):
        raise ModelChangedError(f"{entry.name} was replaced {when} it was hashed")
    if st.st_size != entry.size or st.st_mtime_ns != entry.mtime_ns:
        raise ModelChangedError(
            f"{entry.name} changed {when} it was hashed (size or modification time moved)"
        )


def open_checked(entry: FileEntry) -> int:
    """Open ``entry`` read-only without following a link; it must still be what the walk saw.

    Raises:
        ModelTreeError: it cannot be opened.
        ModelChangedError: it is no longer the same file, size or modification time.
    """
    flags = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(entry.path, flags)
    except OSError as exc:
        raise ModelTreeError(f"cannot open {entry.name}: {exc.strerror}") from None
    try:
        _check_same(entry, os.fstat(fd), "before")
    except BaseException:
        os.close(fd)
        raise
    return fd


def hash_range(
    fd: int, entry: FileEntry, start: int, end: int, hasher: Hasher, buf: memoryview
) -> None:
    """Feed bytes ``[start, end)`` of ``fd`` to ``hasher`` through ``buf``."""
    pos = start
    while pos < end:
        want = min(len(buf), end - pos)
        try:
            n = os.preadv(fd, [buf[:want]], pos)
        except OSError as exc:
            raise ModelTreeError(f"cannot read {entry.name}: {exc.strerror}") from None
        if n == 0:
            raise ModelChangedError(f"{entry.name} became shorter while it was hashed")
        hasher.update(buf[:n])
        pos += n


def _hash_item(item: Item, hash_type: str, inner_threads: int, buf: memoryview) -> bytes:
    hasher = new_hasher(hash_type, threads=inner_threads)
    fd = open_checked(item.entry)
    try:
        hash_range(fd, item.entry, item.start, item.end, hasher, buf)
        _check_same(item.entry, os.fstat(fd), "while")
    finally:
        os.close(fd)
    return hasher.digest()


def hash_items(
    items: Sequence[Item],
    hash_type: str,
    *,
    threads: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[bytes]:
    """Digest of every item, in order, on ``threads`` workers (default: all CPUs).

    ``progress(nbytes)`` is called after each item. BLAKE3 items (whole files) also use the
    package's own threads when there are fewer files than workers.

    Raises:
        ModelTreeError, ModelChangedError, HashUnavailableError: see the module docstring.
    """
    workers = threads or default_threads()
    if hash_type == "blake3":
        new_hasher("blake3")  # fail before any work when the package is missing
    # BLAKE3 hashes whole files: spread the workers over files, and give each file the
    # package's own threads only when there are fewer files than workers (one big file).
    inner = max(1, workers // max(1, len(items))) if hash_type == "blake3" else 1
    local = threading.local()

    def work(item: Item) -> bytes:
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = memoryview(bytearray(BLAKE3_READ_SIZE if inner > 1 else READ_SIZE))
            local.buf = buf
        digest = _hash_item(item, hash_type, inner, buf)
        if progress is not None:
            progress(item.length)
        return digest

    if workers == 1 or len(items) <= 1:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        futures = [pool.submit(work, item) for item in items]
        wait(futures, return_when=FIRST_EXCEPTION)
        for fut in futures:
            if fut.done() and fut.exception() is not None:
                for other in futures:
                    other.cancel()
                raise fut.exception()  # type: ignore[misc]
        return [fut.result() for fut in futures]
