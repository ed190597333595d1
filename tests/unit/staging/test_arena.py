"""Host memory that held plaintext: the caller's own by default, or lent by a HostArena.

What these tests pin, each observed in the real memory (raw reads at the buffer's address,
``/proc/self/maps``), not through the arena's own bookkeeping alone:

* a default call's memory is the caller's alone: nothing in the process keeps it once the
  caller lets it go (no process-wide cache of pages that held plaintext);
* an arena zeroes a buffer when it comes back and reuses its pages only then; closing it
  zeroes every buffer it lent, held ones included, and it refuses to lend afterwards;
* lending, giving back and closing are safe from many threads at once.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import mmap
import threading
from pathlib import Path

import numpy as np
import pytest

from gpucc import staging
from gpucc.staging import format as fmt
from gpucc.staging.arena import MIN_MAPPED, HostArena
from gpucc.staging.cpu import stage_bytes, stage_cpu
from gpucc.staging.dataset import open_sealed
from gpucc.staging.errors import ArenaClosedError, ChunkAuthenticationError
from gpucc.staging.seal import seal_bytes, seal_file
from gpucc.staging.verify import verify_cpu

BIG = MIN_MAPPED + 12345
CS = 1 << 20


def _address(buf: object) -> int:
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data)  # type: ignore[call-overload]


def _raw(address: int, length: int) -> bytes:
    """What the process's memory holds at ``address`` (it must still be mapped)."""
    return ctypes.string_at(address, length)


