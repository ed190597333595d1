"""A bounded prefetch window: the next chunks download while the current ones verify.

The chunk area is cut into parts of whole chunks (about ``part_size`` bytes); up to
``parallelism`` reader threads each take the next part, open one request for it and read
its chunks in order, each into a ring slot. Slot ``i % window`` holds chunk ``i``; a reader
waits until chunk ``i - window`` has been released before it writes chunk ``i``, so memory
stays at ``window x (chunk size + 16)`` bytes of ciphertext whatever the dataset's size,
and the lowest chunk not yet read can always be written (no deadlock whatever the order in
which consumers release).

Consumers :meth:`Prefetcher.take` chunk ``i`` (waiting until it is read) and
:meth:`~Prefetcher.release` it once decrypted. A reader's failure is raised by the
``take`` of the chunk it could not deliver; :meth:`close` stops every reader.
"""

from __future__ import annotations

import threading

from ..format import TAG_SIZE, Header
from .base import ObjectSource, SourceSettings
from .stream import StreamEnded, cut_off

__all__ = ["DEFAULT_WINDOW_BYTES", "Prefetcher", "window_chunks"]

#: The prefetch window by default: parallelism x a part, but no more chunks than fill this many
#: bytes (and at least two per request in flight).
DEFAULT_WINDOW_BYTES = 64 << 20


def window_chunks(header: Header, settings: SourceSettings) -> tuple[int, int]:
    """(chunks per part, chunks in the window) for a dataset read with ``settings``."""
    slot = min(header.chunk_size, header.plaintext_length) + TAG_SIZE
    per_part = max(1, settings.part_size // slot)
    window = settings.window or min(
        per_part * settings.parallelism, max(2 * settings.parallelism, DEFAULT_WINDOW_BYTES // slot)
    )
    return per_part, max(1, min(window, header.chunk_count))


class Prefetcher:
    """Reads a sealed dataset's chunks ahead of verification; see the module docstring."""

    def __init__(self, source: ObjectSource, header: Header, settings: SourceSettings) -> None:
        self.source = source
        self.header = header
        self.count = header.chunk_count
        self.per_part, self.window = window_chunks(header, settings)
        readers = 1 if source.sequential else settings.parallelism
        self.parts = -(-self.count // self.per_part)
        slot = min(header.chunk_size, header.plaintext_length) + TAG_SIZE
        self.slots = [bytearray(slot) for _ in range(self.window)]
        self.held_bytes = self.window * slot
        self._cond = threading.Condition()
        self._filled = bytearray(self.count)
        self._next_for_slot = list(range(self.window))
        self._next_part = 0
        self._error: tuple[int, BaseException] | None = None
        self._stop = False
        self._threads = [
            threading.Thread(target=self._reader, name=f"gpucc-fetch-{n}", daemon=True)
            for n in range(min(readers, self.parts))
        ]
        for thread in self._threads:
            thread.start()

    # --- readers -------------------------------------------------------------------

    def _reader(self) -> None:
        while True:
            with self._cond:
                if self._stop or self._error is not None or self._next_part >= self.parts:
                    return
                part = self._next_part
                self._next_part += 1
            first = part * self.per_part
            last = min(self.count, first + self.per_part) - 1
            index = first
            try:
                self._read_part(first, last)
            except StreamEnded:
                with self._cond:
                    index = self._first_unfilled(first, last)
                    self._fail(index, cut_off(index, self.count, self.source.name))
                return
            except BaseException as exc:
                with self._cond:
                    self._fail(self._first_unfilled(first, last), exc)
                return

    def _first_unfilled(self, first: int, last: int) -> int:
        return next((i for i in range(first, last + 1) if not self._filled[i]), first)

    def _fail(self, index: int, exc: BaseException) -> None:
        if self._error is None or index < self._error[0]:
            self._error = (index, exc)
        self._cond.notify_all()

    def _read_part(self, first: int, last: int) -> None:
        header = self.header
        start = header.chunk_offset(first)
        end = header.chunk_offset(last) + header.chunk_length(last) + TAG_SIZE
        span = self.source.span_at(start, end - start)
        try:
            for index in range(first, last + 1):
                slot = index % self.window
                with self._cond:
                    while self._next_for_slot[slot] != index and not self._stop:
                        self._cond.wait()
                    if self._stop:
                        return
                length = header.chunk_length(index) + TAG_SIZE
                span.read_exact(memoryview(self.slots[slot])[:length])
                with self._cond:
                    self._filled[index] = 1
                    self._cond.notify_all()
        finally:
            span.close()

    # --- consumers -----------------------------------------------------------------

    def take(self, index: int) -> memoryview:
        """Chunk ``index``'s ``ct || tag``, once read.

        Raises:
            The error of the reader that could not deliver it (or an earlier chunk).
        """
        with self._cond:
            while not self._filled[index]:
                if self._error is not None and self._error[0] <= index:
                    raise self._error[1]
                if self._stop:
                    raise RuntimeError("prefetch closed")
                self._cond.wait()
        length = self.header.chunk_length(index) + TAG_SIZE
        return memoryview(self.slots[index % self.window])[:length]

    def release(self, index: int) -> None:
        """Chunk ``index`` is consumed: its slot may take chunk ``index + window``."""
        with self._cond:
            self._next_for_slot[index % self.window] = index + self.window
            self._cond.notify_all()

    def close(self, wait: float = 2.0) -> None:
        """Stop the readers (a reader inside a socket read stops within its timeout)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=wait)
        self.source.unpark()
