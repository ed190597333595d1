"""Seal and CPU-stage throughput against the raw AES-GCM ceiling, measured in one run.

Run by hand (not a test)::

    .venv/bin/python benchmarks/bench_seal_stage.py [--size-mib 512] [--repeat 5] [--smoke]

``--smoke`` runs the whole flow on 8 MiB once (seconds; CI runs it so the script cannot rot).

For 1 MiB and 4 MiB chunks, with one thread and with every CPU, it times:

* ``raw encrypt_into`` / ``raw decrypt_into``: bare ``AESGCM.*_into`` calls, one per chunk
  on a thread pool, over in-memory buffers that are already mapped: the ceiling.
* ``seal_bytes``: the library sealing an in-memory plaintext into memory the caller owns
  outright (the default): one untimed call, its result dropped, then the timed call. Every
  call takes fresh pages from the kernel: nothing in the process keeps them for reuse.
* ``seal_bytes arena``: the same with ``arena=`` (a ``HostArena`` made for this benchmark):
  the timed call gets the pages the first call's result gave back (zeroed) to the arena.
* ``seal_bytes arena +release``: the same, with the dropping of the result (the arena
  zeroes it) timed too.
* ``seal_bytes out=``: the same into a mapped buffer: library overhead alone.
* ``seal_file (+fsync)``: file to file, with the temporary file, fsync and rename.
* ``stage_cpu``: file (page cache) into a buffer the caller owns outright, every chunk
  verified, timed the same way as ``seal_bytes`` (the second of two calls; fresh pages).
* ``stage_cpu arena`` and ``stage_cpu arena +release``: the same with ``arena=``, as for
  ``seal_bytes``.
* ``stage_cpu out=``: the same into a mapped buffer (no page faults while timed).
* ``stage_bytes out=``: a sealed dataset already in memory (no file read): library
  overhead alone.
* ``stage_plaintext_cpu``: a plaintext file, encrypted and decrypted (two AES passes).
* ``verify_cpu``: every chunk of the file authenticated in place in per-thread buffers,
  none kept; ``verify_cpu arena``: the same with the buffers lent by the arena (what
  ``gpucc stage`` does on the CPU without ``--manifest``).
* ``gpucc stage (CLI)``: ``gpucc stage FILE --data-key K --format json`` as a process; its
  own reported rate (open, unwrap and verify every chunk, start-up excluded), as a user
  sees it.
* ``gpucc stage (CLI) before``: with ``--before DIR``, the same command run from another
  source tree (``PYTHONPATH=DIR``, e.g. a worktree of the previous release), interleaved
  with the current one: a change to staging measured against what it replaces in one run.
* ``raw decrypt_into, fresh``: the ceiling into a fresh mapping: what the kernel's page
  clearing costs the bare AES-GCM call, with no library involved.
* ``pread (page cache)``: the copy into private memory that file staging adds to the
  ceiling (see ``staging/cpu.py`` for why the file is not memory-mapped).

Before the table it prints how fast the kernel hands out fresh memory (every page cleared
before its first write), with huge pages and every thread touching its share: a call that
must return fresh memory (the default path) pays that on top of its own work, which bounds
it at ``1 / (1 + out_rate / clear_rate)`` of the same call into a mapped buffer; the bound
is printed beside the measured default calls.

The operations run interleaved, round after round, so that noise from neighbours on a VM
hits the ceiling and the library alike; each cell is the best of ``--repeat`` rounds, in
GB/s of plaintext (10^9 bytes/s), with its ratio to the matching raw ceiling.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpucc.staging import format as fmt
from gpucc.staging.arena import HostArena
from gpucc.staging.cpu import stage_bytes, stage_cpu, stage_plaintext_cpu
from gpucc.staging.dataset import open_sealed
from gpucc.staging.seal import WrapSpec, seal_bytes, seal_file
from gpucc.staging.verify import verify_cpu

MiB = 1024 * 1024


def _best(fn: Callable[[], object], repeat: int, size: int) -> float:
    """Best throughput (GB/s) of ``repeat`` runs; what ``fn`` returns is dropped after the
    clock stops (a caller keeps the result it asked for)."""
    rates = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - started
        rates.append(result if isinstance(result, _Rate) else size / elapsed / 1e9)
        del result
    return max(rates)


class _Rate(float):
    """An operation that measures itself returns its own GB/s."""


def _cli_stage(path: Path, key_file: Path, threads: int, tree: Path | None = None) -> _Rate:
    """The CLI's own rate; ``tree``: run gpucc from that source tree instead."""
    exe = shutil.which("gpucc", path=str(Path(sys.executable).parent))
    argv = [exe] if exe and tree is None else [sys.executable, "-m", "gpucc"]
    argv += ["stage", str(path), "--data-key", str(key_file), "--threads", str(threads)]
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [*argv, "--format", "json"], capture_output=True, text=True, check=True, env=env
    )
    report = json.loads(done.stdout)
    return _Rate(report["bytes"] / report["seconds"] / 1e9)


