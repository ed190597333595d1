"""``gpucc stage s3://bucket/prefix/``: a shard set found under a prefix of moto's S3 server
on 127.0.0.1, staged and verified as a set, and refused exactly as the same files in a local
directory are (a lone, a missing and a foreign shard: the same message, exit 6)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucc.staging.format import read_key_file
from gpucc.staging.shards import open_shard_set, seal_shards
from tests.support.cli import run_cli
from tests.support.stores import bucket, moto_server

CS = 4096
LENGTH = 30 * CS + 77
REMOTE = ("--part-size", "8KiB", "--parallelism", "2")
#: prefix: the shards of set a (index) and set b under it
LAYOUTS = {
    "set": [("a", 0), ("a", 1), ("a", 2)],
    "lone": [("a", 1)],
    "missing": [("a", 0), ("a", 2)],
    "foreign": [("a", 0), ("b", 1), ("a", 2)],
}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two sets of 3 shards of one plaintext under one key (a/ and b/), and one local
    directory per layout holding the same files as the prefix of that name."""
    work = tmp_path_factory.mktemp("remote-shards")
    (work / "d.bin").write_bytes(os.urandom(LENGTH))
    result = run_cli(
        "seal", "d.bin", "--shards", "3", "-o", "a", "--data-key", "k.key",
        "--chunk-size", "4KiB", cwd=work,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # set b: the same plaintext under the same dataset key, another set id
    kek = read_key_file(work / "k.key")
    key = open_shard_set(sorted((work / "a").iterdir()), key_file=work / "k.key").dataset_key
    (work / "b").mkdir()
    seal_shards(work / "d.bin", work / "b", 3, kek=kek, dataset_key=key, chunk_size=CS)
    for prefix, members in LAYOUTS.items():
        (work / prefix).mkdir()
        for which, index in members:
            shard = work / which / f"d-{index:05d}-of-00003.gcc"
            shutil.copyfile(shard, work / prefix / shard.name)
    return work


@pytest.fixture(scope="module")
def s3(work: Path) -> Iterator[dict[str, str]]:
    with moto_server(work) as env:
        client = bucket(env, "data")
        for prefix in LAYOUTS:
            for shard in sorted((work / prefix).iterdir()):
                client.put_object(
                    Bucket="data", Key=f"{prefix}/{shard.name}", Body=shard.read_bytes()
                )
        # not part of the listing: a deeper folder, and an object that is not *.gcc
        client.put_object(Bucket="data", Key="set/deeper/x.gcc", Body=b"not listed")
        client.put_object(Bucket="data", Key="set/README", Body=b"not listed")
        client.put_object(Bucket="data", Key="empty/README", Body=b"no dataset here")
        yield env


def test_stage_a_shard_set_under_a_prefix(work: Path, s3: dict[str, str]) -> None:
    result = run_cli(
        "stage", "s3://data/set/", "--data-key", "k.key", *REMOTE, "-f", "json",
        cwd=work, env=s3,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["dataset"] == "s3://data/set/d-00000-of-00003.gcc"
    assert doc["shards"] == 3 and doc["bytes"] == LENGTH and doc["chunks"] == 31
    assert doc["verified"] is True and doc["scrubbed"] is True
    assert "a set of 3 bound shards" in result.stderr
    assert "testing" not in result.stderr + result.stdout
    local = run_cli("stage", "set", "--data-key", "k.key", "-f", "json", cwd=work)
    assert json.loads(local.stdout)["dataset_id"] == doc["dataset_id"]


def test_the_set_under_a_prefix_is_the_plaintext(
    work: Path, s3: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpucc import staging

    for name, value in s3.items():
        monkeypatch.setenv(name, value)
    shard_set = open_shard_set("s3://data/set/", key_file=work / "k.key")
    assert [p.name for p in shard_set.parts] == [
        f"s3://data/set/d-{i:05d}-of-00003.gcc" for i in range(3)
    ]
    got = b""
    for index in range(3):
        with staging.plan_part(shard_set, index).run() as buf:
            got += buf.tobytes()
    assert got == (work / "d.bin").read_bytes()


@pytest.mark.parametrize("prefix", ["lone", "missing", "foreign"])
def test_a_bad_set_under_a_prefix_is_refused_as_locally(
    work: Path, s3: dict[str, str], prefix: str
) -> None:
    remote = run_cli("stage", f"s3://data/{prefix}/", "--data-key", "k.key", cwd=work, env=s3)
    local = run_cli("stage", prefix, "--data-key", "k.key", cwd=work)
    assert local.returncode == 6, local.stderr
    assert remote.returncode == 6, remote.stderr
    assert remote.stdout == "" and len(remote.stderr.strip().splitlines()) == 1
    assert remote.stderr.replace(f"s3://data/{prefix}/", f"{prefix}/") == local.stderr
    assert {"lone": "lone shard", "missing": "one of 3 shards, but 2 were given",
            "foreign": "belongs to another shard set"}[prefix] in remote.stderr  # fmt: skip


def test_a_lone_remote_shard_named_alone_is_refused_as_locally(
    work: Path, s3: dict[str, str]
) -> None:
    name = "d-00001-of-00003.gcc"
    remote = run_cli("stage", f"s3://data/lone/{name}", "--data-key", "k.key", cwd=work, env=s3)
    local = run_cli("stage", f"lone/{name}", "--data-key", "k.key", cwd=work)
    assert (remote.returncode, local.returncode) == (6, 6)
    assert remote.stderr.replace("s3://data/", "") == local.stderr


def test_shards_named_one_by_one_as_urls_are_a_set(work: Path, s3: dict[str, str]) -> None:
    urls = [f"s3://data/set/d-{i:05d}-of-00003.gcc" for i in range(3)]
    result = run_cli("stage", *urls, "--data-key", "k.key", "-f", "json", cwd=work, env=s3)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["shards"] == 3
    swapped = run_cli("stage", urls[1], urls[0], urls[2], "--data-key", "k.key", cwd=work, env=s3)
    assert swapped.returncode == 6
    assert "is shard 1, given at position 0" in swapped.stderr


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["s3://data/empty/"], 2, "s3://data/empty/ holds no sealed dataset (*.gcc)"),
        (["s3://nobucket/set/"], 8, "s3://nobucket/set/ does not exist"),
        (["https://127.0.0.1:1/set/"], 2, "only s3:// prefixes are listed"),
        (["gs://data/set/"], 2, "gs:// is not supported"),
        (["az://data/set/"], 2, "az:// is not supported"),
        (["s3://data/set/", "set/d-00000-of-00003.gcc"], 2, "from one place"),
        (["-", "s3://data/set/"], 2, "standard input holds one dataset"),
    ],
)
def test_prefix_usage_errors(
    work: Path, s3: dict[str, str], args: list[str], code: int, fragment: str
) -> None:
    result = run_cli("stage", *args, "--data-key", "k.key", cwd=work, env=s3)
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
