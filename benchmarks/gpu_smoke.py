"""Device-side helpers of ``benchmarks/gpu_validate.sh``: smoke checks and timings on one GPU.

Run from the project root (the validation script does)::

    python benchmarks/gpu_smoke.py smoke [--cubin PATH]   # versions, builds, KATs, timings
    python benchmarks/gpu_smoke.py small DIR              # a small staging run (sanitizers)
    python benchmarks/gpu_smoke.py ncu                    # device-resident opens for ncu

``smoke`` prints one ``RESULT ...`` line per finding (the summary collects them) and exits 0
only when everything it checked was right:

* versions (Python, NumPy, CuPy, cryptography, CUDA runtime and driver, NVRTC) and the device;
* an NVRTC build of exactly the sources and options the runtime compiles, AES-GCM and the
  model-hash kernels, with the whole build log on failure; each kernel's registers, local
  memory (spills), static shared memory, and the occupancy the driver reports for the CTA
  widths the runtime launches; with ``--cubin``, the NVRTC machine code of the AES-GCM
  kernels is written there for ``benchmarks/sass_model.py --cubin``;
* the load-time known answers (the runtime builds the kernels and checks them itself);
* the kernels alone on device-resident data, timed with CUDA events at 4 MiB, 64 KiB and
  16 MiB chunks: outputs poisoned before every run and compared in full afterwards, sealing
  compared with the CPU sealer's bytes, one tampered chunk that must be flagged and zeroed;
* the copy ceilings: pinned host-to-device (32 MiB and 4 MiB copies), device-to-host, and
  device-to-device.

``--smoke`` runs ``smoke``, as the dry run below where no GPU is usable (CI runs it).
``GV_FAKE=1`` runs everything that can run against ``tests/support/fake_cupy.py`` (small sizes, no
NVRTC, no hash kernels): a dry run of this script's own flow on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # tests.support.fake_cupy for a dry run

from gpucc.staging import _gpu_runtime as rt  # noqa: E402
from gpucc.staging import format as fmt  # noqa: E402
from gpucc.staging import gpu  # noqa: E402
from gpucc.staging.dataset import open_sealed  # noqa: E402
from gpucc.staging.errors import ChunkAuthenticationError, GpuKernelError  # noqa: E402
from gpucc.staging.model import digest_gpu  # noqa: E402
from gpucc.staging.seal import seal_bytes  # noqa: E402

FAKE = os.environ.get("GV_FAKE") == "1"
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
POISON = 0xA5

# --- names taken from the runtime: the one place to update when the runtime changes -------------

AES_KERNELS = rt.KERNEL_NAMES
HASH_KERNELS = ("sha256_shards", "blake3_chunks", "blake3_parents")
HASH_OPTIONS = ("-std=c++17",)  # the options digest_gpu._kernels builds with


def aes_source() -> str:
    """aesgcm.cu with its header inlined, exactly as the runtime hands it to NVRTC."""
    return rt._kernel_source()


def aes_options() -> tuple[str, ...]:
    return tuple(rt._NVRTC_OPTIONS)


def aes_widths() -> dict[str, int]:
    """CTA width of gcm_chunks per chunk size, as the runtime picks it."""
    return {label: rt._threads_for(cs) for label, cs in (("4 KiB", 4 * KiB), ("64 KiB+", 64 * KiB))}


def known_answers(device: int) -> str | None:
    """Builds the AES-GCM kernels and runs their load-time known answers: None when usable."""
    try:
        return rt.unavailable_reason(device)
    except Exception as exc:  # noqa: BLE001 - a build or known-answer error raised, not returned
        return f"{type(exc).__name__}: {exc}"


# ------------------------------------------------------------------------------------------------


def p(*parts: object) -> None:
    print(*parts, flush=True)


def load_cupy() -> Any:
    """CuPy, or the fake of tests/support/fake_cupy.py put in the runtime's place for a dry run."""
    if FAKE:
        from tests.support import fake_cupy

        fake_cupy.reset(devices=1)
        rt.import_cupy, rt._modules = (lambda: fake_cupy), {}
        return fake_cupy
    return rt.import_cupy()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def environment(cp: Any) -> None:
    import cryptography

    p(f"python {sys.version.split()[0]}, numpy {np.__version__}, cupy {cp.__version__}")
    p(f"RESULT versions: cryptography {cryptography.__version__}, cupy {cp.__version__}")
    runtime = cp.cuda.runtime
    p(f"RESULT cuda: runtime {runtime.runtimeGetVersion()}, driver {runtime.driverGetVersion()}")
    try:
        from cupy.cuda import nvrtc

        p(f"RESULT nvrtc: {nvrtc.getVersion()}")
    except Exception as exc:  # noqa: BLE001 - informational
        p(f"nvrtc version: unknown ({exc!r})")
    props = runtime.getDeviceProperties(0)
    dev = cp.cuda.Device(0)
    attrs = dev.attributes
    free, total = runtime.memGetInfo()
    p(
        f"RESULT device: {_text(props['name'])}, cc {dev.compute_capability}, "
        f"{attrs.get('MultiProcessorCount')} SMs, L2 {attrs.get('L2CacheSize', 0) // MiB} MiB, "
        f"regs/SM {attrs.get('MaxRegistersPerMultiprocessor')}, "
        f"smem/SM {attrs.get('MaxSharedMemoryPerMultiprocessor')} B, "
        f"memory {free / GiB:.1f} of {total / GiB:.1f} GiB free"
    )


