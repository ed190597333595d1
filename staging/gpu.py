"""GPU staging: sealed chunks cross PCIe as ciphertext and are opened and verified on the GPU.

::

    from gpucc.staging import gpu, open_sealed

    dataset = open_sealed("train.gcc")
    with gpu.gpu_staging(dataset, dataset_key) as staged:
        x = torch.from_dlpack(staged.array)      # verified plaintext in device memory
    # here the device memory has been zeroed, also when the body raised

The pipeline (one per GPU)::

    reader threads --pread--> pinned host ring --H2D, copy stream--> device ciphertext ring
        --event--> gcm_chunks + gcm_finalize, compute stream --> final device buffer
                                                             \\--> status words --D2H--> host

* A pinned slot is refilled as soon as its H2D copy has completed (its event), without
  waiting for decryption; a device slot is overwritten only after the kernels that read it
  finished. The ciphertext is never decrypted on the host: the host sees only ciphertext.
* One launch covers many chunks (a batch of about ``batch_bytes``): small chunks do not pay a
  launch each. The kernels are in ``staging/kernels/aesgcm.cu`` (design: ``docs/GPU.md``).
* Every chunk's tag is checked on the GPU. A chunk whose tag fails is zeroed on the device;
  the host reads the status words, stops at the first failure, zeroes everything from that
  chunk on (everything, when staging owns the buffer) and raises
  :class:`~staging.errors.ChunkAuthenticationError` for the lowest failing chunk: the
  same contract as :func:`staging.cpu.stage_cpu`. A buffer is only returned once every
  status word has been read and is zero, so no unverified plaintext reaches the caller.
* Plaintext input (:func:`stage_plaintext_gpu`): host threads seal each chunk under a fresh
  random key into the pinned slots (``AESGCM.encrypt_into``), the GPU opens them.
* :func:`seal_gpu` runs the kernels the other way: data leaving the GPU is sealed on the GPU
  into a dataset any CPU reader (``cryptography``) opens.
* ``gpus``: a dataset is split into chunk ranges across local GPUs, one pipeline each.
* GPUDirect Storage through kvikio when it is importable and not in compatibility mode
  (sealed input only); plain reads otherwise.

CuPy is optional (``pip install 'gpucc[gpu]'``): this module imports without it and
:func:`gpu_available` / :func:`require_gpu` say why GPU staging cannot run. A device whose
kernels do not build or fail their known answers is not "unavailable": every entry point
raises :class:`~staging.errors.GpuKernelError` for it.

This module is the public face. The work is done in ``_gpu_runtime`` (CuPy, the kernel
build and self-test, the per-device key context), ``_gpu_pipeline`` (sources, the pinned
ring and streams of one device) and ``_gpu_shard`` (splitting a dataset over devices).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpucc.core.errors import UsageError

from . import _gpu_runtime as rt
from ._gpu_pipeline import (
    PlaintextSource,
    SealedSource,
)
from ._gpu_runtime import (
    DEFAULT_BATCH_BYTES,
    DEFAULT_SLOTS,
    GcmDevice,
    check_aligned,
    device_list,
    gpu_available,
    gpu_count,
    require_gpu,
    unavailable_reason,
)
from ._gpu_shard import GpuShard, single_array, stage_shards
from .dataset import SealedDataset
from .errors import ChunkAuthenticationError, GpuKernelError
from .format import (
    DEFAULT_CHUNK_SIZE,
    TAG_SIZE,
    Header,
    StrPath,
    compute_header_tag,
    derive_chunk_key,
)
from .seal import ProgressCallback, WrapSpec, default_threads, plan_seal

__all__ = [
    "GpuBackend",
    "GpuShard",
    "GpuStaged",
    "backend",
    "decrypt_records_gpu",
    "gpu_available",
    "gpu_count",
    "gpu_staging",
    "require_gpu",
    "scrub_gpu",
    "seal_gpu",
    "stage_gpu",
    "stage_gpu_sharded",
    "stage_plaintext_gpu",
    "stage_plaintext_gpu_sharded",
    "unavailable_reason",
]

# --- public staging functions ---------------------------------------------------------------------


def stage_gpu_sharded(
    dataset: SealedDataset,
    dataset_key: bytes,
    *,
    gpus: int | Sequence[int] | None = None,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    outs: Sequence[Any] | None = None,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    slots: int = DEFAULT_SLOTS,
    use_gds: bool | None = None,
) -> list[GpuShard]:
    """Open and verify a sealed dataset on one or more GPUs, split by chunk ranges.

    Args:
        dataset: from :func:`staging.open_sealed`.
        dataset_key: the unwrapped dataset key.
        gpus: a device count (devices 0..N-1) or a list of device ids; default device 0.
        threads: host reader threads (default ``min(8, os.cpu_count())``).
        progress: ``progress(done_bytes, total_bytes)`` as batches verify (from pipeline
            threads when several GPUs are used).
        outs: destinations, one per shard (see :func:`stage_gpu`); new arrays by default.
        batch_bytes: sealed bytes per H2D copy and launch.
        slots: depth of the pinned and device rings.
        use_gds: GPUDirect Storage through kvikio; default: when kvikio runs real GDS.

    Returns:
        One :class:`GpuShard` per device used (fewer than asked when there are fewer chunks).

    Raises:
        HeaderAuthenticationError: wrong key or altered header (nothing staged).
        ChunkAuthenticationError: the lowest failing chunk; see :func:`stage_gpu`.
        GpuStagingUnavailableError: no CuPy, no driver or no such device.
        GpuKernelError: the kernels do not build or fail their known answers there
            (``stage="build"``, ...), or a kernel faulted on this work (``"launch"``; every
            byte of the output is zeroed, and a chunk rejected before the fault is still
            raised as ChunkAuthenticationError).
        MalformedDatasetError: the file changed since it was opened.
        StagingIOError: the file cannot be read.
    """
    dataset.check_key(dataset_key)  # before any device work: a wrong key touches nothing
    return _sealed_on(
        usable_devices(gpus),
        dataset,
        dataset_key,
        threads=threads,
        progress=progress,
        outs=outs,
        batch_bytes=batch_bytes,
        slots=slots,
        use_gds=use_gds,
    )


def _sealed_on(
    devices: list[int],
    dataset: SealedDataset,
    dataset_key: bytes,
    *,
    threads: int | None,
    progress: ProgressCallback | None,
    outs: Sequence[Any] | None = None,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    slots: int = DEFAULT_SLOTS,
    use_gds: bool | None = None,
) -> list[GpuShard]:
    """:func:`stage_gpu_sharded` once the key and the devices are checked."""
    chunk_key = derive_chunk_key(dataset_key, dataset.header.dataset_id)
    source = SealedSource(dataset)
    try:
        return stage_shards(
            source,
            chunk_key,
            devices,
            threads=threads or min(8, default_threads()),
            progress=progress,
            outs=outs,
            batch_bytes=batch_bytes,
            slots=slots,
            use_gds=use_gds,
        )
    finally:
        source.close()


def stage_gpu(
    dataset: SealedDataset,
    dataset_key: bytes,
    *,
    device: int = 0,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    out: Any = None,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    slots: int = DEFAULT_SLOTS,
    use_gds: bool | None = None,
) -> Any:
    """Open and verify a sealed dataset into GPU memory.

    Args:
        dataset: from :func:`staging.open_sealed`.
        dataset_key: the unwrapped dataset key.
        device: CUDA device id.
        threads: host reader threads (default ``min(8, os.cpu_count())``).
        progress: ``progress(done_bytes, total_bytes)``, in the calling thread, in order.
        out: a destination on ``device`` (1-D contiguous ``uint8``, plaintext length). Its
            contents are unspecified until this function returns or raises.
        batch_bytes: sealed bytes per H2D copy and launch.
        slots: depth of the pinned and device rings.
        use_gds: GPUDirect Storage through kvikio; default: when kvikio runs real GDS.

    Returns:
        A 1-D ``cupy.ndarray`` of ``uint8``: every byte verified. Use it from PyTorch with
        ``torch.from_dlpack(array)``; zero it with :func:`scrub_gpu` (or use
        :func:`gpu_staging`, which does).

    Raises:
        HeaderAuthenticationError: wrong key or altered header (nothing decrypted).
        ChunkAuthenticationError: a chunk failed; it and every byte after it are zero in
            ``out`` (an array staging allocated itself is zeroed entirely).
        GpuStagingUnavailableError: no CuPy, no driver or no such device.
        GpuKernelError: the kernels do not build or fail their known answers there
            (``stage="build"``, ...), or a kernel faulted on this work (``"launch"``; every
            byte of the output is zeroed, and a chunk rejected before the fault is still
            raised as ChunkAuthenticationError).
        MalformedDatasetError: the file changed since it was opened.
        StagingIOError: the file cannot be read.
    """
    shards = stage_gpu_sharded(
        dataset,
        dataset_key,
        gpus=[device],
        threads=threads,
        progress=progress,
        outs=None if out is None else [out],
        batch_bytes=batch_bytes,
        slots=slots,
        use_gds=use_gds,
    )
    return single_array(shards)


def stage_plaintext_gpu_sharded(
    path: StrPath,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    gpus: int | Sequence[int] | None = None,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    outs: Sequence[Any] | None = None,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    slots: int = DEFAULT_SLOTS,
) -> list[GpuShard]:
    """Move a plaintext file to one or more GPUs sealed in transit (host seals, GPU opens).

    A fresh random dataset key is made for this call only; host threads seal each chunk
    (``AESGCM.encrypt_into``) straight into the pinned ring, and only ciphertext crosses
    PCIe. See :func:`stage_plaintext_gpu`.

    Raises:
        MalformedInputError: ``path`` is not a regular file or changed size.
        ChunkAuthenticationError: a chunk did not verify (memory or transfer corruption).
        GpuStagingUnavailableError: no CuPy, no driver or no such device.
        GpuKernelError: the kernels do not build or fail their known answers there
            (``stage="build"``, ...), or a kernel faulted on this work (``"launch"``; every
            byte of the output is zeroed, and a chunk rejected before the fault is still
            raised as ChunkAuthenticationError).
        StagingIOError: the file cannot be read.
    """
    return _plaintext_on(
        usable_devices(gpus),
        path,
        chunk_size=chunk_size,
        threads=threads,
        progress=progress,
        outs=outs,
        batch_bytes=batch_bytes,
        slots=slots,
    )


def _plaintext_on(
    devices: list[int],
    path: StrPath,
    *,
    chunk_size: int,
    threads: int | None,
    progress: ProgressCallback | None,
    outs: Sequence[Any] | None = None,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    slots: int = DEFAULT_SLOTS,
) -> list[GpuShard]:
    """:func:`stage_plaintext_gpu_sharded` on devices already checked."""
    workers = threads or default_threads()
    source = PlaintextSource(path, chunk_size, workers)
    try:
        chunk_key = derive_chunk_key(source.dataset_key, source.header.dataset_id)
        shards = stage_shards(
            source,
            chunk_key,
            devices,
            threads=workers,
            progress=progress,
            outs=outs,
            batch_bytes=batch_bytes,
            slots=slots,
            use_gds=False,
        )
        try:
            source.check_unchanged()
        except BaseException:
            _scrub_all([shard.array for shard in shards], quietly=True)
            raise
        return shards
    finally:
        source.close()


def stage_plaintext_gpu(
    path: StrPath,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    device: int = 0,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    out: Any = None,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    slots: int = DEFAULT_SLOTS,
) -> Any:
    """Move a plaintext file into GPU memory, sealed in transit under a fresh key.

    Args:
        path: a regular file.
        chunk_size: chunk size of the in-transit sealing.
        device: CUDA device id.
        threads: host threads that read and seal (default ``os.cpu_count()``).
        progress: ``progress(done_bytes, total_bytes)``, in the calling thread, in order.
        out: a destination on ``device`` (see :func:`stage_gpu`).
        batch_bytes: sealed bytes per H2D copy and launch.
        slots: depth of the pinned and device rings.

    Returns:
        A 1-D ``cupy.ndarray`` of ``uint8`` holding the file, verified on the GPU.

    Raises:
        MalformedInputError: ``path`` is not a regular file or changed size.
        ChunkAuthenticationError: a chunk did not verify (memory or transfer corruption).
        GpuStagingUnavailableError: no CuPy, no driver or no such device.
        GpuKernelError: the kernels do not build or fail their known answers there
            (``stage="build"``, ...), or a kernel faulted on this work (``"launch"``; every
            byte of the output is zeroed, and a chunk rejected before the fault is still
            raised as ChunkAuthenticationError).
        StagingIOError: the file cannot be read.
    """
    shards = stage_plaintext_gpu_sharded(
        path,
        chunk_size=chunk_size,
        gpus=[device],
        threads=threads,
        progress=progress,
        outs=None if out is None else [out],
        batch_bytes=batch_bytes,
        slots=slots,
    )
    return single_array(shards)


def scrub_gpu(array: Any) -> None:
    """Zero a device array in place and wait until the zeros are written.

    Raises:
        GpuKernelError: the device reported a fault (``stage="launch"``); the zeroing was
            queued once more and waited for.
    """
    cupy = rt.import_cupy()
    device = int(array.device.id)
    with cupy.cuda.Device(device):
        try:
            array.fill(0)
            cupy.cuda.Device(device).synchronize()
        except rt.device_faults(cupy) as exc:
            rt.zero_buffers(cupy, device, cupy.cuda.get_current_stream(), [array])
            raise rt.launch_fault(device, exc) from None


def _scrub_all(arrays: Sequence[Any], *, quietly: bool = False) -> None:
    """:func:`scrub_gpu` every array, even when one device faults; then raise the first fault
    (unless ``quietly``: another error is already on its way)."""
    first: GpuKernelError | None = None
    for array in arrays:
        try:
            scrub_gpu(array)
        except GpuKernelError as exc:
            first = first or exc
    if first is not None and not quietly:
        raise first


@dataclass
class GpuStaged:
    """What :func:`gpu_staging` yields: the shards, and the array when there is one GPU.

    Attributes:
        shards: one per device, in chunk order.
    """

    shards: list[GpuShard]

    @property
    def nbytes(self) -> int:
        """Plaintext bytes staged, over all shards."""
        return sum(int(s.array.size) for s in self.shards)

    @property
    def array(self) -> Any:
        """The verified plaintext (single-GPU staging)."""
        if len(self.shards) != 1:
            raise UsageError("staged on several GPUs: use .shards")
        return self.shards[0].array

    def scrub(self) -> None:
        """Zero every shard's device memory (all of them, even when one device faults)."""
        _scrub_all([shard.array for shard in self.shards])


