"""A CuPy-compatible test backend whose kernels are gpucc's own CUDA sources, run on the CPU.

Everything around the kernels is :mod:`tests.support.fake_cupy`'s: lazy streams and events,
the per-buffer stream-race checks, NumPy-backed "device" arrays filled with garbage when
allocated, devices, pinned memory and occupancy answers (``Config.sm_count`` x
``Config.occupancy`` is the persistent grid). What differs is :class:`RawModule`: it builds
the source text it is given with :func:`tests.support.cudacpu.build` and every launch runs the
real ``__global__`` function over the requested grid and block, in stream order, when the
stream gets there. A fault the CPU execution finds (a shared-memory race, a misaligned vector
access, a divergent barrier or shuffle) raises :class:`LaunchError` there, as a CUDA error
would surface at the next synchronisation.

:func:`observe` records, for the launches inside it, every block's shared memory as the block
left it and every thread's memory-access trace (:class:`Observer`).

``CUDACPU_VARIANT`` (environment) picks the build: ``check`` (default), ``fast`` or ``asan``.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from tests.support import cudacpu
from tests.support import fake_cupy as _f

uint8 = np.uint8
uint32 = np.uint32
uint64 = np.uint64

Config = _f.Config
StreamRaceError = _f.StreamRaceError
ndarray = _f.ndarray
empty = _f.empty
empty_like = _f.empty_like
zeros = _f.zeros
asarray = _f.asarray
asnumpy = _f.asnumpy
copyto = _f.copyto
from_dlpack = _f.from_dlpack
get_default_memory_pool = _f.get_default_memory_pool

#: Launches run so far: (kernel, grid, block).
launches: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []


class CompileException(Exception):  # noqa: N818 - the CuPy name
    """The source did not build (as cupy.cuda.compiler.CompileException)."""


class LaunchError(_f.CUDARuntimeError):
    """A kernel fault found by the CPU execution (a CUDA error on a GPU)."""


class _Config(ctypes.Structure):
    """cudacpu::Config in cudacpu.h."""

    _fields_ = (
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("seed", ctypes.c_ulonglong),
        ("racecheck", ctypes.c_uint),
        ("nbuffers", ctypes.c_uint),
        ("buffers", (ctypes.c_ulonglong * 2) * 64),
        ("error", ctypes.c_char * 512),
        ("after_block", ctypes.c_void_p),
        ("trace", ctypes.POINTER(ctypes.c_ulonglong)),
        ("trace_banks", ctypes.c_uint),
    )


_AfterBlock = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_uint
)


@dataclass
class Observer:
    """What the CPU execution reports of the launches that run while it is installed
    (:func:`observe`); the "check" build is needed for the traces.

    Attributes:
        blocks: (kernel, linear block index, shared memory as the block left it, and as it
            was before the block ran: poisoned with random bytes).
        traces: (kernel, per-thread access-trace hashes) per launch: every memory access of
            each thread, as (region, offset, size, direction), hashed in program order; the
            same launch over other data gives the same hashes iff no thread's accesses
            depend on the data. Shared-memory accesses count with their bank when
            ``banks`` is set, and without any address otherwise.
    """

    banks: bool = True
    blocks: list[tuple[str, int, bytes, bytes]] = field(default_factory=list)
    traces: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)


#: The installed observer, or None (see :func:`observe`).
_observer: Observer | None = None


@contextmanager
def observe(*, banks: bool = True) -> Iterator[Observer]:
    """Record every block's shared memory and every launch's access trace (see
    :class:`Observer`) for the launches that run inside the ``with``."""
    global _observer
    assert _observer is None, "one observer at a time"
    assert variant() == "check", "the access traces need the instrumented build"
    _observer = Observer(banks=banks)
    try:
        yield _observer
    finally:
        _observer = None


def variant() -> str:
    return os.environ.get("CUDACPU_VARIANT", "check")


_libraries: dict[Path, ctypes.CDLL] = {}
_libraries_lock = threading.Lock()


def _library(path: Path) -> ctypes.CDLL:
    with _libraries_lock:
        lib = _libraries.get(path)
        if lib is None:
            lib = _libraries[path] = ctypes.CDLL(str(path))
        return lib


def _kind(param: str) -> str:
    p = " ".join(param.split())
    if "*" in p:
        return "ptr"
    if p.startswith(("u64", "unsigned long long")):
        return "u64"
    if p.startswith(("u32", "unsigned int")):
        return "u32"
    raise AssertionError(f"unexpected kernel parameter {p!r}")


class RawModule:
    """cupy.RawModule: the source built for the CPU (cached), its kernels looked up."""

    def __init__(self, code: str, options: Sequence[str] = ()) -> None:
        if Config.compile_error is not None:
            raise CompileException(Config.compile_error + "\n(more lines)")
        assert '#include "' not in code, "NVRTC gets no include path: inline the header"
        try:
            path = cudacpu.build(code, tuple(options), variant())
        except cudacpu.CompileError as exc:
            raise CompileException(str(exc)) from None
        self.library = _library(path)
        self.signatures: dict[str, list[str]] = {}
        for m in _f._SIGNATURE.finditer(code):
            self.signatures[m.group(1)] = [_kind(p) for p in m.group(2).split(",")]
        assert sorted(self.signatures) == sorted(cudacpu.kernel_names(code))

    def get_function(self, name: str) -> RawKernel:
        if name not in self.signatures:
            raise KeyError(f"no kernel {name!r} in the module")  # CUDA_ERROR_NOT_FOUND
        return RawKernel(self, name)


class RawKernel:
    """One kernel; a call queues a launch on the current stream (as cupy.RawKernel)."""

    def __init__(self, module: RawModule, name: str) -> None:
        self.name = name
        self.params = module.signatures[name]
        self._entry = getattr(module.library, f"cudacpu_launch_{name}")
        self._entry.restype = ctypes.c_int
        self._entry.argtypes = (ctypes.POINTER(_Config), ctypes.POINTER(ctypes.c_void_p))
        self.kernel = SimpleNamespace(ptr=next(_f._ids))
        _f._functions[self.kernel.ptr] = self  # type: ignore[assignment]

    def __call__(
        self,
        grid: tuple[int, ...],
        block: tuple[int, ...],
        args: tuple[Any, ...],
        shared_mem: int = 0,
    ) -> None:
        assert len(args) == len(self.params), (self.name, len(args), len(self.params))
        for kind, arg in zip(self.params, args, strict=True):
            if kind == "ptr":
                assert isinstance(arg, ndarray), (self.name, kind, type(arg))
            elif kind == "u64":
                assert type(arg) is np.uint64, (self.name, kind, type(arg))
            else:
                assert type(arg) is np.uint32, (self.name, kind, type(arg))
        assert shared_mem == 0, "the kernels use static shared memory only"
        g = (*tuple(int(x) for x in grid), 1, 1)[:3]
        b = (*tuple(int(x) for x in block), 1, 1)[:3]
        assert all(x >= 1 for x in g) and all(x >= 1 for x in b), (g, b)
        assert b[0] * b[1] * b[2] <= 1024, b
        Config.launches.append((self.name, tuple(grid), tuple(block)))
        stream = _f.get_current_stream()
        with _f._lock:
            _f._use(stream, [a for a in args if isinstance(a, ndarray)], self.name)
            seed = _f._rng.getrandbits(64)
            stream.enqueue(lambda: self._run(g, b, args, seed))

    def _run(
        self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], seed: int
    ) -> None:
        values: list[Any] = []
        for kind, arg in zip(self.params, args, strict=True):
            if kind == "ptr":
                values.append(ctypes.c_void_p(int(arg._a.ctypes.data)))
            elif kind == "u64":
                values.append(ctypes.c_uint64(int(arg)))
            else:
                values.append(ctypes.c_uint32(int(arg)))
        pointers = (ctypes.c_void_p * max(1, len(values)))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values]
        )
        cfg = _Config()
        cfg.grid[:] = grid
        cfg.block[:] = block
        cfg.seed = seed
        cfg.racecheck = 1 if variant() == "check" else 0
        # The whole allocations behind the pointer arguments: what the kernel may touch.
        roots = {id(r): r for r in (_f._root(a._a) for a in args if isinstance(a, ndarray))}
        assert len(roots) <= 64
        cfg.nbuffers = len(roots)
        for i, root in enumerate(roots.values()):
            cfg.buffers[i][0] = int(root.ctypes.data)
            cfg.buffers[i][1] = int(root.ctypes.data) + int(root.nbytes)
        launches.append((self.name, grid, block))
        seen = _observer
        keep: list[Any] = []
        if seen is not None:
            nthreads = block[0] * block[1] * block[2]
            trace = (ctypes.c_ulonglong * nthreads)()
            name = self.name

            def after_block(shm: int, before: int, size: int, index: int) -> None:
                after = ctypes.string_at(shm, size)
                seen.blocks.append((name, index, after, ctypes.string_at(before, size)))

            callback = _AfterBlock(after_block)
            keep = [trace, callback]
            cfg.after_block = ctypes.cast(callback, ctypes.c_void_p)
            cfg.trace = trace
            cfg.trace_banks = 1 if seen.banks else 0
        if self._entry(ctypes.byref(cfg), pointers) != 0:
            raise LaunchError(f"{self.name}: {cfg.error.decode(errors='replace')}")
        if seen is not None:
            seen.traces.append((self.name, tuple(int(h) for h in keep[0])))


def _get_device() -> int:
    return _f._current_device()


runtime = SimpleNamespace(**vars(_f.runtime))
runtime.getDevice = _get_device
cuda = SimpleNamespace(**vars(_f.cuda))
cuda.runtime = runtime


def install(
    monkeypatch: Any,
    *,
    devices: int = 1,
    seed: int | None = None,
    sm_count: int = 2,
    occupancy: int = 2,
) -> Any:
    """Put this backend in CuPy's place for one test (the GPU runtime's ``import_cupy``, and
    ``import cupy`` for the model digests); returns the module.

    The persistent grids are ``sm_count * occupancy`` CTAs (H100: 132 SMs; 4 CTAs of
    gcm_chunks per SM).
    """
    from gpucc.staging import _gpu_runtime
    from gpucc.staging.model import digest_gpu

    if not cudacpu.available():
        import pytest

        pytest.skip("no C++ compiler: the CUDA sources cannot run on the CPU here")
    _f.install(monkeypatch, devices=devices, seed=seed)
    Config.sm_count = sm_count
    Config.occupancy = occupancy
    launches.clear()
    me = sys.modules[__name__]
    monkeypatch.setattr(_gpu_runtime, "import_cupy", lambda: me)
    monkeypatch.setitem(sys.modules, "cupy", me)
    monkeypatch.setattr(digest_gpu, "_built", {})
    return me
