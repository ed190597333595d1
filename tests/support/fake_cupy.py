"""A stand-in for the part of CuPy that ``staging.gpu`` uses, for testing without a GPU.

It checks the orchestration, not the kernels' arithmetic (``test_kernel_harness.py`` does that):

* **Lazy streams.** A copy or a launch does not run when it is issued: it is queued on its
  stream and runs only when something forces it (an event or stream synchronize, a
  ``wait_event`` dependency being forced, or ``Event.done`` deciding at random that the GPU
  got there). A missing event wait therefore lets a reader overwrite a pinned slot before its
  copy ran, or lets the host read a status word before it was written, and a test fails.
* **Kernel signatures.** ``RawModule`` parses the ``extern "C"`` kernels of the real
  ``aesgcm.cu`` and every launch is checked against them: an array for a pointer,
  ``numpy.uint64``/``numpy.uint32`` for the integers, the right count.
* **Kernel semantics** (emulated with ``cryptography``): ``gcm_chunks`` writes AES-CTR output
  *before* anything is verified, as the real kernel does; ``gcm_finalize`` checks the tag,
  writes the status word and zeroes a failing chunk, or writes the tag when sealing.
* Fresh allocations (``empty``) are filled with garbage, as device memory may be; ``zeros``
  is garbage too until its memset, queued on the current stream, runs.
* **Stream races.** Every kernel launch and memset records, per buffer, the stream it was
  queued on. Queuing work on a buffer whose last use on *another* stream is not ordered
  before it (that work has not run yet and no ``wait_event`` covers it) raises
  :class:`StreamRaceError` right away: a buffer initialised on the wrong stream, or scrubbed
  before the kernels that use it are done, fails the test that does it.
* **Occupancy.** ``cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor`` answers
  ``Config.occupancy`` for a kernel handle (``RawKernel.kernel.ptr``) it knows.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import random
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

uint8 = np.uint8
uint32 = np.uint32

_lock = threading.RLock()
_ids = itertools.count(0x1000)
_local = threading.local()
_rng = random.Random(1234)


class Config:
    """Knobs the tests turn."""

    device_count = 1
    sm_count = 2
    compile_error: str | None = None
    selftest_broken = False
    #: CTAs of gcm_chunks per SM the driver reports (0: the build cannot be resident).
    occupancy = 3
    #: gcm_chunks forgets the work items past its grid (a broken persistent-grid loop).
    grid_loop_broken = False
    #: gcm_finalize passes every chunk (a broken tag comparison).
    finalize_accepts_all = False
    #: gcm_msgs_finalize passes every message (a broken tag comparison).
    msgs_accept_all = False
    done_probability = 0.5
    launches: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []  # noqa: RUF012
    occupancy_calls: list[tuple[str, int, int]] = []  # noqa: RUF012


def reset(devices: int = 1, seed: int = 0) -> None:
    Config.device_count = devices
    Config.sm_count = 2  # backends that install over this one set their own
    Config.compile_error = None
    Config.selftest_broken = False
    Config.occupancy = 3
    Config.grid_loop_broken = False
    Config.finalize_accepts_all = False
    Config.msgs_accept_all = False
    Config.done_probability = 0.5
    Config.launches = []
    Config.occupancy_calls = []
    _rng.seed(seed)
    _devices.clear()
    _uses.clear()


def install(monkeypatch: Any, *, devices: int = 1, seed: int | None = None) -> Any:
    """Reset this module and put it in the GPU runtime's place for one test (a random seed,
    printed, unless one is given); returns the module."""
    from gpucc.staging import _gpu_runtime

    if seed is None:
        seed = int.from_bytes(os.urandom(4), "big")
        print(f"fake_cupy seed={seed}")
    reset(devices=devices, seed=seed)
    monkeypatch.setattr(_gpu_runtime, "import_cupy", lambda: sys.modules[__name__])
    monkeypatch.setattr(_gpu_runtime, "_modules", {})
    return sys.modules[__name__]


def stand_in_without_gpu(device: int) -> bool:
    """For a benchmark's ``--smoke``: without a usable GPU, put this module in CuPy's place so
    the whole flow still runs (its numbers mean nothing); whether it did. A GPU whose kernels
    are broken is not replaced: that is reported as it is."""
    from gpucc.staging import _gpu_runtime
    from gpucc.staging.errors import GpuKernelError

    try:
        if _gpu_runtime.unavailable_reason(device) is None:
            return False
    except GpuKernelError:
        return False
    reset(devices=1)
    _gpu_runtime.import_cupy, _gpu_runtime._modules = (lambda: sys.modules[__name__]), {}
    return True


class StreamRaceError(AssertionError):
    """Work queued on a buffer that another stream may still be using."""


#: Per buffer (the id of its root NumPy array): the array, and the index of the last op that
#: used it on each stream.
_uses: dict[int, tuple[weakref.ref[np.ndarray[Any, Any]], dict[Stream, int]]] = {}


def _root(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _use(stream: Stream, arrays: Sequence[Any], what: str) -> None:
    """Record that the op about to be queued on ``stream`` uses ``arrays``; check the order."""
    index = len(stream.ops)
    for arr in arrays:
        root = _root(arr._a)
        entry = _uses.get(id(root))
        if entry is None or entry[0]() is not root:
            entry = (weakref.ref(root), {})
            _uses[id(root)] = entry
        for other, last in entry[1].items():
            if other is stream or other.executed > last or stream.after.get(other, 0) > last:
                continue
            raise StreamRaceError(
                f"{what} on stream {stream.ptr:#x} uses a buffer that stream {other.ptr:#x} "
                f"may still be using (its op {last} has not run and nothing orders it first)"
            )
        entry[1][stream] = index


# --- streams and events ---------------------------------------------------------------------------


class Stream:
    def __init__(self, non_blocking: bool = False, *, device: int | None = None) -> None:
        self.device = _current_device() if device is None else device
        self.ops: list[Callable[[], None]] = []
        self.executed = 0
        #: Per other stream: the ops of it that every op queued here from now on runs after.
        self.after: dict[Stream, int] = {}
        self.ptr = next(_ids)
        _streams[self.ptr] = self
        _device_state(self.device).streams.append(self)

    def enqueue(self, op: Callable[[], None]) -> None:
        with _lock:
            self.ops.append(op)

    def run_until(self, n: int) -> None:
        with _lock:
            while self.executed < n:
                op = self.ops[self.executed]
                self.executed += 1
                op()

    def synchronize(self) -> None:
        with _lock:
            self.run_until(len(self.ops))

    def wait_event(self, event: Event) -> None:
        mark = event.mark
        if mark is not None:
            with _lock:
                other, n = mark
                for s, k in [*other.after.items(), (other, n)]:
                    if s is not self:
                        self.after[s] = max(self.after.get(s, 0), k)
            self.enqueue(lambda: mark[0].run_until(mark[1]))

    def __enter__(self) -> Stream:
        stack = _stream_stack()
        stack.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _stream_stack().pop()


_streams: dict[int, Stream] = {}


class Event:
    def __init__(self, block: bool = False, disable_timing: bool = False) -> None:
        self.mark: tuple[Stream, int] | None = None
        self.when = 0.0

    def record(self, stream: Stream | None = None) -> None:
        s = stream if stream is not None else get_current_stream()
        with _lock:
            self.mark = (s, len(s.ops))

        def stamp() -> None:
            self.when = time.perf_counter()

        s.enqueue(stamp)
        with _lock:
            self.mark = (s, len(s.ops))

    def synchronize(self) -> None:
        if self.mark is not None:
            self.mark[0].run_until(self.mark[1])

    @property
    def done(self) -> bool:
        if self.mark is None:
            return True
        with _lock:
            if _rng.random() < Config.done_probability:
                self.synchronize()
            return self.mark[0].executed >= self.mark[1]


def get_elapsed_time(start: Event, stop: Event) -> float:
    stop.synchronize()
    return (stop.when - start.when) * 1e3


def get_current_stream() -> Stream:
    stack = _stream_stack()
    if stack:
        return stack[-1]
    return _device_state(_current_device()).null


def _stream_stack() -> list[Stream]:
    if not hasattr(_local, "streams"):
        _local.streams = []
    stack: list[Stream] = _local.streams
    return stack


# --- devices -------------------------------------------------------------------------------------


class _DeviceState:
    streams: list[Stream]
    null: Stream


_devices: dict[int, _DeviceState] = {}


def _device_state(dev: int) -> _DeviceState:
    with _lock:
        if dev not in _devices:
            state = _DeviceState()
            state.streams = []
            _devices[dev] = state
            state.null = Stream(device=dev)  # registers itself in state.streams
        return _devices[dev]


def _current_device() -> int:
    dev: int = getattr(_local, "device", 0)
    return dev


class Device:
    def __init__(self, device: int | None = None) -> None:
        self.id = _current_device() if device is None else device
        if not 0 <= self.id < Config.device_count:
            raise RuntimeError(f"cudaErrorInvalidDevice: {self.id}")
        self.attributes = {"MultiProcessorCount": Config.sm_count}
        self._saved: list[int] = []

    def __enter__(self) -> Device:
        self._saved.append(_current_device())
        _local.device = self.id
        return self

    def __exit__(self, *exc: object) -> None:
        _local.device = self._saved.pop()

    def synchronize(self) -> None:
        with _lock:
            for s in list(_device_state(self.id).streams):
                s.synchronize()


# --- memory --------------------------------------------------------------------------------------


class ndarray:  # noqa: N801 - the CuPy name
    def __init__(self, a: np.ndarray[Any, Any], device: int) -> None:
        self._a = a
        self.device = SimpleNamespace(id=device)
        self.data = SimpleNamespace(ptr=a.ctypes.data)

    @property
    def dtype(self) -> np.dtype[Any]:
        dt: np.dtype[Any] = self._a.dtype
        return dt

    @property
    def ndim(self) -> int:
        return self._a.ndim

    @property
    def size(self) -> int:
        return int(self._a.size)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._a.shape)

    @property
    def flags(self) -> Any:
        return self._a.flags

    def __getitem__(self, idx: Any) -> ndarray:
        return ndarray(self._a[idx], self.device.id)

    def reshape(self, *shape: int) -> ndarray:
        return ndarray(self._a.reshape(*shape), self.device.id)

    def view(self, dtype: Any) -> ndarray:
        return ndarray(self._a.view(dtype), self.device.id)

    def any(self) -> bool:
        Device(self.device.id).synchronize()
        return bool(self._a.any())

    def fill(self, value: int) -> None:
        a = self._a
        stream = get_current_stream()
        with _lock:
            _use(stream, [self], "fill")
            stream.enqueue(lambda: a.fill(value))

    def get(self, stream: Any = None, out: np.ndarray[Any, Any] | None = None) -> Any:
        get_current_stream().synchronize()
        Device(self.device.id).synchronize()
        if out is None:
            return self._a.copy()
        out[...] = self._a
        return out


def empty(shape: Any, dtype: Any = np.float64) -> ndarray:
    a = np.empty(shape, dtype=dtype)
    garbage = np.random.default_rng(_rng.getrandbits(64)).bytes(a.nbytes)
    a.view(np.uint8).reshape(-1)[:] = np.frombuffer(garbage, dtype=np.uint8)  # uninitialised
    return ndarray(a, _current_device())


def empty_like(a: ndarray) -> ndarray:
    return empty(a.shape, a.dtype)


def get_default_memory_pool() -> Any:
    return SimpleNamespace(free_all_blocks=lambda: None)


def zeros(shape: Any, dtype: Any = np.float64) -> ndarray:
    """Garbage until the memset, queued on the current stream, runs (as cudaMemsetAsync)."""
    arr = empty(shape, dtype)
    arr.fill(0)
    return arr


def asarray(a: Any) -> ndarray:
    if isinstance(a, ndarray):
        return a
    return ndarray(np.array(a, copy=True), _current_device())


def copyto(dst: ndarray, src: ndarray) -> None:
    """A device-to-device copy, queued on the current stream."""
    stream = get_current_stream()
    d, s = dst._a, src._a
    with _lock:
        _use(stream, [dst, src], "copyto")
        stream.enqueue(lambda: np.copyto(d, s))


def from_dlpack(obj: Any) -> ndarray:
    """A view (no copy) of a host tensor's memory, standing in for device memory."""
    a = obj.numpy() if hasattr(obj, "numpy") else np.from_dlpack(obj)
    assert a.flags.writeable and a.flags.c_contiguous
    return ndarray(a, _current_device())


