"""Sealed chunk streams under real gloo process groups (4 ranks on "2 hosts", spawned).

Each rank records what it read in a JSON file; the test process checks the records. Every
rank catches its own failures (so a tampered chunk shows up as data, not as a dead group).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from gpucc.staging import seal_file, stage
from gpucc.staging.errors import ChunkAuthenticationError
from gpucc.staging.shards import ShardSetError, open_shard_set, seal_shards
from gpucc.staging.torch_dataset import (
    KeySharingError,
    SealedChunkStream,
    assign_chunks,
    host_shared_key,
)

CHUNK = 4096
KEY = bytes(range(32))
CHUNKS = 23  # 4 ranks do not divide it
LENGTH = 22 * CHUNK + 1000
WORLD = 4
SEED = 11
TAMPERED_EPOCH = 1


def _plaintext() -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < LENGTH:
        out += hashlib.sha256(b"dist" + counter.to_bytes(8, "little")).digest()
        counter += 1
    return bytes(out[:LENGTH])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _index_of(chunks: dict[str, int], t: torch.Tensor) -> int:
    return chunks[hashlib.sha256(t.numpy().tobytes()).hexdigest()]


def _rank_main(rank: int, work: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        _run(rank, Path(work))
    finally:
        dist.destroy_process_group()


def _run(rank: int, work: Path) -> None:
    setup = json.loads((work / "setup.json").read_text())
    data = _plaintext()
    by_hash = {
        hashlib.sha256(data[g * CHUNK : (g + 1) * CHUNK]).hexdigest(): g for g in range(CHUNKS)
    }
    out: dict[str, Any] = {"rank": rank}
    host = f"host{rank // 2}"  # ranks 0,1 on host0; 2,3 on host1

    # one key release per host, shared with the host's other rank
    calls: list[int] = []

    def obtain() -> bytes:
        calls.append(rank)
        return KEY

    key = host_shared_key(obtain, host=host)
    out["key_ok"] = key == KEY
    out["obtained"] = calls == [rank]

    def failing() -> bytes:
        if host == "host1":
            raise RuntimeError("session refused")
        return KEY

    try:
        host_shared_key(failing, host=host)
        out["second"] = "ok"
    except (KeySharingError, RuntimeError) as exc:
        out["second"] = type(exc).__name__

    # the shard set, two epochs, the main process
    stream = SealedChunkStream(setup["shards"], key=key, seed=SEED)
    out["epochs"] = []
    out["expected"] = []
    for epoch in range(2):
        stream.set_epoch(epoch)
        with stream.iterate() as it:
            out["epochs"].append([_index_of(by_hash, t) for t in it])
        out["expected"].append(stream.chunks())
    # keep this rank's bytes of epoch 0, to compare with staging the whole dataset
    stream.set_epoch(0)
    with stream.iterate() as it:
        mine = {g: t.numpy().tobytes().hex() for g, t in zip(stream.chunks(), it, strict=True)}
    (work / f"bytes-{rank}.json").write_text(json.dumps(mine))

    # DataLoader workers: each (rank, worker) reads its own chunks
    stream.set_epoch(2)
    loader = DataLoader(stream, batch_size=None, num_workers=2, multiprocessing_context="fork")
    out["workers"] = [_index_of(by_hash, t) for t in loader]
    out["worker_shares"] = [stream.chunks(w, 2) for w in range(2)]

    padded = SealedChunkStream(setup["shards"], key=key, seed=SEED, pad=True)
    out["padded"] = [_index_of(by_hash, t) for t in padded]

    # the tampered file: only the rank that reads the chunk fails, and never yields it
    tampered = SealedChunkStream(setup["tampered"], key=key, seed=SEED, threads=1)
    tampered.set_epoch(TAMPERED_EPOCH)
    got: list[int] = []
    kept: list[torch.Tensor] = []
    try:
        for t in tampered:
            got.append(_index_of(by_hash, t))
            kept.append(t)
        out["tamper"] = None
    except ChunkAuthenticationError as exc:
        out["tamper"] = exc.chunk_index
    out["tamper_got"] = got
    # what was yielded before the failure was verified, and stays intact
    out["tamper_kept"] = [_index_of(by_hash, t) for t in kept] == got

    # a missing shard and a foreign one are refused on every rank
    refused = []
    for paths in (setup["shards"][:-1], setup["foreign"]):
        try:
            open_shard_set(paths, key=key)
            refused.append(False)
        except ShardSetError:
            refused.append(True)
    out["refused"] = refused
    dist.barrier()
    (work / f"rank-{rank}.json").write_text(json.dumps(out))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    work = tmp_path_factory.mktemp("dist")
    data = _plaintext()
    src = work / "train.bin"
    src.write_bytes(data)
    shards = seal_shards(src, work / ".", 3, dataset_key=KEY, chunk_size=CHUNK, stem="s")
    other = work / "other"
    other.mkdir()
    again = seal_shards(src, other, 3, dataset_key=KEY, chunk_size=CHUNK, stem="s")
    whole = work / "whole.gcc"
    seal_file(src, whole, dataset_key=KEY, chunk_size=CHUNK)
    tampered = work / "tampered.gcc"
    raw = bytearray(whole.read_bytes())
    victim = assign_chunks(CHUNKS, rank=1, world_size=WORLD, epoch=TAMPERED_EPOCH, seed=SEED)[2]
    raw[open_shard_set(whole, key=KEY).parts[0].header.chunk_offset(victim) + 100] ^= 4
    tampered.write_bytes(bytes(raw))
    setup = {
        "shards": [str(p) for p in shards.paths],
        "foreign": [str(shards.paths[0]), str(again.paths[1]), str(shards.paths[2])],
        "tampered": str(tampered),
        "victim": victim,
    }
    (work / "setup.json").write_text(json.dumps(setup))
    # fork: spawned ranks would each import torch again (tens of seconds on two cores)
    context = multiprocessing.get_context("fork")
    port = _free_port()
    procs = [
        context.Process(target=_rank_main, args=(rank, str(work), port)) for rank in range(WORLD)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=240)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert [proc.exitcode for proc in procs] == [0] * WORLD
    return [json.loads((work / f"rank-{r}.json").read_text()) for r in range(WORLD)], work


def test_one_key_release_per_host(results: tuple[list[dict[str, Any]], Path]) -> None:
    ranks, _ = results
    assert all(r["key_ok"] for r in ranks)
    assert [r["obtained"] for r in ranks] == [True, False, True, False]
    # host1's release failed: its leader re-raises, its other rank gets a typed error
    assert [r["second"] for r in ranks] == ["ok", "ok", "RuntimeError", "KeySharingError"]


def test_epochs_are_disjoint_complete_and_reshuffled(
    results: tuple[list[dict[str, Any]], Path],
) -> None:
    ranks, _ = results
    for epoch in range(2):
        read = [r["epochs"][epoch] for r in ranks]
        assert [r["expected"][epoch] for r in ranks] == read  # what each rank was assigned
        flat = [g for share in read for g in share]
        assert sorted(flat) == list(range(CHUNKS))
        assert [len(s) for s in read] == [6, 6, 6, 5]  # uneven shares, no repeats
    assert ranks[0]["epochs"][0] != ranks[0]["epochs"][1]


def test_rank_bytes_match_whole_dataset_staging(
    results: tuple[list[dict[str, Any]], Path],
) -> None:
    _, work = results
    merged: dict[int, bytes] = {}
    for rank in range(WORLD):
        for g, hexed in json.loads((work / f"bytes-{rank}.json").read_text()).items():
            assert int(g) not in merged
            merged[int(g)] = bytes.fromhex(hexed)
    with stage(work / "whole.gcc", key=KEY) as buf:
        assert b"".join(merged[g] for g in range(CHUNKS)) == bytes(buf)


def test_dataloader_workers_cover_the_epoch(results: tuple[list[dict[str, Any]], Path]) -> None:
    ranks, _ = results
    flat = [g for r in ranks for g in r["workers"]]
    assert sorted(flat) == list(range(CHUNKS))
    for r in ranks:
        shares = r["worker_shares"]
        assert not set(shares[0]) & set(shares[1])
        assert sorted(r["workers"]) == sorted(shares[0] + shares[1])


def test_pad_repeats_to_even_shares(results: tuple[list[dict[str, Any]], Path]) -> None:
    ranks, _ = results
    shares = [r["padded"] for r in ranks]
    assert [len(s) for s in shares] == [6, 6, 6, 6]
    flat = [g for s in shares for g in s]
    assert set(flat) == set(range(CHUNKS))
    assert len(flat) - len(set(flat)) == 1


def test_tampered_chunk_fails_only_on_its_rank(
    results: tuple[list[dict[str, Any]], Path],
) -> None:
    ranks, work = results
    victim = json.loads((work / "setup.json").read_text())["victim"]
    assert [r["tamper"] for r in ranks] == [None, victim, None, None]
    for r in ranks:
        expected = assign_chunks(
            CHUNKS, rank=r["rank"], world_size=WORLD, epoch=TAMPERED_EPOCH, seed=SEED
        )
        if r["tamper"] is None:
            assert r["tamper_got"] == expected
        else:
            assert r["tamper_got"] == expected[:2]
            assert victim not in r["tamper_got"]
        assert r["tamper_kept"]


def test_missing_and_foreign_shards_refused_on_every_rank(
    results: tuple[list[dict[str, Any]], Path],
) -> None:
    ranks, _ = results
    assert all(r["refused"] == [True, True] for r in ranks)
