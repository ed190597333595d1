"""Shard sets: one plaintext sealed into N files that are bound together.

:func:`seal_shards` cuts the plaintext at chunk boundaries into ``n`` contiguous parts and
seals each part as an ordinary sealed dataset (``docs/FORMAT.md``), all under one dataset
key. The binding uses a field the format already authenticates: each shard's 16-byte
``dataset_id`` is ::

    set_id (8 random bytes) || "GSHD" || uint16_le(index) || uint16_le(count)

The header tag of every shard is computed under a chunk key derived from the dataset key
*and* this dataset id, so nobody without the key can change a shard's set id, index or count.
:func:`open_shard_set` verifies every shard's header tag under the key and then checks that
the shards carry the same set id, the same count, and the indices ``0 .. count-1`` in the
order given. The marker ``GSHD`` tells a shard from an unsharded dataset (whose id is random:
a random id carries the marker with probability 2^-32), so a lone shard of a larger set is
refused as well. A shard of another set, a reordered, duplicated or missing shard is refused
with :class:`ShardSetError`; a shard sealed under another key fails its header tag
(:class:`~staging.errors.HeaderAuthenticationError`).

The shards together keep the chunking of the unsharded dataset: global chunk ``g`` is
plaintext bytes ``g * chunk_size ..``, whichever shard holds it.

Every shard gets its own dataset id and therefore its own chunk key, so chunk nonces never
repeat under one key although the shards share the dataset key.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gpucc.core.errors import IntegrityError, MalformedInputError, UsageError
from gpucc.core.files import fsync_dir, refuse_existing, write_all

from .arena import HostArena
from .chunks import ChunkCipher
from .dataset import SealedDataset, io_error, open_sealed
from .errors import StageKeyArgumentsError
from .format import (
    DEFAULT_CHUNK_SIZE,
    StrPath,
    chunk_count_for,
    read_key_file,
)
from .seal import ProgressCallback, WrapSpec, default_threads, plan_seal, seal_chunks

if TYPE_CHECKING:
    from .sources import SourceSettings

__all__ = [
    "SET_ID_SIZE",
    "SHARD_MARKER",
    "ShardId",
    "ShardSet",
    "ShardSetError",
    "ShardSetResult",
    "lone_shard_error",
    "open_shard_set",
    "seal_shards",
    "shard_dataset_id",
    "shard_path",
]

#: Random bytes naming a shard set (the first 8 bytes of every shard's dataset id).
SET_ID_SIZE = 8
#: Bytes 8..11 of a shard's dataset id.
SHARD_MARKER = b"GSHD"
_INDEX = struct.Struct("<4sHH")
MAX_SHARDS = 0xFFFF


class ShardSetError(IntegrityError):
    """Files opened as a shard set are not one complete set in order.

    Attributes:
        path: the offending shard (``None`` when the set as a whole is wrong).
    """

    portable = ("path",)

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


@dataclass(frozen=True)
class ShardId:
    """What a shard's dataset id says about it."""

    set_id: bytes
    index: int
    count: int

    @classmethod
    def parse(cls, dataset_id: bytes) -> ShardId | None:
        """Set id, index and count of a shard's dataset id; ``None`` for an unsharded one."""
        marker, index, count = _INDEX.unpack(dataset_id[SET_ID_SIZE:])
        if marker != SHARD_MARKER:
            return None
        return cls(set_id=dataset_id[:SET_ID_SIZE], index=index, count=count)


def shard_dataset_id(set_id: bytes, index: int, count: int) -> bytes:
    """The dataset id of shard ``index`` of ``count`` in set ``set_id``."""
    if len(set_id) != SET_ID_SIZE:
        raise ValueError(f"a set id is {SET_ID_SIZE} bytes")
    if not 1 <= count <= MAX_SHARDS or not 0 <= index < count:
        raise ValueError(f"shard {index} of {count} is out of range (1..{MAX_SHARDS} shards)")
    return set_id + _INDEX.pack(SHARD_MARKER, index, count)