def asnumpy(a: ndarray) -> np.ndarray[Any, Any]:
    result: np.ndarray[Any, Any] = a.get()
    return result


def alloc_pinned_memory(nbytes: int) -> bytearray:
    return bytearray(nbytes)


def _memcpy_async(dst: int, src: int, size: int, kind: int, stream: int) -> None:
    def copy() -> None:
        ctypes.memmove(dst, src, size)

    _streams[stream].enqueue(copy)


class CUDARuntimeError(RuntimeError):
    """A CUDA runtime error (as cupy.cuda.runtime.CUDARuntimeError): a fault of work queued
    earlier surfaces as one at the next synchronisation or copy."""


class CUDADriverError(RuntimeError):
    """A CUDA driver error (as cupy.cuda.driver.CUDADriverError)."""


runtime = SimpleNamespace(
    CUDARuntimeError=CUDARuntimeError,
    getDeviceCount=lambda: Config.device_count,
    memcpyAsync=_memcpy_async,
    memcpyHostToDevice=1,
    memcpyDeviceToHost=2,
    memcpyDeviceToDevice=3,
    getDeviceProperties=lambda dev: {"name": b"fake GPU"},
)


# --- kernels -------------------------------------------------------------------------------------

_SIGNATURE = re.compile(
    r'extern "C" __global__ void(?: __launch_bounds__\([^)]*\))?\s+(\w+)\(([^)]*)\)'
)