def _mapped(address: int) -> bool:
    """Whether ``address`` lies in any mapping of this process (``/proc/self/maps``)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        start, end = (int(x, 16) for x in line.split()[0].split("-"))
        if start <= address < end:
            return True
    return False


def _data(length: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, length, dtype=np.uint8).tobytes()


# --- no process-wide cache ----------------------------------------------------------------


def test_there_is_no_module_level_pool() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("gpucc.staging._buffers")


@pytest.mark.parametrize("call", ["seal_bytes", "stage_bytes"])
def test_a_default_calls_memory_leaves_the_process_when_the_caller_drops_it(call: str) -> None:
    dk = fmt.new_dataset_key()
    sealed = seal_bytes(_data(BIG, 1), dataset_key=dk, chunk_size=CS)
    result: object = sealed if call == "seal_bytes" else stage_bytes(sealed, dk)
    address = _address(result)
    assert _mapped(address)
    del result
    if call == "seal_bytes":
        del sealed
    gc.collect()
    # Unmapped, not kept for anyone else in the process: no later allocation can be
    # handed these pages with their contents.
    assert not _mapped(address)


def test_default_calls_never_share_memory() -> None:
    dk = fmt.new_dataset_key()
    first = seal_bytes(_data(BIG, 2), dataset_key=dk, chunk_size=CS)
    staged = stage_bytes(first, dk)
    second = seal_bytes(_data(BIG, 3), dataset_key=dk, chunk_size=CS)
    ranges = [(_address(b), len(b) if isinstance(b, memoryview) else b.size) for b in (first, staged, second)]  # fmt: skip
    for i, (a, n) in enumerate(ranges):
        for b, m in ranges[i + 1 :]:
            assert a + n <= b or b + m <= a


# --- an arena: zeroed when a buffer comes back, reused only then --------------------------


def test_a_buffer_is_zeroed_when_it_comes_back_and_then_reused() -> None:
    with HostArena() as arena:
        first = arena.array(BIG)
        assert not first.any()
        first[:] = 0x5A  # plaintext
        address = _address(first)
        del first
        assert arena.idle_bytes >= BIG and arena.lent_bytes == 0
        assert _raw(address, BIG) == bytes(BIG)  # zero in memory before anyone asks again
        again = arena.array(BIG - 100)
        assert _address(again) == address and not again.any()


def test_a_live_view_or_slice_keeps_the_buffer_lent() -> None:
    with HostArena() as arena:
        view = arena.view(BIG)
        view[:] = b"\x07" * BIG
        part = view[10:20]
        address = _address(view)
        del view
        gc.collect()
        assert arena.idle_bytes == 0  # the slice still sees the memory
        other = arena.array(BIG)
        assert _address(other) != address
        other[:] = 9
        assert bytes(part) == b"\x07" * 10
        del part
        assert arena.idle_bytes >= BIG
        assert _raw(address, BIG) == bytes(BIG)


def test_a_smaller_buffer_in_a_reused_mapping_shows_nothing_past_its_length() -> None:
    with HostArena() as arena:
        first = arena.array(BIG + 3 * 4096 + 5)
        first[:] = 0x5A
        address = _address(first)
        del first
        smaller = arena.array(BIG - 100)
        assert _address(smaller) == address
        exporter: object = smaller.base
        assert isinstance(exporter, memoryview) and isinstance(exporter.obj, mmap.mmap)
        whole = np.frombuffer(exporter.obj, dtype=np.uint8)  # what the holder can reach
        assert not whole.any()


def test_close_zeroes_buffers_still_held_and_refuses_to_lend() -> None:
    arena = HostArena()
    held = arena.array(BIG)
    held[:] = 0x5A
    view = arena.view(1000)
    view[:] = b"\x5a" * 1000
    idle = arena.array(BIG * 2)
    del idle
    assert arena.idle_bytes >= 2 * BIG
    arena.close()
    assert arena.closed and arena.idle_bytes == 0
    assert not held.any()  # the same memory, read through the holder's own array
    assert _raw(_address(view), 1000) == bytes(1000)
    with pytest.raises(ArenaClosedError):
        arena.array(10)
    with pytest.raises(ArenaClosedError):
        arena.view(10)
    held[:5] = 1  # still valid memory of the holder's until it is gone
    address = _address(held)
    del held, view
    gc.collect()
    assert not _mapped(address)  # unmapped once the last holder is gone
    arena.close()  # twice is allowed


def test_library_calls_refuse_a_closed_arena(tmp_path: Path) -> None:
    kek = fmt.new_dataset_key()
    (tmp_path / "p.bin").write_bytes(_data(3 * CS, 4))
    seal_file(tmp_path / "p.bin", tmp_path / "p.gcc", kek=kek, chunk_size=CS)
    dataset = open_sealed(tmp_path / "p.gcc")
    dk = dataset.unwrap(kek)
    arena = HostArena()
    arena.close()
    with pytest.raises(ArenaClosedError):
        stage_cpu(dataset, dk, arena=arena)
    with pytest.raises(ArenaClosedError):
        verify_cpu(dataset, dk, arena=arena)
    with pytest.raises(ArenaClosedError):
        seal_bytes(b"x" * 100, dataset_key=dk, arena=arena)
    with pytest.raises(ArenaClosedError), staging.stage(tmp_path / "p.gcc", kek=kek, arena=arena):
        pass


def test_idle_buffers_are_bounded() -> None:
    with HostArena(max_idle=2) as arena:
        arrays = [arena.array(BIG) for _ in range(4)]
        del arrays
        assert arena.idle_bytes <= 2 * BIG


def test_many_threads_lend_give_back_and_close() -> None:
    arena = HostArena(max_idle=4)
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker(seed: int) -> None:
        try:
            start.wait()
            for n in range(40):
                length = 4096 * (1 + (seed + n) % 5) + seed
                buf = arena.array(length)
                assert not buf.any()  # never another thread's bytes
                buf[:] = seed + 1
                assert int(buf.min()) == int(buf.max()) == seed + 1  # nobody else writes here
                del buf
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert arena.lent_bytes == 0
    arena.close()
    assert arena.idle_bytes == 0


# --- staging and sealing through an arena -------------------------------------------------


def test_staging_and_sealing_through_an_arena_reuse_zeroed_pages(tmp_path: Path) -> None:
    kek = fmt.new_dataset_key()
    old, new = _data(BIG + 3 * CS, 5), _data(BIG, 6)
    for name, data in (("old", old), ("new", new)):
        (tmp_path / f"{name}.bin").write_bytes(data)
        seal_file(tmp_path / f"{name}.bin", tmp_path / f"{name}.gcc", kek=kek, chunk_size=CS)
    with HostArena() as arena:
        dataset = open_sealed(tmp_path / "old.gcc")
        staged = stage_cpu(dataset, dataset.unwrap(kek), threads=2, arena=arena)
        assert staged.tobytes() == old
        address = _address(staged)
        del staged  # unscrubbed on purpose: the arena zeroes it as it comes back
        assert arena.lent_bytes == 0
        assert _raw(address, len(old)) == bytes(len(old))
        dataset = open_sealed(tmp_path / "new.gcc")
        staged = stage_cpu(dataset, dataset.unwrap(kek), threads=2, arena=arena)
        assert _address(staged) == address and staged.tobytes() == new
        verified = verify_cpu(dataset, dataset.unwrap(kek), threads=2, arena=arena)
        assert verified.scrubbed and arena.lent_bytes == len(new)  # the chunk buffers are back
        dk = fmt.new_dataset_key()
        sealed = seal_bytes(new, dataset_key=dk, chunk_size=CS, arena=arena)
        assert stage_bytes(sealed, dk, arena=arena).tobytes() == new
    assert not staged.any()  # closing the arena zeroed what was still held
    assert not np.frombuffer(sealed, dtype=np.uint8).any()


def test_a_failed_staging_into_arena_memory_zeroes_it() -> None:
    dk = fmt.new_dataset_key()
    blob = seal_bytes(_data(BIG, 7), dataset_key=dk, chunk_size=CS, threads=2)
    with HostArena() as arena:
        first = stage_bytes(blob, dk, threads=2, arena=arena)
        address = _address(first)
        del first
        header = fmt.Header.parse(bytes(blob[: fmt.HEADER_SIZE]))
        blob[header.chunk_offset(2) + 5] ^= 1
        with pytest.raises(ChunkAuthenticationError) as failed:
            stage_bytes(blob, dk, threads=2, arena=arena)
        assert failed.value.chunk_index == 2
        del failed
        gc.collect()  # the traceback's frames held the buffer
        assert _raw(address, BIG) == bytes(BIG)


def test_seal_bytes_is_the_same_into_any_memory() -> None:
    dk = fmt.new_dataset_key()
    data = _data(BIG, 8)
    dataset_id = bytes(range(16))
    own = seal_bytes(data, dataset_key=dk, chunk_size=CS, dataset_id=dataset_id)
    given = bytearray(len(own))
    seal_bytes(data, dataset_key=dk, chunk_size=CS, dataset_id=dataset_id, out=given)
    with HostArena() as arena:
        lent = seal_bytes(data, dataset_key=dk, chunk_size=CS, dataset_id=dataset_id, arena=arena)
        assert own == given == lent
    assert stage_bytes(own, dk).tobytes() == data


def test_stage_with_an_arena_scrubs_and_gives_the_buffer_back(tmp_path: Path) -> None:
    kek = fmt.new_dataset_key()
    data = _data(BIG, 9)
    (tmp_path / "p.bin").write_bytes(data)
    seal_file(tmp_path / "p.bin", tmp_path / "p.gcc", kek=kek, chunk_size=CS)
    with HostArena() as arena:
        with staging.stage(tmp_path / "p.gcc", kek=kek, arena=arena) as buf:
            assert buf.tobytes() == data
            address = _address(buf)
        del buf
        assert arena.lent_bytes == 0 and arena.idle_bytes >= BIG
        assert _raw(address, BIG) == bytes(BIG)