@contextmanager
def gpu_staging(
    source: SealedDataset | StrPath,
    dataset_key: bytes | None = None,
    *,
    gpus: int | Sequence[int] | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
) -> Iterator[GpuStaged]:
    """Stage onto the GPU(s), yield the result, and zero the device memory on exit.

    ``source`` is an opened sealed dataset (then ``dataset_key`` is required) or the path of a
    plaintext file (sealed in transit under a fresh key; no key allowed). The device memory
    is zeroed when the block exits, normally or by an exception.

    Raises:
        UsageError: a key with a plaintext path, or no key with a sealed dataset.
        Everything :func:`stage_gpu_sharded` and :func:`stage_plaintext_gpu_sharded` raise.
    """
    if isinstance(source, SealedDataset):
        if dataset_key is None:
            raise UsageError("a sealed dataset needs its dataset key")
        shards = stage_gpu_sharded(
            source, dataset_key, gpus=gpus, threads=threads, progress=progress
        )
    else:
        if dataset_key is not None:
            raise UsageError(f"{source} is a plaintext path, so it takes no key")
        shards = stage_plaintext_gpu_sharded(
            source, chunk_size=chunk_size, gpus=gpus, threads=threads, progress=progress
        )
    staged = GpuStaged(shards=shards)
    try:
        yield staged
    finally:
        staged.scrub()