def shard_path(out_dir: StrPath, stem: str, index: int, count: int) -> Path:
    """``out_dir/stem-00000-of-00004.gcc``: the file name :func:`seal_shards` uses."""
    return Path(out_dir) / f"{stem}-{index:05d}-of-{count:05d}.gcc"


@dataclass(frozen=True)
class ShardSetResult:
    """What :func:`seal_shards` wrote.

    Attributes:
        set_id: the 12-byte set id.
        paths: the shards, in index order.
        chunk_size: plaintext bytes per chunk (shared by every shard).
        plaintext_length: bytes of the whole plaintext.
        chunk_counts: chunks per shard.
        dataset_key: the dataset key of every shard (secret; not in the repr).
    """

    set_id: bytes
    paths: tuple[Path, ...]
    chunk_size: int
    plaintext_length: int
    chunk_counts: tuple[int, ...]
    dataset_key: bytes = field(repr=False)

    #: the schema of :meth:`to_dict`'s document
    SCHEMA: ClassVar[str] = "gpucc.seal.shards/v1"

    def to_dict(self, src: StrPath, *, key_id: bytes, seconds: float) -> dict[str, Any]:
        """The ``gpucc.seal.shards/v1`` document (``gpucc seal --shards N -f json``)."""
        return {
            "schema": self.SCHEMA,
            "input": str(src),
            "set_id": self.set_id.hex(),
            "shards": [str(p) for p in self.paths],
            "chunks": list(self.chunk_counts),
            "chunk_size": self.chunk_size,
            "bytes": self.plaintext_length,
            "key_id": key_id.hex(),
            "seconds": round(seconds, 6),
        }


