"""Sources without a store: standard input (``-``), read once in order, and local files.

Standard input has no length to learn first and no pin: its bytes are read in order, once,
by a single span at a time, and the sealed format's own binding decides. A stream that ends
inside a chunk names the chunk it cut off (exit 6); bytes after the final chunk are refused
as an extended dataset, exactly as for a file.
"""

from __future__ import annotations

import os
import sys
from io import BufferedIOBase

from ..dataset import io_error
from ..errors import ChunkAuthenticationError, ExtendedDatasetError, StagingIOError
from .base import ObjectSource, Span

__all__ = ["LocalSource", "StdinSource", "StreamEnded"]


class StreamEnded(StagingIOError):
    """Internal: the stream ended before a span was filled (turned into the error naming the
    chunk it cut off by the reader that knows the chunk)."""


class _StreamSpan(Span):
    def __init__(self, source: StdinSource, offset: int, length: int) -> None:
        super().__init__(source.name, offset, length, float("inf"))
        self.source = source

    def read_exact(self, buf: memoryview) -> None:
        got = 0
        while got < len(buf):
            try:
                n = self.source.stream.readinto(buf[got:])
            except OSError as exc:
                raise io_error("read", "standard input", exc) from None
            if not n:
                raise StreamEnded(
                    f"standard input ended {self.source.position + got - self.offset} bytes "
                    f"into {self.where()}"
                )
            got += n
        self.source.position += got
        self.done += got

    def close(self) -> None:
        pass


class StdinSource(ObjectSource):
    """``-``: a sealed dataset piped in."""

    sequential = True

    def __init__(self, stream: BufferedIOBase | None = None) -> None:
        self.stream: BufferedIOBase = stream if stream is not None else sys.stdin.buffer  # type: ignore[assignment]
        self.name = "-"
        self.size = None
        self.pin = "stream (read once, in order)"
        self.position = 0

    def open_span(self, offset: int, length: int) -> Span:
        if offset != self.position:
            raise ValueError(f"standard input is at {self.position}, not {offset}")
        return _StreamSpan(self, offset, length)

    def finish(self) -> None:
        extra = self.stream.read(1)
        if extra:
            raise ExtendedDatasetError(
                "-: standard input carries bytes after the final chunk that the "
                "authenticated header describes"
            )


class _FileSpan(Span):
    def __init__(self, source: LocalSource, offset: int, length: int) -> None:
        super().__init__(source.name, offset, length, float("inf"))
        self.source = source

    def read_exact(self, buf: memoryview) -> None:
        from ..dataset import read_exact

        try:
            read_exact(self.source.fd, buf, self.offset + self.done)
        except OSError as exc:
            raise io_error("read", self.name, exc) from None
        self.done += len(buf)

    def close(self) -> None:
        pass


class LocalSource(ObjectSource):
    """A local file read through the source interface (``pread`` into private memory)."""

    def __init__(self, path: str) -> None:
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise io_error("read", path, exc) from None
        self.name = path
        self.size = os.fstat(self.fd).st_size
        self.pin = "local file"

    def open_span(self, offset: int, length: int) -> Span:
        return _FileSpan(self, offset, length)

    def close(self) -> None:
        os.close(self.fd)


def cut_off(chunk: int, count: int, name: str) -> ChunkAuthenticationError:
    """The error for a stream that ended inside chunk ``chunk`` of ``count``."""
    rest = f", and chunks {chunk + 1} to {count - 1} are missing" if chunk < count - 1 else ""
    return ChunkAuthenticationError(
        chunk, f"{name} ended inside it{rest} (chunks 0 to {count - 1}; truncated)"
    )
