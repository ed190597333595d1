"""The CPU execution of the CUDA kernels under AddressSanitizer and UndefinedBehaviorSanitizer,
and under ThreadSanitizer.

The kernels are built with ``-fsanitize=address,undefined`` (``CUDACPU_VARIANT=asan``) and
loaded into a Python started with libasan preloaded (ASan must come first), in a process of
its own: a set of the kernel tests must pass there, and a kernel reading past its buffer or
overflowing a signed integer must abort with the sanitizer's report. The ThreadSanitizer
build (``tsan``) runs a block's threads as OS threads, a second race detector beside the
default build's own.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import cudacpu
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow


def _runtime(name: str) -> str:
    cxx = cudacpu.compiler()
    if cxx is None:
        pytest.skip("no C++ compiler: the CUDA sources cannot run on the CPU here")
    found = subprocess.run(
        [cxx, f"-print-file-name={name}"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if not found or not Path(found).is_file():
        pytest.skip(f"the compiler has no {name}")
    return found


def _libasan() -> str:
    return _runtime("libasan.so")


def _run(args: list[str], **settings: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=_libasan(),
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=0",
        UBSAN_OPTIONS="print_stacktrace=1",
        CUDACPU_VARIANT="asan",
    )
    env.update(settings)
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


#: The message kernels' tests import torch (the torch extra); where it is not installed (and not
#: required, see tests/conftest.py) the other kernels still run under the sanitizers.
_MESSAGES = "tests/unit/staging/test_kernels_on_cpu_messages.py"
_TORCH = importlib.util.find_spec("torch") is not None or bool(
    os.environ.get("GPUCC_REQUIRE_TORCH")
)


def test_the_kernel_runs_are_clean_under_asan_and_ubsan() -> None:
    selection = [
        "tests/unit/staging/test_cudacpu.py",
        "tests/unit/staging/test_kernels_on_cpu.py",
        *([_MESSAGES] if _TORCH else []),
        "-k",
        "not 2sm and (start_up or selftest and 4097 or bit_exact and 17-65536 or finalize_flags"
        " or message_batches or digests or device_crypt or barrier or shuffle or divergent"
        " or misaligned)",
    ]
    done = _run(["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *selection])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout


FAULTY = r"""
typedef unsigned int u32;
extern "C" __global__ void __launch_bounds__(32) past_the_end(const u32* in, u32* out, u32 n) {
    out[threadIdx.x] = in[n + threadIdx.x];  // n words were allocated
}
extern "C" __global__ void __launch_bounds__(32) signed_overflow(const u32* in, u32* out, u32 n) {
    int x = 2147483600 + static_cast<int>(in[0]);
    x += static_cast<int>(n);
    out[threadIdx.x] = static_cast<u32>(x);
}
"""

SCRIPT = """
import sys
import numpy as np
import pytest
from tests.support.cudacpu import backend
with pytest.MonkeyPatch.context() as mp:
    cp = backend.install(mp)
    module = cp.RawModule(code=sys.argv[2])
    src = cp.asarray(np.zeros(8, dtype=np.uint32))
    out = cp.zeros(32, dtype=cp.uint32)
    module.get_function(sys.argv[1])((1,), (32,), (src, out, np.uint32(int(sys.argv[3]))))
    print(cp.asnumpy(out)[0])
"""


@pytest.mark.parametrize(
    ("kernel", "n", "report"),
    [
        ("past_the_end", 8, "AddressSanitizer: heap-buffer-overflow"),
        ("signed_overflow", 100, "signed integer overflow"),
    ],
)
def test_the_sanitizers_bite(kernel: str, n: int, report: str) -> None:
    done = _run(["-c", SCRIPT, kernel, FAULTY, str(n)])
    assert done.returncode != 0 and report in done.stderr, done.stderr[-3000:]


@pytest.mark.torch
def test_the_kernels_as_os_threads_are_clean_under_thread_sanitizer(tmp_path: Path) -> None:
    """The ThreadSanitizer build runs every thread of a block as an OS thread (a lane holds its
    warp's lock while it runs): a message batch and the start-up checks before it, covering
    every AES-GCM kernel, must run without a data race report."""
    log = tmp_path / "tsan"
    done = _run(
        [
            "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
            _MESSAGES,
            "-k", "1sm and message_batches",
        ],
        LD_PRELOAD=_runtime("libtsan.so"),
        TSAN_OPTIONS=f"halt_on_error=1 report_signal_unsafe=0 log_path={log}",
        CUDACPU_VARIANT="tsan",
    )  # fmt: skip
    reports = "".join(p.read_text() for p in tmp_path.glob("tsan*"))
    assert done.returncode == 0 and " passed" in done.stdout, (
        reports[-4000:] + done.stdout[-2000:] + done.stderr[-2000:]
    )