def _second(size: int, fn: Callable[[], object]) -> _Rate:
    """The rate of ``fn``'s second call in a row, the first one's result dropped (what a
    program that calls it repeatedly sees)."""
    result = fn()
    del result
    started = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - started
    del result
    return _Rate(size / elapsed / 1e9)


def _with_release(size: int, fn: Callable[[], object]) -> _Rate:
    """Like :func:`_second`, with the dropping of the timed call's result timed too (an
    arena zeroes a buffer as it comes back)."""
    result = fn()
    del result
    started = time.perf_counter()
    result = fn()
    del result
    return _Rate(size / (time.perf_counter() - started) / 1e9)


def _raw(
    aead: AESGCM,
    op: str,
    src: memoryview,
    dst: memoryview,
    chunk: int,
    count: int,
    threads: int,
    pool: ThreadPoolExecutor | None,
) -> None:
    """The ceiling: one ``*_into`` call per chunk, nothing else."""
    aad = bytes(41)
    total = len(src) if op == "enc" else len(dst)

    def one(i: int) -> None:
        length = min(chunk, total - i * chunk)
        nonce = i.to_bytes(12, "big")
        if op == "enc":
            s = src[i * chunk : i * chunk + length]
            d = dst[i * (chunk + 16) : i * (chunk + 16) + length + 16]
            aead.encrypt_into(nonce, s, aad, d)
        else:
            s = src[i * (chunk + 16) : i * (chunk + 16) + length + 16]
            d = dst[i * chunk : i * chunk + length]
            aead.decrypt_into(nonce, s, aad, d)

    if pool is None:
        for i in range(count):
            one(i)
    else:
        for _ in pool.map(one, range(count)):
            pass


