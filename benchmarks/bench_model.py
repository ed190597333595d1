"""Model digest throughput: gpucc's CPU (and GPU) paths against raw hashlib/blake3, one run.

Run by hand (not a test)::

    .venv/bin/python benchmarks/bench_model.py [--size-mib 512] [--files 8] [--repeat 5]
    .venv/bin/python benchmarks/bench_model.py --smoke    # seconds: a check CI runs

A model of ``--files`` random files (``--size-mib`` in all) is written to a scratch directory
and read once, so every row reads from the page cache. Rows, each on every CPU:

* ``raw sha256 4MiB shards, in memory``: ``hashlib.sha256`` over 4 MiB slices of buffers already
  in memory, on a thread pool: the ceiling with no file reads.
* ``raw sha256 4MiB shards, pread``: the same, each shard read with ``os.preadv`` in 1 MiB pieces
  into a per-thread buffer: the ceiling for hashing files, which the library is compared with.
* ``gpucc sha256 4MiB shards``: ``digest_model`` (walk, open and stat checks, manifest).
* ``raw blake3, in memory`` / ``raw blake3, update_mmap``: the blake3 package with all its
  threads, per file (``update_mmap`` is how model_signing hashes).
* ``gpucc blake3 per file``: ``digest_model`` with BLAKE3.
* ``model_signing ...``: the reference implementation, when installed.
* With CuPy and a GPU: ``gpu ... device-resident`` digests the same bytes already on the GPU
  (``digest_device_buffers``) and ``gpucc ... --device gpu`` reads the files too.

Operations run interleaved, round after round; each cell is the best of ``--repeat`` rounds in
GB/s (10^9 bytes/s) with its ratio to the matching ceiling. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpucc.staging.model import digest_gpu, digest_model, make_serialization
from gpucc.staging.model.digest_cpu import default_threads

MiB = 1024 * 1024
SHARD = 4 * MiB
READ = MiB


def _best(fn: Callable[[], object], size: int, rates: list[float]) -> None:
    time.sleep(0.2)  # let the previous row's worker threads (blake3's pool spins) go idle
    started = time.perf_counter()
    fn()
    rates.append(size / (time.perf_counter() - started) / 1e9)


def _raw_sha_memory(blobs: list[bytes], threads: int) -> Callable[[], object]:
    views = [memoryview(b)[s : s + SHARD] for b in blobs for s in range(0, len(b), SHARD)]

    def run() -> object:
        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(lambda v: hashlib.sha256(v).digest(), views))

    return run


def _raw_sha_pread(files: list[Path], threads: int) -> Callable[[], object]:
    sizes = [f.stat().st_size for f in files]
    jobs = [
        (f, s, min(SHARD, n - s))
        for f, n in zip(files, sizes, strict=True)
        for s in range(0, n, SHARD)
    ]
    local = threading.local()

    def one(job: tuple[Path, int, int]) -> bytes:
        path, start, n = job
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = memoryview(bytearray(READ))
        h = hashlib.sha256()
        fd = os.open(path, os.O_RDONLY)
        try:
            for at in range(start, start + n, READ):
                got = os.preadv(fd, [buf[: min(READ, start + n - at)]], at)
                h.update(buf[:got])
        finally:
            os.close(fd)
        return h.digest()

    def run() -> object:
        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(one, jobs))

    return run


def _raw_blake3(blobs: list[bytes], files: list[Path], mmap: bool) -> Callable[[], object]:
    import blake3

    def run() -> object:
        out = []
        for blob, path in zip(blobs, files, strict=True):
            h = blake3.blake3(max_threads=blake3.blake3.AUTO)
            if mmap:
                h.update_mmap(path)
            else:
                h.update(blob)
            out.append(h.digest())
        return out

    return run


def _model_signing(root: Path, blake: bool) -> Callable[[], object] | None:
    try:
        ms: Any = importlib.import_module("model_signing")
    except ImportError:
        return None
    config = ms.hashing.Config()
    if blake:
        config.use_file_serialization(hashing_algorithm="blake3")
    else:
        config.use_shard_serialization(shard_size=SHARD)
    return lambda: config.hash(root)


def _gpu_rows(root: Path, blobs: list[bytes]) -> dict[str, tuple[Callable[[], object], str]]:
    if not digest_gpu.available():
        return {}
    import cupy
    import numpy as np

    arrays = [cupy.asarray(np.frombuffer(b, dtype=np.uint8)) for b in blobs]

    def device(hash_type: str, shard: int | None) -> Callable[[], object]:
        def run() -> object:
            out = digest_gpu.digest_device_buffers(arrays, hash_type, shard_size=shard)
            cupy.cuda.runtime.deviceSynchronize()
            return out

        return run

    sha = make_serialization(root, shard_size=SHARD)
    b3 = make_serialization(root, hash_type="blake3")
    return {
        "gpu sha256 4MiB shards, device-resident": (device("sha256", SHARD), "sha-mem"),
        "gpu blake3 per buffer, device-resident": (device("blake3", None), "b3-mem"),
        "gpucc sha256 4MiB shards --device gpu": (
            lambda: digest_model(root, sha, device="gpu"),
            "sha-file",
        ),
        "gpucc blake3 --device gpu": (lambda: digest_model(root, b3, device="gpu"), "b3-file"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=512, help="model size (MiB)")
    parser.add_argument("--files", type=int, default=8, help="number of files")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (best kept)")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    parser.add_argument("--smoke", action="store_true", help="8 MiB in 2 files, one round")
    args = parser.parse_args()
    if args.smoke:
        args.size_mib, args.files, args.repeat = 8, 2, 1
    threads = default_threads()
    per_file = args.size_mib * MiB // args.files
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        root = Path(scratch) / "model"
        root.mkdir()
        files = [root / f"shard-{i:03d}.safetensors" for i in range(args.files)]
        blobs = []
        for f in files:
            blob = os.urandom(per_file)
            f.write_bytes(blob)
            blobs.append(blob)
        size = per_file * args.files
        sha = make_serialization(root, shard_size=SHARD)
        b3 = make_serialization(root, hash_type="blake3")
        rows: dict[str, tuple[Callable[[], object], str]] = {
            "raw sha256 4MiB shards, in memory": (_raw_sha_memory(blobs, threads), "sha-mem"),
            "raw sha256 4MiB shards, pread": (_raw_sha_pread(files, threads), "sha-file"),
            "gpucc sha256 4MiB shards": (lambda: digest_model(root, sha), "sha-file"),
            "raw blake3, in memory": (_raw_blake3(blobs, files, mmap=False), "b3-mem"),
            "raw blake3, update_mmap": (_raw_blake3(blobs, files, mmap=True), "b3-file"),
            "gpucc blake3 per file": (lambda: digest_model(root, b3), "b3-file"),
        }
        for label, blake in (("model_signing sha256 4MiB shards", False),
                             ("model_signing blake3 per file", True)):  # fmt: skip
            fn = _model_signing(root, blake)
            if fn is not None:
                rows[label] = (fn, "b3-file" if blake else "sha-file")
        rows.update(_gpu_rows(root, blobs))
        for fn, _ in rows.values():  # warm up: page cache, thread pools, kernel builds
            fn()
        rates: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.repeat):
            for name, (fn, _) in rows.items():
                _best(fn, size, rates[name])
    best = {name: max(r) for name, r in rates.items()}
    ceilings = {
        "sha-mem": best["raw sha256 4MiB shards, in memory"],
        "sha-file": best["raw sha256 4MiB shards, pread"],
        "b3-mem": best["raw blake3, in memory"],
        "b3-file": best["raw blake3, update_mmap"],
    }
    head = f"model {args.size_mib} MiB, {args.files} files, {threads} threads"
    print(f"{head}, best of {args.repeat}")
    print(f"{'operation':<44} {'GB/s':>8} {'vs ceiling':>11}")
    for name, (_, kind) in rows.items():
        ratio = best[name] / ceilings[kind]
        print(f"{name:<44} {best[name]:>8.2f} {ratio:>10.2f}x")
    cpu_file = best["gpucc sha256 4MiB shards"]
    for name in rows:
        if name.startswith("gpu ") or name.endswith("--device gpu"):
            print(f"{name}: {best[name] / cpu_file:.1f}x the all-core CPU sha256 verifier")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
