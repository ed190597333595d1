"""Host memory that holds plaintext: owned by the caller, or lent by an arena the caller closes.

A staging or sealing call gets its host memory one of two ways:

* **By default** (no ``arena``) it returns memory the caller owns outright: a large buffer is
  an anonymous private mapping of its own (huge pages advised, no extra zero-fill pass), a
  small one an ordinary array or ``bytearray``. Nothing else in the process keeps, sees or
  reuses it; the kernel unmaps it when the last array or view of it is gone. Scratch memory a
  call uses inside is zeroed before the call returns.
* **With a** :class:`HostArena` it is lent from the arena. A buffer comes back when its last
  array or view is gone; the arena zeroes it then and keeps it mapped for the next buffer it
  lends, which so costs no fresh pages (on a small VM the kernel's clearing of fresh pages
  costs about as much as AES-GCM itself; docs/BENCHMARKS.md). :meth:`HostArena.close` zeroes
  every buffer it lent, those still held included, drops their pages and unmaps the idle
  ones; a closed arena lends nothing more.

::

    with HostArena() as arena:
        for path in paths:
            with staging.stage(path, key_file=f, arena=arena) as buf:
                train(buf)
    # every page the arena lent is zero here
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import weakref
from types import TracebackType

import numpy as np
import numpy.typing as npt

from .errors import ArenaClosedError

__all__ = ["MIN_MAPPED", "HostArena", "owned_array", "owned_view"]

#: Memory a call owns outright is a mapping of its own from this size up; smaller buffers
#: come from the heap (an ordinary zeroed array or bytearray).
MIN_MAPPED = 4 << 20
_HUGE = 2 << 20


def _map(length: int) -> mmap.mmap:
    """A fresh anonymous private mapping of ``length`` bytes (at least one), huge pages
    advised when it can hold one. Its pages are faulted in (and cleared by the kernel) on
    first touch, by whichever thread writes them."""
    mm = mmap.mmap(-1, max(1, length), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if length >= _HUGE and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            mm.madvise(mmap.MADV_HUGEPAGE)
    return mm


def owned_array(length: int) -> npt.NDArray[np.uint8]:
    """A writable ``uint8`` array of ``length`` bytes that only the caller holds (zeros).

    Large ones are a mapping of their own, unmapped when the array and its views are gone.
    """
    if length < MIN_MAPPED:
        return np.zeros(length, dtype=np.uint8)
    return np.frombuffer(_map(length), dtype=np.uint8, count=length)


def owned_view(length: int) -> memoryview:
    """A writable ``memoryview`` (format ``B``) of ``length`` bytes that only the caller
    holds (zeros); large ones are a mapping of their own (see :func:`owned_array`)."""
    if length < MIN_MAPPED:
        return memoryview(bytearray(length))
    return owned_array(length).data


def _zero(mm: mmap.mmap, length: int) -> None:
    """Leave nothing in ``mm``: the first ``length`` bytes (the part that was lent) and the
    rest of their last page are overwritten, whole pages past them are dropped (they read
    back as zeros). A lent array's exporter reaches the whole mapping, so all of it counts."""
    page = mmap.PAGESIZE
    boundary = min(len(mm), -(-length // page) * page)
    if boundary:
        pages = np.frombuffer(mm, dtype=np.uint8, count=boundary)
        pages.fill(0)
        del pages
    if len(mm) > boundary:
        mm.madvise(mmap.MADV_DONTNEED, boundary, len(mm) - boundary)


def _unexported(mm: mmap.mmap) -> bool:
    """Whether no buffer of ``mm`` is exported any more (a resize is refused while one is)."""
    try:
        mm.resize(len(mm))
    except (BufferError, OSError, ValueError, SystemError):
        return False
    return True


def _physical_quarter() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 1 << 30


class HostArena:
    """Host buffers for plaintext, lent to staging and sealing calls and reused between them.

    Every buffer is an anonymous private mapping (huge pages advised). A buffer the arena
    lends reads as zeros; it comes back when its last array, view or slice is gone, is zeroed
    then, and is kept mapped (idle) for a later buffer of about its size. :meth:`close` zeroes
    every buffer the arena lent, also those still held (their memory stays valid and reads
    as zeros until they are gone), drops their pages and unmaps the idle ones; after that the
    arena lends nothing (:class:`~staging.errors.ArenaClosedError`). Close it only after the
    last use of what it lent, as with any buffer whose owner frees it.

    Thread-safe: buffers may be lent, come back and be closed from any thread.

    Args:
        max_idle: idle mappings kept for reuse (others are unmapped as they come back).
        max_idle_bytes: bytes kept idle at most (default: a quarter of physical memory).
    """

    def __init__(self, *, max_idle: int = 16, max_idle_bytes: int | None = None) -> None:
        # Reentrant: a buffer may come back (its finalizer runs) in a garbage collection
        # that starts while this thread holds the lock.
        self._lock = threading.RLock()
        self._idle: list[mmap.mmap] = []
        self._lent: dict[int, tuple[mmap.mmap, int]] = {}
        self._closed = False
        self._max_idle = max_idle
        self._max_idle_bytes = _physical_quarter() if max_idle_bytes is None else max_idle_bytes

    # --- lending ---------------------------------------------------------------------

    def array(self, length: int) -> npt.NDArray[np.uint8]:
        """Lend a writable one-dimensional ``uint8`` array of ``length`` bytes, all zeros.

        Raises:
            ArenaClosedError: the arena is closed.
        """
        with self._lock:
            if self._closed:
                raise ArenaClosedError("this host arena is closed: it lends no more memory")
            # A mapping over twice the size is kept for a larger request: reusing it here
            # would drop the pages it has already faulted in.
            fits = [mm for mm in self._idle if length <= len(mm) <= 2 * max(1, length)]
            mm = min(fits, key=len) if fits else None
            if mm is not None:
                self._idle.remove(mm)
            else:
                mm = _map(length)
            self._lent[id(mm)] = (mm, length)
        arr = np.frombuffer(mm, dtype=np.uint8, count=length)
        # NumPy keeps the exported buffer in arr.base; every view of arr (and every
        # memoryview of it, slices included) keeps arr alive, so this runs only once
        # nothing can reach the memory through the array any more.
        weakref.finalize(arr.base, self._back, mm, length).atexit = False
        return arr

    def view(self, length: int) -> memoryview:
        """Lend a writable ``memoryview`` (format ``B``) of ``length`` bytes, all zeros: the
        bytes-like form of :meth:`array` (it compares equal to ``bytes`` of the same content).

        Raises:
            ArenaClosedError: the arena is closed.
        """
        return self.array(length).data

    def _back(self, mm: mmap.mmap, length: int) -> None:
        """A lent buffer's last array is gone: zero it, then keep it for reuse or unmap it."""
        with self._lock:
            self._lent.pop(id(mm), None)
            if mm.closed:
                return
            _zero(mm, length)
            if not _unexported(mm):
                return  # exported again by hand: zeroed, and freed with its last export
            if self._closed:
                mm.close()
                return
            self._idle.append(mm)
            self._idle.sort(key=len, reverse=True)
            while len(self._idle) > self._max_idle or self.idle_bytes > self._max_idle_bytes:
                self._idle.pop().close()

    # --- state -----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def idle_bytes(self) -> int:
        """Bytes in idle (zeroed) mappings kept for reuse."""
        with self._lock:
            return sum(map(len, self._idle))

    @property
    def lent_bytes(self) -> int:
        """Bytes of the buffers lent and not yet back."""
        with self._lock:
            return sum(length for _, length in self._lent.values())

    # --- closing ---------------------------------------------------------------------

    def close(self) -> None:
        """Zero every buffer lent and not back, drop its pages, unmap every idle buffer.

        A buffer still held stays valid memory that reads as zeros; it is unmapped when its
        last array or view is gone. Closing twice is allowed.
        """
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            for mm in idle:
                mm.close()  # zeroed when it came back
            for mm, length in list(self._lent.values()):
                if not mm.closed:
                    _zero(mm, length)
                    mm.madvise(mmap.MADV_DONTNEED, 0, len(mm))

    def __enter__(self) -> HostArena:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
