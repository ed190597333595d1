"""One rank of ``tests/e2e/test_torchrun_remote.py``, started by ``torchrun`` (gloo).

``python -m torch.distributed.run --standalone --nproc-per-node N -m
tests.support.torchrun_remote WORK``: every rank streams the shard set under the S3 prefix
of ``WORK/setup.json`` (the server is reached through the AWS variables of the environment)
through DataLoaders with 0 and 2 workers, checks every batch byte for byte against
``WORK/plain.bin``, and writes what it delivered to ``WORK/rank-R.json``. Every request
for a byte range of an object that any of its processes opens is appended to
``WORK/spans-R.jsonl`` (process, DataLoader worker, phase, object, offset, length).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, get_worker_info

from gpucc.staging.sources.base import Span
from gpucc.staging.sources.s3 import S3Source
from gpucc.staging.torch_dataset import SealedChunkStream
from tests.support import torch_records as tr

WORKERS = (0, 2)
PHASE = {"now": ""}


def _log_spans(work: Path, rank: int) -> None:
    """Record every ranged request an S3 source of this rank (or its workers) opens."""
    original = S3Source.open_span

    def logged(self: S3Source, offset: int, length: int) -> Span:
        info = get_worker_info()
        line = {
            "pid": os.getpid(),
            "worker": -1 if info is None else info.id,
            "phase": PHASE["now"],
            "object": self.name,
            "offset": offset,
            "length": length,
        }
        with (work / f"spans-{rank}.jsonl").open("a") as log:
            log.write(json.dumps(line) + "\n")
        return original(self, offset, length)

    S3Source.open_span = logged  # type: ignore[method-assign]


def _watch(work: Path, rank: int) -> Any:
    """A DataLoader worker that hangs dumps every thread's stack and exits (a failure with
    its cause, not a test that waits for its timeout)."""

    def init(_worker: int) -> None:
        log = (work / f"hang-{rank}-{os.getpid()}.txt").open("w")
        faulthandler.dump_traceback_later(90, exit=True, file=log)

    return init


def _run(work: Path, rank: int) -> dict[str, Any]:
    setup = json.loads((work / "setup.json").read_text())
    data = (work / "plain.bin").read_bytes()
    chunk = setup["chunk_size"]
    out: dict[str, Any] = {"rank": rank, "configs": {}, "failures": []}
    for workers in WORKERS:
        name = f"w{workers}"
        PHASE["now"] = f"open-{name}"
        stream = SealedChunkStream(
            setup["url"],
            key=bytes.fromhex(setup["key"]),
            record_size=tr.RECORD,
            seed=setup["seed"],
            threads=2,
        )
        PHASE["now"] = name
        extra: dict[str, Any] = {}
        if workers:
            extra.update(multiprocessing_context="fork", worker_init_fn=_watch(work, rank))
        loader = DataLoader(stream, batch_size=None, num_workers=workers, **extra)
        batches = list(loader)
        shares = [stream.chunks(w, max(1, workers)) for w in range(max(1, workers))]
        try:
            tr.check_delivery(batches, shares, None, data, chunk)
        except AssertionError as exc:
            out["failures"].append(f"{name}: {exc}")
        delivered = sorted(g for b in batches for g in tr.chunks_of(b, data, chunk))
        out["configs"][name] = {"shares": shares, "delivered": delivered}
        stream.close()
    return out


def main() -> None:
    work = Path(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    _log_spans(work, rank)
    try:
        out = _run(work, rank)
    except Exception:
        out = {"rank": rank, "crashed": traceback.format_exc()}
    out["world"] = dist.get_world_size()
    dist.barrier()
    dist.destroy_process_group()
    (work / f"rank-{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