def _parse_signatures(code: str) -> dict[str, list[str]]:
    out = {}
    for name, params in _SIGNATURE.findall(code):
        kinds = []
        for p in params.split(","):
            p = " ".join(p.split())
            if "*" in p:
                kinds.append("ptr")
            elif p.startswith("u64"):
                kinds.append("u64")
            elif p.startswith("u32"):
                kinds.append("u32")
            else:
                raise AssertionError(f"unexpected kernel parameter {p!r}")
        out[name] = kinds
    return out


class CompileException(Exception):
    pass


class RawModule:
    def __init__(self, code: str, options: Sequence[str] = ()) -> None:
        if Config.compile_error is not None:
            raise CompileException(Config.compile_error + "\n(more lines)")
        assert '#include "' not in code, "NVRTC gets no include path: inline the header"
        self.signatures = _parse_signatures(code)
        from gpucc.staging._gpu_runtime import KERNEL_NAMES

        assert set(self.signatures) == set(KERNEL_NAMES)

    def get_function(self, name: str) -> Kernel:
        return Kernel(name, self.signatures[name])


#: CUfunction handles of the kernels looked up so far.
_functions: dict[int, Kernel] = {}


class Kernel:
    def __init__(self, name: str, params: list[str]) -> None:
        self.name = name
        self.params = params
        self.kernel = SimpleNamespace(ptr=next(_ids))  # RawKernel.kernel: a cupy Function
        _functions[self.kernel.ptr] = self

    def __call__(
        self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]
    ) -> None:
        assert len(args) == len(self.params), (self.name, len(args), len(self.params))
        for kind, arg in zip(self.params, args, strict=True):
            if kind == "ptr":
                assert isinstance(arg, ndarray), (self.name, kind, type(arg))
            elif kind == "u64":
                assert type(arg) is np.uint64, (self.name, kind, type(arg))
            else:
                assert type(arg) is np.uint32, (self.name, kind, type(arg))
        assert 1 <= grid[0] and 1 <= block[0] <= 256 and block[0] % 32 == 0, (grid, block)
        Config.launches.append((self.name, tuple(grid), tuple(block)))
        impl = _IMPLS[self.name]
        stream = get_current_stream()
        with _lock:
            _use(stream, [a for a in args if isinstance(a, ndarray)], self.name)
            stream.enqueue(lambda: impl(grid, block, *args))


