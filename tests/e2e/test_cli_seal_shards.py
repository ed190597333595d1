"""``gpucc seal --shards N`` as a process: bound shards that open as a set, and only as one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpucc.staging.format import read_key_file
from gpucc.staging.shards import ShardSetError, open_shard_set
from tests.conftest import GpuccRunner


def test_seal_shards_writes_a_bound_set(tmp_path: Path, run_gpucc: GpuccRunner) -> None:
    gpucc = run_gpucc
    data = os.urandom(10 * 4096 + 17)
    (tmp_path / "d.bin").write_bytes(data)
    (tmp_path / "out").mkdir()
    args = ("seal", "d.bin", "-o", "out", "--key-file", "k.key", "--chunk-size", "4KiB")
    result = gpucc(*args, "--shards", "3", "-f", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == "gpucc.seal.shards/v1" and len(doc["shards"]) == 3
    assert sum(doc["chunks"]) == 11 and doc["bytes"] == len(data)
    paths = [tmp_path / p for p in doc["shards"]]
    kek = read_key_file(tmp_path / "k.key")
    shard_set = open_shard_set(paths, kek=kek)
    assert len(shard_set.parts) == 3 and shard_set.chunk_count == 11
    assert shard_set.set_id.hex() == doc["set_id"]
    with pytest.raises(ShardSetError):
        open_shard_set([paths[0], paths[2]], kek=kek)  # a missing shard
    again = gpucc(*args, "--shards", "3", cwd=tmp_path)
    assert again.returncode == 8  # existing shards are not replaced without --force
    forced = gpucc(*args, "--shards", "3", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    not_a_dir = gpucc("seal", "d.bin", "-o", "x.gcc", "--key-file", "k.key", "--shards", "2",
                      cwd=tmp_path)  # fmt: skip
    assert not_a_dir.returncode == 2