# --- device-resident data: the kernels without the pipeline ---------------------------------------


def decrypt_records_gpu(
    records: Any,
    header: Header,
    dataset_key: bytes,
    *,
    out: Any = None,
    first_chunk: int = 0,
) -> Any:
    """Open sealed records already in device memory (one launch pair over all of them).

    ``records`` holds ``ct_i || tag_i`` of chunks ``first_chunk ..`` back to back (the file's
    chunk area, or part of it), as a 1-D ``uint8`` device array. This is the kernel alone:
    the benchmark's device-resident measurement and the tests' direct path.

    Raises:
        ChunkAuthenticationError: the lowest failing chunk; ``out`` is zeroed from it on (an
            array allocated here is zeroed entirely).
        ValueError: ``records`` is not a whole number of records.
        GpuKernelError: a kernel faulted (``stage="launch"``); ``out`` is zeroed.
    """
    cupy = rt.import_cupy()
    device_id = int(records.device.id)
    chunk_key = derive_chunk_key(dataset_key, header.dataset_id)
    count, length = _count_records(header, records.size, first_chunk)
    check_aligned("records", records)
    if out is not None:
        check_aligned("out", out)
    owned = out is None
    faults = rt.device_faults(cupy)
    with cupy.cuda.Device(device_id):
        if owned:
            out = cupy.empty(length, dtype=cupy.uint8)
        elif out.size != length or out.dtype != cupy.uint8:
            raise ValueError(f"out must be {length} uint8 bytes")
        stream = cupy.cuda.get_current_stream()
        try:
            gcm = GcmDevice(cupy, device_id, header, chunk_key)  # on the current stream
            try:
                status = cupy.zeros(max(1, count), dtype=cupy.uint32)
                if count:
                    gcm.launch(first_chunk, count, records, out, status, seal=False)
                verdicts = cupy.asnumpy(status[:count])
            except BaseException:
                rt.zero_buffers(cupy, device_id, stream, [out])
                rt.scrub_quietly(faults, gcm.close)
                raise
            gcm.close()
        except faults as exc:
            rt.zero_buffers(cupy, device_id, stream, [out])
            raise rt.launch_fault(device_id, exc) from None
        bad = np.flatnonzero(verdicts)
        if bad.size:
            cut = 0 if owned else int(bad[0]) * header.chunk_size
            # The rejection is what is raised, even if the device faults while zeroing.
            rt.zero_buffers(cupy, device_id, stream, [out[cut:]])
            raise ChunkAuthenticationError(first_chunk + int(bad[0]))
    return out