def _occupancy(func: int, block_size: int, dynamic_smem: int) -> int:
    """cuOccupancyMaxActiveBlocksPerMultiprocessor, as cupy.cuda.driver exposes it."""
    kernel = _functions[func]  # a KeyError for anything but a kernel handle
    assert type(block_size) is int and 32 <= block_size <= 256 and block_size % 32 == 0
    assert dynamic_smem == 0, "the kernels use static shared memory only"
    Config.occupancy_calls.append((kernel.name, block_size, dynamic_smem))
    return Config.occupancy


def _ceil(a: int, b: int) -> int:
    return (a + b - 1) // b


def _key(ctx: ndarray) -> bytes:
    return ctx._a[:8].tobytes()


def _fake_setup(
    grid: Any, block: Any, key: ndarray, ctx: ndarray, ct: Any, nf: Any, nl: Any
) -> None:
    assert grid == (1,) and block == (256,)
    assert ctx.size == 72 + 4 * int(ct) + 4 * 257
    ctx._a[:8] = key._a.view(np.uint32)
    ctx._a[8:] = 0x5EC2E7  # stands for the expanded key material


def _chunks_of(
    first: Any, total: Any, last_len: Any, n: Any, cs: Any
) -> list[tuple[int, int, int]]:
    """(local index, dataset index, plaintext length) of a batch."""
    out = []
    for local in range(int(n)):
        idx = int(first) + local
        length = int(last_len) if idx == int(total) - 1 else int(cs)
        out.append((local, idx, length))
    return out