def build(
    cp: Any, label: str, source: str, options: tuple[str, ...], names: tuple[str, ...]
) -> Any:
    """Build one module with NVRTC through CuPy: the kernels by name, or None (log printed)."""
    started = time.perf_counter()
    try:
        module = cp.RawModule(code=source, options=options)
        kernels = {name: module.get_function(name) for name in names}
    except Exception as exc:  # noqa: BLE001 - CompileException and driver errors alike
        p(f"RESULT build {label}: FAILED ({type(exc).__name__})")
        p(f"---- full build log ({label}) ----")
        p(str(exc))
        p("---- end of build log ----")
        return None
    took = time.perf_counter() - started
    p(f"RESULT build {label}: ok in {took:.1f} s, options {' '.join(options) or '-'}")
    for name, kernel in kernels.items():
        try:
            at = kernel.attributes
            p(
                f"RESULT attrs {name}: {at['num_regs']} regs, local {at['local_size_bytes']} B, "
                f"static smem {at['shared_size_bytes']} B, max {at['max_threads_per_block']} "
                f"threads/CTA, binary sm_{at['binary_version']}"
            )
        except Exception as exc:  # noqa: BLE001 - the fake has no attributes
            p(f"attrs {name}: not available ({type(exc).__name__})")
    return kernels


def occupancy(cp: Any, kernels: dict[str, Any]) -> None:
    """Resident CTAs per SM as the driver reports them, for the widths the runtime launches."""
    try:
        from cupy.cuda import driver

        chunks = kernels["gcm_chunks"].kernel.ptr
        parts = []
        for label, width in aes_widths().items():
            ctas = driver.occupancyMaxActiveBlocksPerMultiprocessor(chunks, width, 0)
            parts.append(f"{ctas} CTAs/SM at {width} threads ({label} chunks)")
        fin = driver.occupancyMaxActiveBlocksPerMultiprocessor(
            kernels["gcm_finalize"].kernel.ptr, 256, 0
        )
        msgs = driver.occupancyMaxActiveBlocksPerMultiprocessor(
            kernels["gcm_msgs"].kernel.ptr, 256, 0
        )
        p(
            f"RESULT occupancy gcm_chunks: {', '.join(parts)} (the persistent grid is this "
            f"times the SM count); gcm_finalize {fin} CTAs/SM at 256 threads; gcm_msgs "
            f"{msgs} CTAs/SM at 256 threads"
        )
    except Exception as exc:  # noqa: BLE001 - informational (and absent on the fake)
        p(f"occupancy: not available ({type(exc).__name__}: {exc})")


def write_cubin(cp: Any, path: Path) -> None:
    """NVRTC machine code of the AES-GCM source with the runtime's options, for sass_model."""
    try:
        from cupy.cuda import nvrtc

        major, minor = cp.cuda.Device(0).compute_capability[:2]
        prog = nvrtc.createProgram(aes_source(), "aesgcm.cu", [], [])
        try:
            nvrtc.compileProgram(prog, [*aes_options(), f"-arch=sm_{major}{minor}"])
            path.write_bytes(nvrtc.getCUBIN(prog))
        finally:
            nvrtc.destroyProgram(prog)
        p(f"cubin for the static model: {path} (sm_{major}{minor})")
    except Exception as exc:  # noqa: BLE001 - the static model then uses nvcc only
        p(f"cubin for the static model: not written ({type(exc).__name__}: {exc})")


