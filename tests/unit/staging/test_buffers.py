"""Host buffers: reused only when nothing can still see them, and never handed out stale.

Large staging buffers come from a pool of anonymous mappings; these tests pin the rules that
make reuse safe: a mapping goes back to the pool only after the array and every view or
exported buffer of it are gone, and a staging call into reused memory returns exactly the
new dataset's bytes (or nothing, on failure).
"""

from __future__ import annotations

import gc
import mmap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gpucc.staging import _buffers
from gpucc.staging import format as fmt
from gpucc.staging.cpu import stage_bytes, stage_cpu
from gpucc.staging.dataset import open_sealed
from gpucc.staging.errors import ChunkAuthenticationError
from gpucc.staging.seal import seal_bytes, seal_file

BIG = _buffers.MIN_POOLED + 12345
CS = 1 << 20


@pytest.fixture(autouse=True)
def _empty_pool() -> Iterator[None]:
    _buffers.release_idle()
    yield
    _buffers.release_idle()


def _address(arr: np.ndarray) -> int:
    return int(arr.__array_interface__["data"][0])


def _data(length: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, length, dtype=np.uint8).tobytes()


def test_a_dropped_buffer_is_reused() -> None:
    first = _buffers.host_buffer(BIG)
    first[:] = 7
    address = _address(first)
    del first
    assert _buffers.idle_bytes() >= BIG
    second = _buffers.host_buffer(BIG - 100)
    assert _address(second) == address
    assert _buffers.idle_bytes() == 0
    assert second.flags.writeable and second.shape == (BIG - 100,)


def test_a_live_view_keeps_the_memory_out_of_the_pool() -> None:
    first = _buffers.host_buffer(BIG)
    first[:] = 7
    view = first[100:200]
    del first
    assert _buffers.idle_bytes() == 0
    other = _buffers.host_buffer(BIG)
    other[:] = 9
    assert bytes(view) == bytes([7]) * 100  # still its own memory
    del view
    del other


def test_an_exported_buffer_keeps_the_memory_out_of_the_pool() -> None:
    first = _buffers.host_buffer(BIG)
    exported = first.data
    del first
    assert _buffers.idle_bytes() == 0
    del exported
    assert _buffers.idle_bytes() >= BIG


def test_small_buffers_are_plain_zeroed_arrays() -> None:
    small = _buffers.host_buffer(1000)
    assert small.shape == (1000,) and not small.any()


def test_idle_mappings_are_bounded() -> None:
    arrays = [_buffers.host_buffer(BIG) for _ in range(_buffers.MAX_IDLE + 2)]
    del arrays
    assert _buffers.idle_bytes() <= _buffers.MAX_IDLE * BIG


def test_a_dropped_view_is_reused_and_a_live_slice_keeps_it() -> None:
    first = _buffers.host_view(BIG)
    assert len(first) == BIG and not first.readonly and first.format == "B"
    first[:] = b"\x07" * BIG
    part = first[10:20]
    del first
    assert _buffers.idle_bytes() == 0  # the slice still sees the mapping
    other = _buffers.host_view(BIG)
    other[:] = b"\x09" * BIG
    assert bytes(part) == b"\x07" * 10
    del part, other
    assert _buffers.idle_bytes() >= BIG
    assert _buffers.host_view(10) == bytes(10)


def test_a_sealed_view_is_reused_by_the_next_seal() -> None:
    dk = fmt.new_dataset_key()
    first = seal_bytes(_data(BIG, 5), dataset_key=dk, chunk_size=CS)
    address = _address(np.frombuffer(first, dtype=np.uint8))
    gc.collect()
    del first
    assert _buffers.idle_bytes() >= BIG
    data = _data(BIG, 6)
    again = seal_bytes(data, dataset_key=dk, chunk_size=CS)
    assert _address(np.frombuffer(again, dtype=np.uint8)) == address
    assert stage_bytes(again, dk).tobytes() == data


def test_staging_into_reused_memory_returns_only_the_new_dataset(tmp_path: Path) -> None:
    kek = fmt.new_dataset_key()
    old, new = _data(BIG + 3 * CS, 1), _data(BIG, 2)
    for name, data in (("old", old), ("new", new)):
        (tmp_path / f"{name}.bin").write_bytes(data)
        seal_file(tmp_path / f"{name}.bin", tmp_path / f"{name}.gcc", kek=kek, chunk_size=CS)
    dataset = open_sealed(tmp_path / "old.gcc")
    staged = stage_cpu(dataset, dataset.unwrap(kek), threads=2)
    assert staged.tobytes() == old
    del staged  # unscrubbed on purpose: the next call must not show any of it
    assert _buffers.idle_bytes() >= len(old)
    dataset = open_sealed(tmp_path / "new.gcc")
    staged = stage_cpu(dataset, dataset.unwrap(kek), threads=2)
    assert staged.tobytes() == new


def test_a_failed_staging_into_reused_memory_zeroes_it(tmp_path: Path) -> None:
    dk = fmt.new_dataset_key()
    data = _data(BIG, 3)
    blob = seal_bytes(data, dataset_key=dk, chunk_size=CS, threads=2)
    first = stage_bytes(blob, dk, threads=2)
    address = _address(first)
    del first
    header = fmt.Header.parse(bytes(blob[: fmt.HEADER_SIZE]))
    blob[header.chunk_offset(2) + 5] ^= 1
    with pytest.raises(ChunkAuthenticationError) as failed:
        stage_bytes(blob, dk, threads=2)
    assert failed.value.chunk_index == 2
    del failed
    gc.collect()  # the traceback's frames held the buffer
    again = _buffers.host_buffer(BIG)
    assert _address(again) == address
    assert not again.any()  # the failed call zeroed all of it, verified chunks included


def test_seal_bytes_without_out_matches_with_out() -> None:
    dk = fmt.new_dataset_key()
    data = _data(BIG, 4)
    dataset_id = bytes(range(16))
    fresh = seal_bytes(data, dataset_key=dk, chunk_size=CS, dataset_id=dataset_id)
    given = bytearray(len(fresh))
    seal_bytes(data, dataset_key=dk, chunk_size=CS, dataset_id=dataset_id, out=given)
    assert fresh == given
    assert stage_bytes(fresh, dk).tobytes() == data


@pytest.mark.parametrize("as_view", [False, True])
def test_a_smaller_buffer_in_a_reused_mapping_shows_nothing_of_the_last_user(
    as_view: bool,
) -> None:
    first = _buffers.host_buffer(BIG + 3 * 4096 + 5)
    first[:] = 0x5A  # e.g. plaintext an unscrubbed caller dropped
    address = _address(first)
    del first
    smaller: object = (_buffers.host_view if as_view else _buffers.host_buffer)(BIG - 100)
    exporter = smaller if isinstance(smaller, memoryview) else getattr(smaller, "base", None)
    assert isinstance(exporter, memoryview) and isinstance(exporter.obj, mmap.mmap)
    whole = np.frombuffer(exporter.obj, dtype=np.uint8)  # what the caller can reach
    assert _address(whole) == address  # the same mapping, reused
    assert not whole[BIG - 100 :].any()  # past the length asked for: nothing left
