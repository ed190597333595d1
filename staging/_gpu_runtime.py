"""GPU staging runtime: CuPy, the AES-GCM kernels, their self-test and one device's key context.

Everything else in GPU staging reaches CuPy through :func:`import_cupy` (looked up on this
module at call time, so tests can put a fake in its place).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np

from gpucc.core.errors import UsageError

# The kernel geometry, mirrored from staging/kernels/aesgcm_math.cuh, is shared with the known
# answers; it is re-exported here for the modules that launch kernels.
from ._gpu_geometry import _COMBINE_THREADS as _COMBINE_THREADS
from ._gpu_geometry import _CTX_HPOW as _CTX_HPOW
from ._gpu_geometry import _K as _K
from ._gpu_geometry import _MAX_THREADS as _MAX_THREADS
from ._gpu_geometry import _ctx_words as _ctx_words
from ._gpu_geometry import _one_line as _one_line
from ._gpu_geometry import _threads_for as _threads_for
from ._gpu_geometry import _tiles as _tiles
from ._gpu_kat import check_production
from .errors import GpuKernelError, GpuStagingUnavailableError
from .format import (
    Header,
)

__all__ = [
    "DEFAULT_BATCH_BYTES",
    "DEFAULT_SLOTS",
    "GcmDevice",
    "device_list",
    "gpu_available",
    "device_faults",
    "gpu_count",
    "import_cupy",
    "launch_fault",
    "require_gpu",
    "scrub_quietly",
    "unavailable_reason",
    "zero_buffers",
]

#: Default bytes of sealed records per batch: one H2D copy and one launch pair each.
#: At ~50 GB/s this is ~0.7 ms per batch, well above the ~10-50 us a batch costs in Python.
DEFAULT_BATCH_BYTES = 32 * 1024 * 1024
#: Default slots of the pinned host ring and of the device ciphertext ring.
DEFAULT_SLOTS = 4
#: Reads of sealed records are split into pieces of this size across reader threads.
READ_PIECE = 4 * 1024 * 1024


def check_aligned(name: str, array: Any) -> None:
    """The kernels read and write 16-byte vectors: device buffers must be 16-byte aligned."""
    if int(array.data.ptr) % 16:
        raise ValueError(f"{name} must start on a 16-byte boundary (a view at an odd offset?)")


def zero_buffers(
    cupy: Any, device_id: int, stream: Any, buffers: Sequence[Any]
) -> BaseException | None:
    """Zero ``buffers`` on ``stream`` (after the work queued there) and wait for it.

    When the wait reports a fault of earlier work on the stream, the zeroing is queued and
    waited for once more (a stream that faulted and still takes work then runs it; a device
    that refuses all work refuses it again). Returns the first device fault, or ``None``.
    """
    faults = device_faults(cupy)
    first: BaseException | None = None
    for _ in range(2):
        with cupy.cuda.Device(device_id), stream:
            steps = [functools.partial(b.fill, 0) for b in buffers if b is not None]
            fault = scrub_quietly(faults, *steps, stream.synchronize)
        if fault is None:
            break
        first = first or fault
    return first


# --- CuPy, devices and the compiled module ------------------------------------------------------


def import_cupy() -> Any:
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


def device_faults(cupy: Any) -> tuple[type[BaseException], ...]:
    """The errors ``cupy`` raises for a CUDA runtime or driver failure: what a kernel that hit an
    illegal address (or any launch that failed) surfaces as, at that launch or at the next
    synchronisation or copy (``CUDARuntimeError``, ``CUDADriverError``)."""
    kinds: list[type[BaseException]] = []
    for part, name in (("runtime", "CUDARuntimeError"), ("driver", "CUDADriverError")):
        kind = getattr(getattr(cupy.cuda, part, None), name, None)
        if isinstance(kind, type) and issubclass(kind, BaseException):
            kinds.append(kind)
    return tuple(kinds)


def launch_fault(device_id: int, exc: BaseException) -> GpuKernelError:
    """A fault of kernels that passed their start-up checks, on real work: ``stage="launch"``."""
    return GpuKernelError(
        f"a kernel launch failed on CUDA device {device_id} after the kernels passed their "
        f"start-up checks: {_one_line(exc)}",
        device_id=device_id,
        stage="launch",
    )


def scrub_quietly(
    faults: tuple[type[BaseException], ...], *steps: Callable[[], None]
) -> BaseException | None:
    """Run every step (zeroing, freeing) even when one of them faults: a device that faulted
    may refuse later work too. Returns the first device fault, or ``None``."""
    first: BaseException | None = None
    for step in steps:
        try:
            step()
        except faults as exc:
            first = first or exc
    return first


def gpu_count() -> int:
    """Number of CUDA devices CuPy sees (0 without CuPy, a driver or a device)."""
    try:
        cupy = import_cupy()
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


def _log_lines(text: str, limit: int = GpuKernelError.LOG_LINES) -> tuple[str, ...]:
    """The lines of a build log worth showing: its error lines, else its first lines."""
    lines = [" ".join(line.split())[:240] for line in text.splitlines()]
    lines = [line for line in lines if line]
    errors = [line for line in lines if "error" in line.lower()]
    return tuple((errors or lines)[:limit])


#: The kernels of aesgcm.cu, as the runtime looks them up.
KERNEL_NAMES = (
    "gcm_setup",
    "gcm_chunks",
    "gcm_finalize",
    "gcm_selftest",
    "gcm_msgs",
    "gcm_msgs_finalize",
)

#: Options for NVRTC. CuPy adds the architecture of the current device (sm_90 on an H100).
_NVRTC_OPTIONS = ("-std=c++17", f"-DGCMK_K={_K}")


@dataclass
class _Kernels:
    """The kernels built for one device, and what has been checked about them there.

    ``grids`` maps a gcm_chunks CTA width to its persistent grid; a width is in it only once
    the production known answers (:func:`_check_production`) passed at that width.
    """

    setup: Any
    chunks: Any
    finalize: Any
    selftest: Any
    msgs: Any
    msgs_finalize: Any
    sm_count: int
    grids: dict[int, int] = field(default_factory=dict)
    #: Persistent grid of gcm_msgs, set once the message-batch known answers passed.
    msgs_grid: int = 0


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

    Right after building, the kernels must reproduce the known answers of :data:`_KATS`
    through gcm_selftest, sealing and opening, and the production kernels must open (and
    reject) the fixed dataset of :func:`_check_production` at CTA width 256; otherwise
    nothing is staged with them. A failure is not cached: the next call builds again.

    Raises:
        GpuStagingUnavailableError: no CuPy, no driver, no such device.
        GpuKernelError: the device is there, but the kernels do not build, cannot be resident,
            or fail a known answer.
    """
    with _modules_lock:
        found = _modules.get(device_id)
        if found is not None:
            return found
        cupy = import_cupy()
        try:
            count = int(cupy.cuda.runtime.getDeviceCount())
        except Exception as exc:  # noqa: BLE001 - CUDARuntimeError and driver load errors
            raise GpuStagingUnavailableError(f"no usable CUDA device: {_one_line(exc)}") from None
        if not 0 <= device_id < count:
            raise GpuStagingUnavailableError(
                f"CUDA device {device_id} does not exist ({count} device(s) present)"
            )
        try:
            with cupy.cuda.Device(device_id) as device:
                sm_count = int(device.attributes["MultiProcessorCount"])
        except Exception as exc:  # noqa: BLE001 - the device cannot be opened at all
            raise GpuStagingUnavailableError(
                f"CUDA device {device_id} is not usable: {_one_line(exc)}"
            ) from None
        with cupy.cuda.Device(device_id):
            kernels = _build(cupy, device_id, sm_count)
            try:
                passed = _self_test(kernels, cupy)
            except Exception as exc:  # noqa: BLE001 - a launch or copy failed
                raise GpuKernelError(
                    f"the AES-GCM self-test could not run on CUDA device {device_id}: "
                    f"{_one_line(exc)}",
                    device_id=device_id,
                    stage="known-answer",
                ) from None
            if not passed:
                raise GpuKernelError(
                    f"the AES-GCM kernels failed their known-answer self-test on CUDA device "
                    f"{device_id} (a miscompiled or unsupported build); refusing to stage",
                    device_id=device_id,
                    stage="known-answer",
                )
            _check_production(kernels, cupy, device_id, _MAX_THREADS)
        _modules[device_id] = kernels
        return kernels


