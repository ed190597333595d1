"""Reading sealed chunks for the PyTorch datasets: sources, CPU and GPU readers, item shapes.

Shared by :mod:`staging.torch_dataset` (map-style) and :mod:`staging.torch_stream`
(iterable). A reader decrypts only into memory that nobody else can see until the chunk's
tag verified: the plaintext AES-GCM writes before its check never reaches a tensor that was
handed out.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch

from gpucc.core.errors import UsageError

from ._pipeline import ChunkFailure, run_chunks
from .chunks import ChunkCipher
from .dataset import io_error, read_exact
from .errors import ChunkAuthenticationError, MalformedDatasetError
from .format import TAG_SIZE, StrPath
from .shards import ShardSet, open_shard_set
from .sources import ObjectSource, Opener
from .sources.errors import ObjectChangedError

__all__ = ["Source", "TorchDevice"]

#: What the datasets read: a sealed file, the files of a shard set in order, or an opened set;
#: a name may be an ``s3://`` or ``https://`` object, or an ``s3://bucket/prefix/``.
Source = StrPath | Sequence[StrPath] | ShardSet
TorchDevice = Literal["cpu", "cuda"]


def open_source(
    source: Source,
    key: bytes | None,
    kek: bytes | None,
    key_file: StrPath | None,
    key_for: Callable[[bytes], bytes] | None,
) -> ShardSet:
    if isinstance(source, ShardSet):
        if any(x is not None for x in (key, kek, key_file, key_for)):
            raise UsageError("an opened shard set carries its key: give no key arguments")
        return source
    shards = open_shard_set(source, key=key, kek=kek, key_file=key_file, key_for=key_for)
    for part in shards.parts:
        if part.source is not None:  # each reader opens its own (CpuReader)
            part.source.close()
    return shards


class CpuReader:
    """Reads and verifies global chunks of a shard set into host memory (one process).

    A local part is opened at once and checked against its verified header. A remote part
    (``s3://``, ``https://``, :mod:`staging.sources`) is opened in this process when its
    first chunk is read, and must still be the object the set was verified at (its length
    and pin, an ETag or version); then each chunk is one ranged read of its own bytes. So a
    rank or a DataLoader worker opens only the shards its chunks lie in, and reads only
    their ranges.
    """

    def __init__(self, shards: ShardSet, threads: int) -> None:
        self.shards = shards
        self.threads = threads
        self.fds: list[int] = []
        self._sources: dict[int, ObjectSource] = {}
        self._lock = threading.Lock()
        self._opener = Opener()
        try:
            for part in shards.parts:
                if part.source is not None:
                    self.fds.append(-1)
                    continue
                try:
                    fd = os.open(part.path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError as exc:
                    raise io_error("read", part.path, exc) from None
                self.fds.append(fd)
                try:
                    size = os.fstat(fd).st_size
                    prefix = os.pread(fd, len(part.prefix), 0)
                except OSError as exc:
                    raise io_error("read", part.path, exc) from None
                if size != part.header.file_size or prefix != part.prefix:
                    raise MalformedDatasetError(f"{part.path} changed after it was opened")
        except BaseException:
            self.close()
            raise
        self._ciphers = [ChunkCipher(shards.dataset_key, p.header) for p in shards.parts]
        self._scratch = [bytearray(shards.chunk_size + TAG_SIZE) for _ in range(threads)]

    def open_for(self, chunks: Sequence[int]) -> None:
        """Open now, in this thread, the remote shards that ``chunks`` lie in (and no
        other): the threads that then read the chunks only send requests.

        Raises:
            ObjectChangedError: see :meth:`_source`.
        """
        for part in sorted({self.shards.locate(g)[0] for g in chunks}):
            if self.shards.parts[part].source is not None:
                self._source(part)

    def _source(self, part: int) -> ObjectSource:
        """This process's source of remote part ``part``, opened on first use.

        Raises:
            ObjectChangedError: the object is no longer the one the set was verified at.
        """
        with self._lock:
            source = self._sources.get(part)
            if source is not None:
                return source
            dataset = self.shards.parts[part]
            verified = dataset.source
            assert verified is not None
            source = self._opener.open(dataset.name, verified.settings)
            if source.size != dataset.header.file_size or source.pin != verified.pin:
                source.close()
                raise ObjectChangedError(
                    f"{dataset.name} changed after the shard set was opened: it is no longer "
                    f"{verified.pin} of {dataset.header.file_size} bytes"
                )
            self._sources[part] = source
            return source

    def read_sealed(self, chunk: int, scratch: bytearray) -> tuple[int, int, memoryview]:
        """``(shard, local chunk, ct || tag)`` of global chunk ``chunk``, read into ``scratch``."""
        part, local = self.shards.locate(chunk)
        dataset = self.shards.parts[part]
        header = dataset.header
        sealed = memoryview(scratch)[: header.chunk_length(local) + TAG_SIZE]
        if dataset.source is not None:
            self._source(part).read_into(header.chunk_offset(local), sealed)
            return part, local, sealed
        try:
            read_exact(self.fds[part], sealed, header.chunk_offset(local))
        except OSError as exc:
            raise io_error("read", dataset.path, exc) from None
        return part, local, sealed

    def decrypt_one(self, chunk: int, out: memoryview, scratch: bytearray) -> int:
        """Verify global chunk ``chunk`` into ``out``, reading through ``scratch``.

        ``out`` must be memory nobody else reads before this returns (AES-GCM writes the
        plaintext before it checks the tag). Returns the plaintext length.

        Raises:
            ChunkAuthenticationError: with the global index and the shard; ``out`` is zeroed.
        """
        part, local, sealed = self.read_sealed(chunk, scratch)
        length = len(sealed) - TAG_SIZE
        try:
            self._ciphers[part].decrypt_into(local, sealed, out[:length])
        except ChunkAuthenticationError:
            dataset = self.shards.parts[part]
            raise ChunkAuthenticationError(
                chunk, f"{dataset.name}, chunk {local}", path=dataset.path
            ) from None
        return length

    def decrypt(self, chunks: Sequence[int], out: np.ndarray[Any, np.dtype[np.uint8]]) -> None:
        """Verify ``chunks`` into ``out`` back to back, each at ``j * chunk_size``.

        Raises:
            ChunkAuthenticationError: the first failing chunk (its global index); ``out``
                is zeroed.
        """
        size = self.shards.chunk_size
        view = out.data.cast("B")

        def work(j: int, slot: int) -> None:
            self.decrypt_one(chunks[j], view[j * size : (j + 1) * size], self._scratch[slot])

        try:
            run_chunks(len(chunks), work, threads=min(self.threads, max(1, len(chunks))))
        except ChunkFailure as failure:
            out.fill(0)
            raise failure.cause from None
        except BaseException:
            out.fill(0)
            raise
        finally:
            view.release()

    def close(self) -> None:
        fds, self.fds = self.fds, []
        for fd in fds:
            if fd >= 0:
                os.close(fd)
        with self._lock:
            opened, self._sources = self._sources, {}
        for source in opened.values():
            source.close()


class GpuReader:
    """Reads sealed chunks into private host memory and opens each on the GPU into an array
    of its own (from CuPy's memory pool), verified before anybody sees it."""

    def __init__(self, shards: ShardSet, device: int) -> None:
        from . import _gpu_runtime, gpu

        gpu.require_gpu(device)
        self._gpu = gpu
        self.cupy: Any = _gpu_runtime.import_cupy()
        self.device = device
        self.cpu = CpuReader(shards, 1)
        self.shards = shards
        self._scratch = bytearray(shards.chunk_size + TAG_SIZE)

    def open_chunk(self, chunk: int) -> Any:
        """Global chunk ``chunk`` verified into a new device array (zeroed if it fails).

        Raises:
            ChunkAuthenticationError: with the global index and the shard.
        """
        cupy = self.cupy
        part, local, sealed = self.cpu.read_sealed(chunk, self._scratch)
        path = self.shards.parts[part].path
        name = self.shards.parts[part].name
        with cupy.cuda.Device(self.device):
            records = cupy.asarray(np.frombuffer(sealed, dtype=np.uint8))
            out = cupy.empty(len(sealed) - TAG_SIZE, dtype=cupy.uint8)
            try:
                self._gpu.decrypt_records_gpu(
                    records,
                    self.shards.parts[part].header,
                    self.shards.dataset_key,
                    out=out,
                    first_chunk=local,
                )
            except ChunkAuthenticationError:
                raise ChunkAuthenticationError(chunk, f"{name}, chunk {local}", path=path) from None
            except BaseException:
                out.fill(0)
                cupy.cuda.Device(self.device).synchronize()
                raise
        return out

    def close(self) -> None:
        self.cpu.close()


def device_index(device: str) -> tuple[TorchDevice, int]:
    if device == "cpu":
        return "cpu", 0
    kind, _, index = device.partition(":")
    if kind in ("cuda", "gpu"):
        return "cuda", int(index or "0")
    raise UsageError(f"unknown device {device!r} (expected cpu, cuda or cuda:N)")


def as_items(
    flat: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...] | None, record_size: int | None
) -> torch.Tensor:
    typed = flat.view(dtype) if dtype != torch.uint8 else flat
    if record_size is None and shape is None:
        return typed
    return typed.reshape(-1, *(shape or ()))


def record_shape(
    record_size: int | None, dtype: torch.dtype, shape: Sequence[int] | None
) -> tuple[int, ...] | None:
    itemsize = torch.empty((), dtype=dtype).element_size()
    if shape is not None:
        shape = tuple(int(s) for s in shape)
        elements = int(np.prod(shape)) if shape else 1
        if record_size is not None and elements * itemsize != record_size:
            raise UsageError(f"shape {shape} of {dtype} is not {record_size} bytes")
        return shape
    if record_size is None:
        return None
    if record_size % itemsize:
        raise UsageError(f"record_size {record_size} is not a multiple of {dtype}'s size")
    return (record_size // itemsize,)
