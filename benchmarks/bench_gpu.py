"""GPU staging throughput beside its ceilings and the CPU baseline, measured in one run.

Run on a GPU machine (not a test)::

    python benchmarks/bench_gpu.py --size 4GiB [--chunk-sizes 64KiB,1MiB,4MiB,16MiB]
                                   [--repeat 5] [--device 0] [--check] [--json out.json]

``--check`` first runs the correctness tests (kernel harness, pipeline, and the GPU tests on
this GPU) and stops if any fails, so one call checks and times everything. Without a usable
GPU (no CuPy, no driver, no device) it prints why and exits 0; with a GPU whose kernels do not
build or fail their known answers it prints the build log's lines and exits 5; any other
failure (a kernel rejecting an authentic dataset included) ends it with a non-zero status.

For each chunk size, with the same bytes:

1. ``H2D pinned copy``: plain pinned host-to-device copies, 32 MiB each, one stream: the PCIe
   line rate every other row is compared with (CUDA events).
2. ``CPU 1 thread`` / ``CPU N threads``: the baseline the GPU path replaces: read the sealed
   file (page cache), ``AESGCM.decrypt_into`` into a pinned ring, copy to the GPU; serial with
   one thread, overlapped with all cores (wall clock, ends with a device sync).
3. ``gpucc sealed``: :func:`staging.gpu.stage_gpu` from the page-cached sealed file (wall clock).
4. ``gpucc plaintext``: :func:`staging.gpu.stage_plaintext_gpu` (host seals with all cores, the
   GPU opens) from a page-cached plaintext file (wall clock).
5. ``kernel open`` / ``kernel seal``: the kernels alone over device-resident data, one launch
   pair over the whole size (CUDA events); ``D2D copy``: the device-to-device copy ceiling.

``--smoke`` runs the whole flow on 300 KiB once (on ``tests/support/fake_cupy.py`` where no
GPU is usable), a check CI runs so the script cannot rot.

Each cell is the median of ``--repeat`` runs, in GB/s (10^9 bytes/s) of plaintext, with its
ratio to the line rate. The table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpucc.staging import _gpu_runtime as rt
from gpucc.staging import format as fmt
from gpucc.staging import gpu
from gpucc.staging.dataset import open_sealed
from gpucc.staging.errors import GpuKernelError
from gpucc.staging.seal import seal_file

DESCRIPTION = "GPU staging throughput beside its ceilings and the CPU baseline."
#: Exit status when a GPU is present but its kernels do not build or fail their known answers
#: (the status ``gpucc`` exits with for the same error: its environment family).
EXIT_BROKEN_KERNELS = 5
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
COPY = 32 * MiB
ROOT = Path(__file__).resolve().parent.parent


def _use_stand_in_without_gpu(device: int) -> bool:
    """For ``--smoke``: tests/support/fake_cupy.py in CuPy's place when no GPU is usable."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.support.fake_cupy import stand_in_without_gpu

    return stand_in_without_gpu(device)


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    unit = (m.group(2) or "B").upper().replace("I", "")
    scale = {"B": 1, "KB": KiB, "MB": MiB, "GB": GiB, "TB": 1 << 40}[unit]
    return int(float(m.group(1)) * scale)


def _median(fn: Callable[[], float], repeat: int) -> float:
    """Median of ``repeat`` timings (seconds) returned by ``fn``, after one warm-up."""
    fn()
    return statistics.median(fn() for _ in range(repeat))


def _events_time(cp: Any, stream: Any, work: Callable[[], None]) -> float:
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    work()
    stop.record(stream)
    stop.synchronize()
    return float(cp.cuda.get_elapsed_time(start, stop)) / 1e3