def _build(cupy: Any, device_id: int, sm_count: int) -> _Kernels:
    """Compile the module for the current device and look its kernels up.

    Raises:
        GpuKernelError: NVRTC or the module load failed (with the log's error lines).
    """
    try:
        module = cupy.RawModule(code=_kernel_source(), options=_NVRTC_OPTIONS)
        return _Kernels(
            setup=module.get_function("gcm_setup"),
            chunks=module.get_function("gcm_chunks"),
            finalize=module.get_function("gcm_finalize"),
            selftest=module.get_function("gcm_selftest"),
            msgs=module.get_function("gcm_msgs"),
            msgs_finalize=module.get_function("gcm_msgs_finalize"),
            sm_count=sm_count,
        )
    except GpuStagingUnavailableError as exc:  # the packaged source itself is damaged
        raise GpuKernelError(str(exc), device_id=device_id, stage="build") from None
    except Exception as exc:  # noqa: BLE001 - CompileException, CUDADriverError, ...
        raise GpuKernelError(
            f"the AES-GCM kernels did not build for CUDA device {device_id}: "
            f"{exc.__class__.__name__}",
            device_id=device_id,
            stage="build",
            log=_log_lines(str(exc)),
        ) from None


def _persistent_grid(
    cupy: Any, kernels: _Kernels, device_id: int, width: int, *, name: str = "gcm_chunks"
) -> int:
    """CTAs of gcm_chunks (or ``name``) in the persistent grid at ``width`` threads:
    occupancy x SMs.

    The occupancy is what the driver reports for the built kernel (registers, static shared
    memory and the CTA width decide it), not an assumption.

    Raises:
        GpuKernelError: the driver cannot say, or says that no CTA fits on an SM.
    """
    try:
        kernel = kernels.chunks if name == "gcm_chunks" else kernels.msgs
        handle = int(kernel.kernel.ptr)
        per_sm = int(cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(handle, width, 0))
    except Exception as exc:  # noqa: BLE001 - CUDADriverError, an API difference, ...
        raise GpuKernelError(
            f"the occupancy of {name} at {width} threads is unknown on CUDA device "
            f"{device_id}: {_one_line(exc)}",
            device_id=device_id,
            stage="occupancy",
        ) from None
    if per_sm < 1:
        raise GpuKernelError(
            f"{name} at {width} threads cannot be resident on CUDA device {device_id} "
            f"(the driver reports {per_sm} CTAs per SM: too many registers or too much "
            f"shared memory in this build)",
            device_id=device_id,
            stage="occupancy",
        )
    return per_sm * kernels.sm_count