# --- timings -------------------------------------------------------------------------------------


def events_seconds(cp: Any, stream: Any, work: Callable[[], None]) -> float:
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    work()
    stop.record(stream)
    stop.synchronize()
    return float(cp.cuda.get_elapsed_time(start, stop)) / 1e3


def rate_line(label: str, nbytes: int, seconds: list[float], extra: str = "") -> float:
    med = statistics.median(seconds)
    gbps = nbytes / med / 1e9
    spread = f"{nbytes / max(seconds) / 1e9:.1f}..{nbytes / min(seconds) / 1e9:.1f}"
    p(f"RESULT {label}: {gbps:.1f} GB/s (median of {len(seconds)}, range {spread}){extra}")
    return gbps


def copy_ceilings(cp: Any, size: int, reps: int) -> float:
    """Pinned H2D (32 MiB and 4 MiB copies), D2H and D2D over ``size`` bytes; returns D2D GB/s."""
    rt_ = cp.cuda.runtime
    pinned = cp.cuda.alloc_pinned_memory(size)
    host = np.frombuffer(pinned, dtype=np.uint8, count=size)
    host[:] = np.random.default_rng().integers(0, 256, size, dtype=np.uint8)
    dev = cp.empty(size, dtype=cp.uint8)
    dev2 = cp.empty(size, dtype=cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)

    def pieces(piece: int, kind: int, to_device: bool) -> Callable[[], None]:
        def work() -> None:
            for off in range(0, size, piece):
                n = min(piece, size - off)
                dst, src = (dev.data.ptr + off, host.ctypes.data + off)
                if not to_device:
                    dst, src = src, dst
                rt_.memcpyAsync(dst, src, n, kind, stream.ptr)

        return work

    d2d_gbps = 0.0
    runs = (
        ("copy H2D pinned, 32 MiB copies", pieces(32 * MiB, rt_.memcpyHostToDevice, True)),
        ("copy H2D pinned, 4 MiB copies", pieces(4 * MiB, rt_.memcpyHostToDevice, True)),
        ("copy D2H pinned, 32 MiB copies", pieces(32 * MiB, rt_.memcpyDeviceToHost, False)),
        (
            "copy D2D",
            lambda: rt_.memcpyAsync(
                dev2.data.ptr, dev.data.ptr, size, rt_.memcpyDeviceToDevice, stream.ptr
            ),
        ),
    )
    for label, work in runs:
        events_seconds(cp, stream, work)  # warm-up
        times = [events_seconds(cp, stream, work) for _ in range(reps)]
        extra = ""
        if label == "copy D2D":
            extra = f"; {2 * size / statistics.median(times) / 1e9:.0f} GB/s read+written"
        gbps = rate_line(label, size, times, extra)
        if label == "copy D2D":
            d2d_gbps = gbps
    if not np.array_equal(cp.asnumpy(dev2), host):
        p("RESULT copy check: FAILED (the copies did not round trip)")
        d2d_gbps = -1.0
    return d2d_gbps


