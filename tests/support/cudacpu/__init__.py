"""A CPU execution of gpucc's CUDA sources, for the test suite (no GPU, no driver).

:func:`build` compiles the exact source text the runtime hands NVRTC as host C++ with g++,
force-including ``cudacpu.h`` (the CUDA built-ins: fibers for threads, real barriers and warp
shuffles, poisoned shared memory, alignment checks) with ``__CUDA_ARCH__`` defined, so the
device branches of the ``__host__ __device__`` code are the ones built. Each ``extern "C"
__global__`` kernel gets a trampoline ``cudacpu_launch_<name>(Config*, void** args)`` taking
its arguments as ``cuLaunchKernel`` does. Builds are cached per source, options and variant in
a directory under the system's temporary directory.

Variants: ``"check"`` (the default: the shared-memory race detector, alignment checks and a
bounds check against the launch's buffers on every access, through GCC's ThreadSanitizer
instrumentation calling the header's hooks),
``"fast"`` (no per-access checks), ``"asan"`` (AddressSanitizer and UndefinedBehavior-
Sanitizer; the library must then be loaded into a process started with libasan preloaded) and
``"tsan"`` (ThreadSanitizer, a block's threads as OS threads; libtsan preloaded).
:mod:`tests.support.cudacpu.backend` puts a CuPy-compatible module over the built library.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["HEADER", "CompileError", "available", "build", "compiler", "kernel_names"]

HEADER = Path(__file__).with_name("cudacpu.h")

_KERNEL = re.compile(r'extern "C" __global__ void(?: __launch_bounds__\([^)]*\))?\s+(\w+)\(')

_COMMON = (
    "-std=c++17",
    "-fPIC",
    "-shared",
    "-D__CUDACC_RTC__=1",
    "-D__CUDA_ARCH__=900",
    "-Wno-unknown-pragmas",
    "-Wno-attributes",
    "-fno-strict-aliasing",
    "-fvisibility=hidden",
)

VARIANTS: dict[str, tuple[str, ...]] = {
    "fast": ("-O2",),
    "check": ("-O2", "-DCUDACPU_RACECHECK=1", "-fsanitize=thread"),
    "tsan": ("-O1", "-g", "-fsanitize=thread", "-DCUDACPU_THREADS=1"),
    "asan": (
        "-O1",
        "-g",
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=undefined",
        "-fno-omit-frame-pointer",
    ),
}


class CompileError(RuntimeError):
    """g++ refused the source (the message holds its first error lines)."""


def compiler() -> str | None:
    """The C++ compiler to use (``$CXX`` or g++), or None when there is none."""
    return shutil.which(os.environ.get("CXX", "g++"))


def available() -> bool:
    return compiler() is not None


def kernel_names(source: str) -> list[str]:
    return _KERNEL.findall(source)


def _cache_dir() -> Path:
    path = Path(tempfile.gettempdir()) / f"gpucc-cudacpu-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _translation_unit(source: str) -> str:
    names = kernel_names(source)
    if not names:
        raise CompileError('no extern "C" __global__ kernels in the source')
    lines = [source, "", "// --- launch trampolines (cudacpu) ---"]
    for name in names:
        lines.append(
            f'extern "C" __attribute__((visibility("default"))) int '
            f"cudacpu_launch_{name}(cudacpu::Config* cfg, void** args) "
            f"{{ return cudacpu::launch_kernel({name}, cfg, args); }}"
        )
    return "\n".join(lines) + "\n"


def build(source: str, options: tuple[str, ...] = (), variant: str = "check") -> Path:
    """The shared library built from ``source`` (cached), for :mod:`ctypes`.

    ``options``: NVRTC options; ``-D`` definitions are passed on, others (``-std=...``,
    architectures) are NVRTC's business and ignored.

    Raises:
        CompileError: no compiler, or the source does not compile.
    """
    cxx = compiler()
    if cxx is None:
        raise CompileError("no C++ compiler (g++) found")
    defines = tuple(o for o in options if o.startswith("-D"))
    flags = (*_COMMON, *VARIANTS[variant], *defines)
    unit = _translation_unit(source)
    key = hashlib.sha256("\0".join([HEADER.read_text(), unit, *flags, cxx]).encode()).hexdigest()[
        :24
    ]
    out = _cache_dir() / f"{key}-{variant}.so"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory(dir=_cache_dir()) as tmp:
        src = Path(tmp) / "kernels.cpp"
        src.write_text(unit)
        lib = Path(tmp) / "kernels.so"
        if variant == "check":
            # Instrumented, but linked without ThreadSanitizer's runtime: the header's hooks
            # are the runtime.
            obj = Path(tmp) / "kernels.o"
            steps = [
                [cxx, *flags, "-include", str(HEADER), "-c", "-o", str(obj), str(src)],
                [cxx, "-shared", "-o", str(lib), str(obj)],
            ]
        else:
            steps = [[cxx, *flags, "-include", str(HEADER), "-o", str(lib), str(src)]]
        for cmd in steps:
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                errors = [ln for ln in done.stderr.splitlines() if "error" in ln][:20]
                raise CompileError("\n".join(errors or done.stderr.splitlines()[:20]))
        os.replace(lib, out)  # atomic: a concurrent build of the same key is harmless
    return out
