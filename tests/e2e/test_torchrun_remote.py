"""SealedChunkStream under a real ``torchrun`` (2 ranks, gloo) reading a shard set from moto's
S3 server on 127.0.0.1 by its prefix: every rank and DataLoader worker delivers its share
byte for byte, the shares are the plaintext exactly once, and each process asks the store
only for its own chunks' byte ranges (besides the headers every rank verifies)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpucc.staging.format import PREFIX_SIZE, TAG_SIZE
from gpucc.staging.shards import ShardSet, open_shard_set, seal_shards
from tests.support import torch_records as tr
from tests.support.paths import ROOT as REPO_ROOT
from tests.support.stores import bucket, moto_server

KEY = bytes(range(32))
CHUNK = 4096
CHUNKS = 14  # over 3 shards of 5, 5 and 4 chunks; 2 ranks
SEED = 5
RANKS = 2


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("torchrun-remote")
    (work / "plain.bin").write_bytes(tr.plaintext(CHUNKS, CHUNK))
    (work / "set").mkdir()
    seal_shards(work / "plain.bin", work / "set", 3, dataset_key=KEY, chunk_size=CHUNK, stem="s")
    setup = {"url": "s3://data/train/", "key": KEY.hex(), "chunk_size": CHUNK, "seed": SEED}
    (work / "setup.json").write_text(json.dumps(setup))
    return work


@pytest.fixture(scope="module")
def s3(work: Path) -> Iterator[dict[str, str]]:
    with moto_server(work) as env:
        client = bucket(env, "data")
        for shard in sorted((work / "set").iterdir()):
            client.put_object(Bucket="data", Key=f"train/{shard.name}", Body=shard.read_bytes())
        yield env


def _launch(work: Path, env: dict[str, str]) -> tuple[list[dict[str, Any]], list[list[Any]]]:
    full = {**os.environ, **env, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={RANKS}", "-m", "tests.support.torchrun_remote", str(work)]
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=full, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = [json.loads((work / f"rank-{r}.json").read_text()) for r in range(RANKS)]
    logs = [work / f"spans-{r}.jsonl" for r in range(RANKS)]
    spans = [
        [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        for log in logs
    ]
    return results, spans


def _ranges(shards: ShardSet, chunks: list[int]) -> set[tuple[str, int, int]]:
    """(object, offset, length) of the sealed bytes of ``chunks``."""
    out = set()
    for g in chunks:
        part, local = shards.locate(g)
        header = shards.parts[part].header
        name = f"s3://data/train/{shards.parts[part].path.name}"
        out.add((name, header.chunk_offset(local), header.chunk_length(local) + TAG_SIZE))
    return out


@pytest.mark.slow
def test_each_rank_and_worker_reads_only_its_shards_ranges(work: Path, s3: dict[str, str]) -> None:
    results, spans = _launch(work, s3)
    local = open_shard_set(sorted((work / "set").iterdir()), key=KEY)
    expected_heads = {(f"s3://data/train/{p.path.name}", 0) for p in local.parts}
    expected_heads |= {
        (f"s3://data/train/{p.path.name}", PREFIX_SIZE) for p in local.parts if p.header.wrap_length
    }
    for r in results:
        assert "crashed" not in r, r.get("crashed")
        assert r["world"] == RANKS and r["failures"] == []
    for name in ("w0", "w2"):
        delivered = sorted(g for r in results for g in r["configs"][name]["delivered"])
        assert delivered == list(range(CHUNKS))  # the plaintext, exactly once across ranks
        for rank, (result, log) in enumerate(zip(results, spans, strict=True)):
            shares = result["configs"][name]["shares"]
            # opening the set: every shard's header and wrap section, nothing more
            heads = {(s["object"], s["offset"]) for s in log if s["phase"] == f"open-{name}"}
            assert heads == expected_heads
            reads = [s for s in log if s["phase"] == name]
            assert len(reads) == sum(len(share) for share in shares)  # each chunk read once
            mine = _ranges(local, [g for share in shares for g in share])
            assert {(s["object"], s["offset"], s["length"]) for s in reads} == mine, rank
            if name == "w2":  # each worker process asked only for its own share's ranges
                for worker, share in enumerate(shares):
                    got = {
                        (s["object"], s["offset"], s["length"])
                        for s in reads
                        if s["worker"] == worker
                    }
                    assert got == _ranges(local, share), (rank, worker)
                    assert len({s["pid"] for s in reads if s["worker"] == worker}) == 1
                assert all(s["worker"] in (0, 1) for s in reads)
            touched = {s["object"] for s in reads}
            owned = {o for o, _, _ in mine}
            assert touched == owned
