"""Sealed datasets from a source: opened, verified and staged with a prefetch window.

The same checks as for a local file, in the same order (:mod:`staging.cpu`): the header
parsed, the header tag authenticated under the key, the object's length compared with the
one the authenticated header describes (a truncated object names the chunks it lacks),
then every chunk. Chunks are read ahead by :class:`.prefetch.Prefetcher` and decrypted by
``threads`` workers as they arrive; a chunk whose tag fails names the object it came from.
No plaintext of an unverified chunk is kept or returned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..chunks import ChunkCipher
from ..cpu import Buffer, _decrypt_all, _destination
from ..dataset import SealedDataset, describe_unsealed
from ..errors import ChunkAuthenticationError, MalformedDatasetError
from ..format import HEADER_SIZE, MAGIC, PREFIX_SIZE, Header, parse_wrap_section
from ..seal import ProgressCallback, default_threads
from ..verify import Verified, _verify_chunks
from .base import ObjectSource, SourceSettings, Span
from .prefetch import Prefetcher
from .stream import StreamEnded

if TYPE_CHECKING:
    from ..arena import HostArena

__all__ = [
    "SourceVerified",
    "open_keyed_source",
    "open_sealed_source",
    "stage_source",
    "verify_source",
]

#: The most bytes a wrap record can take (as staging.dataset).
_MAX_RECORD = 4 + 1024 + 12 + 48


@dataclass(frozen=True)
class SourceVerified(Verified):
    """:class:`~staging.verify.Verified`, and how the source was read.

    Attributes:
        source: the object's name.
        pin: what every read was bound to.
        window_bytes: the ciphertext prefetch window (memory held besides the plaintext).
        parallelism: requests in flight at most.
        part_size: bytes per request.
    """

    source: str = ""
    pin: str = ""
    window_bytes: int = 0
    parallelism: int = 1
    part_size: int = 0


def _read(source: ObjectSource, offset: int, length: int) -> bytes:
    buf = bytearray(length)
    try:
        source.read_into(offset, memoryview(buf))
    except StreamEnded:
        raise MalformedDatasetError(
            f"{source.name} is not a sealed dataset: it ends inside the sealed header"
        ) from None
    return bytes(buf)


def _read_span(span: Span, length: int, name: str) -> bytes:
    buf = bytearray(max(0, length))
    try:
        span.read_exact(memoryview(buf))
    except StreamEnded:
        raise MalformedDatasetError(
            f"{name} is not a sealed dataset: it ends inside the sealed header"
        ) from None
    return bytes(buf)


def open_sealed_source(source: ObjectSource, *, park: bool = True) -> SealedDataset:
    """Parse a sealed dataset's header and wrap section from ``source``.

    With ``park`` (for a dataset read whole) the header is read by one request for the
    whole object, parked for the chunks; without it (a shard set whose chunks are read by
    other processes, :mod:`staging.torch_read`) the header and the wrap section are read as
    two requests for exactly their bytes.

    Raises:
        MalformedDatasetError: not a sealed dataset (what it looks like is said), or a bad
            header field or wrap section.
        The errors of the source (:mod:`.errors`).
    """
    name = source.name
    whole = source.size if source.size is not None else PREFIX_SIZE
    if whole < PREFIX_SIZE:
        head = _read(source, 0, whole) if whole else b""
        raise MalformedDatasetError(
            f"{name} is not a sealed dataset: {describe_unsealed(head, whole)}"
        )
    # One request for the whole object: the header is read from its start and the request
    # is parked where the header ends, for the chunks (staging.sources.base). Narrow: the
    # header's bytes alone.
    narrow = not park and not source.sequential
    span = source.open_span(0, PREFIX_SIZE) if narrow else source.span_at(0, whole)
    keep = False
    try:
        head = _read_span(span, PREFIX_SIZE, name)
        if head[: len(MAGIC)] != MAGIC:
            more = min(512, whole) - PREFIX_SIZE
            if narrow:
                rest = _read(source, PREFIX_SIZE, more) if more > 0 else b""
            else:
                rest = _read_span(span, more, name)
            sample = head + rest
            raise MalformedDatasetError(
                f"{name} is not a sealed dataset: "
                f"{describe_unsealed(sample, source.size or len(sample))}"
            )
        try:
            header = Header.parse(head[:HEADER_SIZE])
            if source.size is not None and source.size < PREFIX_SIZE + header.wrap_length:
                raise MalformedDatasetError("it ends inside its wrap section")
            if narrow and header.wrap_length:
                span.close()
                span = source.open_span(PREFIX_SIZE, header.wrap_length)
            wrap_bytes = _read_span(span, header.wrap_length, name)
            wrap = parse_wrap_section(wrap_bytes)
        except MalformedDatasetError as exc:
            raise MalformedDatasetError(f"{name}: {exc}") from None
        if source.size is not None and park:
            source.park(span)
            keep = True
    finally:
        if not keep:
            span.close()
    return SealedDataset(
        path=Path(name),
        header=header,
        header_tag=head[HEADER_SIZE:PREFIX_SIZE],
        wrap=wrap,
        prefix=head[:PREFIX_SIZE] + wrap_bytes,
        file_length=source.size if source.size is not None else -1,
        source=source,
    )


def _named(exc: ChunkAuthenticationError, name: str) -> ChunkAuthenticationError:
    if exc.args and str(exc.args[0]).endswith("failed authentication"):
        return ChunkAuthenticationError(
            exc.chunk_index,
            f"{name} served bytes that are not the sealed chunk (altered or corrupted in "
            "the store or in transit)",
        )
    return exc


def _decrypt(cipher: ChunkCipher, pf: Prefetcher, index: int, out: memoryview) -> None:
    ct = pf.take(index)
    try:
        cipher.decrypt_into(index, ct, out)
    except ChunkAuthenticationError as exc:
        raise _named(exc, pf.source.name) from None
    finally:
        pf.release(index)


def verify_source(
    dataset: SealedDataset,
    dataset_key: bytes,
    *,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    settings: SourceSettings | None = None,
    arena: HostArena | None = None,
) -> SourceVerified:
    """Authenticate every chunk of a dataset opened from a source, keeping no plaintext.

    Raises:
        HeaderAuthenticationError: wrong key or altered header (nothing read further).
        ChunkAuthenticationError: the lowest chunk that failed, or that the object or
            stream lacks; it names the object.
        ExtendedDatasetError: bytes after the final chunk.
        ObjectChangedError, StoreProtocolError, StoreUnavailableError: see :mod:`.errors`.
    """
    assert dataset.source is not None
    settings = settings or dataset.source.settings
    threads = threads or default_threads()
    cipher = dataset.check_key(dataset_key)
    pf = Prefetcher(dataset.source, dataset.header, settings)

    def work(index: int, _sealed: memoryview, plain: memoryview) -> None:
        _decrypt(cipher, pf, index, plain)  # from the prefetcher's slot: no buffer to read into

    try:
        verified = _verify_chunks(dataset.header, threads, progress, work, arena, read=False)
        dataset.source.finish()
    finally:
        pf.close()
    return SourceVerified(
        **dataclasses.asdict(verified),
        source=dataset.source.name,
        pin=dataset.source.pin,
        window_bytes=pf.held_bytes,
        parallelism=len(pf._threads),
        part_size=pf.per_part * len(pf.slots[0]),
    )


def stage_source(
    dataset: SealedDataset,
    dataset_key: bytes,
    *,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    out: Buffer | None = None,
    settings: SourceSettings | None = None,
    arena: HostArena | None = None,
) -> Buffer:
    """Decrypt and verify a dataset from a source into host memory
    (:func:`staging.cpu.stage_cpu` for a source: the same errors and the same zeroing)."""
    assert dataset.source is not None
    threads = threads or default_threads()
    header = dataset.header
    cipher = dataset.check_key(dataset_key)
    dst = _destination(header.plaintext_length, out, arena)
    pf = Prefetcher(dataset.source, header, settings or dataset.source.settings)

    def decrypt(index: int, _slot: int, plain: memoryview) -> None:
        _decrypt(cipher, pf, index, plain)

    try:
        _decrypt_all(header, decrypt, dst, threads=threads, progress=progress, owned=out is None)
        try:
            dataset.source.finish()
        except BaseException:  # e.g. bytes after the final chunk: none of it is returned
            dst[:] = 0
            raise
    finally:
        pf.close()
    return dst


def open_keyed_source(
    source: ObjectSource, dataset_key_for: Callable[[SealedDataset], tuple[bytes, str]]
) -> tuple[SealedDataset, bytes, str]:
    """A sealed dataset read from ``source``, its key and where the key came from (for
    :func:`staging.api.plan_stage`, which makes the plan)."""
    dataset = open_sealed_source(source)
    key, key_source = dataset_key_for(dataset)
    return dataset, key, key_source
