"""What every dataset source offers: its size, its pin, and exact reads of byte spans.

A source is opened once (its size and its pin, the ETag or version it will be read at, are
learnt then) and read through :class:`Span` objects: one request for ``length`` bytes from
``offset``, consumed in order with :meth:`Span.read_exact`. Every span of a source is
bound to the pin, so bytes of two versions of an object are never mixed: a change is an
:class:`~.errors.ObjectChangedError` naming the object.

Time: each read of a span (one chunk) has one deadline, :attr:`SourceSettings.deadline`
seconds of network time (sending the request or resuming it, waiting for the answer, reading
the bytes, retries included), so a body that drips a byte at a time fails as surely as one
that never comes. Time a span spends waiting for room in the prefetch window is not network
time and does not count.

The span that read a dataset's header is kept open (*parked*) where the header ended:
:meth:`ObjectSource.span_at` hands it to the first part that starts there, and on to each
following part while they are read in order, so one request can carry the whole object.
"""

from __future__ import annotations

import random
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from gpucc.core.errors import UsageError

from .errors import StoreDeadlineError

__all__ = [
    "DEFAULT_DEADLINE",
    "DEFAULT_PARALLELISM",
    "DEFAULT_PART_SIZE",
    "Detached",
    "ObjectSource",
    "SourceSettings",
    "Span",
    "backoff",
]

DEFAULT_PARALLELISM = 4
DEFAULT_PART_SIZE = 16 << 20
DEFAULT_DEADLINE = 60.0


@dataclass(frozen=True)
class SourceSettings:
    """How a remote dataset is read.

    Attributes:
        parallelism: requests in flight at once (each reads one part).
        part_size: bytes one request reads (rounded to whole chunks, at least one).
        window: chunks held ahead of verification (ciphertext; default: parallelism x the
            chunks of a part, at most 64 MiB of chunks and at least two per request).
        deadline: the longest one request may take, seconds (see the module docstring).
        timeout: the longest one socket operation may wait, seconds.
        retries: retries of a transient failure (connection, 5xx, a body ending early),
            with exponential backoff; each retry resumes where the failed one stopped.
        ca_file: CA certificates for https:// (default: the system's, or
            ``SSL_CERT_FILE`` / ``REQUESTS_CA_BUNDLE``); s3:// follows ``AWS_CA_BUNDLE``.
    """

    parallelism: int = DEFAULT_PARALLELISM
    part_size: int = DEFAULT_PART_SIZE
    window: int | None = None
    deadline: float = DEFAULT_DEADLINE
    timeout: float = 20.0
    retries: int = 4
    ca_file: Path | None = None

    def __post_init__(self) -> None:
        if self.parallelism < 1 or self.part_size < 1 or (self.window or 1) < 1:
            raise UsageError("parallelism, part size and window must be at least 1")
        if not self.deadline > 0 or not self.timeout > 0 or self.retries < 0:
            raise UsageError("the deadline and timeout must be positive, retries not negative")


class Span(ABC):
    """One request's bytes, read in order. Closing it early drops the connection."""

    def __init__(self, name: str, offset: int, length: int, deadline: float) -> None:
        self.name = name
        self.offset = offset
        self.length = length
        self.done = 0
        self._budget = deadline
        self._spent = 0.0

    def where(self) -> str:
        """The object and byte range, for messages."""
        return f"{self.name} bytes {self.offset}-{self.offset + self.length - 1}"

    def charge(self, started: float) -> None:
        """Count network time since ``started`` against the deadline.

        Raises:
            StoreDeadlineError: the span has used its deadline.
        """
        self._spent += time.monotonic() - started
        if self._spent > self._budget:
            raise StoreDeadlineError(
                f"{self.where()}: no complete answer within the {self._budget:g} s deadline "
                f"({self.done} of {self.length} bytes came)"
            )

    def restart_deadline(self) -> None:
        """Start a new deadline: each chunk read (its retries included) has one of its own."""
        self._spent = 0.0

    def remaining(self) -> float:
        """Network time left to this span, seconds."""
        return max(0.001, self._budget - self._spent)

    @abstractmethod
    def read_exact(self, buf: memoryview) -> None:
        """Fill ``buf`` with the span's next ``len(buf)`` bytes (retrying where it may).

        Raises:
            StoreUnavailableError: the bytes did not come (retries spent, deadline passed).
            ObjectChangedError, StoreProtocolError: see :mod:`.errors`.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the request (dropping its connection unless it was read to the end)."""