def kernels_alone(cp: Any, data: np.ndarray[Any, Any], cs: int, reps: int, d2d: float) -> bool:
    """gcm_chunks + gcm_finalize on device-resident records; poisoned outputs, one tamper."""
    size = int(data.size)
    label = f"{cs // KiB} KiB chunks" if cs < MiB else f"{cs // MiB} MiB chunks"
    did, dk = os.urandom(16), fmt.new_dataset_key()
    header = fmt.Header(chunk_size=cs, dataset_id=did, plaintext_length=size)
    blob = seal_bytes(data.data, dataset_key=dk, chunk_size=cs, dataset_id=did)
    host_records = np.frombuffer(blob, dtype=np.uint8)[header.chunks_offset :]
    records = cp.asarray(host_records)
    plain = cp.asarray(data)
    out = cp.empty(size, dtype=cp.uint8)
    resealed = cp.empty(int(host_records.size), dtype=cp.uint8)
    n = header.chunk_count
    status = cp.zeros(n, dtype=cp.uint32)
    key = fmt.derive_chunk_key(dk, did)
    ok = True
    gcm = rt.GcmDevice(cp, 0, header, key)
    stream = gcm.stream  # the device context's own stream: launches are ordered on it
    try:

        def poison(buf: Any) -> None:
            with stream:
                buf.fill(POISON)

        def open_all() -> None:
            gcm.launch(0, n, records, out, status, seal=False)

        def seal_all() -> None:
            gcm.launch(0, n, plain, resealed, status, seal=True)

        opens: list[float] = []
        for i in range(reps + 1):  # the first run is the warm-up
            poison(out)
            took = events_seconds(cp, stream, open_all)
            if i:
                opens.append(took)
            if i in (0, reps):
                verdicts = cp.asnumpy(status)
                if verdicts.any() or not np.array_equal(cp.asnumpy(out), data):
                    p(f"RESULT kernel open {label}: WRONG (run {i}: poisoned output not matched)")
                    ok = False
        seals: list[float] = []
        for i in range(reps + 1):
            poison(resealed)
            took = events_seconds(cp, stream, seal_all)
            if i:
                seals.append(took)
        if not np.array_equal(cp.asnumpy(resealed), host_records):
            p(f"RESULT kernel seal {label}: WRONG (not the CPU sealer's bytes)")
            ok = False
        if ok:
            vs = f", {rate(size, opens) / d2d:.2f}x D2D" if d2d > 0 else ""
            rate_line(f"kernel open {label}", size, opens, f"{vs}, {n} chunks, output checked")
            rate_line(f"kernel seal {label}", size, seals, ", equals the CPU sealer")
        # One tampered chunk: flagged alone, and its plaintext zeroed.
        bad_index = n // 2
        tampered = host_records.copy()
        tampered[bad_index * (cs + fmt.TAG_SIZE) + 5] ^= 1
        records_bad = cp.asarray(tampered)
        poison(out)
        gcm.launch(0, n, records_bad, out, status, seal=False)
        stream.synchronize()
        flagged = np.flatnonzero(cp.asnumpy(status)).tolist()
        got = cp.asnumpy(out)
        zeroed = not got[bad_index * cs : (bad_index + 1) * cs].any()
        if flagged == [bad_index] and zeroed:
            p(f"RESULT tamper {label}: ok (chunk {bad_index} of {n} flagged and zeroed)")
        else:
            p(f"RESULT tamper {label}: WRONG (flagged {flagged[:5]}, zeroed {zeroed})")
            ok = False
        del records_bad
    finally:
        gcm.close()
        with stream:
            out.fill(0)
            plain.fill(0)
        stream.synchronize()
    return ok


def rate(nbytes: int, seconds: list[float]) -> float:
    return nbytes / statistics.median(seconds) / 1e9


def free_pool(cp: Any) -> None:
    cp.get_default_memory_pool().free_all_blocks()


