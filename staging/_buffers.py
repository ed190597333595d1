"""Host memory for staging and sealing: huge pages, no extra zero-fill pass, reuse between calls.

Where the time of a call into fresh memory goes (``perf``, 2-vCPU VM): with 4 KiB pages a
buffer costs a page fault per 4 KiB, and ``bytearray(n)`` adds a ``memset`` pass in one
thread, together slower than AES-GCM itself; with transparent huge pages the faults are few
but the kernel still clears every fresh page (``clear_page``) before the first write. So:

* :func:`host_buffer` lends an anonymous private mapping (huge pages advised) as a NumPy
  array, and takes the mapping back when the last array or view of it is gone, so the next
  call in the process reuses pages that are already mapped instead of paying the kernel's
  page clearing again. Reused memory holds whatever its previous array held (a staging
  API's buffer is scrubbed before it is dropped); callers write or zero every byte before
  they hand the array out; what lies past the length asked for is cleared when a larger
  mapping is reused for a smaller buffer. :func:`host_view` lends the same memory as a
  ``memoryview``, for callers whose result is bytes rather than an array (sealing).

Idle mappings are kept up to :data:`MAX_IDLE` of them and a quarter of physical memory;
:func:`release_idle` unmaps them.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import weakref

import numpy as np
import numpy.typing as npt

__all__ = ["MAX_IDLE", "MIN_POOLED", "host_buffer", "host_view", "idle_bytes", "release_idle"]

#: Buffers smaller than this come from NumPy's allocator (the heap reuses them anyway).
MIN_POOLED = 4 << 20
#: Idle mappings kept for reuse.
MAX_IDLE = 2


def _idle_cap() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 1 << 30


def _clear_beyond(mm: mmap.mmap, length: int) -> None:
    """Leave nothing of an earlier user past ``length`` in a reused mapping: a view's
    exporter (``memoryview.obj``, an array's ``base``) reaches the whole mapping, not only
    the ``length`` bytes its caller writes. Whole pages are dropped (they come back as
    zeros), the partial page is zeroed."""
    page = mmap.PAGESIZE
    boundary = min(len(mm), -(-length // page) * page)
    if boundary > length:
        mm[length:boundary] = bytes(boundary - length)
    if len(mm) > boundary:
        mm.madvise(mmap.MADV_DONTNEED, boundary, len(mm) - boundary)


class _Pool:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[mmap.mmap] = []
        self.cap = _idle_cap()

    def take(self, length: int) -> mmap.mmap:
        with self.lock:
            # A mapping over twice the size is kept for a larger request: reusing it here
            # would drop the pages it has already faulted in.
            fits = [mm for mm in self.idle if length <= len(mm) <= 2 * length]
            mm = min(fits, key=len) if fits else None
            if mm is not None:
                self.idle.remove(mm)
        if mm is not None:
            _clear_beyond(mm, length)
            return mm
        mm = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            with contextlib.suppress(OSError):
                mm.madvise(mmap.MADV_HUGEPAGE)
        return mm

    def give_back(self, mm: mmap.mmap) -> None:
        """Called when the last array over ``mm`` is gone; keeps it if nothing else uses it."""
        try:
            mm.resize(len(mm))  # raises while any buffer of it is still exported
        except (BufferError, OSError, ValueError, SystemError):
            return
        with self.lock:
            self.idle.append(mm)
            self.idle.sort(key=len, reverse=True)
            while len(self.idle) > MAX_IDLE or sum(map(len, self.idle)) > self.cap:
                self.idle.pop().close()

    def release(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
        for mm in idle:
            mm.close()


_POOL = _Pool()


def host_buffer(length: int) -> npt.NDArray[np.uint8]:
    """A writable one-dimensional ``uint8`` array of ``length`` bytes, contents undefined.

    Large buffers are anonymous mappings with huge pages advised, reused once the array and
    every view of it are gone. The caller writes every byte (or zeroes the array) before
    anyone else sees it.
    """
    if length < MIN_POOLED:
        return np.zeros(length, dtype=np.uint8)
    mm = _POOL.take(length)
    arr = np.frombuffer(mm, dtype=np.uint8, count=length)
    # NumPy keeps the exported buffer in arr.base; every view of arr keeps that alive, so
    # this runs only when no array over the mapping is left.
    weakref.finalize(arr.base, _POOL.give_back, mm).atexit = False
    return arr


def idle_bytes() -> int:
    """Bytes held in idle mappings, ready for reuse."""
    with _POOL.lock:
        return sum(map(len, _POOL.idle))


def release_idle() -> None:
    """Unmap every idle buffer (memory in use is not affected)."""
    _POOL.release()


def host_view(length: int) -> memoryview:
    """A writable ``memoryview`` (format ``B``) of ``length`` bytes, contents undefined.

    The bytes-like counterpart of :func:`host_buffer` (it compares equal to ``bytes`` with
    the same content, and slices like them). Large ones are pooled mappings, reused once
    the view and every slice or export of it are gone; the caller writes every byte.
    """
    if length < MIN_POOLED:
        return memoryview(bytearray(length))
    mm = _POOL.take(length)
    view = memoryview(mm)[:length]
    # A slice shares the exporter's managed buffer, which a memoryview releases before
    # its weak references are called back: the mapping is free when this runs, unless a
    # slice or export of the view is still alive (then give_back leaves it alone).
    weakref.finalize(view, _POOL.give_back, mm).atexit = False
    return view