def _count_records(header: Header, nbytes: int, first: int) -> tuple[int, int]:
    """(chunks, plaintext bytes) of ``nbytes`` of records starting at chunk ``first``."""
    count = 0
    plain = 0
    pos = 0
    total = header.chunk_count
    stride = header.chunk_size + TAG_SIZE
    if nbytes and first < total:
        full = min(total - 1 - first, nbytes // stride)
        count, plain, pos = full, full * header.chunk_size, full * stride
    while pos < nbytes and first + count < total:
        length = header.chunk_length(first + count)
        pos += length + TAG_SIZE
        plain += length
        count += 1
    if pos != nbytes:
        raise ValueError("records do not end on a chunk boundary")
    return count, plain


def seal_gpu(
    data: Any,
    *,
    kek: bytes | None = None,
    wrap: WrapSpec | None = None,
    dataset_key: bytes | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    dataset_id: bytes | None = None,
) -> bytearray:
    """Seal device data on the GPU into a sealed dataset (format v1) in host memory.

    Only ciphertext leaves the device. The result is exactly what :func:`staging.seal_bytes`
    would write for the same key, dataset id and data, so any reader opens it.

    Args:
        data: a 1-D ``uint8`` device array (contiguous).
        kek: wrap the dataset key for this key-file key, or
        wrap: for this recipient, or neither and pass
        dataset_key: the dataset key (also usable with kek/wrap; random by default).
        chunk_size: the dataset's chunk size.
        dataset_id: 16 bytes (random by default; tests only).

    Raises:
        ValueError: inconsistent key arguments or a bad ``data`` array.
        GpuStagingUnavailableError: no CuPy.
        GpuKernelError: the kernels do not build or fail their known answers there
            (``stage="build"``, ...), or a kernel faulted on this work (``"launch"``; the
            device copy of the records is zeroed, nothing is returned).
    """
    cupy = rt.import_cupy()
    if data.dtype != cupy.uint8 or data.ndim != 1 or not data.flags.c_contiguous:
        raise ValueError("data must be a contiguous 1-D uint8 device array")
    check_aligned("data", data)
    header, key, record = plan_seal(
        int(data.size),
        kek=kek,
        wrap=wrap,
        dataset_key=dataset_key,
        chunk_size=chunk_size,
        dataset_id=dataset_id,
    )
    chunk_key = derive_chunk_key(key, header.dataset_id)
    prefix = (
        header.to_bytes()
        + compute_header_tag(chunk_key, header)
        + (b"" if record is None else record.to_bytes())
    )
    device_id = int(data.device.id)
    blob = bytearray(header.file_size)
    blob[: len(prefix)] = prefix
    with cupy.cuda.Device(device_id):
        require_gpu(device_id)
        records = cupy.empty(header.file_size - len(prefix), dtype=cupy.uint8)
        faults = rt.device_faults(cupy)
        stream = cupy.cuda.get_current_stream()
        try:
            gcm = GcmDevice(cupy, device_id, header, chunk_key)  # on the current stream
            try:
                status = cupy.zeros(header.chunk_count, dtype=cupy.uint32)
                gcm.launch(0, header.chunk_count, data, records, status, seal=True)
                host = np.frombuffer(memoryview(blob)[len(prefix) :], dtype=np.uint8)
                records.get(out=host)
            except BaseException:
                rt.scrub_quietly(faults, gcm.close)
                raise
            gcm.close()
        except faults as exc:
            rt.zero_buffers(cupy, device_id, stream, [records])
            raise rt.launch_fault(device_id, exc) from None
    return blob


# --- the staging.api backend ----------------------------------------------------------------------


@dataclass(frozen=True)
class GpuBackend:
    """The GPU backend for :func:`staging.stage` (``device="gpu"`` / ``"auto"``).

    With one device, the staged buffer is a ``cupy.ndarray``; with several, a list of
    :class:`GpuShard` in chunk order.
    """

    devices: tuple[int, ...] = (0,)
    name: str = "gpu"

    def stage_sealed(
        self,
        dataset: SealedDataset,
        dataset_key: bytes,
        *,
        threads: int | None,
        progress: ProgressCallback | None,
    ) -> Any:
        """Open and verify a sealed dataset on the GPU(s)."""
        dataset.check_key(dataset_key)
        shards = _sealed_on(
            list(self.devices), dataset, dataset_key, threads=threads, progress=progress
        )
        return shards[0].array if len(self.devices) == 1 else shards

    def stage_plaintext(
        self,
        path: Path,
        *,
        chunk_size: int,
        threads: int | None,
        progress: ProgressCallback | None,
    ) -> Any:
        """Move a plaintext file onto the GPU(s), sealed in transit."""
        shards = _plaintext_on(
            list(self.devices), path, chunk_size=chunk_size, threads=threads, progress=progress
        )
        return shards[0].array if len(self.devices) == 1 else shards

    def scrub(self, buf: Any) -> None:
        """Zero what :meth:`stage_sealed` or :meth:`stage_plaintext` returned."""
        _scrub_all([shard.array for shard in buf] if isinstance(buf, list) else [buf])


def backend(gpus: int | Sequence[int] | None = None) -> GpuBackend:
    """The GPU backend for ``gpus`` (default: device 0), checked to be usable.

    Raises:
        GpuStagingUnavailableError: no CuPy, no driver, or too few devices.
        GpuKernelError: the kernels do not build or fail their known answers there.
        UsageError: a bad ``gpus`` value.
    """
    return GpuBackend(devices=tuple(usable_devices(gpus)))


def usable_devices(gpus: int | Sequence[int] | None = None) -> list[int]:
    """The device ids ``gpus`` names, each checked once to be usable for staging.

    Raises:
        GpuStagingUnavailableError: no CuPy, no driver, or too few devices.
        GpuKernelError: the kernels do not build or fail their known answers there.
        UsageError: a bad ``gpus`` value.
    """
    devices = device_list(gpus)
    for dev in devices:
        if dev != 0 or not isinstance(gpus, int) or gpus == 1:
            require_gpu(dev)  # device_list already checked device 0 for a count above 1
    return devices