def smoke(cubin: Path | None) -> int:
    cp = load_cupy()
    ok = True
    kernels: dict[str, Any] | None = None
    if not FAKE:
        try:
            environment(cp)
        except Exception:  # noqa: BLE001 - informational: the checks below still run
            traceback.print_exc()
            p("RESULT device: not read (exception above)")
        with cp.cuda.Device(0):
            kernels = build(cp, "aesgcm", aes_source(), aes_options(), AES_KERNELS)
            hashes = build(cp, "hash", digest_gpu.kernel_source(), HASH_OPTIONS, HASH_KERNELS)
        if kernels is None or hashes is None:
            return 3
        occupancy(cp, kernels)
        if cubin is not None:
            write_cubin(cp, cubin)
    else:
        p("dry run on tests/support/fake_cupy.py: no NVRTC, attributes or hash kernels")
        kernels = build(cp, "aesgcm", aes_source(), aes_options(), AES_KERNELS)
        if kernels is None:
            return 3
    started = time.perf_counter()
    reason = known_answers(0)
    took = time.perf_counter() - started
    verdict = "ok" if reason is None else f"FAILED: {reason}"
    p(f"RESULT known answers aesgcm: {verdict} ({took:.1f} s)")
    if reason is not None:
        return 4
    if not FAKE:
        started = time.perf_counter()
        hashes_ok = digest_gpu.available()
        took = time.perf_counter() - started
        p(f"RESULT known answers hash: {'ok' if hashes_ok else 'FAILED'} ({took:.1f} s)")
        ok = ok and hashes_ok
    size = 4 * MiB if FAKE else GiB
    reps = 2 if FAKE else 10
    chunk_sizes = (64 * KiB, 1 * MiB) if FAKE else (4 * MiB, 64 * KiB, 16 * MiB)
    d2d = 0.0
    try:
        d2d = copy_ceilings(cp, size, reps)
        ok = ok and d2d >= 0
    except Exception:  # noqa: BLE001 - record and go on to the kernels
        traceback.print_exc()
        p("RESULT copy ceilings: FAILED (exception above)")
        ok = False
    free_pool(cp)
    data = np.random.default_rng().integers(0, 256, size, dtype=np.uint8)
    for cs in chunk_sizes:
        try:
            ok = kernels_alone(cp, data, cs, reps, d2d) and ok
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            p(f"RESULT kernel open {cs // KiB} KiB chunks: FAILED (exception above)")
            ok = False
        free_pool(cp)
    p(f"RESULT smoke: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


# --- a small staging run for compute-sanitizer ---------------------------------------------------


def _host(cp: Any, array: Any) -> bytes:
    return bytes(cp.asnumpy(array).tobytes())


def small(tmp: Path) -> int:
    """Every kernel and every pipeline path once, on small inputs."""
    cp = load_cupy()
    if not FAKE:
        # No pools: each array is its own allocation, so an access past its end is caught.
        cp.cuda.set_allocator(None)
        cp.cuda.set_pinned_memory_allocator(None)
    tmp.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng()

    def sealed(data: bytes, cs: int, name: str) -> tuple[Any, bytes, Path]:
        dk = fmt.new_dataset_key()
        path = tmp / name
        path.write_bytes(seal_bytes(data, dataset_key=dk, chunk_size=cs))
        return open_sealed(path), dk, path

    cs = 64 * KiB
    data = rng.integers(0, 256, 5 * cs + 4096 + 7, dtype=np.uint8).tobytes()
    ds, dk, path = sealed(data, cs, "a.gcc")
    # 1. the pipeline with 2 chunks a batch and 2 slots (the rings wrap), a partial last chunk
    batch = 2 * (cs + fmt.TAG_SIZE)
    assert _host(cp, gpu.stage_gpu(ds, dk, batch_bytes=batch, slots=2)) == data
    p("pipeline: ok")
    # 2. device-resident records, one launch pair
    blob = path.read_bytes()
    records = cp.asarray(np.frombuffer(blob[ds.header.chunks_offset :], dtype=np.uint8))
    assert _host(cp, gpu.decrypt_records_gpu(records, ds.header, dk)) == data
    p("device-resident: ok")
    # 3. a tampered chunk
    bad = bytearray(blob)
    bad[ds.header.chunk_offset(3) + 100] ^= 1
    path.write_bytes(bad)
    try:
        gpu.stage_gpu(open_sealed(path), dk, batch_bytes=batch, slots=2)
    except ChunkAuthenticationError as exc:
        assert exc.chunk_index == 3, exc.chunk_index
    else:
        raise AssertionError("a tampered chunk was accepted")
    p("tamper: ok")
    # 4. 4 KiB chunks (narrower CTAs) and plaintext input sealed on the host in transit
    little = rng.integers(0, 256, 37 * 4096 + 3, dtype=np.uint8).tobytes()
    ds4, dk4, _ = sealed(little, 4 * KiB, "b.gcc")
    assert _host(cp, gpu.stage_gpu(ds4, dk4, batch_bytes=8 * (4096 + fmt.TAG_SIZE))) == little
    plain = tmp / "p.bin"
    plain.write_bytes(little)
    staged = gpu.stage_plaintext_gpu(plain, chunk_size=4 * KiB, batch_bytes=16 * KiB)
    assert _host(cp, staged) == little
    p("4 KiB chunks and plaintext input: ok")
    # 5. sealing on the GPU, byte for byte the CPU sealer's output
    did = os.urandom(16)
    on_gpu = gpu.seal_gpu(cp.asarray(np.frombuffer(data, dtype=np.uint8)), dataset_key=dk,
                          chunk_size=cs, dataset_id=did)  # fmt: skip
    assert on_gpu == seal_bytes(data, dataset_key=dk, chunk_size=cs, dataset_id=did)
    p("GPU sealing: ok")
    # 6. the model-hash kernels on device buffers (odd sizes: unaligned tails, a BLAKE3 tree)
    if not FAKE:
        import hashlib

        blobs = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (3, 5000, 300_001)]
        arrays = [cp.asarray(np.frombuffer(b, dtype=np.uint8)) for b in blobs]
        got = digest_gpu.digest_device_buffers(arrays, "sha256", shard_size=4096)
        want = [[hashlib.sha256(b[s : s + 4096]).digest() for s in range(0, len(b), 4096)]
                for b in blobs]  # fmt: skip
        assert got == want
        digest_gpu.digest_device_buffers(arrays, "blake3")
        p("hash kernels: ok")
    p("SMALL RUN OK")
    return 0