def _pread_all(path: Path, chunk: int, threads: int, pool: ThreadPoolExecutor | None) -> None:
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    bufs = [bytearray(chunk) for _ in range(max(1, threads))]

    def one(i: int) -> None:
        buf = memoryview(bufs[i % len(bufs)])
        os.preadv(fd, [buf], i * chunk)

    try:
        count = -(-size // chunk)
        if pool is None:
            for i in range(count):
                one(i)
        else:
            # Same buffer per thread slot is fine here: only the copy cost matters.
            for _ in pool.map(one, range(count)):
                pass
    finally:
        os.close(fd)


def _into_fresh(size: int, fn: Callable[..., None]) -> _Rate:
    """The rate of ``fn(dst=...)`` into a fresh anonymous mapping (huge pages advised), as a
    call that allocates its result gets; unmapping it afterwards is not timed."""
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mm.madvise(mmap.MADV_HUGEPAGE)
    view = memoryview(mm)
    try:
        started = time.perf_counter()
        fn(dst=view)
        return _Rate(size / (time.perf_counter() - started) / 1e9)
    finally:
        view.release()
        mm.close()


def _fresh_pages(size: int, threads: int) -> None:
    """Touch every page of a fresh anonymous mapping (huge pages advised), the threads
    splitting it: the kernel's cost of handing out cleared memory."""
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mm.madvise(mmap.MADV_HUGEPAGE)
    view = memoryview(mm)

    def touch(part: int) -> None:
        pages = np.frombuffer(view, dtype=np.uint8)
        pages[part * size // threads : (part + 1) * size // threads : 4096] = 1

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(touch, range(threads)))
    view.release()
    mm.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=512, help="plaintext size (MiB)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (best kept)")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    parser.add_argument("--smoke", action="store_true", help="8 MiB, one round: a quick check")
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        help="also time gpucc stage (CLI) from this source tree (a checkout to compare with)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.size_mib, args.repeat = 8, 1

    size = args.size_mib * MiB
    repeat = args.repeat
    all_threads = os.cpu_count() or 1
    thread_counts = sorted({1, all_threads})
    import cryptography

    print(
        f"plaintext {args.size_mib} MiB, best of {repeat}; cpu_count={all_threads}; "
        f"Python {sys.version.split()[0]}, cryptography {cryptography.__version__}, "
        f"numpy {np.__version__}",
        flush=True,
    )
    plain = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    kek = fmt.new_dataset_key()
    wrap_length = WrapSpec.key_file(kek).record_length
    # (operation, chunk, threads, GB/s, ceiling GB/s or None)
    rows: list[tuple[str, int, int, float, float | None]] = []
    clear_rate = {t: _best(partial(_fresh_pages, size, t), repeat, size) for t in thread_counts}

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmpdir = Path(tmp)
        src = tmpdir / "plain.bin"
        plain.tofile(src)
        key_file = tmpdir / "bench.key"
        fmt.write_key_file(key_file, kek)
        for chunk in (1 * MiB, 4 * MiB):
            count = -(-size // chunk)
            sealed_path = tmpdir / f"sealed-{chunk}.gcc"
            seal_file(src, sealed_path, kek=kek, chunk_size=chunk)
            dataset = open_sealed(sealed_path)
            dk = dataset.unwrap(kek)
            raw_mem = bytearray(size + 16 * count)
            mem_key = fmt.new_dataset_key()
            sealed_mem = seal_bytes(plain.data, dataset_key=mem_key, chunk_size=chunk)
            seal_out = bytearray(fmt.sealed_size(size, chunk, wrap_length))
            staged = np.ones(size, dtype=np.uint8)  # mapped: no page faults while timed
            aead = AESGCM(os.urandom(32))
            for threads in thread_counts:
                executor = ThreadPoolExecutor(threads) if threads > 1 else None
                arena = HostArena()
                # name -> (callable, name of its ceiling)
                ops: dict[str, tuple[Callable[[], object], str | None]] = {
                    "raw encrypt_into": (
                        partial(
                            _raw, aead, "enc", plain.data, memoryview(raw_mem), chunk, count,
                            threads, executor,
                        ),
                        None,
                    ),
                    "raw decrypt_into": (
                        partial(
                            _raw, aead, "dec", memoryview(raw_mem), staged.data, chunk, count,
                            threads, executor,
                        ),
                        None,
                    ),
                    "raw decrypt_into, fresh": (
                        partial(_into_fresh, size, partial(
                            _raw, aead, "dec", memoryview(raw_mem), chunk=chunk, count=count,
                            threads=threads, pool=executor,
                        )),
                        "raw decrypt_into",
                    ),
                    "pread (page cache)": (
                        partial(_pread_all, sealed_path, chunk, threads, executor), None
                    ),
                    "seal_bytes": (
                        partial(
                            _second, size,
                            partial(
                                seal_bytes, plain.data, kek=kek, chunk_size=chunk, threads=threads
                            ),
                        ),
                        "raw encrypt_into",
                    ),
                    "seal_bytes arena": (
                        partial(
                            _second, size,
                            partial(
                                seal_bytes, plain.data, kek=kek, chunk_size=chunk, threads=threads,
                                arena=arena,
                            ),
                        ),
                        "raw encrypt_into",
                    ),
                    "seal_bytes arena +release": (
                        partial(
                            _with_release, size,
                            partial(
                                seal_bytes, plain.data, kek=kek, chunk_size=chunk, threads=threads,
                                arena=arena,
                            ),
                        ),
                        "raw encrypt_into",
                    ),
                    "seal_bytes out=": (
                        partial(
                            seal_bytes, plain.data, kek=kek, chunk_size=chunk, threads=threads,
                            out=seal_out,
                        ),
                        "raw encrypt_into",
                    ),
                    "seal_file (+fsync)": (
                        partial(
                            seal_file, src, tmpdir / "bench.gcc", kek=kek, chunk_size=chunk,
                            threads=threads, force=True,
                        ),
                        "raw encrypt_into",
                    ),
                    "stage_cpu": (
                        partial(_second, size, partial(stage_cpu, dataset, dk, threads=threads)),
                        "raw decrypt_into",
                    ),
                    "stage_cpu arena": (
                        partial(
                            _second, size,
                            partial(stage_cpu, dataset, dk, threads=threads, arena=arena),
                        ),
                        "raw decrypt_into",
                    ),
                    "stage_cpu arena +release": (
                        partial(
                            _with_release, size,
                            partial(stage_cpu, dataset, dk, threads=threads, arena=arena),
                        ),
                        "raw decrypt_into",
                    ),
                    "verify_cpu": (
                        partial(verify_cpu, dataset, dk, threads=threads), "raw decrypt_into"
                    ),
                    "verify_cpu arena": (
                        partial(verify_cpu, dataset, dk, threads=threads, arena=arena),
                        "raw decrypt_into",
                    ),
                    "gpucc stage (CLI)": (
                        partial(_cli_stage, sealed_path, key_file, threads), "raw decrypt_into"
                    ),
                    **(
                        {
                            "gpucc stage (CLI) before": (
                                partial(_cli_stage, sealed_path, key_file, threads, args.before),
                                "raw decrypt_into",
                            )
                        }
                        if args.before is not None
                        else {}
                    ),
                    "stage_cpu out=": (
                        partial(stage_cpu, dataset, dk, threads=threads, out=staged),
                        "raw decrypt_into",
                    ),
                    "stage_bytes out=": (
                        partial(stage_bytes, sealed_mem, mem_key, threads=threads, out=staged),
                        "raw decrypt_into",
                    ),
                    "stage_plaintext_cpu": (
                        partial(stage_plaintext_cpu, src, chunk_size=chunk, threads=threads),
                        None,
                    ),
                }  # fmt: skip
                # Interleave the operations round by round, so that a noisy neighbour slows
                # the ceiling and the library alike; keep each one's best round.
                best = dict.fromkeys(ops, 0.0)
                for _ in range(repeat):
                    for name, (fn, _ceiling) in ops.items():
                        best[name] = max(best[name], _best(fn, 1, size))
                if executor is not None:
                    executor.shutdown()
                arena.close()
                for name, (_fn, ceiling_name) in ops.items():
                    ceiling_rate = best[ceiling_name] if ceiling_name else None
                    rows.append((name, chunk, threads, best[name], ceiling_rate))
                print(f"  done: chunk {chunk // MiB} MiB, {threads} thread(s)", flush=True)

    print()
    cells = ", ".join(f"{t} thr {rate:.2f} GB/s" for t, rate in clear_rate.items())
    print(f"fresh memory (the kernel clears every page first; huge pages): {cells}")
    print()
    header = f"{'operation':<26} {'chunk':>6}"
    for threads in thread_counts:
        header += f" {f'{threads} thr GB/s':>12} {'vs raw':>7}"
    print(header)
    print("-" * len(header))
    names = list(dict.fromkeys(r[0] for r in rows))
    for chunk in (1 * MiB, 4 * MiB):
        for name in names:
            line = f"{name:<26} {chunk // MiB:>4}Mi"
            for threads in thread_counts:
                match = [r for r in rows if r[:3] == (name, chunk, threads)]
                rate, ceiling = match[0][3], match[0][4]
                ratio = f"{rate / ceiling:.2f}" if ceiling else ""
                line += f" {rate:>12.2f} {ratio:>7}"
            print(line)
    print()
    print("arena and default paths against the same call into a caller's mapped buffer (out=):")
    for chunk in (1 * MiB, 4 * MiB):
        for threads in thread_counts:
            rates = {r[0]: r[3] for r in rows if r[1:3] == (chunk, threads)}

            def ratios(pairs: tuple[tuple[str, str], ...], rates: dict[str, float] = rates) -> str:
                return ", ".join(f"{name} {rates[name] / rates[base]:.2f}" for name, base in pairs)

            arena_cells = ratios(
                (
                    ("stage_cpu arena", "stage_cpu out="),
                    ("seal_bytes arena", "seal_bytes out="),
                    ("stage_cpu arena +release", "stage_cpu out="),
                    ("seal_bytes arena +release", "seal_bytes out="),
                    ("gpucc stage (CLI)", "stage_cpu out="),
                )
            )
            default_cells = ratios(
                (("stage_cpu", "stage_cpu out="), ("seal_bytes", "seal_bytes out="))
            )
            bounds = ", ".join(
                f"{name} {1 / (1 + rates[base] / clear_rate[threads]):.2f}"
                for name, base in (("stage", "stage_cpu out="), ("seal", "seal_bytes out="))
            )
            print(f"  {chunk // MiB} MiB, {threads} thr, arena: {arena_cells}")
            print(f"      default (fresh memory every call): {default_cells}")
            bare = rates["raw decrypt_into, fresh"] / rates["raw decrypt_into"]
            print(
                f"      bound for a call into fresh memory: {bounds}; "
                f"bare decrypt_into into fresh memory: {bare:.2f} of into mapped"
            )
    print()
    print("gpucc stage (CLI) against raw AES-GCM decrypt in the same run:")
    for chunk in (1 * MiB, 4 * MiB):
        cells = ", ".join(
            f"{r[2]} thr {r[3] / r[4]:.2f}"
            for r in rows
            if r[0] == "gpucc stage (CLI)" and r[1] == chunk and r[4]
        )
        print(f"  {chunk // MiB} MiB: {cells}")
        if args.before is not None:
            cells = ", ".join(
                f"{r[2]} thr {r[3] / r[4]:.2f}"
                for r in rows
                if r[0] == "gpucc stage (CLI) before" and r[1] == chunk and r[4]
            )
            print(f"  {chunk // MiB} MiB, before ({args.before}): {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