def _nonce(prefix: Any, idx: int) -> bytes:
    return int(prefix).to_bytes(4, "little") + idx.to_bytes(8, "big")


def _fake_chunks(
    grid: Any,
    block: Any,
    src: ndarray,
    dst: ndarray,
    ctx: ndarray,
    partials: ndarray,
    first: Any,
    total: Any,
    last_len: Any,
    n: Any,
    cs: Any,
    prefix: Any,
    encrypt: Any,
    tiles_full: Any,
    tiles_last: Any,
) -> None:
    ct = 4 * block[0]
    assert int(tiles_full) == _ceil(_ceil(int(cs), 16), ct)
    assert int(tiles_last) == _ceil(_ceil(int(last_len), 16), ct)
    final = int(first) + int(n) == int(total)
    items = (int(n) - final) * int(tiles_full) + (int(tiles_last) if final else 0)
    assert grid[0] <= items and partials.size >= 4 * items
    key = _key(ctx)
    stride = int(cs) + 16
    for local, idx, length in _chunks_of(first, total, last_len, n, cs):
        if Config.grid_loop_broken and local * int(tiles_full) >= grid[0]:
            continue  # a CTA that never loops back for its next work item
        if encrypt:
            a, b = local * int(cs), local * stride
        else:
            a, b = local * stride, local * int(cs)
        ctr = Cipher(algorithms.AES(key), modes.CTR(_nonce(prefix, idx) + (2).to_bytes(4, "big")))
        data = src._a[a : a + length].tobytes()
        dst._a[b : b + length] = np.frombuffer(ctr.encryptor().update(data), dtype=np.uint8)