# --- device-resident opens for Nsight Compute ----------------------------------------------------


@contextmanager
def nvtx_range(name: str) -> Iterator[None]:
    """An NVTX push/pop range (CuPy's, else PyTorch's) so ncu profiles only what is inside."""
    push: Callable[[str], Any] | None = None
    pop: Callable[[], Any] | None = None
    try:
        from cupy.cuda import nvtx

        if getattr(nvtx, "available", True):
            push, pop = nvtx.RangePush, nvtx.RangePop
    except Exception:  # noqa: BLE001 - try the next provider
        push = None
    if push is None:
        try:
            import torch

            push, pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
        except Exception:  # noqa: BLE001 - no NVTX: ncu then profiles every launch
            push = None
    p(f"NVTX range {name!r}: {'pushed' if push is not None else 'not available'}")
    if push is not None:
        push(name)
    try:
        yield
    finally:
        if pop is not None:
            pop()


def for_ncu() -> int:
    """Two opens: 128 MiB in 4 MiB chunks, then 64 MiB in 64 KiB chunks (one launch pair each).

    The kernels are built and their known answers run first, outside the NVTX range
    ``gv-measure`` that the validation script tells ncu to profile.
    """
    cp = load_cupy()
    reason = known_answers(0)
    if reason is not None:
        p(f"kernels not usable: {reason}")
        return 4
    with nvtx_range("gv-measure") if not FAKE else nullcontext():
        return _ncu_opens(cp)


def _ncu_opens(cp: Any) -> int:
    rng = np.random.default_rng()
    sizes = ((4 * MiB, 64 * KiB),) if FAKE else ((128 * MiB, 4 * MiB), (64 * MiB, 64 * KiB))
    for size, cs in sizes:
        data = rng.integers(0, 256, size, dtype=np.uint8)
        did, dk = os.urandom(16), fmt.new_dataset_key()
        header = fmt.Header(chunk_size=cs, dataset_id=did, plaintext_length=size)
        blob = seal_bytes(data.data, dataset_key=dk, chunk_size=cs, dataset_id=did)
        records = cp.asarray(np.frombuffer(blob, dtype=np.uint8)[header.chunks_offset :])
        out = gpu.decrypt_records_gpu(records, header, dk)
        assert np.array_equal(cp.asnumpy(out), data)
        p(f"ncu: opened {size // MiB} MiB in {cs // KiB} KiB chunks")
    return 0


def main(argv: list[str] | None = None) -> int:
    global FAKE
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="run 'smoke'; without a usable GPU as the GV_FAKE=1 dry run (a check CI runs)",
    )
    sub = ap.add_subparsers(dest="cmd")
    sm = sub.add_parser("smoke", help="versions, builds, known answers, kernel and copy timings")
    sm.add_argument("--cubin", type=Path, help="write the NVRTC cubin of aesgcm.cu here")
    sa = sub.add_parser("small", help="a small staging run (for compute-sanitizer)")
    sa.add_argument("dir", type=Path, help="scratch directory")
    sub.add_parser("ncu", help="device-resident opens for Nsight Compute")
    args = ap.parse_args(argv)
    if args.smoke:
        if args.cmd not in (None, "smoke"):
            ap.error("--smoke runs the 'smoke' command")
        try:
            FAKE = FAKE or rt.unavailable_reason(0) is not None
        except GpuKernelError:
            pass  # a present GPU with broken kernels: the real run reports it
        return smoke(getattr(args, "cubin", None))
    if args.cmd is None:
        ap.error("a command is required")
    if args.cmd == "smoke":
        return smoke(args.cubin)
    if args.cmd == "small":
        return small(args.dir)
    return for_ncu()


if __name__ == "__main__":
    sys.exit(main())
