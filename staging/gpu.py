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
:func:`gpu_available` / :func:`require_gpu` say why GPU staging cannot run.
"""

from __future__ import annotations

import os
import stat
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from gpucc.gpuattest.errors import MalformedInputError, UsageError

from .chunks import ChunkCipher
from .dataset import SealedDataset, io_error, read_exact
from .errors import ChunkAuthenticationError, GpuStagingUnavailableError, MalformedDatasetError
from .format import (
    DEFAULT_CHUNK_SIZE,
    KEY_SIZE,
    TAG_SIZE,
    Header,
    StrPath,
    compute_header_tag,
    derive_chunk_key,
    new_dataset_key,
)
from .seal import ProgressCallback, WrapSpec, default_threads

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

# --- kernel geometry, mirrored from staging/kernels/aesgcm_math.cuh ----------
# tests/test_kernel_harness.py checks these against the header (harness command "layout").

#: Blocks per thread per tile (GCMK_K).
_K = 4
#: Largest CTA of gcm_chunks (GCMK_MAX_THREADS).
_MAX_THREADS = 256
#: Threads of gcm_finalize (kCombineThreads); also the highest power of G in the key context.
_COMBINE_THREADS = 256
#: Word offset of H^1 in the key context (kCtxHPow).
_CTX_HPOW = 72
#: CTAs of gcm_chunks resident per SM (its __launch_bounds__ minimum): the persistent grid.
_CTAS_PER_SM = 4

#: Default bytes of sealed records per batch: one H2D copy and one launch pair each.
#: At ~50 GB/s this is ~0.7 ms per batch, well above the ~10-50 us a batch costs in Python.
DEFAULT_BATCH_BYTES = 32 * 1024 * 1024
#: Default slots of the pinned host ring and of the device ciphertext ring.
DEFAULT_SLOTS = 4
#: Reads of sealed records are split into pieces of this size across reader threads.
_READ_PIECE = 4 * 1024 * 1024


def _ctx_words(ct: int) -> int:
    """32-bit words of a key context for tiles of ``ct`` blocks (ctx_words in the header)."""
    return _CTX_HPOW + 4 * ct + 4 * (_COMBINE_THREADS + 1)


def _threads_for(chunk_size: int) -> int:
    """CTA width of gcm_chunks: the widest (<= 256) whose tile fits in a full chunk."""
    blocks = chunk_size // 16
    width = _MAX_THREADS
    while width > 32 and _K * width > blocks:
        width //= 2
    return width


def _check_aligned(name: str, array: Any) -> None:
    """The kernels read and write 16-byte vectors: device buffers must be 16-byte aligned."""
    if int(array.data.ptr) % 16:
        raise ValueError(f"{name} must start on a 16-byte boundary (a view at an odd offset?)")


def _tiles(length: int, ct: int) -> int:
    blocks = -(-length // 16)
    return -(-blocks // ct)


# --- CuPy, devices and the compiled module ------------------------------------------------------


def _cupy() -> Any:
    """The cupy module (imported lazily; it is an optional dependency).

    Raises:
        GpuStagingUnavailableError: CuPy is not installed.
    """
    try:
        import cupy
    except ImportError as exc:
        raise GpuStagingUnavailableError(
            f"CuPy is not installed ({exc.__class__.__name__}: {exc})"
        ) from None
    return cupy


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] if text else exc.__class__.__name__


def gpu_count() -> int:
    """Number of CUDA devices CuPy sees (0 without CuPy, a driver or a device)."""
    try:
        cupy = _cupy()
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - any failure here means "no usable GPU"
        return 0


def _kernel_source() -> str:
    """aesgcm.cu with aesgcm_math.cuh inlined (no include path needed, zip-safe)."""
    pkg = resources.files("gpucc.staging.kernels")
    header = pkg.joinpath("aesgcm_math.cuh").read_text(encoding="utf-8")
    main = pkg.joinpath("aesgcm.cu").read_text(encoding="utf-8")
    include = '#include "aesgcm_math.cuh"'
    if main.count(include) != 1:
        raise GpuStagingUnavailableError("kernel source is damaged (include line not found)")
    return main.replace(include, header)


#: Options for NVRTC. CuPy adds the architecture of the current device (sm_90 on an H100).
_NVRTC_OPTIONS = ("-std=c++17", f"-DGCMK_K={_K}")


@dataclass(frozen=True)
class _Kernels:
    setup: Any
    chunks: Any
    finalize: Any
    selftest: Any
    sm_count: int


#: Known answers checked on each device right after the kernels are built (McGrew & Viega,
#: "The Galois/Counter Mode of Operation", AES-256 test cases 14 and 16: one full block; and
#: AAD with a partial last block). key, iv, aad, plaintext, ciphertext, tag (hex).
_KATS = (
    (
        "00" * 32,
        "00" * 12,
        "",
        "00" * 16,
        "cea7403d4d606b6e074ec5d3baf39d18",
        "d0d1c8a799996bf0265b98b5d48ab919",
    ),
    (
        "feffe9928665731c6d6a8f9467308308" * 2,
        "cafebabefacedbaddecaf888",
        "feedfacedeadbeeffeedfacedeadbeefabaddad2",
        "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
        "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39",
        "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
        "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662",
        "76fc6ece0f4e1768cddf8853bb2d551b",
    ),
)

#: Threads of the gcm_selftest CTA (its __launch_bounds__).
_SELFTEST_THREADS = 64


def _gcm_message(
    kernels: _Kernels,
    cupy: Any,
    key: bytes,
    iv: bytes,
    aad: bytes,
    data: bytes,
    *,
    seal: bool,
) -> tuple[bytes, bytes]:
    """One plain GCM message through gcm_selftest on the current device: (output, tag).

    Sealing returns the ciphertext and its tag; opening returns the CTR output and the tag
    computed over ``data`` (the caller compares). The same device code as staging runs.
    """

    def dev(b: bytes) -> Any:
        # Never a zero-size allocation: the kernel gets a valid pointer either way.
        return cupy.asarray(np.frombuffer(b or b"\x00", dtype=np.uint8))

    ct = _K * _SELFTEST_THREADS
    partials = cupy.zeros(max(1, _tiles(len(data), ct)) * 4, dtype=cupy.uint32)
    out = cupy.zeros(max(1, len(data)), dtype=cupy.uint8)
    tag = cupy.zeros(16, dtype=cupy.uint8)
    d_key = dev(key)
    try:
        kernels.selftest(
            (1,),
            (_SELFTEST_THREADS,),
            (
                d_key,
                dev(iv),
                np.uint64(len(iv)),
                dev(aad),
                np.uint64(len(aad)),
                dev(data),
                out,
                np.uint64(len(data)),
                np.uint32(1 if seal else 0),
                partials,
                tag,
            ),
        )
        result = bytes(cupy.asnumpy(out)[: len(data)].tobytes())
        return result, bytes(cupy.asnumpy(tag).tobytes())
    finally:
        d_key.fill(0)
        partials.fill(0)


def _self_test(kernels: _Kernels, cupy: Any) -> bool:
    """Run the known answers on the current device, both directions."""
    for key, iv, aad, pt, ct, tag in _KATS:
        k, i, a, p, c, t = (bytes.fromhex(x) for x in (key, iv, aad, pt, ct, tag))
        if _gcm_message(kernels, cupy, k, i, a, p, seal=True) != (c, t):
            return False
        if _gcm_message(kernels, cupy, k, i, a, c, seal=False) != (p, t):
            return False
    return True


_modules: dict[int, _Kernels] = {}
_modules_lock = threading.Lock()


def _kernels(device_id: int) -> _Kernels:
    """The compiled kernels for one device (compiled once per process and device).

    Right after building, the kernels must reproduce the known answers of :data:`_KATS` on
    that device, sealing and opening; otherwise nothing is staged with them.

    Raises:
        GpuStagingUnavailableError: no CuPy, no such device, the kernels do not build, or
            they fail the known-answer self-test.
    """
    with _modules_lock:
        found = _modules.get(device_id)
        if found is not None:
            return found
        cupy = _cupy()
        try:
            count = int(cupy.cuda.runtime.getDeviceCount())
        except Exception as exc:  # noqa: BLE001 - CUDARuntimeError and driver load errors
            raise GpuStagingUnavailableError(f"no usable CUDA device: {_one_line(exc)}") from None
        if not 0 <= device_id < count:
            raise GpuStagingUnavailableError(
                f"CUDA device {device_id} does not exist ({count} device(s) present)"
            )
        try:
            with cupy.cuda.Device(device_id):
                module = cupy.RawModule(code=_kernel_source(), options=_NVRTC_OPTIONS)
                kernels = _Kernels(
                    setup=module.get_function("gcm_setup"),
                    chunks=module.get_function("gcm_chunks"),
                    finalize=module.get_function("gcm_finalize"),
                    selftest=module.get_function("gcm_selftest"),
                    sm_count=int(cupy.cuda.Device(device_id).attributes["MultiProcessorCount"]),
                )
                passed = _self_test(kernels, cupy)
        except GpuStagingUnavailableError:
            raise
        except Exception as exc:  # noqa: BLE001 - CompileException, CUDADriverError, ...
            raise GpuStagingUnavailableError(
                f"the AES-GCM kernels did not build for CUDA device {device_id}: {_one_line(exc)}"
            ) from None
        if not passed:
            raise GpuStagingUnavailableError(
                f"the AES-GCM kernels failed their known-answer self-test on CUDA device "
                f"{device_id} (a miscompiled or unsupported build); refusing to stage"
            )
        _modules[device_id] = kernels
        return kernels


def unavailable_reason(device_id: int = 0) -> str | None:
    """Why GPU staging cannot run on ``device_id`` (one line), or ``None`` when it can.

    Compiles the kernels for that device the first time (cached for the process).
    """
    try:
        _kernels(device_id)
    except GpuStagingUnavailableError as exc:
        return str(exc)
    return None


def gpu_available(device_id: int = 0) -> bool:
    """Whether CuPy, the device and the compiled kernels are all usable."""
    return unavailable_reason(device_id) is None


def require_gpu(device_id: int = 0) -> None:
    """Check that GPU staging can run on ``device_id``.

    Raises:
        GpuStagingUnavailableError: with a one-line reason (no CuPy, no device, the kernels
            do not compile).
    """
    _kernels(device_id)


def _device_list(gpus: int | Sequence[int] | None) -> list[int]:
    if gpus is None:
        return [0]
    if isinstance(gpus, int):
        if gpus < 1:
            raise UsageError("--gpus must be at least 1")
        if gpus == 1:
            return [0]
        require_gpu(0)  # without any usable GPU, say why (no CuPy, ...) rather than count
        present = gpu_count()
        if gpus > present:
            raise GpuStagingUnavailableError(
                f"{gpus} GPUs requested, {present} CUDA device(s) present"
            )
        return list(range(gpus))
    devices = list(gpus)
    if not devices or len(set(devices)) != len(devices):
        raise UsageError("gpus must name distinct devices")
    return devices


# --- one key on one device ------------------------------------------------------------------------


class _GcmDevice:
    """The key context and scratch of one dataset on one device, and the launches over it.

    The chunk key goes to the device once, gcm_setup expands it (round keys, powers of H) into
    the context, and the device copy of the key is zeroed right after. :meth:`close` zeroes
    the context and the GHASH scratch.
    """

    def __init__(self, cupy: Any, device_id: int, header: Header, chunk_key: bytes) -> None:
        self.cupy = cupy
        self.device_id = device_id
        self.header = header
        self.kernels = _kernels(device_id)
        self.width = _threads_for(header.chunk_size)
        self.ct = _K * self.width
        self.total = header.chunk_count
        self.last_len = header.chunk_length(self.total - 1)
        self.tiles_full = _tiles(header.chunk_size, self.ct)
        self.tiles_last = _tiles(self.last_len, self.ct)
        self.prefix = int.from_bytes(header.dataset_id[:4], "little")
        self.grid_cap = max(1, self.kernels.sm_count * _CTAS_PER_SM)
        self.ctx: Any = None
        self.partials: Any = None
        self.digest: Any = None
        with cupy.cuda.Device(device_id):
            self.ctx = cupy.zeros(_ctx_words(self.ct), dtype=cupy.uint32)
            self.digest = cupy.asarray(np.frombuffer(header.digest, dtype=np.uint8))
            key = cupy.asarray(np.frombuffer(chunk_key, dtype=np.uint8))
            try:
                self.kernels.setup(
                    (1,),
                    (256,),
                    (
                        key,
                        self.ctx,
                        np.uint32(self.ct),
                        np.uint64(-(-header.chunk_size // 16)),
                        np.uint64(-(-self.last_len // 16)),
                    ),
                )
            finally:
                key.fill(0)
            cupy.cuda.get_current_stream().synchronize()

    def items(self, first: int, count: int) -> int:
        """Work items (chunk, tile) of the batch of chunks [first, first + count)."""
        final = first + count == self.total
        return (count - int(final)) * self.tiles_full + (self.tiles_last if final else 0)

    def ensure_partials(self, items: int) -> None:
        """Scratch for ``items`` tile shares (grown on demand, zeroed when dropped)."""
        need = max(1, items) * 4
        if self.partials is None or self.partials.size < need:
            with self.cupy.cuda.Device(self.device_id):
                if self.partials is not None:
                    self.partials.fill(0)
                self.partials = self.cupy.empty(need, dtype=self.cupy.uint32)

    def launch(
        self, stream: Any, first: int, count: int, src: Any, dst: Any, status: Any, *, seal: bool
    ) -> None:
        """Open (or seal) chunks [first, first + count) on ``stream``.

        ``src``/``dst``: device arrays at the batch's first chunk (records and plaintext, or
        the reverse when sealing); ``status``: ``count`` uint32 words for the verdicts.
        """
        items = self.items(first, count)
        self.ensure_partials(items)
        common = (
            np.uint64(first),
            np.uint64(self.total),
            np.uint64(self.last_len),
            np.uint32(count),
            np.uint32(self.header.chunk_size),
            np.uint32(self.prefix),
            np.uint32(1 if seal else 0),
            np.uint32(self.tiles_full),
            np.uint32(self.tiles_last),
        )
        with self.cupy.cuda.Device(self.device_id), stream:
            if items:
                self.kernels.chunks(
                    (min(items, self.grid_cap),),
                    (self.width,),
                    (src, dst, self.ctx, self.partials, *common),
                )
            self.kernels.finalize(
                (count,),
                (_COMBINE_THREADS,),
                (
                    src,
                    dst,
                    self.ctx,
                    self.partials,
                    self.digest,
                    status,
                    *common,
                    np.uint32(self.ct),
                ),
            )

    def close(self) -> None:
        """Zero the key context and the GHASH scratch (device memory)."""
        with self.cupy.cuda.Device(self.device_id):
            for buf in (self.ctx, self.partials):
                if buf is not None:
                    buf.fill(0)
            self.cupy.cuda.get_current_stream().synchronize()
        self.ctx = self.partials = None


# --- sources: what fills a pinned slot with sealed records ----------------------------------------


class _Source:
    """Fills host memory with the sealed records ``ct_i || tag_i`` of a range of chunks."""

    header: Header

    def tasks(self, first: int, count: int, dst: memoryview) -> list[Callable[[], None]]:
        """Independent pieces of work that together write chunks [first, first+count)."""
        raise NotImplementedError

    def gds_path(self) -> Path | None:
        """The sealed file, when records may be read straight into device memory."""
        return None

    def close(self) -> None:
        """Release files and scratch."""


def _records_span(header: Header, first: int, count: int) -> tuple[int, int]:
    """File offset and length of the records of chunks [first, first + count)."""
    start = header.chunk_offset(first)
    last = first + count - 1
    end = header.chunk_offset(last) + header.chunk_length(last) + TAG_SIZE
    return start, end - start


class _SealedSource(_Source):
    def __init__(self, dataset: SealedDataset) -> None:
        self.header = dataset.header
        self.path = dataset.path
        try:
            self.fd = os.open(dataset.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise io_error("read", dataset.path, exc) from None
        try:
            size = os.fstat(self.fd).st_size
            prefix = os.pread(self.fd, len(dataset.prefix), 0)
        except OSError as exc:
            os.close(self.fd)
            raise io_error("read", dataset.path, exc) from None
        if size != self.header.file_size or prefix != dataset.prefix:
            os.close(self.fd)
            raise MalformedDatasetError(f"{dataset.path} changed after it was opened")

    def tasks(self, first: int, count: int, dst: memoryview) -> list[Callable[[], None]]:
        offset, length = _records_span(self.header, first, count)
        out: list[Callable[[], None]] = []
        for start in range(0, length, _READ_PIECE):
            piece = dst[start : min(length, start + _READ_PIECE)]

            def read(piece: memoryview = piece, at: int = offset + start) -> None:
                try:
                    read_exact(self.fd, piece, at)
                except OSError as exc:
                    raise io_error("read", self.path, exc) from None

            out.append(read)
        return out

    def gds_path(self) -> Path | None:
        return self.path

    def close(self) -> None:
        os.close(self.fd)


class _PlaintextSource(_Source):
    """Reads plaintext chunks and seals them on the host under a fresh random key."""

    def __init__(self, path: StrPath, chunk_size: int, threads: int) -> None:
        self.path = Path(path)
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise io_error("read", path, exc) from None
        try:
            st = os.fstat(self.fd)
            if not stat.S_ISREG(st.st_mode):
                raise MalformedInputError(f"{path} is not a regular file")
            self.header = Header.new(st.st_size, chunk_size=chunk_size)
        except BaseException:
            os.close(self.fd)
            raise
        self.dataset_key = new_dataset_key()
        self.cipher = ChunkCipher(self.dataset_key, self.header)
        scratch = min(chunk_size, max(1, self.header.plaintext_length))
        self._free: deque[bytearray] = deque(bytearray(scratch) for _ in range(max(1, threads)))
        self._all = list(self._free)
        self._lock = threading.Lock()

    def tasks(self, first: int, count: int, dst: memoryview) -> list[Callable[[], None]]:
        header = self.header
        base = header.chunk_offset(first)
        out: list[Callable[[], None]] = []
        for index in range(first, first + count):
            length = header.chunk_length(index)
            at = header.chunk_offset(index) - base
            record = dst[at : at + length + TAG_SIZE]

            def seal(index: int = index, length: int = length, record: memoryview = record) -> None:
                with self._lock:
                    scratch = self._free.popleft()
                try:
                    plain = memoryview(scratch)[:length]
                    try:
                        read_exact(self.fd, plain, index * header.chunk_size)
                    except MalformedDatasetError:
                        raise MalformedInputError(
                            f"{self.path} shrank while it was staged"
                        ) from None
                    except OSError as exc:
                        raise io_error("read", self.path, exc) from None
                    self.cipher.encrypt_into(index, plain, record)
                finally:
                    with self._lock:
                        self._free.append(scratch)

            out.append(seal)
        return out

    def check_unchanged(self) -> None:
        if os.fstat(self.fd).st_size != self.header.plaintext_length:
            raise MalformedInputError(f"{self.path} changed size while it was staged")

    def close(self) -> None:
        for buf in self._all:
            np.frombuffer(buf, dtype=np.uint8)[:] = 0  # plaintext scratch
        os.close(self.fd)


# --- GPUDirect Storage (optional) -----------------------------------------------------------------


def _kvikio_usable() -> bool:
    """kvikio importable and running real GDS (not its POSIX compatibility mode)."""
    try:
        import kvikio
        import kvikio.defaults
    except Exception:  # noqa: BLE001 - not installed or broken: plain reads
        return False
    try:
        return not bool(kvikio.defaults.compat_mode())
    except Exception:  # noqa: BLE001 - API differences between kvikio versions
        _ = kvikio
        return False


# --- the per-device pipeline ----------------------------------------------------------------------


class _Stopped(Exception):
    """Internal: another device's pipeline failed; this one stopped early."""


