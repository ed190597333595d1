"""Encrypted DDP vs plain DDP: per-iteration time, crypto share, bytes sealed.

Run ``python benchmarks/bench_ddp.py`` (it starts its own gloo ranks for each world size)
or under torchrun, one world size per launch::

    torchrun --nproc-per-node 2 benchmarks/bench_ddp.py --json
    python benchmarks/bench_ddp.py --smoke       # seconds: one small case, a check CI runs
    torchrun --nproc-per-node 4 benchmarks/bench_ddp.py --device cuda   # NCCL, GPU sealing

With ``--device cuda`` every rank trains on its own GPU (``cuda:LOCAL_RANK``, or the rank
modulo the GPUs present), the backend is NCCL unless ``--backend gloo`` is given, the buckets
are sealed and opened on the GPU, and each iteration ends with a device synchronisation;
``crypto`` is then the host time of the launches (the GPU kernels' own rates are in
``benchmarks/bench_ddp_gpu.py``).

For every model size, bucket size and world size it reports the median iteration time
(forward, backward with the all-reduce, optimizer step) of plain DDP and of the encrypted
hook with each algorithm, the ratio, the share of the iteration (mean) spent sealing and
opening and in the hook as a whole (rank 0), the bytes rank 0 sealed per iteration, and
the machine's single-core AES-256-GCM rate as a ceiling. Keys here are derived from an
unattested ECDH exchange: the benchmark measures the data path only; attested setup is a
one-time cost per group.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from gpucc.ddp import EncryptedAllReduce, GroupKeys, encrypted_allreduce_hook  # noqa: E402
from gpucc.ddp.messages import group_transcript_hash  # noqa: E402
from gpucc.ddp.setup import exchange_bytes  # noqa: E402
from gpucc.keyrelease.messages import (  # noqa: E402
    CURVE,
    decode_public_key,
    encode_public_key,
)

MODELS = {"1M": (4, 512), "8M": (8, 1024), "25M": (6, 2048)}  # (layers, width)


def aes_gcm_ceiling(nbytes: int = 4 << 20, seconds: float = 0.5) -> float:
    """Single-core AES-256-GCM seal rate in GB/s."""
    aead = AESGCM(AESGCM.generate_key(256))
    data = os.urandom(nbytes)
    nonce = bytes(12)
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        aead.encrypt(nonce, data, b"")
        count += 1
    return count * nbytes / (time.perf_counter() - t0) / 1e9


def bench_keys() -> GroupKeys:
    """Unattested keys (benchmark only): ECDH over the group, edge keys as in setup."""
    private = ec.generate_private_key(CURVE)
    public = exchange_bytes(encode_public_key(private.public_key()), limit=97, group=None)
    rank, size = dist.get_rank(), dist.get_world_size()
    shared = {
        p: private.exchange(ec.ECDH(), decode_public_key(public[p], "peer"))
        for p in range(size)
        if p != rank
    }
    th = group_transcript_hash(b"benchmark" + b"".join(public))
    return GroupKeys(rank=rank, world_size=size, shared_secrets=shared, transcript_hash=th)


def make_model(layers: int, width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods)


def time_iterations(ddp: DDP, width: int, iters: int, device: torch.device) -> list[float]:
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(8, width, device=device)
    times = []
    for i in range(iters + 2):  # two warm-up iterations (DDP rebuilds buckets after one)
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = ddp(x).square().mean()
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return times


def rank_device(args: argparse.Namespace) -> torch.device:
    if args.device != "cuda":
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    index = local % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def run_rank(args: argparse.Namespace) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    device = rank_device(args)
    keys = bench_keys()
    rows = []
    for model_name in args.models:
        layers, width = MODELS[model_name]
        for bucket_mb in args.bucket_mb:
            plain = DDP(make_model(layers, width).to(device), bucket_cap_mb=bucket_mb)
            base = statistics.median(time_iterations(plain, width, args.iters, device))
            params = sum(p.numel() for p in plain.parameters())
            for algorithm in args.algorithms:
                state = EncryptedAllReduce(keys, algorithm=algorithm)
                enc = DDP(make_model(layers, width).to(device), bucket_cap_mb=bucket_mb)
                enc.register_comm_hook(state, encrypted_allreduce_hook)
                time_iterations(enc, width, 0, device)
                state.stats.reset()
                times = time_iterations(enc, width, args.iters, device)
                t = statistics.median(times)
                mean = statistics.fmean(times)
                n = max(1, state.stats.steps)
                state.close()
                rows.append(
                    {
                        "device": device.type,
                        "backend": str(dist.get_backend()),
                        "world_size": dist.get_world_size(),
                        "model": model_name,
                        "params": params,
                        "bucket_mb": bucket_mb,
                        "algorithm": algorithm,
                        "plain_ms": base * 1e3,
                        "encrypted_ms": t * 1e3,
                        "ratio": t / base,
                        "crypto_share": state.stats.crypto_seconds / n / mean,
                        "hook_share": state.stats.hook_seconds / n / mean,
                        "sealed_mb_per_iter": state.stats.sealed_bytes / n / 1e6,
                    }
                )
    return rows


def worker(rank: int, size: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        backend_for(args), rank=rank, world_size=size, timeout=dt.timedelta(seconds=300)
    )
    rows = run_rank(args)
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    gc.collect()  # DDP's reference cycles hold the group: end it here, threads joined
    dist.destroy_process_group()


def backend_for(args: argparse.Namespace) -> str:
    if args.backend:
        return str(args.backend)
    return "nccl" if args.device == "cuda" else "gloo"


def spawn(size: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    out = Path(f"/tmp/bench_ddp_{os.getpid()}_{size}.json")
    ctx = mp.get_context("spawn") if args.device == "cuda" else mp.get_context("fork")
    procs = [ctx.Process(target=worker, args=(r, size, port, args, str(out))) for r in range(size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise SystemExit(f"a rank of world size {size} failed")
    rows: list[dict[str, Any]] = json.loads(out.read_text())
    out.unlink()
    return rows


def table(rows: list[dict[str, Any]], ceiling: float) -> str:
    head = (
        f"{'N':>2} {'model':>5} {'bucket':>7} {'algo':>4} {'plain ms':>9} {'enc ms':>9} "
        f"{'ratio':>6} {'crypto':>7} {'hook':>6} {'sealed MB':>10}"
    )
    lines = [f"single-core AES-256-GCM seal: {ceiling:.2f} GB/s", head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['world_size']:>2} {r['model']:>5} {r['bucket_mb']:>5g}MB {r['algorithm']:>4} "
            f"{r['plain_ms']:>9.1f} {r['encrypted_ms']:>9.1f} {r['ratio']:>5.2f}x "
            f"{r['crypto_share']:>6.0%} {r['hook_share']:>6.0%} {r['sealed_mb_per_iter']:>10.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--models", nargs="+", default=["1M", "8M"], choices=sorted(MODELS))
    ap.add_argument("--bucket-mb", type=float, nargs="+", default=[1.0, 25.0])
    ap.add_argument("--algorithms", nargs="+", default=["a2a", "ring"])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--backend", choices=["gloo", "nccl"], help="default: nccl on cuda, else gloo")
    ap.add_argument("--smoke", action="store_true", help="2 ranks, 1M model, 1 MB, 2 iterations")
    args = ap.parse_args()
    if args.smoke:
        args.world_sizes, args.models, args.bucket_mb = [2], ["1M"], [1.0]
        args.algorithms, args.iters = ["a2a"], 2
    ceiling = aes_gcm_ceiling()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        dist.init_process_group(backend_for(args), timeout=dt.timedelta(seconds=300))
        rows = run_rank(args)
        rank = dist.get_rank()
        gc.collect()  # as in worker()
        dist.destroy_process_group()
        if rank != 0:
            return
    else:
        rows = [row for size in args.world_sizes for row in spawn(size, args)]
    doc = {"aes_gcm_single_core_gbps": ceiling, "cpus": os.cpu_count(), "rows": rows}
    print(json.dumps(doc, indent=2) if args.json else table(rows, ceiling))


if __name__ == "__main__":
    main()
