"""SealedChunkStream under a real ``torchrun`` (gloo; 1 and 3 ranks): DataLoaders in
several configurations per launch, records checked byte for byte on every rank, the epoch
covered exactly once across ranks, and a tampered chunk failing only where it is read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpucc.staging import seal_file
from gpucc.staging.shards import open_shard_set, seal_shards
from tests.support import torch_records as tr
from tests.support.paths import ROOT as REPO_ROOT

KEY = bytes(range(32))
CHUNK = 4096
CHUNKS = 14  # not a multiple of 3 or 4: ranks get uneven shares
SEED = 3
VICTIM = 5


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("torchrun")
    data = tr.plaintext(CHUNKS, CHUNK)
    src = work / "plain.bin"
    src.write_bytes(data)
    shards = seal_shards(src, work, 3, dataset_key=KEY, chunk_size=CHUNK, stem="s")
    tampered = work / "tampered.gcc"
    seal_file(src, tampered, dataset_key=KEY, chunk_size=CHUNK)
    header = open_shard_set(tampered, key=KEY).parts[0].header
    tr.tamper(tampered, header.chunk_offset(VICTIM) + 33)
    setup = {
        "shards": [str(p) for p in shards.paths],
        "tampered": str(tampered),
        "chunk_size": CHUNK,
        "key": KEY.hex(),
        "seed": SEED,
    }
    (work / "setup.json").write_text(json.dumps(setup))
    return work


def _launch(work: Path, ranks: int) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    for stale in work.glob("rank-*.json"):
        stale.unlink()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={ranks}", "-m", "tests.support.torchrun_loader", str(work)]
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((work / f"rank-{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 3])
def test_torchrun_delivers_every_configuration_exactly(data_dir: Path, ranks: int) -> None:
    results = _launch(data_dir, ranks)
    for r in results:
        assert "crashed" not in r, r.get("crashed")
        assert r["world"] == ranks
        assert r["failures"] == []
    from tests.support.torchrun_loader import CONFIGS, EPOCHS

    for name, config in CONFIGS.items():
        orders = []
        for epoch in range(EPOCHS):
            shares = [r["configs"][name][epoch] for r in results]
            flat = sorted(g for share in shares for g in share)
            if config[5]:  # pad: every rank reads as many chunks, a few of them twice
                assert {len(share) for share in shares} == {-(-CHUNKS // ranks)}, name
                assert sorted(set(flat)) == list(range(CHUNKS)), (name, epoch)
            else:
                assert flat == list(range(CHUNKS)), (name, epoch)  # exactly once across ranks
            orders.append(shares)
        if ranks > 1:
            assert orders[0] != orders[1]  # set_epoch reshuffled across ranks

    for workers in ("0", "2"):
        owners = [r for r in results if any(VICTIM in s for s in r["tamper"][workers]["shares"])]
        assert len(owners) == 1
        for r in results:
            got = r["tamper"][workers]
            assert VICTIM not in got["delivered"]
            mine = sorted(g for s in got["shares"] for g in s)
            if r is owners[0]:
                assert got["error"] == [VICTIM, str(data_dir / "tampered.gcc")]
                assert set(got["delivered"]) < set(mine)
            else:
                assert got["error"] is None
                assert sorted(got["delivered"]) == mine
