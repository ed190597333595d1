"""PyTorch datasets over sealed chunks, in one process: content, split, scrubbing, failures."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from gpucc.core.errors import UsageError
from gpucc.staging import seal_file, stage
from gpucc.staging.errors import ChunkAuthenticationError, GpuStagingUnavailableError
from gpucc.staging.format import TAG_SIZE
from gpucc.staging.shards import open_shard_set, seal_shards
from gpucc.staging.torch_dataset import (
    SealedChunkDataset,
    SealedChunkStream,
    assign_chunks,
    host_shared_key,
    rank_and_world,
)

CHUNK = 4096
KEY = bytes(range(32))
CHUNKS = 13
LENGTH = 12 * CHUNK + 2048  # the last chunk is half a chunk


def _plaintext(length: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < length:
        out += hashlib.sha256(counter.to_bytes(8, "little")).digest()
        counter += 1
    return bytes(out[:length])


DATA = _plaintext(LENGTH)


def _chunk(g: int) -> bytes:
    return DATA[g * CHUNK : (g + 1) * CHUNK]


@pytest.fixture
def sealed(tmp_path: Path) -> Path:
    src = tmp_path / "train.bin"
    src.write_bytes(DATA)
    dst = tmp_path / "train.gcc"
    seal_file(src, dst, dataset_key=KEY, chunk_size=CHUNK)
    return dst


def _tamper(path: Path, chunk: int) -> None:
    shards = open_shard_set(path, key=KEY)
    raw = bytearray(path.read_bytes())
    raw[shards.parts[0].header.chunk_offset(chunk) + 5] ^= 1
    path.write_bytes(bytes(raw))


# --- the split -------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4, 13, 20])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_split_is_disjoint_and_complete(world: int, workers: int) -> None:
    for epoch in range(3):
        shares = [
            assign_chunks(
                CHUNKS, rank=r, world_size=world, epoch=epoch, worker=w, num_workers=workers
            )
            for r in range(world)
            for w in range(workers)
        ]
        flat = [c for share in shares for c in share]
        assert sorted(flat) == list(range(CHUNKS))
        per_rank = [sum(len(shares[r * workers + w]) for w in range(workers)) for r in range(world)]
        assert max(per_rank) - min(per_rank) <= 1
        assert per_rank == sorted(per_rank, reverse=True)  # lower ranks take the extra chunks


def test_split_shuffles_per_epoch_and_seed() -> None:
    orders = {
        (epoch, seed): assign_chunks(CHUNKS, rank=0, world_size=1, epoch=epoch, seed=seed)
        for epoch in range(3)
        for seed in (0, 1)
    }
    assert len({tuple(o) for o in orders.values()}) == 6
    assert assign_chunks(CHUNKS, rank=0, world_size=1, epoch=2) == orders[(2, 0)]
    assert assign_chunks(CHUNKS, rank=0, world_size=1, shuffle=False) == list(range(CHUNKS))


@pytest.mark.parametrize("world", [2, 3, 4, 5, 20])
def test_pad_gives_every_rank_the_same_count(world: int) -> None:
    shares = [assign_chunks(CHUNKS, rank=r, world_size=world, pad=True) for r in range(world)]
    assert len({len(s) for s in shares}) == 1
    flat = [c for s in shares for c in s]
    assert set(flat) == set(range(CHUNKS))
    assert len(flat) == -(-CHUNKS // world) * world


def test_rank_and_world_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert rank_and_world() == (2, 3)
    assert rank_and_world(0, 1) == (0, 1)
    with pytest.raises(UsageError):
        rank_and_world(3, 3)


def test_host_shared_key_without_a_process_group() -> None:
    assert host_shared_key(lambda: KEY) == KEY
    with pytest.raises(UsageError):
        host_shared_key(lambda: b"short")


# --- the stream --------------------------------------------------------------------------


def test_stream_matches_whole_dataset_staging(sealed: Path) -> None:
    with stage(sealed, key=KEY) as buf:
        whole = bytes(buf)
    stream = SealedChunkStream(sealed, key=KEY, rank=0, world_size=1, seed=3)
    with stream.iterate() as it:
        got = {g: bytes(t.numpy()) for g, t in zip(stream.chunks(), it, strict=True)}
    assert b"".join(got[g] for g in range(CHUNKS)) == whole == DATA


def test_stream_over_shards_and_ranks(tmp_path: Path) -> None:
    src = tmp_path / "train.bin"
    src.write_bytes(DATA)
    paths = seal_shards(src, tmp_path, 4, dataset_key=KEY, chunk_size=CHUNK).paths
    seen: dict[int, bytes] = {}
    for rank in range(3):
        stream = SealedChunkStream(paths, key=KEY, rank=rank, world_size=3)
        stream.set_epoch(5)
        for g, t in zip(stream.chunks(), stream, strict=True):
            assert g not in seen
            seen[g] = bytes(t.numpy())
    assert b"".join(seen[g] for g in range(CHUNKS)) == DATA


def test_stream_records_and_dtype(sealed: Path) -> None:
    stream = SealedChunkStream(
        sealed, key=KEY, shuffle=False, record_size=64, dtype=torch.int32, shape=(4, 4)
    )
    batches = list(stream.iterate())
    assert [b.shape for b in batches] == [(64, 4, 4)] * 12 + [(32, 4, 4)]
    first = np.frombuffer(DATA[:64], dtype=np.int32).reshape(4, 4)
    stream2 = SealedChunkStream(
        sealed, key=KEY, shuffle=False, record_size=64, dtype=torch.int32, shape=(4, 4)
    )
    assert np.array_equal(next(iter(stream2))[0].numpy(), first)
    with pytest.raises(UsageError):
        SealedChunkStream(sealed, key=KEY, record_size=48)  # does not divide the chunk size


def _free_buffers(stream: SealedChunkStream) -> list[np.ndarray]:
    pool = stream._pool
    assert pool is not None
    return list(pool.free)


def test_tensors_own_their_memory_and_are_zeroed_once_freed(sealed: Path) -> None:
    import gc

    stream = SealedChunkStream(sealed, key=KEY, rank=0, world_size=1, seed=2)
    kept = list(stream)  # every tensor kept past the end of the iteration stays intact
    assert [bytes(t.numpy()) for t in kept] == [_chunk(g) for g in stream.chunks()]
    assert len({t.data_ptr() for t in kept}) == CHUNKS  # no two share memory
    pointers = {t.data_ptr() for t in kept}
    del kept
    gc.collect()
    free = _free_buffers(stream)
    assert free and {b.ctypes.data for b in free} <= pointers  # freed tensors came back...
    assert all(int(np.count_nonzero(b)) == 0 for b in free)  # ...zeroed: the pass had ended

    # a buffer comes back to be reused only once its last view is gone
    it = iter(stream)
    first = next(it)
    view = first[100:200]
    del first
    gc.collect()
    assert view.data_ptr() - 100 not in {b.ctypes.data for b in _free_buffers(stream)}
    later = [bytes(t.numpy()) for t in it]
    assert len(later) == CHUNKS - 1
    assert bytes(view.numpy()) == _chunk(stream.chunks()[0])[100:200]


def test_consumer_failure_stops_the_workers_and_zeroes_what_they_read_ahead(
    sealed: Path,
) -> None:
    import threading

    stream = SealedChunkStream(sealed, key=KEY, shuffle=False, threads=2, prefetch=4)
    kept: list[torch.Tensor] = []
    with pytest.raises(RuntimeError, match="consumer"), stream.iterate() as it:
        for t in it:
            kept.append(t)
            if len(kept) == 3:
                raise RuntimeError("consumer failed")
    assert [bytes(t.numpy()) for t in kept] == [_chunk(g) for g in range(3)]
    free = _free_buffers(stream)
    assert free and all(int(np.count_nonzero(b)) == 0 for b in free)
    assert not [t for t in threading.enumerate() if t.name.startswith("gpucc-stream")]

    # without a with block: closing the stream ends its open iterations
    it2 = iter(stream)
    held = next(it2)
    stream.close()
    assert list(it2) == []
    assert bytes(held.numpy()) == _chunk(0)


def test_an_abandoned_iteration_ends_its_workers(sealed: Path) -> None:
    import gc
    import threading

    stream = SealedChunkStream(sealed, key=KEY, shuffle=False, threads=2, prefetch=3)
    it = iter(stream)
    held = next(it)
    del it  # the workers wait for the consumer; they must not keep the iteration alive
    gc.collect()
    assert not [t for t in threading.enumerate() if t.name.startswith("gpucc-stream")]
    assert bytes(held.numpy()) == _chunk(0)
    assert all(int(np.count_nonzero(b)) == 0 for b in _free_buffers(stream))


def test_pool_zeroes_buffers_it_lets_go() -> None:
    from gpucc.staging.torch_stream import _Pool

    pool = _Pool(64)
    pool.begin(keep=1)
    bufs = [pool.take() for _ in range(pool.SPARE + 3)]  # a big batch held at once
    for buf in bufs:
        buf.fill(7)
    for buf in bufs:
        pool.give(buf)  # during the pass: kept for reuse as they are, up to keep + SPARE
    kept, extra = bufs[: 1 + pool.SPARE], bufs[1 + pool.SPARE :]
    assert [id(b) for b in pool.free] == [id(b) for b in kept]
    assert all(int(np.count_nonzero(b)) == 64 for b in kept)
    assert all(int(np.count_nonzero(b)) == 0 for b in extra)  # over the limit: zeroed, let go
    pool.end()
    assert all(int(np.count_nonzero(b)) == 0 for b in kept)
    again = pool.take()
    again.fill(1)
    pool.give(again)  # after the pass: zeroed as it comes back
    assert int(np.count_nonzero(again)) == 0


def test_the_stream_closes_its_own_arena_once_its_tensors_are_freed(sealed: Path) -> None:
    import gc

    stream = SealedChunkStream(sealed, key=KEY, shuffle=False, threads=2, prefetch=3)
    arena = stream.pool().arena  # the one this process's iterations lend from
    it = iter(stream)
    held = next(it)
    assert arena.lent_bytes > 0
    stream.close()
    closed_while_held = arena.closed
    assert not closed_while_held  # a tensor the consumer holds stays intact...
    assert bytes(held.numpy()) == _chunk(0)
    del held, it
    gc.collect()
    assert arena.closed and arena.idle_bytes == 0  # ...and once freed, the arena is closed
    assert [bytes(t.numpy()) for t in stream] == [_chunk(g) for g in range(CHUNKS)]  # a new pool


def test_a_callers_arena_lends_the_tensors_and_its_close_zeroes_them(sealed: Path) -> None:
    from gpucc.staging.arena import HostArena

    arena = HostArena()
    stream = SealedChunkStream(sealed, key=KEY, shuffle=False, threads=2, arena=arena)
    kept = list(stream)
    assert [bytes(t.numpy()) for t in kept] == [_chunk(g) for g in range(CHUNKS)]
    assert arena.lent_bytes >= CHUNKS * CHUNK  # every tensor's memory is the arena's
    stream.close()
    assert not arena.closed  # the caller's to close
    arena.close()
    assert all(int(torch.count_nonzero(t)) == 0 for t in kept)


def test_tampered_chunk_is_never_yielded(tmp_path: Path, sealed: Path) -> None:
    _tamper(sealed, 7)
    stream = SealedChunkStream(sealed, key=KEY, shuffle=False, threads=2, prefetch=4)
    yielded: list[torch.Tensor] = []
    with pytest.raises(ChunkAuthenticationError) as info:
        for t in stream:
            assert bytes(t.numpy()) == _chunk(len(yielded))
            yielded.append(t)
    assert info.value.chunk_index == 7
    # chunks 8.. were verified ahead, but nothing after the failure is yielded
    assert len(yielded) == 7
    assert info.value.path == sealed
    free = _free_buffers(stream)  # what was read ahead came back zeroed
    assert free and all(int(np.count_nonzero(b)) == 0 for b in free)


def test_tampered_chunk_in_a_shard_reports_its_global_index(tmp_path: Path) -> None:
    src = tmp_path / "train.bin"
    src.write_bytes(DATA)
    paths = seal_shards(src, tmp_path, 2, dataset_key=KEY, chunk_size=CHUNK).paths
    shards = open_shard_set(paths, key=KEY)
    assert shards.locate(9) == (1, 3)
    raw = bytearray(paths[1].read_bytes())
    raw[shards.parts[1].header.chunk_offset(3) + CHUNK + TAG_SIZE - 1] ^= 0x80  # its tag
    paths[1].write_bytes(bytes(raw))
    stream = SealedChunkStream(paths, key=KEY, shuffle=False, threads=1)
    got: list[bytes] = []
    with pytest.raises(ChunkAuthenticationError) as info:
        for t in stream:
            got.append(bytes(t.numpy()))
    assert info.value.chunk_index == 9
    assert got == [_chunk(g) for g in range(9)]


def test_dataloader_workers_split_the_chunks(sealed: Path) -> None:
    stream = SealedChunkStream(sealed, key=KEY, rank=1, world_size=2, seed=4)
    stream.set_epoch(1)
    loader = DataLoader(stream, batch_size=None, num_workers=2)
    got = [bytes(t.numpy()) for t in loader]
    expected = stream.chunks()
    assert sorted(got) == sorted(_chunk(g) for g in expected)
    by_worker = [stream.chunks(w, 2) for w in range(2)]
    assert sorted(by_worker[0] + by_worker[1]) == sorted(expected)
    assert not set(by_worker[0]) & set(by_worker[1])


def test_cuda_refuses_dataloader_workers(sealed: Path) -> None:
    stream = SealedChunkStream(sealed, key=KEY, device="cuda")
    loader = DataLoader(stream, batch_size=None, num_workers=1)
    with pytest.raises(UsageError, match="num_workers=0"):
        next(iter(loader))


# --- map-style ---------------------------------------------------------------------------


def test_records_may_span_chunks(sealed: Path) -> None:
    size = 3 * 1024 + 4  # does not divide the chunk size: records cross chunk boundaries
    dataset = SealedChunkDataset(sealed, key=KEY, record_size=4 * 2, dtype=torch.float32)
    assert len(dataset) == LENGTH // 8
    assert dataset[3].shape == (2,)
    del dataset
    length = (LENGTH // size) * size
    src = sealed.with_name("odd.bin")
    src.write_bytes(DATA[:length])
    odd = sealed.with_name("odd.gcc")
    seal_file(src, odd, dataset_key=KEY, chunk_size=CHUNK)
    records = SealedChunkDataset(odd, key=KEY, record_size=size)
    assert len(records) == LENGTH // size
    order = [5, 0, 1, len(records) - 1, 2, 5]
    for i in order:
        assert bytes(records[i].numpy()) == DATA[i * size : (i + 1) * size]
    assert bytes(records[-1].numpy()) == DATA[length - size : length]
    with pytest.raises(IndexError):
        records[len(records)]
    records.close()
    assert records._cache is not None and int(np.count_nonzero(records._cache)) == 0
    assert bytes(records[1].numpy()) == DATA[size : 2 * size]  # reopens after close


def test_chunk_items_and_dataloader(sealed: Path) -> None:
    dataset = SealedChunkDataset(sealed, key=KEY)
    assert len(dataset) == CHUNKS
    assert bytes(dataset[12].numpy()) == DATA[12 * CHUNK :]
    records = SealedChunkDataset(sealed, key=KEY, record_size=512)
    loader = DataLoader(records, batch_size=8, num_workers=2, shuffle=False)
    joined = b"".join(bytes(batch.numpy().tobytes()) for batch in loader)
    assert joined == DATA


def test_map_style_tamper_fails_only_the_items_it_covers(sealed: Path) -> None:
    _tamper(sealed, 4)
    records = SealedChunkDataset(sealed, key=KEY, record_size=1024)
    assert bytes(records[15].numpy()) == DATA[15 * 1024 : 16 * 1024]  # chunk 3
    with pytest.raises(ChunkAuthenticationError) as info:
        records[16]  # chunk 4
    assert info.value.chunk_index == 4
    assert records._cache is not None and int(np.count_nonzero(records._cache)) == 0
    assert bytes(records[20].numpy()) == DATA[20 * 1024 : 21 * 1024]  # chunk 5


def test_key_arguments(sealed: Path) -> None:
    shards = open_shard_set(sealed, key=KEY)
    assert len(SealedChunkDataset(shards)) == CHUNKS
    with pytest.raises(UsageError):
        SealedChunkDataset(shards, key=KEY)
    with pytest.raises(UsageError):
        SealedChunkDataset(sealed)
    calls: list[bytes] = []

    def key_for(digest: bytes) -> bytes:
        calls.append(digest)
        return KEY

    SealedChunkStream(sealed, key_for=key_for)
    assert calls == [shards.parts[0].header_digest]


# --- the GPU -----------------------------------------------------------------------------


def _gpu_or_skip() -> None:
    from gpucc.staging import gpu

    reason = gpu.unavailable_reason(0)
    if reason is not None:
        pytest.skip(reason)


@pytest.mark.gpu
def test_gpu_stream_matches_cpu(sealed: Path) -> None:
    _gpu_or_skip()
    stream = SealedChunkStream(sealed, key=KEY, device="cuda", shuffle=False)
    kept: list[torch.Tensor] = []
    got = b""
    for t in stream:
        assert t.device.type == "cuda"
        kept.append(t)
        got += bytes(t.cpu().numpy())
    assert got == DATA
    # each chunk in device memory of its own: intact after the later ones
    assert b"".join(bytes(t.cpu().numpy()) for t in kept) == DATA
    assert len({t.data_ptr() for t in kept}) == len(kept)


@pytest.mark.gpu
def test_gpu_stream_tamper(sealed: Path) -> None:
    _gpu_or_skip()
    _tamper(sealed, 2)
    stream = SealedChunkStream(sealed, key=KEY, device="cuda", shuffle=False, threads=1)
    got: list[bytes] = []
    with pytest.raises(ChunkAuthenticationError) as info:
        for t in stream:
            got.append(bytes(t.cpu().numpy()))
    assert (info.value.chunk_index, info.value.path) == (2, sealed)
    assert got == [_chunk(0), _chunk(1)]


def test_cuda_without_a_gpu_is_a_typed_error(sealed: Path) -> None:
    from gpucc.staging import gpu

    if gpu.unavailable_reason(0) is None:
        pytest.skip("a GPU is usable here")
    stream = SealedChunkStream(sealed, key=KEY, device="cuda")
    with pytest.raises(GpuStagingUnavailableError):
        next(iter(stream))


def test_order_seed_vectors() -> None:
    from gpucc.staging.torch_dataset import order_seed

    assert order_seed(0, 0) == 4119592201761774218
    assert order_seed(1, 2) == 2449904900912751215
    assert order_seed(0, 1) != order_seed(1, 0)
    # torch.randperm under that seed (torch's CPU generator)
    assert assign_chunks(10, rank=0, world_size=1, seed=1, epoch=2) == [
        3,
        1,
        5,
        8,
        6,
        4,
        2,
        9,
        7,
        0,
    ]