@dataclass
class _Failure:
    """What the pipelines of one staging call share: the lowest failing chunk, and an abort.

    A pipeline stops issuing batches once a failure is known *below* its next batch (all
    of that will be zeroed anyway) and keeps going otherwise, so the chunks before the
    lowest failure are all verified and stay; ``aborted`` (any other error) stops them all.
    """

    lock: threading.Lock = field(default_factory=threading.Lock)
    index: int | None = None
    aborted: threading.Event = field(default_factory=threading.Event)

    def report(self, index: int) -> None:
        with self.lock:
            if self.index is None or index < self.index:
                self.index = index

    def lowest(self) -> int | None:
        with self.lock:
            return self.index


def _run_device(
    *,
    device_id: int,
    source: _Source,
    chunk_key: bytes,
    first: int,
    count: int,
    out: Any,
    pool: ThreadPoolExecutor,
    batch_bytes: int,
    slots: int,
    use_gds: bool,
    failure: _Failure,
    on_verified: Callable[[int], None] | None,
) -> None:
    """Stage chunks [first, first + count) into ``out`` on one device.

    On a failing chunk: the whole pipeline drains, the failing chunk and everything after it
    in ``out`` are zeroed, and ChunkAuthenticationError is raised for the lowest one. On any
    other error ``out`` is zeroed entirely before the error propagates.
    """
    cupy = _cupy()
    header = source.header
    size = header.chunk_size
    stride = size + TAG_SIZE
    per_batch = max(1, min(count, batch_bytes // stride))
    batches = [
        (b, min(per_batch, first + count - b)) for b in range(first, first + count, per_batch)
    ]
    # Rows of the device ring stay 256-byte aligned: the kernels use 16-byte vector accesses.
    slot_bytes = -(-max(_records_span(header, b, n)[1] for b, n in batches) // 256) * 256
    nslots = max(1, min(slots, len(batches)))
    gds = use_gds and source.gds_path() is not None

    with cupy.cuda.Device(device_id):
        gcm = _GcmDevice(cupy, device_id, header, chunk_key)
        copy_stream = cupy.cuda.Stream(non_blocking=True)
        compute_stream = cupy.cuda.Stream(non_blocking=True)
        d_ring = cupy.empty((nslots, slot_bytes), dtype=cupy.uint8)
        status_d = cupy.zeros(count, dtype=cupy.uint32)
        status_mem = cupy.cuda.alloc_pinned_memory(max(4, 4 * count))
        status_h = np.frombuffer(status_mem, dtype=np.uint32, count=count)
        status_h[:] = 0
        h_mem: list[Any] = []
        h_ring: list[np.ndarray[Any, np.dtype[np.uint8]]] = []
        if not gds:
            for _ in range(nslots):
                mem = cupy.cuda.alloc_pinned_memory(slot_bytes)
                h_mem.append(mem)
                h_ring.append(np.frombuffer(mem, dtype=np.uint8, count=slot_bytes))
        copied = [cupy.cuda.Event(disable_timing=True) for _ in range(nslots)]
        consumed = [cupy.cuda.Event(disable_timing=True) for _ in range(nslots)]
        used = [False] * nslots
        gds_file: Any = None
        if gds:
            import kvikio

            gds_file = kvikio.CuFile(str(source.gds_path()), "r")

        reads: dict[int, list[Future[None]]] = {}

        def schedule_read(bi: int) -> None:
            b, n = batches[bi]
            slot = bi % nslots
            nbytes = _records_span(header, b, n)[1]
            if gds:
                offset = header.chunk_offset(b)

                def gds_read(slot: int = slot, nbytes: int = nbytes, offset: int = offset) -> None:
                    if used[slot]:
                        consumed[slot].synchronize()  # the kernels that read this slot are done
                    got = gds_file.pread(d_ring[slot, :nbytes], nbytes, offset).get()
                    if got != nbytes:
                        raise MalformedDatasetError(
                            "the file ended early (truncated while in use?)"
                        )

                reads[bi] = [pool.submit(gds_read)]
                return
            view = h_ring[slot].data[:nbytes]
            wait = copied[slot] if used[slot] else None

            def guarded(task: Callable[[], None], wait: Any = wait) -> Callable[[], None]:
                def run() -> None:
                    if wait is not None:
                        wait.synchronize()  # the previous H2D copy out of this pinned slot
                    task()

                return run

            reads[bi] = [pool.submit(guarded(t)) for t in source.tasks(b, n, view)]

        pending: deque[tuple[int, int, Any]] = deque()  # (local first, count, event)
        verified = 0

        def check(block: bool) -> None:
            nonlocal verified
            while pending and (block or pending[0][2].done):
                lo, n, ev = pending.popleft()
                ev.synchronize()
                bad = np.flatnonzero(status_h[lo : lo + n])
                if bad.size:
                    failure.report(first + lo + int(bad[0]))
                    return
                verified += n
                if on_verified is not None:
                    on_verified(n)

        try:
            for bi in range(min(nslots, len(batches))):
                schedule_read(bi)
            for bi, (b, n) in enumerate(batches):
                if failure.aborted.is_set():
                    raise _Stopped
                lowest = failure.lowest()
                if lowest is not None and lowest < b:
                    break
                slot = bi % nslots
                for fut in reads.pop(bi):
                    fut.result()
                nbytes = _records_span(header, b, n)[1]
                src = d_ring[slot, :nbytes]
                lo = b - first
                if not gds:
                    if used[slot]:
                        copy_stream.wait_event(consumed[slot])  # device slot free again
                    cupy.cuda.runtime.memcpyAsync(
                        src.data.ptr,
                        h_ring[slot].ctypes.data,
                        nbytes,
                        cupy.cuda.runtime.memcpyHostToDevice,
                        copy_stream.ptr,
                    )
                    copied[slot].record(copy_stream)
                    compute_stream.wait_event(copied[slot])
                dst = out[lo * size : lo * size + _shard_bytes(header, b, n)]
                gcm.launch(compute_stream, b, n, src, dst, status_d[lo : lo + n], seal=False)
                cupy.cuda.runtime.memcpyAsync(
                    status_h.ctypes.data + 4 * lo,
                    status_d.data.ptr + 4 * lo,
                    4 * n,
                    cupy.cuda.runtime.memcpyDeviceToHost,
                    compute_stream.ptr,
                )
                consumed[slot].record(compute_stream)
                used[slot] = True
                pending.append((lo, n, consumed[slot]))
                if bi + nslots < len(batches):
                    schedule_read(bi + nslots)
                check(block=False)
            compute_stream.synchronize()
            check(block=True)
        except BaseException:
            _drain(reads, copy_stream, compute_stream)
            out.fill(0)
            cupy.cuda.Device(device_id).synchronize()
            raise
        finally:
            _drain(reads, copy_stream, compute_stream)
            gcm.close()
            status_d.fill(0)
            if gds_file is not None:
                gds_file.close()

        lowest = failure.lowest()
        if lowest is not None and lowest < first + count:
            # Nothing from the lowest failing chunk on is trusted (this device's part of it).
            cut = max(0, lowest - first) * size
            if cut < out.size:
                out[cut:].fill(0)
            cupy.cuda.Device(device_id).synchronize()
            if lowest >= first:
                raise ChunkAuthenticationError(lowest)
            raise _Stopped


def _drain(reads: dict[int, list[Future[None]]], *streams: Any) -> None:
    """Let every read in flight finish (none may write a buffer that is being freed)."""
    for futures in reads.values():
        for fut in futures:
            fut.cancel()
    for futures in reads.values():
        for fut in futures:
            if not fut.cancelled():
                try:
                    fut.result()
                except BaseException:  # noqa: BLE001, S110 - the first error is already raised
                    pass
    reads.clear()
    for s in streams:
        s.synchronize()


# --- shards and results ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuShard:
    """The part of a dataset staged on one GPU.

    Attributes:
        device: CUDA device id.
        first_chunk: the first chunk it holds.
        chunk_count: how many chunks it holds.
        offset: its first plaintext byte within the whole dataset.
        array: verified plaintext, a 1-D ``cupy.ndarray`` of ``uint8`` on ``device``.
    """

    device: int
    first_chunk: int
    chunk_count: int
    offset: int
    array: Any = field(repr=False)


def _split(header: Header, devices: Sequence[int]) -> list[tuple[int, int, int]]:
    """(device, first chunk, chunk count) for each device: contiguous, balanced, non-empty."""
    total = header.chunk_count
    used = devices[: max(1, min(len(devices), total))]
    out = []
    start = 0
    for k, dev in enumerate(used):
        n = total // len(used) + (1 if k < total % len(used) else 0)
        out.append((dev, start, n))
        start += n
    return out


def _shard_bytes(header: Header, first: int, count: int) -> int:
    last = first + count - 1
    return (count - 1) * header.chunk_size + header.chunk_length(last)


def _stage(
    source: _Source,
    chunk_key: bytes,
    devices: Sequence[int],
    *,
    threads: int,
    progress: ProgressCallback | None,
    outs: Sequence[Any] | None,
    batch_bytes: int,
    slots: int,
    use_gds: bool | None,
) -> list[GpuShard]:
    cupy = _cupy()
    for dev in devices:
        require_gpu(dev)
    header = source.header
    plan = _split(header, devices)
    gds = _kvikio_usable() if use_gds is None else use_gds
    shards: list[GpuShard] = []
    for k, (dev, first, count) in enumerate(plan):
        length = _shard_bytes(header, first, count)
        if outs is not None:
            arr = outs[k]
            if (
                arr.dtype != cupy.uint8
                or arr.ndim != 1
                or arr.size != length
                or not arr.flags.c_contiguous
                or int(arr.device.id) != dev
            ):
                raise ValueError(
                    f"out must be a contiguous 1-D uint8 array of {length} bytes on device {dev}"
                )
            _check_aligned("out", arr)
        else:
            with cupy.cuda.Device(dev):
                # Every byte is overwritten by the kernels (or zeroed on failure).
                arr = cupy.empty(length, dtype=cupy.uint8)
        shards.append(
            GpuShard(
                device=dev,
                first_chunk=first,
                chunk_count=count,
                offset=first * header.chunk_size,
                array=arr,
            )
        )

    failure = _Failure()
    total_bytes = header.plaintext_length
    done_chunks = [0]
    progress_lock = threading.Lock()

    def on_verified(n: int) -> None:
        if progress is None:
            return
        with progress_lock:
            done_chunks[0] += n
            progress(min(total_bytes, done_chunks[0] * header.chunk_size), total_bytes)

    errors: list[tuple[int, BaseException]] = []
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gpucc-gpu-read") as pool:

        def run(shard: GpuShard) -> None:
            try:
                _run_shard(shard)
            except (ChunkAuthenticationError, _Stopped):
                raise
            except BaseException:
                failure.aborted.set()
                raise

        def _run_shard(shard: GpuShard) -> None:
            _run_device(
                device_id=shard.device,
                source=source,
                chunk_key=chunk_key,
                first=shard.first_chunk,
                count=shard.chunk_count,
                out=shard.array,
                pool=pool,
                batch_bytes=batch_bytes,
                slots=slots,
                use_gds=gds,
                failure=failure,
                on_verified=on_verified,
            )

        if len(shards) == 1:
            try:
                run(shards[0])
            except BaseException as exc:  # noqa: BLE001 - re-raised below after cleanup
                errors.append((0, exc))
        else:
            with ThreadPoolExecutor(len(shards), thread_name_prefix="gpucc-gpu") as lanes:
                futures = [lanes.submit(run, s) for s in shards]
                for k, fut in enumerate(futures):
                    error = fut.exception()
                    if error is not None:
                        errors.append((k, error))

    real = [(k, e) for k, e in errors if not isinstance(e, _Stopped)]
    if real:
        # Staging owns these arrays: zero them all; a caller's `out` keeps its verified prefix.
        lowest = failure.lowest()
        only_auth = all(isinstance(e, ChunkAuthenticationError) for _, e in real)
        for shard in shards:
            cut = 0
            if outs is not None and lowest is not None and only_auth:
                cut = max(0, lowest - shard.first_chunk) * header.chunk_size
            if cut < shard.array.size:
                with cupy.cuda.Device(shard.device):
                    shard.array[cut:].fill(0)
                    cupy.cuda.Device(shard.device).synchronize()
        if only_auth and lowest is not None:
            raise ChunkAuthenticationError(lowest) from None
        raise real[0][1]
    return shards


def _single(shards: list[GpuShard]) -> Any:
    assert len(shards) == 1
    return shards[0].array


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
        GpuStagingUnavailableError: no CuPy, no such device, or the kernels do not build.
        MalformedDatasetError: the file changed since it was opened.
        StagingIOError: the file cannot be read.
    """
    dataset.check_key(dataset_key)
    devices = _device_list(gpus)
    for dev in devices:
        require_gpu(dev)
    chunk_key = derive_chunk_key(dataset_key, dataset.header.dataset_id)
    source = _SealedSource(dataset)
    try:
        return _stage(
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
        GpuStagingUnavailableError: no CuPy, no such device, or the kernels do not build.
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
    return _single(shards)


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
        GpuStagingUnavailableError: no CuPy, no such device, or the kernels do not build.
        StagingIOError: the file cannot be read.
    """
    devices = _device_list(gpus)
    for dev in devices:
        require_gpu(dev)
    workers = threads or default_threads()
    source = _PlaintextSource(path, chunk_size, workers)
    try:
        chunk_key = derive_chunk_key(source.dataset_key, source.header.dataset_id)
        shards = _stage(
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
            for shard in shards:
                scrub_gpu(shard.array)
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
        GpuStagingUnavailableError: no CuPy, no such device, or the kernels do not build.
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
    return _single(shards)


def scrub_gpu(array: Any) -> None:
    """Zero a device array in place and wait until the zeros are written."""
    cupy = _cupy()
    with cupy.cuda.Device(int(array.device.id)):
        array.fill(0)
        cupy.cuda.Device(int(array.device.id)).synchronize()


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
        """Zero every shard's device memory."""
        for shard in self.shards:
            scrub_gpu(shard.array)


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
    """
    cupy = _cupy()
    device_id = int(records.device.id)
    chunk_key = derive_chunk_key(dataset_key, header.dataset_id)
    count, length = _count_records(header, records.size, first_chunk)
    _check_aligned("records", records)
    if out is not None:
        _check_aligned("out", out)
    owned = out is None
    with cupy.cuda.Device(device_id):
        if owned:
            out = cupy.empty(length, dtype=cupy.uint8)
        elif out.size != length or out.dtype != cupy.uint8:
            raise ValueError(f"out must be {length} uint8 bytes")
        status = cupy.zeros(max(1, count), dtype=cupy.uint32)
        gcm = _GcmDevice(cupy, device_id, header, chunk_key)
        try:
            stream = cupy.cuda.get_current_stream()
            if count:
                gcm.launch(stream, first_chunk, count, records, out, status, seal=False)
            verdicts = cupy.asnumpy(status[:count])
        except BaseException:
            out.fill(0)
            raise
        finally:
            gcm.close()
        bad = np.flatnonzero(verdicts)
        if bad.size:
            cut = 0 if owned else int(bad[0]) * header.chunk_size
            out[cut:].fill(0)
            cupy.cuda.Device(device_id).synchronize()
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
        GpuStagingUnavailableError: no CuPy or the kernels do not build.
    """
    cupy = _cupy()
    if data.dtype != cupy.uint8 or data.ndim != 1 or not data.flags.c_contiguous:
        raise ValueError("data must be a contiguous 1-D uint8 device array")
    _check_aligned("data", data)
    if kek is not None and wrap is not None:
        raise ValueError("give either kek or wrap, not both")
    spec = WrapSpec.key_file(kek) if kek is not None else wrap
    if spec is None and dataset_key is None:
        raise ValueError("without kek or wrap, pass the dataset_key to use")
    key = new_dataset_key() if dataset_key is None else dataset_key
    if len(key) != KEY_SIZE:
        raise ValueError("a dataset key is 32 bytes")
    header = Header(
        chunk_size=chunk_size,
        dataset_id=os.urandom(16) if dataset_id is None else dataset_id,
        plaintext_length=int(data.size),
        wrap_length=0 if spec is None else spec.record_length,
    )
    chunk_key = derive_chunk_key(key, header.dataset_id)
    record = None if spec is None else spec.wrap(key, header.digest)
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
        status = cupy.zeros(header.chunk_count, dtype=cupy.uint32)
        gcm = _GcmDevice(cupy, device_id, header, chunk_key)
        try:
            stream = cupy.cuda.get_current_stream()
            gcm.launch(stream, 0, header.chunk_count, data, records, status, seal=True)
            host = np.frombuffer(memoryview(blob)[len(prefix) :], dtype=np.uint8)
            records.get(out=host)
        finally:
            gcm.close()
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
        shards = stage_gpu_sharded(
            dataset, dataset_key, gpus=list(self.devices), threads=threads, progress=progress
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
        shards = stage_plaintext_gpu_sharded(
            path,
            chunk_size=chunk_size,
            gpus=list(self.devices),
            threads=threads,
            progress=progress,
        )
        return shards[0].array if len(self.devices) == 1 else shards

    def scrub(self, buf: Any) -> None:
        """Zero what :meth:`stage_sealed` or :meth:`stage_plaintext` returned."""
        if isinstance(buf, list):
            for shard in buf:
                scrub_gpu(shard.array)
        else:
            scrub_gpu(buf)


def backend(gpus: int | Sequence[int] | None = None) -> GpuBackend:
    """The GPU backend for ``gpus`` (default: device 0), checked to be usable.

    Raises:
        GpuStagingUnavailableError: no CuPy, too few devices, or the kernels do not build.
        UsageError: a bad ``gpus`` value.
    """
    devices = _device_list(gpus)
    for dev in devices:
        require_gpu(dev)
    return GpuBackend(devices=tuple(devices))