def _fake_finalize(
    grid: Any,
    block: Any,
    src: ndarray,
    dst: ndarray,
    ctx: ndarray,
    partials: ndarray,
    digest: ndarray,
    status: ndarray,
    first: Any,
    total: Any,
    last_len: Any,
    n: Any,
    cs: Any,
    prefix: Any,
    encrypt: Any,
    tiles_full: Any,
    tiles_last: Any,
    ct: Any,
) -> None:
    assert grid == (int(n),) and block == (256,)
    assert status.size == int(n)
    key = _key(ctx)
    aead = AESGCM(key)
    stride = int(cs) + 16
    dig = digest._a.tobytes()
    for local, idx, length in _chunks_of(first, total, last_len, n, cs):
        aad = dig + idx.to_bytes(8, "little") + (b"\x01" if idx == int(total) - 1 else b"\x00")
        nonce = _nonce(prefix, idx)
        if encrypt:
            pt = src._a[local * int(cs) : local * int(cs) + length].tobytes()
            tag = aead.encrypt(nonce, pt, aad)[-16:]
            at = local * stride + length
            dst._a[at : at + 16] = np.frombuffer(tag, dtype=np.uint8)
            status._a[local] = 0
            continue
        record = src._a[local * stride : local * stride + length + 16].tobytes()
        try:
            if not Config.finalize_accepts_all:
                aead.decrypt(nonce, record, aad)
            status._a[local] = 0
        except InvalidTag:
            status._a[local] = 1
            dst._a[local * int(cs) : local * int(cs) + length] = 0


def _fake_selftest(
    grid: Any,
    block: Any,
    key: ndarray,
    iv: ndarray,
    iv_len: Any,
    aad: ndarray,
    aad_len: Any,
    src: ndarray,
    dst: ndarray,
    length: Any,
    encrypt: Any,
    partials: ndarray,
    tag_out: ndarray,
) -> None:
    assert grid == (1,) and block == (64,)
    k = key._a.tobytes()
    nonce = iv._a[: int(iv_len)].tobytes()
    data = src._a[: int(length)].tobytes()
    if Config.selftest_broken:
        data = bytes(len(data))
    if not encrypt:  # opening: CTR output, and the tag over the given ciphertext
        ctr = Cipher(algorithms.AES(k), modes.GCM(nonce)).encryptor()
        ctr.authenticate_additional_data(aad._a[: int(aad_len)].tobytes())
        # GCM's CTR is an involution: encrypting the ciphertext gives the plaintext, but the
        # tag must cover the ciphertext, so seal the recovered plaintext to get it.
        plain = ctr.update(data) + ctr.finalize()
        data_for_tag = plain
    else:
        data_for_tag = data
    enc = Cipher(algorithms.AES(k), modes.GCM(nonce)).encryptor()
    enc.authenticate_additional_data(aad._a[: int(aad_len)].tobytes())
    out = enc.update(data_for_tag) + enc.finalize()
    result = out if encrypt else data_for_tag
    dst._a[: len(result)] = np.frombuffer(result, dtype=np.uint8)
    tag_out._a[:16] = np.frombuffer(enc.tag, dtype=np.uint8)


def _messages(desc: ndarray, aad: ndarray, nmsgs: Any, ctxs: ndarray) -> list[dict[str, Any]]:
    """The descriptors of a message batch (kMsgWords = 16 words each), decoded."""
    words = 72 + 4 * 1024 + 4 * 257
    d = desc._a.reshape(-1)
    assert d.size == 16 * int(nmsgs)
    out = []
    for i in range(int(nmsgs)):
        w = [int(x) for x in d[16 * i : 16 * (i + 1)]]

        def u64(k: int, w: list[int] = w) -> int:
            return w[k] | (w[k + 1] << 32)

        key = w[10]
        assert (key + 1) * words <= ctxs.size
        # The kernel reads the AAD's full blocks with 16-byte vector loads: a misaligned
        # address faults on a GPU.
        assert (aad.data.ptr + w[14]) % 16 == 0, f"message {i}: AAD at a misaligned address"
        out.append(
            {
                "src": u64(0),
                "dst": u64(2),
                "tag": u64(4),
                "len": u64(6),
                "item": u64(8),
                "key": ctxs._a[words * key : words * key + 8].tobytes(),
                "nonce": np.array(w[11:14], dtype="<u4").tobytes(),
                "aad": aad._a[w[14] : w[14] + w[15]].tobytes(),
            }
        )
    return out