def _check_production(kernels: _Kernels, cupy: Any, device_id: int, width: int) -> None:
    """The production known answers at ``width`` (:mod:`._gpu_kat`) through :class:`GcmDevice`
    on the persistent grid; on success ``width`` is recorded in ``kernels.grids``.

    Raises:
        GpuKernelError: a wrong result, or the check could not run.
    """
    grid = _persistent_grid(cupy, kernels, device_id, width)

    def open_device(header: Header, chunk_key: bytes, stream: Any) -> GcmDevice:
        return GcmDevice(
            cupy, device_id, header, chunk_key, stream=stream, _unchecked=(kernels, grid)
        )

    check_production(cupy, device_id, width, grid, open_device)
    kernels.grids[width] = grid


def _kernels_at(device_id: int, width: int) -> tuple[_Kernels, int]:
    """The kernels of ``device_id`` and their persistent grid at ``width`` threads.

    The production known answers run at ``width`` on that device before its first use.

    Raises:
        GpuStagingUnavailableError, GpuKernelError: see :func:`_kernels`.
    """
    kernels = _kernels(device_id)
    with _modules_lock:
        grid = kernels.grids.get(width)
        if grid is None:
            cupy = import_cupy()
            with cupy.cuda.Device(device_id):
                _check_production(kernels, cupy, device_id, width)
            grid = kernels.grids[width]
    return kernels, grid


def unavailable_reason(device_id: int = 0) -> str | None:
    """Why GPU staging cannot run on ``device_id`` (one line), or ``None`` when it can.

    Compiles and checks the kernels for that device the first time (cached for the process).
    "Cannot run" means no CuPy, no driver or no such device; a device whose kernels do not
    build or fail their known answers is not a reason but an error.

    Raises:
        GpuKernelError: the device is there and its kernels are broken.
    """
    try:
        _kernels(device_id)
    except GpuStagingUnavailableError as exc:
        return str(exc)
    return None


def gpu_available(device_id: int = 0) -> bool:
    """Whether CuPy, the device and the compiled kernels are all usable.

    Raises:
        GpuKernelError: the device is there and its kernels are broken.
    """
    return unavailable_reason(device_id) is None


def require_gpu(device_id: int = 0) -> None:
    """Check that GPU staging can run on ``device_id``.

    Raises:
        GpuStagingUnavailableError: with a one-line reason (no CuPy, no driver, no device).
        GpuKernelError: the kernels do not build or fail their known answers there.
    """
    _kernels(device_id)