def _wall(cp: Any, work: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    work()
    cp.cuda.Device().synchronize()
    return time.perf_counter() - t0


# --- the measurements ----------------------------------------------------------------------------


def line_rate(cp: Any, size: int, out: Any) -> Callable[[], float]:
    host_mem = cp.cuda.alloc_pinned_memory(min(size, GiB))
    host = np.frombuffer(host_mem, dtype=np.uint8, count=min(size, GiB))
    host[:] = 1
    stream = cp.cuda.Stream(non_blocking=True)

    def work() -> None:
        for off in range(0, size, COPY):
            n = min(COPY, size - off)
            # The pinned source is min(size, 1 GiB), a multiple of COPY when it wraps.
            src = host.ctypes.data + off % len(host)
            cp.cuda.runtime.memcpyAsync(
                out.data.ptr + off, src, n, cp.cuda.runtime.memcpyHostToDevice, stream.ptr
            )

    return lambda: _events_time(cp, stream, work)


def cpu_baseline(cp: Any, path: Path, dk: bytes, out: Any, threads: int) -> Callable[[], float]:
    """Read sealed records, decrypt with cryptography into a pinned ring, copy to the GPU."""
    dataset = open_sealed(path)
    header = dataset.header
    aead = AESGCM(fmt.derive_chunk_key(dk, header.dataset_id))
    cs = header.chunk_size
    per_slot = max(1, COPY // cs)
    slots = 4 if threads > 1 else 1
    pinned = [cp.cuda.alloc_pinned_memory(per_slot * cs) for _ in range(slots)]
    ring = [np.frombuffer(m, dtype=np.uint8, count=per_slot * cs) for m in pinned]
    local = threading.local()  # one record buffer per worker thread
    stream = cp.cuda.Stream(non_blocking=True)
    copied = [cp.cuda.Event(disable_timing=True) for _ in range(slots)]
    fd = os.open(path, os.O_RDONLY)

    def chunk(index: int, dst: memoryview) -> None:
        if not hasattr(local, "buf"):
            local.buf = bytearray(cs + 16)
        length = header.chunk_length(index)
        rec = memoryview(local.buf)[: length + 16]
        os.preadv(fd, [rec], header.chunk_offset(index))
        aead.decrypt_into(
            fmt.chunk_nonce(header.dataset_id, index),
            rec,
            fmt.chunk_aad(header.digest, index, header.is_final(index)),
            dst[:length],
        )

    def run() -> None:
        pool = ThreadPoolExecutor(threads) if threads > 1 else None
        try:
            used = [False] * slots
            for b, first in enumerate(range(0, header.chunk_count, per_slot)):
                slot = b % slots
                if used[slot]:
                    copied[slot].synchronize()
                n = min(per_slot, header.chunk_count - first)
                view = ring[slot].data
                jobs = []
                for k in range(n):
                    dst = view[k * cs : (k + 1) * cs]
                    if pool is None:
                        chunk(first + k, dst)
                    else:
                        jobs.append(pool.submit(chunk, first + k, dst))
                for j in jobs:
                    j.result()
                nbytes = (n - 1) * cs + header.chunk_length(first + n - 1)
                cp.cuda.runtime.memcpyAsync(
                    out.data.ptr + first * cs,
                    ring[slot].ctypes.data,
                    nbytes,
                    cp.cuda.runtime.memcpyHostToDevice,
                    stream.ptr,
                )
                copied[slot].record(stream)
                used[slot] = True
            stream.synchronize()
        finally:
            if pool is not None:
                pool.shutdown()

    return lambda: _wall(cp, run)


def gpucc_sealed(cp: Any, path: Path, dk: bytes, out: Any) -> Callable[[], float]:
    dataset = open_sealed(path)
    return lambda: _wall(cp, lambda: gpu.stage_gpu(dataset, dk, out=out))


def gpucc_plaintext(cp: Any, path: Path, cs: int, out: Any) -> Callable[[], float]:
    return lambda: _wall(
        cp, lambda: gpu.stage_plaintext_gpu(path, chunk_size=cs, out=out, threads=os.cpu_count())
    )


def kernels_alone(
    cp: Any, path: Path, dk: bytes, out: Any
) -> tuple[Callable[[], float], Callable[[], float], Callable[[], float], Callable[[], None]]:
    """(open, seal, D2D copy) timers over device-resident data, and a cleanup."""
    dataset = open_sealed(path)
    header = dataset.header
    raw = np.fromfile(path, dtype=np.uint8, offset=header.chunks_offset)
    records = cp.asarray(raw)
    del raw
    sealed_again = cp.empty_like(records)
    stream = cp.cuda.Stream(non_blocking=True)
    dev = rt.GcmDevice(
        cp, int(out.device.id), header, fmt.derive_chunk_key(dk, header.dataset_id), stream=stream
    )
    with stream:  # initialised on the stream the kernels write it on
        status = cp.zeros(header.chunk_count, dtype=cp.uint32)
    n = header.chunk_count

    def open_all() -> float:
        t = _events_time(cp, stream, lambda: dev.launch(0, n, records, out, status, seal=False))
        if cp.asnumpy(status).any():
            raise RuntimeError("the kernel rejected an authentic dataset")
        return t

    def seal_all() -> float:
        return _events_time(
            cp, stream, lambda: dev.launch(0, n, out, sealed_again, status, seal=True)
        )

    def d2d() -> float:
        return _events_time(
            cp,
            stream,
            lambda: cp.cuda.runtime.memcpyAsync(
                out.data.ptr,
                records.data.ptr,
                out.size,
                cp.cuda.runtime.memcpyDeviceToDevice,
                stream.ptr,
            ),
        )

    def close() -> None:
        dev.close()
        gpu.scrub_gpu(sealed_again)

    return open_all, seal_all, d2d, close


# --- driver --------------------------------------------------------------------------------------


def run_checks() -> int:
    tests = [
        "tests/unit/staging/test_kernel_harness.py",
        "tests/unit/staging/test_gpu_pipeline.py",
        "tests/gpu/test_gpu_staging.py",
    ]
    print("== correctness: " + " ".join(tests), flush=True)
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-rs", *tests], cwd=ROOT)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=DESCRIPTION)
    ap.add_argument("--size", type=parse_size, default=4 * GiB)
    ap.add_argument("--chunk-sizes", default="64KiB,1MiB,4MiB,16MiB")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="run the correctness tests first")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--tmp", type=Path, help="directory for the dataset files")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="300 KiB, two chunk sizes, one run; on the CuPy stand-in without a GPU",
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.size, args.chunk_sizes, args.repeat = 300 * KiB, "4KiB,64KiB", 1
        if _use_stand_in_without_gpu(args.device):
            print("smoke: no GPU, dry run on tests/support/fake_cupy.py (numbers mean nothing)")
    chunk_sizes = [parse_size(x) for x in args.chunk_sizes.split(",") if x.strip()]

    if args.check:
        rc = run_checks()
        if rc != 0:
            print(f"correctness tests failed (exit {rc}); not timing a broken build")
            return rc
    try:
        reason = gpu.unavailable_reason(args.device)
    except GpuKernelError as exc:
        print(f"GPU {args.device} present, but its kernels are broken: {exc}")
        return EXIT_BROKEN_KERNELS
    if reason is not None:
        print(f"no GPU: {reason} (nothing measured)")
        return 0
    if args.size < 4 * GiB:
        print(f"note: --size {args.size / GiB:.2f} GiB is below the 4 GiB the goals are stated for")

    cp = rt.import_cupy()
    threads = os.cpu_count() or 1
    props = cp.cuda.runtime.getDeviceProperties(args.device)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    print(f"device {args.device}: {name}, {threads} host CPUs, size {args.size / GiB:.2f} GiB")

    rows = [
        "H2D pinned copy (line rate)",
        "CPU 1 thread: decrypt then copy",
        f"CPU {threads} threads: decrypt then copy",
        "gpucc sealed (page cache)",
        f"gpucc plaintext (host seals, {threads} threads)",
        "kernel open, device-resident",
        "kernel seal, device-resident",
        "D2D copy (ceiling)",
    ]
    results: dict[int, dict[str, float]] = {}
    rng = np.random.default_rng(int.from_bytes(os.urandom(8), "big"))
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp, cp.cuda.Device(args.device):
        plain = Path(tmp) / "plain.bin"
        with open(plain, "wb") as fh:
            left = args.size
            while left:
                n = min(left, 256 * MiB)
                fh.write(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
                left -= n
        out = cp.empty(args.size, dtype=cp.uint8)
        for cs in chunk_sizes:
            print(f"-- chunk size {cs // KiB} KiB: sealing", flush=True)
            kek = fmt.new_dataset_key()
            sealed = Path(tmp) / "sealed.gcc"
            seal_file(plain, sealed, kek=kek, chunk_size=cs, threads=threads)
            dk = open_sealed(sealed).unwrap(kek)
            for p in (sealed, plain):  # into the page cache
                with open(p, "rb") as fh:
                    while fh.read(64 * MiB):
                        pass
            timers: dict[str, Callable[[], float]] = {
                rows[0]: line_rate(cp, args.size, out),
                rows[1]: cpu_baseline(cp, sealed, dk, out, 1),
                rows[2]: cpu_baseline(cp, sealed, dk, out, threads),
                rows[3]: gpucc_sealed(cp, sealed, dk, out),
                rows[4]: gpucc_plaintext(cp, plain, cs, out),
            }
            k_open, k_seal, d2d, close = kernels_alone(cp, sealed, dk, out)
            timers[rows[5]], timers[rows[6]], timers[rows[7]] = k_open, k_seal, d2d
            results[cs] = {}
            for row, timer in timers.items():
                seconds = _median(timer, args.repeat)
                results[cs][row] = args.size / seconds / 1e9
                print(f"   {row:<42} {results[cs][row]:8.2f} GB/s", flush=True)
            close()
            sealed.unlink()
            cp.get_default_memory_pool().free_all_blocks()
        gpu.scrub_gpu(out)

    print()
    header = f"{'GB/s (x line rate)':<44}" + "".join(f"{cs // KiB:>9} KiB  " for cs in chunk_sizes)
    print(header)
    print("-" * len(header))
    for row in rows:
        cells = ""
        for cs in chunk_sizes:
            rate = results[cs][row]
            cells += f"{rate:8.1f} ({rate / results[cs][rows[0]]:4.2f})"
        print(f"{row:<44}{cells}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"device": name, "size": args.size, "host_cpus": threads, "gbps": results},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