def _fake_msgs(
    grid: Any,
    block: Any,
    src: ndarray,
    dst: ndarray,
    ctxs: ndarray,
    partials: ndarray,
    desc: ndarray,
    aad: ndarray,
    nmsgs: Any,
    items: Any,
    encrypt: Any,
) -> None:
    """CTR output of every message, before anything is verified (as the real kernel)."""
    assert block == (256,) and 1 <= grid[0] <= int(items)
    item = 0
    for m in _messages(desc, aad, nmsgs, ctxs):
        assert m["item"] == item and m["src"] % 16 == 0 and m["dst"] % 16 == 0
        item += _ceil(_ceil(m["len"], 16), 1024)
        ctr = Cipher(algorithms.AES(m["key"]), modes.CTR(m["nonce"] + (2).to_bytes(4, "big")))
        data = src._a[m["src"] : m["src"] + m["len"]].tobytes()
        out = ctr.encryptor().update(data)
        dst._a[m["dst"] : m["dst"] + m["len"]] = np.frombuffer(out, dtype=np.uint8)
    assert item == int(items) and partials.size >= 4 * item


def _fake_msgs_finalize(
    grid: Any,
    block: Any,
    src: ndarray,
    dst: ndarray,
    ctxs: ndarray,
    partials: ndarray,
    desc: ndarray,
    aad: ndarray,
    status: ndarray,
    nmsgs: Any,
    encrypt: Any,
    ct: Any,
) -> None:
    assert grid == (int(nmsgs),) and block == (256,) and int(ct) == 1024
    assert status.size == int(nmsgs)
    for i, m in enumerate(_messages(desc, aad, nmsgs, ctxs)):
        aead = AESGCM(m["key"])
        n = m["len"]
        if encrypt:
            pt = src._a[m["src"] : m["src"] + n].tobytes()
            tag = aead.encrypt(m["nonce"], pt, m["aad"])[-16:]
            dst._a[m["tag"] : m["tag"] + 16] = np.frombuffer(tag, dtype=np.uint8)
            status._a[i] = 0
            continue
        sealed = (
            src._a[m["src"] : m["src"] + n].tobytes() + src._a[m["tag"] : m["tag"] + 16].tobytes()
        )
        try:
            if not Config.msgs_accept_all:
                aead.decrypt(m["nonce"], sealed, m["aad"])
            status._a[i] = 0
        except InvalidTag:
            status._a[i] = 1
            dst._a[m["dst"] : m["dst"] + n] = 0


_IMPLS: dict[str, Callable[..., None]] = {
    "gcm_msgs": _fake_msgs,
    "gcm_msgs_finalize": _fake_msgs_finalize,
    "gcm_selftest": _fake_selftest,
    "gcm_setup": _fake_setup,
    "gcm_chunks": _fake_chunks,
    "gcm_finalize": _fake_finalize,
}

cuda = SimpleNamespace(
    Device=Device,
    Stream=Stream,
    Event=Event,
    get_current_stream=get_current_stream,
    get_elapsed_time=get_elapsed_time,
    alloc_pinned_memory=alloc_pinned_memory,
    runtime=runtime,
    driver=SimpleNamespace(
        CUDADriverError=CUDADriverError,
        occupancyMaxActiveBlocksPerMultiprocessor=_occupancy,
    ),
)
