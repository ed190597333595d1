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
    args = ("seal", "d.bin", "-o", "out", "--data-key", "k.key", "--chunk-size", "4KiB")
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
    (tmp_path / "x.gcc").write_bytes(b"a file")
    not_a_dir = gpucc("seal", "d.bin", "-o", "x.gcc", "--data-key", "k.key", "--shards", "2",
                      cwd=tmp_path)  # fmt: skip
    assert not_a_dir.returncode == 2
    assert (tmp_path / "x.gcc").read_bytes() == b"a file"


def test_seal_shards_creates_its_directory(tmp_path: Path, run_gpucc: GpuccRunner) -> None:
    (tmp_path / "d.bin").write_bytes(os.urandom(3 * 4096))
    args = ("seal", "d.bin", "--data-key", "k.key", "--chunk-size", "4KiB")
    result = run_gpucc(
        *args, "-o", "shards/", "--shards", "2", cwd=tmp_path
    )  # seal --help's example
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == [
        "d-00000-of-00002.gcc",
        "d-00001-of-00002.gcc",
    ]
    nested = run_gpucc(*args, "-o", "a/b", "--shards", "3", cwd=tmp_path)
    assert nested.returncode == 0, nested.stderr
    assert len(list((tmp_path / "a" / "b").iterdir())) == 3
    # a failure after the directory was made leaves no directory behind
    failed = run_gpucc(*args, "-o", "c", "--shards", "4", cwd=tmp_path)  # 3 chunks: at most 3
    assert failed.returncode == 2
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("force", [False, True])
def test_seal_shards_never_writes_over_the_key_file_or_the_dataset(
    tmp_path: Path, run_gpucc: GpuccRunner, force: bool
) -> None:
    data = os.urandom(2 * 4096)
    (tmp_path / "d.bin").write_bytes(data)
    (tmp_path / "out").mkdir()
    shard = tmp_path / "out" / "d-00000-of-00001.gcc"
    flags = ("--chunk-size", "4KiB", "--shards", "1", *(("--force",) if force else ()))

    # the key file named as the shard itself: refused before it is created
    first = run_gpucc("seal", "d.bin", "-o", "out", "--data-key", str(shard), *flags, cwd=tmp_path)
    assert first.returncode == 2, first.stderr
    assert not shard.exists()

    # an existing key file at the shard's name, another spelling of it, and a hard link to it
    made = run_gpucc("seal", "d.bin", "-o", "x.gcc", "--data-key", "k.key", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    key = (tmp_path / "k.key").read_bytes()
    os.link(tmp_path / "k.key", shard)
    for key_file in (str(shard), "out/../out/d-00000-of-00001.gcc", "k.key"):
        result = run_gpucc(
            "seal", "d.bin", "-o", "out", "--data-key", key_file, *flags, cwd=tmp_path
        )
        assert result.returncode == 8, (key_file, result.stderr)
        assert "key" in result.stderr or "output" in result.stderr
        assert shard.read_bytes() == key == (tmp_path / "k.key").read_bytes()
    shard.unlink()

    # the dataset as a shard (a hard link at the shard's name)
    os.link(tmp_path / "d.bin", shard)
    result = run_gpucc("seal", "d.bin", "-o", "out", "--data-key", "k.key", *flags, cwd=tmp_path)
    assert result.returncode == 8, result.stderr
    assert (tmp_path / "d.bin").read_bytes() == data
