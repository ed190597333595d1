"""Gradient sealing on the GPU: the message kernels on DDP-shaped batches, beside a copy ceiling.

Run on a GPU machine (needs CuPy, not PyTorch)::

    python benchmarks/bench_ddp_gpu.py [--buckets 1MB,4MB,25MB,100MB] [--ranks 2,4,8]
                                       [--repeat 20] [--device 0] [--json out.json]

For each bucket size and group size N, the batch one rank seals in an all-to-all round
(N-1 messages of 1/N of the bucket, each under its own key, 52-byte AADs, 16-byte aligned
pieces, frames ``ciphertext | tag``) is sealed in one launch pair and opened back in one,
with CUDA events around each; and a device-to-device copy of the bucket gives the memory
ceiling in the same run. Rates are GB/s (10^9 bytes/s) of plaintext: ``seal`` and ``open``
each over the bytes that batch protects, ``seal+open`` over the bucket's bytes through both
(the sender's and the receiver's work for one bucket on one GPU). The ring's hops are
batches of one message of 1/N; ``one message`` rows give that shape at the whole bucket.

The target (docs/DDP.md): sealing and opening a 25 MB bucket at 200 GB/s or more each.
Without a usable GPU it prints why and exits 0; with ``--smoke`` (one small case, a check CI
runs) it then runs on ``tests/support/fake_cupy.py`` instead. ``GV_FAKE=1`` runs it against
``tests/support/fake_cupy.py`` (a dry run of its flow; the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # tests.support.fake_cupy for a dry run

from gpucc.staging import _gpu_runtime as rt  # noqa: E402
from gpucc.staging.errors import GpuKernelError  # noqa: E402
from gpucc.staging.gpu_messages import DeviceKeyring, DeviceMessage  # noqa: E402

MB = 10**6


def parse_sizes(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        p = part.strip().upper()
        unit = MB if p.endswith("MB") else 1
        out.append(int(float(p.removesuffix("MB")) * unit))
    return out


def batch(nbytes: int, pieces: int) -> tuple[list[DeviceMessage], list[DeviceMessage], int, int]:
    """Seal and open descriptors of ``pieces`` messages covering ``nbytes`` (16-aligned)."""
    per = -(-nbytes // pieces)
    per = -(-per // 16) * 16
    seal, opened, frame = [], [], per + 16
    for i in range(pieces):
        nonce = i.to_bytes(4, "big") + os.urandom(8)
        aad = os.urandom(52)
        seal.append(
            DeviceMessage(
                i, nonce, aad, src=i * per, dst=i * frame, tag=i * frame + per, length=per
            )
        )
        opened.append(
            DeviceMessage(
                i, nonce, aad, src=i * frame, dst=i * per, tag=i * frame + per, length=per
            )
        )
    return seal, opened, per * pieces, frame * pieces


def time_ms(cp: Any, stream: Any, work: Any, repeat: int) -> float:
    times: list[float] = []
    for _ in range(repeat + 1):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        work()
        stop.record(stream)
        stop.synchronize()
        times.append(float(cp.cuda.get_elapsed_time(start, stop)))
    return statistics.median(times[1:])  # the first run warms up


def measure(cp: Any, device: int, nbytes: int, pieces: int, repeat: int) -> dict[str, Any]:
    seal, opened, plain_len, frames_len = batch(nbytes, pieces)
    keys = [os.urandom(32) for _ in range(pieces)]
    stream = cp.cuda.Stream(non_blocking=True)
    with (
        cp.cuda.Device(device),
        stream,
        DeviceKeyring(keys, device_id=device, stream=stream) as ring,
    ):
        plain = cp.asarray(np.frombuffer(os.urandom(plain_len), dtype=np.uint8))
        frames = cp.zeros(frames_len, dtype=cp.uint8)
        back = cp.empty(plain_len, dtype=cp.uint8)
        copy = cp.empty_like(plain)
        t_seal = time_ms(cp, stream, lambda: ring.seal(seal, plain, frames), repeat)
        status: list[Any] = []
        t_open = time_ms(cp, stream, lambda: status.append(ring.open(opened, frames, back)), repeat)
        t_copy = time_ms(cp, stream, lambda: cp.copyto(copy, plain), repeat)
        verdicts = cp.asnumpy(status[-1])
        ok = not verdicts.any() and cp.asnumpy(back).tobytes() == cp.asnumpy(plain).tobytes()
    if not ok:
        raise SystemExit("the opened bucket differs from the sealed one: kernels are wrong")

    def gbs(ms: float) -> float:
        return plain_len / (ms * 1e-3) / 1e9

    return {
        "bucket_bytes": nbytes,
        "messages": pieces,
        "seal_ms": t_seal,
        "open_ms": t_open,
        "seal_gbs": gbs(t_seal),
        "open_gbs": gbs(t_open),
        "seal_open_gbs": plain_len / ((t_seal + t_open) * 1e-3) / 1e9,
        "d2d_copy_gbs": gbs(t_copy),
    }


def _use_stand_in_without_gpu(device: int) -> bool:
    """For ``--smoke``: tests/support/fake_cupy.py in CuPy's place when no GPU is usable."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.support.fake_cupy import stand_in_without_gpu

    return stand_in_without_gpu(device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--buckets", default="1MB,4MB,25MB,100MB")
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="one 1 MB bucket, N=2, one run; on the CuPy stand-in without a GPU",
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.buckets, args.ranks, args.repeat = "1MB", "2", 1
        if _use_stand_in_without_gpu(args.device):
            print("smoke: no GPU, dry run on tests/support/fake_cupy.py (numbers mean nothing)")
    if os.environ.get("GV_FAKE") == "1":
        from tests.support import fake_cupy

        fake_cupy.reset(devices=1)
        rt.import_cupy, rt._modules = (lambda: fake_cupy), {}
        print("dry run on tests/support/fake_cupy.py: these numbers mean nothing")
    try:
        reason = rt.unavailable_reason(args.device)
    except GpuKernelError as exc:
        print(f"GPU kernels unusable: {exc}", file=sys.stderr)
        return 5
    if reason is not None:
        print(f"no GPU: {reason}")
        return 0
    cp = rt.import_cupy()
    rows = []
    for nbytes in parse_sizes(args.buckets):
        for n in [int(x) for x in args.ranks.split(",")]:
            row = measure(cp, args.device, nbytes, n - 1, args.repeat)
            row["shape"] = f"a2a N={n}"
            rows.append(row)
        row = measure(cp, args.device, nbytes, 1, args.repeat)
        row["shape"] = "one message"
        rows.append(row)
    head = (
        f"{'bucket':>8} {'shape':>12} {'msgs':>4} {'seal':>8} {'open':>8} {'seal+open':>9} "
        f"{'D2D copy':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['bucket_bytes'] / MB:>6.0f}MB {r['shape']:>12} {r['messages']:>4} "
            f"{r['seal_gbs']:>8.1f} {r['open_gbs']:>8.1f} {r['seal_open_gbs']:>9.1f} "
            f"{r['d2d_copy_gbs']:>9.1f}"
        )
    print("GB/s of plaintext; D2D copy: the same bytes copied on the device (read + write).")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
