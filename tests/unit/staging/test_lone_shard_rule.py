"""A library call cannot do what the command line refuses: one shard of a larger set is
refused by plan_stage and stage, as ``gpucc stage`` refuses it, unless its verified set is
named."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucc.staging import plan_stage, stage
from gpucc.staging.format import new_dataset_key
from gpucc.staging.shards import ShardSetError, open_shard_set, seal_shards


@pytest.fixture
def shard_set(tmp_path: Path) -> tuple[list[Path], bytes]:
    plain = tmp_path / "plain.bin"
    plain.write_bytes(bytes(range(256)) * 200)
    kek = new_dataset_key()
    (tmp_path / "out").mkdir()
    result = seal_shards(plain, tmp_path / "out", 3, kek=kek, chunk_size=4096)
    return list(result.paths), kek


def test_plan_stage_refuses_a_lone_shard(shard_set: tuple[list[Path], bytes]) -> None:
    paths, kek = shard_set
    with pytest.raises(ShardSetError, match="one of 3 shards"):
        plan_stage(paths[0], kek=kek)
    with pytest.raises(ShardSetError, match="one of 3 shards"):
        with stage(paths[1], kek=kek):
            pass


def test_a_part_of_its_verified_set_is_staged(shard_set: tuple[list[Path], bytes]) -> None:
    paths, kek = shard_set
    verified = open_shard_set(paths, kek=kek)
    staged = b""
    for part in verified.parts:
        with stage(part.path, key=verified.dataset_key, in_set=verified) as buf:
            staged += bytes(buf)
    assert staged == bytes(range(256)) * 200


def test_a_part_of_another_set_is_still_refused(
    shard_set: tuple[list[Path], bytes], tmp_path: Path
) -> None:
    paths, kek = shard_set
    plain = tmp_path / "other.bin"
    plain.write_bytes(b"x" * 20_000)
    (tmp_path / "other").mkdir()
    other = seal_shards(plain, tmp_path / "other", 2, kek=kek, chunk_size=4096)
    elsewhere = open_shard_set(list(other.paths), kek=kek)
    with pytest.raises(ShardSetError):
        plan_stage(paths[0], kek=kek, in_set=elsewhere)