def device_list(gpus: int | Sequence[int] | None) -> list[int]:
    if gpus is None:
        return [0]
    if isinstance(gpus, int):
        if gpus < 1:
            raise UsageError("gpus must be at least 1")
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


class GcmDevice:
    """The key context and scratch of one dataset on one device, and the launches over it.

    Everything runs on one stream, ``stream`` (the current stream by default): the context
    and every scratch buffer are initialised there, the kernels are launched there and
    :meth:`close` zeroes them there, so each is ordered after the work that uses it. Work the
    caller queued on its current stream before this object was made happens first.

    The chunk key goes to the device once, gcm_setup expands it (round keys, powers of H) into
    the context, and the device copy of the key is zeroed right after. Before the first use
    of a CTA width on a device, the production known answers run at that width.

    Raises:
        GpuStagingUnavailableError, GpuKernelError: see :func:`require_gpu`.
    """

    def __init__(
        self,
        cupy: Any,
        device_id: int,
        header: Header,
        chunk_key: bytes,
        *,
        stream: Any = None,
        _unchecked: tuple[_Kernels, int] | None = None,
    ) -> None:
        self.cupy = cupy
        self.device_id = device_id
        self.header = header
        self.width = _threads_for(header.chunk_size)
        if _unchecked is None:
            self.kernels, self.grid_cap = _kernels_at(device_id, self.width)
        else:  # the production known answers themselves (kernels and grid under test)
            self.kernels, self.grid_cap = _unchecked
        self.ct = _K * self.width
        self.total = header.chunk_count
        self.last_len = header.chunk_length(self.total - 1)
        self.tiles_full = _tiles(header.chunk_size, self.ct)
        self.tiles_last = _tiles(self.last_len, self.ct)
        self.prefix = int.from_bytes(header.dataset_id[:4], "little")
        self.ctx: Any = None
        self.partials: Any = None
        self.digest: Any = None
        with cupy.cuda.Device(device_id):
            caller = cupy.cuda.get_current_stream()
            self.stream: Any = caller if stream is None else stream
            if int(self.stream.ptr) != int(caller.ptr):
                joined = cupy.cuda.Event(disable_timing=True)
                joined.record(caller)
                self.stream.wait_event(joined)
            with self.stream:
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
                    key.fill(0)
                    self.stream.synchronize()
                except BaseException:
                    # A fault: the key's copy and whatever of the context was written are
                    # zeroed as far as the device still takes work; the error goes on.
                    ctx, self.ctx = self.ctx, None
                    zero_buffers(cupy, device_id, self.stream, [key, ctx])
                    raise

    def items(self, first: int, count: int) -> int:
        """Work items (chunk, tile) of the batch of chunks [first, first + count)."""
        final = first + count == self.total
        return (count - int(final)) * self.tiles_full + (self.tiles_last if final else 0)

    def ensure_partials(self, items: int) -> None:
        """Scratch for ``items`` tile shares, grown on demand, on :attr:`stream`.

        The scratch that is dropped is zeroed first, after the kernels that used it; the new
        one is zeroed before the kernels that use it (both in stream order).
        """
        need = max(1, items) * 4
        if self.partials is None or self.partials.size < need:
            with self.cupy.cuda.Device(self.device_id), self.stream:
                if self.partials is not None:
                    self.partials.fill(0)
                self.partials = self.cupy.empty(need, dtype=self.cupy.uint32)
                self.partials.fill(0)

    def launch(
        self, first: int, count: int, src: Any, dst: Any, status: Any, *, seal: bool
    ) -> None:
        """Open (or seal) chunks [first, first + count) on :attr:`stream`.

        ``src``/``dst``: device arrays at the batch's first chunk (records and plaintext, or
        the reverse when sealing); ``status``: ``count`` uint32 words for the verdicts. The
        caller orders their writes before this stream (events) or makes them on it.
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
        with self.cupy.cuda.Device(self.device_id), self.stream:
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
        """Zero the key context and the GHASH scratch, after the kernels that use them.

        A device fault on the way (a kernel of this stream faulted) still zeroes every buffer
        the device takes work for, and is raised after that.
        """
        bufs = [self.ctx, self.partials]
        self.ctx = self.partials = None
        fault = zero_buffers(self.cupy, self.device_id, self.stream, bufs)
        if fault is not None:
            raise fault