def _split(chunks: int, n: int) -> list[tuple[int, int]]:
    """Shard ``i`` gets chunks ``floor(i*C/n) .. floor((i+1)*C/n)``: sizes differ by <= 1."""
    return [(i * chunks // n, (i + 1) * chunks // n) for i in range(n)]


def seal_shards(
    src: StrPath,
    out_dir: StrPath,
    n: int,
    *,
    kek: bytes | None = None,
    wrap: WrapSpec | None = None,
    dataset_key: bytes | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    threads: int | None = None,
    stem: str | None = None,
    progress: ProgressCallback | None = None,
    force: bool = False,
    arena: HostArena | None = None,
) -> ShardSetResult:
    """Seal the regular file ``src`` into ``n`` bound shards in ``out_dir``.

    The plaintext is cut at chunk boundaries; shard sizes differ by at most one chunk.
    Shards are written to temporary names and put into place only once all of them are
    complete and flushed: on error none is left behind. An existing file of a shard's name
    is refused before anything is sealed, and replaced only with ``force``.

    Args:
        src: the plaintext file.
        out_dir: an existing directory.
        n: number of shards, 1 .. the plaintext's chunk count (and at most 65535).
        kek, wrap, dataset_key: as :func:`staging.seal.seal_file`; one dataset key for all
            shards, wrapped into each of them.
        chunk_size: plaintext bytes per chunk.
        threads: worker threads (default ``os.cpu_count()``).
        stem: file name stem (default: ``src``'s name without its suffix).
        progress: ``progress(done_bytes, total_bytes)`` over the whole plaintext.
        force: replace existing files of the shards' names.
        arena: lends the chunk buffers, as in :func:`staging.seal.seal_file`.

    Raises:
        OutputExistsError: a shard's file exists and ``force`` is not set.
        UsageError: ``n`` out of range.
        MalformedDatasetError: ``chunk_size`` out of range.
        MalformedInputError: ``src`` is not a regular file or changed size while sealing.
        StagingIOError: a file cannot be read or written.
    """
    src = Path(src)
    out_dir = Path(out_dir)
    threads = threads or default_threads()
    stem = stem or src.stem
    try:
        src_fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise io_error("read", src, exc) from None
    written: list[tuple[Path, Path]] = []
    try:
        st = os.fstat(src_fd)
        if not stat.S_ISREG(st.st_mode):
            raise MalformedInputError(f"{src} is not a regular file")
        total = st.st_size
        chunks = chunk_count_for(total, chunk_size)
        if not 1 <= n <= min(chunks, MAX_SHARDS):
            raise UsageError(
                f"{src} has {chunks} chunk(s) of {chunk_size} bytes: it splits into 1 to "
                f"{min(chunks, MAX_SHARDS)} shards, not {n}"
            )
        for index in range(n):
            refuse_existing(shard_path(out_dir, stem, index, n), force=force)
        set_id = secrets.token_bytes(SET_ID_SIZE)
        key = dataset_key
        counts: list[int] = []
        done_bytes = 0
        for index, (first, end) in enumerate(_split(chunks, n)):
            start = first * chunk_size
            length = min(total, end * chunk_size) - start
            header, key, record = plan_seal(
                length,
                kek=kek,
                wrap=wrap,
                dataset_key=key,
                chunk_size=chunk_size,
                dataset_id=shard_dataset_id(set_id, index, n),
            )
            cipher = ChunkCipher(key, header)
            tag = cipher.header_tag()
            prefix = header.to_bytes() + tag + (b"" if record is None else record.to_bytes())
            dst = shard_path(out_dir, stem, index, n)
            tmp = dst.with_name(f"{dst.name}.tmp-{secrets.token_hex(4)}")
            written.append((tmp, dst))

            def report(done: int, _total: int, base: int = done_bytes) -> None:
                if progress is not None:
                    progress(base + done, total)

            _write_part(src_fd, src, start, tmp, cipher, prefix, threads, report, arena)
            counts.append(header.chunk_count)
            done_bytes += length
        if os.fstat(src_fd).st_size != total:
            raise MalformedInputError(f"{src} changed size while it was being sealed")
        for tmp, dst in written:
            try:
                if force:
                    os.replace(tmp, dst)
                else:  # link, then unlink: fails (EEXIST) rather than replace a new file
                    os.link(tmp, dst)
                    os.unlink(tmp)
            except FileExistsError:
                refuse_existing(dst)
            except OSError as exc:
                raise io_error("put into place", dst, exc) from None
        fsync_dir(out_dir)
        if key is None:  # pragma: no cover - plan_seal always returns a key
            raise UsageError("no dataset key")
        return ShardSetResult(
            set_id=set_id,
            paths=tuple(dst for _, dst in written),
            chunk_size=chunk_size,
            plaintext_length=total,
            chunk_counts=tuple(counts),
            dataset_key=key,
        )
    except BaseException:
        for tmp, _ in written:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    finally:
        os.close(src_fd)


def _write_part(
    src_fd: int,
    src: Path,
    start: int,
    tmp: Path,
    cipher: ChunkCipher,
    prefix: bytes,
    threads: int,
    progress: Callable[[int, int], None],
    arena: HostArena | None,
) -> None:
    """Seal plaintext ``src[start : start + length]`` into the new file ``tmp``."""
    header = cipher.header
    try:
        out_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise io_error("create", tmp, exc) from None
    try:
        try:
            os.ftruncate(out_fd, header.file_size)
            write_all(out_fd, memoryview(prefix), 0)
        except OSError as exc:
            raise io_error("write", tmp, exc) from None
        seal_chunks(
            src_fd,
            src,
            out_fd,
            tmp,
            cipher,
            start=start,
            threads=threads,
            progress=progress,
            arena=arena,
        )
        try:
            os.fsync(out_fd)
        except OSError as exc:
            raise io_error("write", tmp, exc) from None
    finally:
        os.close(out_fd)


@dataclass(frozen=True)
class ShardSet:
    """Sealed files verified to be one complete shard set, in index order.

    A single unsharded dataset is a set of one (:func:`open_shard_set` accepts it).

    Attributes:
        parts: the shards, opened.
        set_id: the set id (empty for a single unsharded dataset).
        chunk_size: plaintext bytes per chunk.
        dataset_key: the verified dataset key (not in the repr).
    """

    parts: tuple[SealedDataset, ...]
    set_id: bytes
    chunk_size: int
    dataset_key: bytes = field(repr=False)
    _firsts: tuple[int, ...] = field(repr=False, default=(0,))

    @property
    def chunk_count(self) -> int:
        """Chunks of the whole set (global chunk indices are ``0 .. chunk_count-1``)."""
        return sum(p.header.chunk_count for p in self.parts)

    @property
    def plaintext_length(self) -> int:
        """Plaintext bytes of the whole set."""
        return sum(p.plaintext_length for p in self.parts)

    def locate(self, chunk: int) -> tuple[int, int]:
        """``(shard, local chunk)`` of global chunk ``chunk``."""
        if not 0 <= chunk < self.chunk_count:
            raise IndexError(f"chunk {chunk} out of range 0..{self.chunk_count - 1}")
        part = 0
        while part + 1 < len(self._firsts) and self._firsts[part + 1] <= chunk:
            part += 1
        return part, chunk - self._firsts[part]

    def chunk_length(self, chunk: int) -> int:
        """Plaintext bytes in global chunk ``chunk``."""
        part, local = self.locate(chunk)
        return self.parts[part].header.chunk_length(local)


def lone_shard_error(part: SealedDataset, ident: ShardId) -> ShardSetError:
    """The error for one shard of a larger set opened on its own."""
    return ShardSetError(
        f"{part.name} is shard {ident.index}, one of {ident.count} shards: a lone shard is "
        "not a dataset (stage the whole set)",
        path=part.path,
    )


def _resolve_key(
    first: SealedDataset,
    *,
    key: bytes | None,
    kek: bytes | None,
    key_file: StrPath | None,
    key_for: Callable[[bytes], bytes] | None,
) -> bytes:
    if sum(x is not None for x in (key, kek, key_file, key_for)) != 1:
        raise StageKeyArgumentsError(
            f"{first.path} needs exactly one of key, kek, key_file or key_for",
            path=first.path,
            sealed=True,
        )
    if key is not None:
        return key
    if key_for is not None:
        return key_for(first.header_digest)
    if key_file is not None:
        kek = read_key_file(key_file)
    if kek is None:  # pragma: no cover - excluded by the count above
        raise UsageError("no key given")
    return first.unwrap(kek, verify_header=False)


def _open_parts(
    paths: StrPath | Sequence[StrPath], settings: SourceSettings | None
) -> tuple[SealedDataset, ...]:
    """Open local files and ``s3://`` / ``https://`` objects; a prefix (``s3://b/p/``)
    stands for the sealed objects under it, in name order, as a directory does locally."""
    from . import sources

    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    if not paths:
        raise UsageError("a shard set needs at least one file")
    opener = sources.Opener()  # one S3 client for the listing and every object of the set
    names: list[StrPath] = []
    for name in paths:
        if sources.is_prefix(name):
            names += sources.list_datasets(str(name), settings, opener=opener)
        elif name == "-":
            raise UsageError("standard input holds one dataset, not a part of a shard set")
        else:
            names.append(name)
    if not any(sources.is_remote(n) for n in names):
        return tuple(open_sealed(p) for p in names)
    from .sources.sealed import open_sealed_source

    parts: list[SealedDataset] = []
    try:
        for name in names:
            if not sources.is_remote(name):
                parts.append(open_sealed(name))
                continue
            source = opener.open(str(name), settings)
            try:
                # The headers alone: each part's chunks are read by whoever needs them.
                parts.append(open_sealed_source(source, park=False))
            except BaseException:
                source.close()
                raise
    except BaseException:
        for part in parts:
            if part.source is not None:
                part.source.close()
        raise
    return tuple(parts)


def open_shard_set(
    paths: StrPath | Sequence[StrPath],
    *,
    key: bytes | None = None,
    kek: bytes | None = None,
    key_file: StrPath | None = None,
    key_for: Callable[[bytes], bytes] | None = None,
    settings: SourceSettings | None = None,
) -> ShardSet:
    """Open sealed files as one shard set (or one unsharded dataset) and verify the binding.

    ``paths`` are local files, ``s3://`` or ``https://`` objects (read with ``settings``,
    :mod:`staging.sources`), or an ``s3://bucket/prefix/``, which stands for the sealed
    objects (``*.gcc``) directly under it in name order. A remote part keeps its source
    (:attr:`SealedDataset.source`, pinned to the object's ETag or version); only its header
    has been read.

    The key comes from exactly one of ``key``, ``kek``, ``key_file`` or ``key_for``
    (``key_for(header_digest)`` is called with shard 0's header digest). Every shard's
    header tag is verified under it before the set is checked.

    Raises:
        UsageError: an ``https://`` prefix (no listing), standard input, or a prefix with
            no ``*.gcc`` object.
        ObjectNotFoundError, StoreAccessDeniedError, StoreUnavailableError, ...: the
            errors of :mod:`staging.sources.errors`, for a remote part.
        ShardSetError: a shard of another set, a shard at the wrong position, a duplicate,
            a missing shard, or shards with different chunk sizes.
        HeaderAuthenticationError: a shard's header does not verify under the key.
        StageKeyArgumentsError: not exactly one key source.
        MalformedDatasetError, StagingIOError, KeyFileError, KeyUnwrapError,
            DatasetKeyMismatchError: see :func:`staging.dataset.open_sealed` and
            :meth:`staging.dataset.SealedDataset.unwrap`.
    """
    parts = _open_parts(paths, settings)
    dataset_key = _resolve_key(parts[0], key=key, kek=kek, key_file=key_file, key_for=key_for)
    for part in parts:
        part.check_key(dataset_key)
    chunk_size = parts[0].header.chunk_size
    firsts: list[int] = []
    running = 0
    for part in parts:
        firsts.append(running)
        running += part.header.chunk_count
    first = ShardId.parse(parts[0].dataset_id)
    if len(parts) == 1 and first is None:
        return ShardSet(parts=parts, set_id=b"", chunk_size=chunk_size, dataset_key=dataset_key)
    for position, part in enumerate(parts):
        ident = ShardId.parse(part.dataset_id)
        if ident is None or first is None:
            raise ShardSetError(f"{part.name} is not a shard", path=part.path)
        if ident.set_id != first.set_id:
            raise ShardSetError(
                f"{part.name} belongs to another shard set than {parts[0].name}", path=part.path
            )
        if ident.count != len(parts) and len(parts) == 1:
            raise lone_shard_error(part, ident)
        if ident.count != len(parts):
            raise ShardSetError(
                f"{part.name} is one of {ident.count} shards, but {len(parts)} were given",
                path=part.path,
            )
        if ident.index != position:
            raise ShardSetError(
                f"{part.name} is shard {ident.index}, given at position {position}",
                path=part.path,
            )
        if part.header.chunk_size != chunk_size:
            raise ShardSetError(f"{part.name} has another chunk size", path=part.path)
        if position < len(parts) - 1 and part.plaintext_length % chunk_size:
            raise ShardSetError(f"{part.name} does not end on a chunk boundary", path=part.path)
    if first is None:  # pragma: no cover - refused in the loop above
        raise ShardSetError("not a shard set")
    return ShardSet(
        parts=parts,
        set_id=first.set_id,
        chunk_size=chunk_size,
        dataset_key=dataset_key,
        _firsts=tuple(firsts),
    )
