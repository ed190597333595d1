"""One rank of ``tests/e2e/test_torchrun_loader.py``, started by ``torchrun`` (gloo).

``python -m torch.distributed.run --standalone --nproc-per-node N -m
tests.support.torchrun_loader WORK``: every rank reads the shard set in ``WORK/setup.json``
through DataLoaders in several configurations over two epochs, checks every batch byte for
byte (``tests.support.torch_records``) and writes what it delivered to
``WORK/rank-R.json``; then it reads the tampered file. A check that fails is recorded, not
raised, so one rank's failure does not hang the others.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from gpucc.staging.errors import ChunkAuthenticationError
from gpucc.staging.torch_dataset import SealedChunkStream
from tests.support import torch_records as tr

# name: batch size, custom collation, workers, pin_memory, persistent workers, pad
CONFIGS: dict[str, tuple[int | None, bool, int, bool, bool, bool]] = {
    "none-w0": (None, False, 0, False, False, False),
    "bs4-w0": (4, False, 0, True, False, False),
    "bs3-cat-w2": (3, True, 2, False, False, False),
    "none-w2-persistent-pin": (None, False, 2, True, True, False),
    "bs2-w2-persistent-pad": (2, False, 2, False, True, True),
}
EPOCHS = 2


def _loader(
    stream: SealedChunkStream, config: tuple[int | None, bool, int, bool, bool, bool]
) -> Any:
    batch, cat, workers, pin, persistent, _ = config
    extra: dict[str, Any] = {"collate_fn": tr.cat_collate} if cat else {}
    if workers:
        extra.update(multiprocessing_context="fork", persistent_workers=persistent)
    return DataLoader(stream, batch_size=batch, num_workers=workers, pin_memory=pin, **extra)


def _run(work: Path, rank: int) -> dict[str, Any]:
    setup = json.loads((work / "setup.json").read_text())
    data = (work / "plain.bin").read_bytes()
    chunk = setup["chunk_size"]
    key = bytes.fromhex(setup["key"])
    out: dict[str, Any] = {"rank": rank, "configs": {}, "failures": []}
    for name, config in CONFIGS.items():
        stream = SealedChunkStream(
            setup["shards"],
            key=key,
            record_size=tr.RECORD,
            seed=setup["seed"],
            threads=2,
            pad=config[5],
        )
        loader = _loader(stream, config)
        workers = max(1, config[2])
        epochs = []
        for epoch in range(EPOCHS):
            stream.set_epoch(epoch)
            batches = list(loader)  # all kept: none may change under later ones
            shares = [stream.chunks(w, workers) for w in range(workers)]
            try:
                tr.check_delivery(batches, shares, config[0], data, chunk)
            except AssertionError as exc:
                out["failures"].append(f"{name} epoch {epoch}: {exc}")
            epochs.append(sorted(g for b in batches for g in tr.chunks_of(b, data, chunk)))
        out["configs"][name] = epochs

    out["tamper"] = {}
    for workers in (0, 2):
        stream = SealedChunkStream(
            setup["tampered"], key=key, record_size=tr.RECORD, seed=setup["seed"], threads=1
        )
        stream.set_epoch(1)
        extra: dict[str, Any] = {"multiprocessing_context": "fork"} if workers else {}
        loader = DataLoader(stream, batch_size=4, num_workers=workers, **extra)
        delivered: list[int] = []
        result: dict[str, Any] = {"error": None}
        try:
            for batch in loader:
                delivered += tr.chunks_of(batch, data, chunk)
        except ChunkAuthenticationError as exc:
            result["error"] = [exc.chunk_index, str(exc.path)]
        except AssertionError as exc:
            out["failures"].append(f"tamper, {workers} workers: {exc}")
        result["delivered"] = delivered
        result["shares"] = [stream.chunks(w, max(1, workers)) for w in range(max(1, workers))]
        out["tamper"][str(workers)] = result
    return out


def main() -> None:
    work = Path(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
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
