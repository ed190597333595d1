"""Sealed data through PyTorch into training batches, beside plain memmap reading; a
DataLoader against raw staging; N ranks against one.

Run by hand (not a test)::

    .venv/bin/python benchmarks/bench_torch_data.py [--size-mib 256] [--repeat 3] [--ranks 1,2,4]
    .venv/bin/python benchmarks/bench_torch_data.py --smoke   # seconds: a check CI runs

On one sealed dataset and its plaintext (page cache, ``--chunk-mib`` chunks, records of
``--record`` bytes), every loader row delivers training batches of ``--train-batch``
records (views of each delivered chunk, in the epoch's shuffled chunk order); the consumer
touches one byte per batch:

* ``memmap``: the plaintext file through ``np.memmap``, each chunk copied into a tensor,
  through ``DataLoader(batch_size=None)``: plain reading, the baseline.
* ``stream``: ``SealedChunkStream`` (one rank, every chunk verified, a tensor of its own
  per chunk) through ``DataLoader(batch_size=None, num_workers=0)``, one epoch per round
  on the same stream. ``stream + clone``: the same, the consumer cloning each chunk (what
  a copy per chunk, on top of owned buffers, costs). ``workers=2``: both through two
  persistent DataLoader workers (tensors cross to the main process in shared memory;
  the workers follow ``set_epoch``). ``bs=4 chunks``: both through ``DataLoader(batch_size=4)``,
  whose default collation stacks four chunks (a copy) into each delivered batch.
* ``stage_cpu``: the raw staging path, the whole dataset into a fresh buffer (what
  ``staging.stage`` does), and ``stage_cpu out=``: into a buffer mapped beforehand.
* ``DataLoader(map, bs=B)``: ``SealedChunkDataset`` records through ``DataLoader`` with
  ``batch_size=B`` and a sequential sampler (per-record Python, collated copies).
* ranks: ``N`` processes, each a ``SealedChunkStream`` with ``rank=r, world_size=N`` and one
  decrypt thread, started together; the rate is all bytes over the slowest rank's time, and
  scaling is that rate over N times the one-rank rate with the same settings.

Each cell is the best of ``--repeat`` rounds (the cases interleave round by round), in
GB/s of plaintext (10^9 bytes/s) and samples (records) per second.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from gpucc.staging.cpu import stage_cpu
from gpucc.staging.dataset import open_sealed
from gpucc.staging.seal import seal_file
from gpucc.staging.torch_dataset import SealedChunkDataset, SealedChunkStream

MiB = 1024 * 1024
KEY = bytes(range(32))


def _timed(fn: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    samples = fn()
    return time.perf_counter() - started, samples


class _Memmap(IterableDataset[torch.Tensor]):
    """Plain reading: the plaintext's chunks, in the stream's order, copied from a memmap."""

    def __init__(self, path: Path, order: SealedChunkStream, chunk: int, record: int) -> None:
        self.path, self.order, self.chunk, self.record = path, order, chunk, record

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        data = np.memmap(self.path, dtype=np.uint8, mode="r")
        for g in self.order.chunks(worker, workers):
            piece = np.array(data[g * self.chunk : (g + 1) * self.chunk])
            yield torch.from_numpy(piece).view(-1, self.record)


def _batches(loader: Any, train_batch: int, clone: bool = False) -> int:
    """Training batches of ``train_batch`` records from every delivered chunk."""
    samples = 0
    touched = 0
    for chunk in loader:
        if clone:
            chunk = chunk.clone()
        for batch in chunk.reshape(-1, chunk.shape[-1]).split(train_batch):
            samples += int(batch.shape[0])
            touched += int(batch[0, 0])
    return samples


def _loader(dataset: Any, workers: int, batch: int | None = None) -> Any:
    extra: dict[str, Any] = {}
    if workers:  # persistent: the rows measure reading, not starting processes
        extra.update(multiprocessing_context="fork", persistent_workers=True)
    return DataLoader(dataset, batch_size=batch, num_workers=workers, **extra)


def _map_loader(path: Path, threads: int, record: int, batch: int) -> int:
    dataset = SealedChunkDataset(path, key=KEY, record_size=record, threads=threads)
    samples = 0
    for items in DataLoader(dataset, batch_size=batch, num_workers=0):
        samples += int(items.shape[0])
    dataset.close()
    return samples


def _rank(path: str, rank: int, world: int, record: int, barrier: Any, out: Any) -> None:
    torch.set_num_threads(1)
    stream = SealedChunkStream(
        path, key=KEY, threads=1, record_size=record, rank=rank, world_size=world, seed=1
    )
    barrier.wait()
    started = time.perf_counter()
    samples = 0
    for batch in stream:
        samples += int(batch.shape[0])
    out.put((rank, time.perf_counter() - started, samples))


def _ranks(path: Path, world: int, record: int) -> tuple[float, int]:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(world)
    queue = context.Queue()
    procs = [
        context.Process(target=_rank, args=(str(path), r, world, record, barrier, queue))
        for r in range(world)
    ]
    for proc in procs:
        proc.start()
    results = [queue.get(timeout=600) for _ in range(world)]
    for proc in procs:
        proc.join()
    return max(r[1] for r in results), sum(r[2] for r in results)


def _ranks_case(path: Path, world: int, record: int) -> Callable[[], tuple[float, int]]:
    return lambda: _ranks(path, world, record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--chunk-mib", type=int, default=4)
    parser.add_argument("--record", type=int, default=4096, help="bytes per sample")
    parser.add_argument("--train-batch", type=int, default=256, help="samples per batch")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batch", type=int, default=256, help="map-style batch size")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--smoke", action="store_true", help="8 MiB, one round, 1-2 ranks")
    args = parser.parse_args()
    if args.smoke:
        args.size_mib, args.chunk_mib, args.repeat, args.ranks = 8, 1, 1, "1,2"
    size: int = args.size_mib * MiB
    chunk: int = args.chunk_mib * MiB
    threads: int = args.threads
    record: int = args.record
    train: int = args.train_batch
    worlds = [int(n) for n in args.ranks.split(",")]

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "data.bin"
        src.write_bytes(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).data)
        path = Path(tmp) / "data.gcc"
        seal_file(src, path, dataset_key=KEY, chunk_size=chunk)
        dataset = open_sealed(path)
        out = np.zeros(size, dtype=np.uint8)
        samples_total = size // record
        # one stream for every round, as one per training run (epochs reuse its buffers)
        stream = SealedChunkStream(path, key=KEY, threads=threads, record_size=record, seed=1)
        plain = _Memmap(src, stream, chunk, record)
        epochs = itertools.count()

        def epoch(loader: Any, clone: bool = False) -> Callable[[], int]:
            def run() -> int:
                stream.set_epoch(next(epochs))  # the memmap rows follow the same order
                return _batches(loader, train, clone)

            return run

        def raw_fresh() -> int:
            buf = stage_cpu(dataset, KEY, threads=threads)
            buf.fill(0)
            return samples_total

        def raw_out() -> int:
            stage_cpu(dataset, KEY, threads=threads, out=out)
            return samples_total

        loaders = {
            "memmap": epoch(_loader(plain, 0)),
            "stream": epoch(_loader(stream, 0)),
            "stream + clone": epoch(_loader(stream, 0), clone=True),
            "memmap, bs=4 chunks": epoch(_loader(plain, 0, 4)),
            "stream, bs=4 chunks": epoch(_loader(stream, 0, 4)),
            "memmap, workers=2": epoch(_loader(plain, 2)),
            "stream, workers=2": epoch(_loader(stream, 2)),
        }
        cases: dict[str, Callable[[], tuple[float, int]]] = {
            name: functools.partial(_timed, run) for name, run in loaders.items()
        }
        cases["stage_cpu"] = lambda: _timed(raw_fresh)
        cases["stage_cpu out="] = lambda: _timed(raw_out)
        cases[f"DataLoader(map, bs={args.batch})"] = lambda: _timed(
            lambda: _map_loader(path, threads, record, args.batch)
        )
        for world in worlds:
            cases[f"{world} rank(s), 1 thread each"] = _ranks_case(path, world, record)

        best: dict[str, tuple[float, int]] = {}
        for _ in range(args.repeat):
            for name, case in cases.items():
                seconds, samples = case()
                if name not in best or seconds < best[name][0]:
                    best[name] = (seconds, samples)

    print(
        f"{args.size_mib} MiB, {args.chunk_mib} MiB chunks, {record}-byte samples in batches "
        f"of {train}, {threads} decrypt thread(s) (single-process rows), {os.cpu_count()} "
        f"CPUs, torch {torch.__version__}, best of {args.repeat}"
    )
    print(f"{'path':<32} {'GB/s':>7} {'samples/s':>12}  ratio")
    rate = {name: size / seconds / 1e9 for name, (seconds, _) in best.items()}
    one = rate.get("1 rank(s), 1 thread each", 0.0)
    for name, (seconds, samples) in best.items():
        ratio = ""
        if name.startswith("stream"):
            base = "memmap," + name.partition(",")[2] if "," in name else "memmap"
            ratio = f"{rate[name] / rate[base]:.2f} x {base}"
        elif name.startswith("DataLoader"):
            ratio = f"{rate[name] / rate['stage_cpu out=']:.2f} x stage_cpu out="
        elif "rank" in name and one:
            world = int(name.split()[0])
            ratio = f"{rate[name] / (world * one):.2f} x (N x one rank)"
        print(f"{name:<32} {rate[name]:7.2f} {samples / seconds:12,.0f}  {ratio}")
    stream.close()


if __name__ == "__main__":
    main()