class ObjectSource(ABC):
    """A dataset to read: a local file, an object in a store, or a stream.

    Attributes:
        name: how messages name it (the URL without query or credentials, ``-``, a path).
        size: its length in bytes, ``None`` for a stream (standard input).
        pin: what every read is bound to (``etag "..."``, ``version ...``), or why
            nothing is (``stream``, ``local file``).
        sequential: spans must be opened in order, each where the last ended (a stream).
        settings: how it is read (parallelism, parts, window, deadline, retries).
    """

    name: str
    size: int | None
    pin: str
    sequential: bool = False
    settings: SourceSettings = SourceSettings()

    @abstractmethod
    def open_span(self, offset: int, length: int) -> Span:
        """A request for ``length`` bytes from ``offset``."""

    _parked: Span | None = None
    _parking = threading.Lock()

    def park(self, span: Span) -> None:
        """Keep ``span`` open for :meth:`span_at` (closing any span parked before)."""
        self.unpark()
        self._parked = span

    def unpark(self) -> None:
        """Close the parked span, if any."""
        with self._parking:
            span, self._parked = self._parked, None
        if span is not None:
            span.close()

    def span_at(self, offset: int, length: int) -> Span:
        """The parked span, where it is at ``offset`` and reaches ``offset + length``
        (handed over as a slice of it); else a new request."""
        with self._parking:
            parked = self._parked
            if (
                parked is not None
                and parked.offset + parked.done == offset
                and parked.offset + parked.length >= offset + length
            ):
                return _Slice(self, parked, offset, length)
        return self.open_span(offset, length)

    def read_into(self, offset: int, buf: memoryview) -> None:
        """Read exactly ``len(buf)`` bytes from ``offset`` (one span)."""
        span = self.open_span(offset, len(buf))
        try:
            span.read_exact(buf)
        finally:
            span.close()

    def finish(self) -> None:
        """Called once every chunk was read: a stream checks that nothing follows.

        Raises:
            ExtendedDatasetError: a stream carries bytes after the final chunk.
        """
        return None

    def close(self) -> None:
        """Release connections."""
        return None

    def __reduce__(self) -> tuple[type[Detached], tuple[str, int | None, str, SourceSettings]]:
        """Pickled (to a DataLoader worker that is spawned), a source is what names it:
        its connections stay in this process and the worker opens its own."""
        return Detached, (self.name, self.size, self.pin, self.settings)


class Detached(ObjectSource):
    """What a pickled source becomes in another process: its name, length, pin and settings,
    to open it again (:mod:`staging.torch_read` does and checks the pin); it reads nothing."""

    def __init__(self, name: str, size: int | None, pin: str, settings: SourceSettings) -> None:
        self.name = name
        self.size = size
        self.pin = pin
        self.settings = settings

    def open_span(self, offset: int, length: int) -> Span:
        raise UsageError(f"{self.name} was opened in another process: open it here")


def backoff(attempt: int) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, ...): 0.1 s doubling, jittered,
    at most 2 s."""
    return float(min(2.0, 0.1 * 2 ** (attempt - 1)) * (0.5 + random.random() / 2))  # noqa: S311 - jitter


class _Slice(Span):
    """``length`` bytes of a parked span; it stays parked after a slice read to its end."""

    def __init__(self, source: ObjectSource, parked: Span, offset: int, length: int) -> None:
        super().__init__(parked.name, offset, length, float("inf"))
        self.source = source
        self.parked = parked

    def read_exact(self, buf: memoryview) -> None:
        self.parked.read_exact(buf)
        self.done += len(buf)

    def close(self) -> None:
        finished = self.parked.done == self.parked.length
        if self.done != self.length or finished:
            self.source.unpark()
