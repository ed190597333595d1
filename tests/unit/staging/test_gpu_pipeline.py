"""The GPU staging pipeline's orchestration, run without a GPU against ``tests/support/fake_cupy.py``.

The fake runs copies and kernels lazily (only when an event or stream synchronisation forces
them), so these tests catch a missing event wait, a pinned slot refilled too early, a status
word read before it was written, or a wrong kernel argument type; the kernels themselves are
emulated with ``cryptography``. What the real kernels compute is checked by
``test_kernel_harness.py``; the real thing end to end by ``test_gpu_staging.py`` on a GPU.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpucc.cli.exitcodes import exit_code_for
from gpucc.core.errors import UsageError
from gpucc.staging import _gpu_kat as kat
from gpucc.staging import _gpu_pipeline, gpu
from gpucc.staging import _gpu_runtime as rt
from gpucc.staging import dataset as dataset_mod
from gpucc.staging import format as fmt
from gpucc.staging.dataset import SealedDataset, open_sealed
from gpucc.staging.errors import (
    ChunkAuthenticationError,
    GpuKernelError,
    GpuStagingUnavailableError,
    HeaderAuthenticationError,
    MalformedDatasetError,
    StagingIOError,
)
from gpucc.staging.seal import seal_bytes
from tests.support import fake_cupy
from tests.support.paths import ROOT

CS = 4096
SENTINEL = 0xA5


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    fake_cupy.install(monkeypatch, devices=3)
    # Multi-tile known-answer chunks of 3 tiles keep every test's kernel load cheap; the real
    # shape (300 tiles) runs in test_production_known_answers_shape_and_once_per_device_and_width.
    monkeypatch.setattr(kat, "_KAT_TILES", 3)
    yield fake_cupy
    fake_cupy.reset()


def _data(n: int) -> bytes:
    return os.urandom(n)


def _sealed(tmp_path: Path, data: bytes, cs: int = CS) -> tuple[SealedDataset, bytes]:
    dk = fmt.new_dataset_key()
    path = tmp_path / "d.gcc"
    path.write_bytes(seal_bytes(data, dataset_key=dk, chunk_size=cs, threads=2))
    return open_sealed(path), dk


def _poisoned(n: int, device: int = 0) -> Any:
    return fake_cupy.ndarray(np.full(n, SENTINEL, dtype=np.uint8), device)


def _host(arr: Any) -> bytes:
    return bytes(fake_cupy.asnumpy(arr).tobytes())


SIZES = [0, 1, 15, 16, 17, CS - 1, CS, CS + 1, 5 * CS + 7, 24 * CS, 37 * CS + 3]
PIPELINES: list[dict[str, Any]] = [
    {"batch_bytes": 1, "slots": 1, "threads": 1},  # one chunk per batch, no overlap
    {"batch_bytes": 3 * (CS + 16), "slots": 2, "threads": 3},
    {"batch_bytes": 5 * (CS + 16), "slots": 4, "threads": 2},
    {"batch_bytes": 1 << 30, "slots": 4, "threads": 4},  # everything in one launch
]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("pipe", range(len(PIPELINES)))
def test_sealed_round_trip_overwrites_every_byte(
    fake: Any, tmp_path: Path, size: int, pipe: int
) -> None:
    data = _data(size)
    dataset, dk = _sealed(tmp_path, data)
    out = _poisoned(size)
    got = gpu.stage_gpu(dataset, dk, out=out, **PIPELINES[pipe])
    assert got is out
    assert _host(out) == data


@pytest.mark.parametrize("size", [0, 1, CS, 9 * CS + 1])
def test_sealed_round_trip_into_a_fresh_array(fake: Any, tmp_path: Path, size: int) -> None:
    data = _data(size)
    dataset, dk = _sealed(tmp_path, data)
    arr = gpu.stage_gpu(dataset, dk, batch_bytes=2 * CS, slots=3)
    assert arr.dtype == np.uint8 and arr.shape == (size,)
    assert _host(arr) == data


@pytest.mark.parametrize("size", [0, 1, CS - 1, CS, 11 * CS + 5])
def test_plaintext_round_trip(fake: Any, tmp_path: Path, size: int) -> None:
    data = _data(size)
    (tmp_path / "p.bin").write_bytes(data)
    out = _poisoned(size)
    gpu.stage_plaintext_gpu(
        tmp_path / "p.bin", chunk_size=CS, out=out, batch_bytes=4 * CS, slots=2, threads=3
    )
    assert _host(out) == data


def test_small_chunks_are_batched_per_launch(fake: Any, tmp_path: Path) -> None:
    data = _data(64 * CS)
    dataset, dk = _sealed(tmp_path, data)
    gpu.stage_gpu(dataset, dk, batch_bytes=16 * (CS + 16), slots=2)  # known answers run once
    fake.Config.launches = []
    gpu.stage_gpu(dataset, dk, batch_bytes=16 * (CS + 16), slots=2)
    chunks = [x for x in fake.Config.launches if x[0] == "gcm_chunks"]
    finals = [x for x in fake.Config.launches if x[0] == "gcm_finalize"]
    assert len(chunks) == 4 and len(finals) == 4  # 64 chunks, 4 launches each
    assert {grid for _, grid, _ in finals} == {(16,)}
    # A 4 KiB chunk is one tile of 64 threads x 4 blocks; 16 chunks' tiles, and a persistent
    # grid of the occupancy the driver reports (3 per SM) times the SMs (2).
    assert {(grid, block) for _, grid, block in chunks} == {((2 * 3,), (64,))}


# --- failures ----------------------------------------------------------------------------------

N = 9  # chunks in the tamper datasets (the last one short)


def _tamper_set(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    data = _data((N - 1) * CS + 1000)
    dataset, dk = _sealed(tmp_path, data)
    return dataset.path, data, dk


def _flip(path: Path, offset: int) -> None:
    blob = bytearray(path.read_bytes())
    blob[offset] ^= 0x04
    path.write_bytes(bytes(blob))


def _assert_failed_at(path: Path, dk: bytes, data: bytes, index: int, **kw: Any) -> None:
    out = _poisoned(len(data))
    with pytest.raises(ChunkAuthenticationError) as info:
        gpu.stage_gpu(open_sealed(path), dk, out=out, **kw)
    assert info.value.chunk_index == index and exit_code_for(info.value) == 6
    host = _host(out)
    assert host[: index * CS] == data[: index * CS]  # verified chunks stay
    assert not any(host[index * CS :])  # the failing chunk and everything after: zero


@pytest.mark.parametrize("index", range(N))
@pytest.mark.parametrize("where", ["ciphertext", "tag"])
def test_flipped_bit_names_the_chunk_and_leaves_nothing_unverified(
    fake: Any, tmp_path: Path, index: int, where: str
) -> None:
    path, data, dk = _tamper_set(tmp_path)
    header = open_sealed(path).header
    start = header.chunk_offset(index)
    length = header.chunk_length(index)
    _flip(path, start + (length // 2 if where == "ciphertext" else length + 7))
    _assert_failed_at(path, dk, data, index, batch_bytes=2 * (CS + 16), slots=3, threads=2)


@pytest.mark.parametrize("pipe", range(len(PIPELINES)))
@pytest.mark.parametrize("done_probability", [0.0, 0.5, 1.0])
def test_the_lowest_failing_chunk_is_named_whatever_the_timing(
    fake: Any, tmp_path: Path, pipe: int, done_probability: float
) -> None:
    fake.Config.done_probability = done_probability
    path, data, dk = _tamper_set(tmp_path)
    header = open_sealed(path).header
    for index in (6, 2):
        _flip(path, header.chunk_offset(index) + 1)
    _assert_failed_at(path, dk, data, 2, **PIPELINES[pipe])


def test_owned_buffer_is_zeroed_entirely_on_failure(
    fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, data, dk = _tamper_set(tmp_path)
    _flip(path, open_sealed(path).header.chunk_offset(4) + 9)
    made: list[Any] = []
    real_empty = fake.empty

    def spy(shape: Any, dtype: Any = np.float64) -> Any:
        arr = real_empty(shape, dtype)
        made.append(arr)
        return arr

    monkeypatch.setattr(fake, "empty", spy)
    with pytest.raises(ChunkAuthenticationError):
        gpu.stage_gpu(open_sealed(path), dk, batch_bytes=CS, slots=2)
    outs = [a for a in made if a.size == len(data) and a.ndim == 1]
    assert len(outs) == 1
    assert not any(_host(outs[0]))


def test_swapped_and_spliced_chunks(fake: Any, tmp_path: Path) -> None:
    path, data, dk = _tamper_set(tmp_path)
    header = open_sealed(path).header
    blob = bytearray(path.read_bytes())
    a, b = header.chunk_offset(3), header.chunk_offset(4)
    rec = CS + 16
    blob[a : a + rec], blob[b : b + rec] = blob[b : b + rec], blob[a : a + rec]
    path.write_bytes(bytes(blob))
    _assert_failed_at(path, dk, data, 3, batch_bytes=3 * rec)
    # A chunk from another dataset under the same dataset key: its AAD and nonce differ.
    blob[a : a + rec], blob[b : b + rec] = blob[b : b + rec], blob[a : a + rec]  # undo
    other = bytes(seal_bytes(_data(len(data)), dataset_key=dk, chunk_size=CS))
    blob[a : a + rec] = other[a : a + rec]
    path.write_bytes(bytes(blob))
    _assert_failed_at(path, dk, data, 3, batch_bytes=rec)


def test_wrong_key_and_altered_header_touch_nothing(fake: Any, tmp_path: Path) -> None:
    path, data, dk = _tamper_set(tmp_path)
    out = _poisoned(len(data))
    fake.Config.launches = []
    with pytest.raises(HeaderAuthenticationError):
        gpu.stage_gpu(open_sealed(path), fmt.new_dataset_key(), out=out)
    _flip(path, 20)  # dataset id: still parses
    with pytest.raises(HeaderAuthenticationError):
        gpu.stage_gpu(open_sealed(path), dk, out=out)
    assert fake.Config.launches == []
    assert _host(out) == bytes([SENTINEL]) * len(data)


def test_file_changed_after_open(fake: Any, tmp_path: Path) -> None:
    path, data, dk = _tamper_set(tmp_path)
    dataset = open_sealed(path)
    _flip(path, 70)  # header tag
    with pytest.raises(MalformedDatasetError, match="changed"):
        gpu.stage_gpu(dataset, dk, out=_poisoned(len(data)))


def test_read_error_zeroes_the_whole_output(
    fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, data, dk = _tamper_set(tmp_path)
    header = open_sealed(path).header
    real = dataset_mod.read_exact

    def failing(fd: int, buf: memoryview, offset: int) -> None:
        if offset >= header.chunk_offset(5):
            raise OSError(5, "Input/output error")
        real(fd, buf, offset)

    monkeypatch.setattr(_gpu_pipeline, "read_exact", failing)
    out = _poisoned(len(data))
    with pytest.raises(StagingIOError, match="Input/output error"):
        gpu.stage_gpu(open_sealed(path), dk, out=out, batch_bytes=CS, slots=2)
    assert not any(_host(out))


# --- several GPUs ---------------------------------------------------------------------------------


def test_split_across_gpus(fake: Any, tmp_path: Path) -> None:
    data = _data(20 * CS + 77)
    dataset, dk = _sealed(tmp_path, data)
    shards = gpu.stage_gpu_sharded(dataset, dk, gpus=3, batch_bytes=2 * CS, slots=2)
    assert [s.device for s in shards] == [0, 1, 2]
    assert [s.chunk_count for s in shards] == [7, 7, 7]
    assert b"".join(_host(s.array) for s in shards) == data
    assert [s.offset for s in shards] == [0, 7 * CS, 14 * CS]
    # Fewer chunks than GPUs: only as many GPUs as chunks.
    (tmp_path / "small").mkdir()
    small, dk2 = _sealed(tmp_path / "small", b"ab")
    assert len(gpu.stage_gpu_sharded(small, dk2, gpus=[2, 0])) == 1


@pytest.mark.parametrize("bad", [1, 8, 15, 20])
def test_failure_on_one_gpu_stops_all_and_names_the_lowest_chunk(
    fake: Any, tmp_path: Path, bad: int
) -> None:
    data = _data(20 * CS + 77)
    dataset, dk = _sealed(tmp_path, data)
    _flip(dataset.path, dataset.header.chunk_offset(bad) + 3)
    if bad + 9 < dataset.header.chunk_count:  # a second, later bad chunk
        _flip(dataset.path, dataset.header.chunk_offset(bad + 9) + 3)
    outs = [_poisoned(7 * CS, 0), _poisoned(7 * CS, 1), _poisoned(6 * CS + 77, 2)]
    with pytest.raises(ChunkAuthenticationError) as info:
        gpu.stage_gpu_sharded(
            open_sealed(dataset.path), dk, gpus=3, outs=outs, batch_bytes=CS, slots=2
        )
    assert info.value.chunk_index == bad
    whole = b"".join(_host(o) for o in outs)
    assert whole[: bad * CS] == data[: bad * CS]
    assert not any(whole[bad * CS :])


def test_too_many_gpus_or_bad_ids(fake: Any, tmp_path: Path) -> None:
    dataset, dk = _sealed(tmp_path, _data(CS))
    with pytest.raises(GpuStagingUnavailableError, match="4 GPUs requested"):
        gpu.stage_gpu_sharded(dataset, dk, gpus=4)
    with pytest.raises(GpuStagingUnavailableError, match="device 7 does not exist"):
        gpu.stage_gpu_sharded(dataset, dk, gpus=[7])
    with pytest.raises(UsageError):
        gpu.stage_gpu_sharded(dataset, dk, gpus=0)
    with pytest.raises(UsageError):
        gpu.stage_gpu_sharded(dataset, dk, gpus=[1, 1])


# --- sealing on the GPU and device-resident records --------------------------------------------


@pytest.mark.parametrize("size", [0, 1, CS, 3 * CS + 9])
def test_gpu_seal_opens_on_the_cpu_and_back(fake: Any, tmp_path: Path, size: int) -> None:
    data = _data(size)
    kek = fmt.new_dataset_key()
    dev = fake_cupy.asarray(np.frombuffer(data, dtype=np.uint8))
    blob = gpu.seal_gpu(dev, kek=kek, chunk_size=CS)
    (tmp_path / "g.gcc").write_bytes(blob)
    dataset = open_sealed(tmp_path / "g.gcc")
    from gpucc.staging.cpu import stage_cpu

    assert stage_cpu(dataset, dataset.unwrap(kek)).tobytes() == data
    # Same key and dataset id: byte for byte what the CPU sealer writes.
    dk = dataset.unwrap(kek)
    again = gpu.seal_gpu(dev, dataset_key=dk, chunk_size=CS, dataset_id=dataset.dataset_id)
    assert again == seal_bytes(data, dataset_key=dk, chunk_size=CS, dataset_id=dataset.dataset_id)
    # And the device-resident records open on the GPU.
    records = fake_cupy.asarray(
        np.frombuffer(bytes(blob[dataset.header.chunks_offset :]), np.uint8)
    )
    assert _host(gpu.decrypt_records_gpu(records, dataset.header, dk)) == data


def test_device_resident_records_tampered(fake: Any, tmp_path: Path) -> None:
    data = _data(6 * CS)
    dataset, dk = _sealed(tmp_path, data)
    raw = bytearray(dataset.path.read_bytes()[dataset.header.chunks_offset :])
    raw[2 * (CS + 16) + 5] ^= 1
    records = fake_cupy.asarray(np.frombuffer(bytes(raw), np.uint8))
    out = _poisoned(len(data))
    with pytest.raises(ChunkAuthenticationError) as info:
        gpu.decrypt_records_gpu(records, dataset.header, dk, out=out)
    assert info.value.chunk_index == 2
    host = _host(out)
    assert host[: 2 * CS] == data[: 2 * CS] and not any(host[2 * CS :])
    with pytest.raises(ValueError, match="chunk boundary"):
        gpu.decrypt_records_gpu(records[:100], dataset.header, dk)


# --- availability, the backend, the context manager -------------------------------------------


def test_unavailable_without_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_cupy() -> Any:
        raise GpuStagingUnavailableError("CuPy is not installed (ModuleNotFoundError: no cupy)")

    monkeypatch.setattr(rt, "import_cupy", no_cupy)
    monkeypatch.setattr(rt, "_modules", {})
    assert not gpu.gpu_available()
    reason = gpu.unavailable_reason()
    assert reason is not None and "CuPy" in reason and "\n" not in reason
    with pytest.raises(GpuStagingUnavailableError) as info:
        gpu.require_gpu()
    assert exit_code_for(info.value) == 5
    for gpus in (None, 1, 2):
        with pytest.raises(GpuStagingUnavailableError, match="CuPy is not installed"):
            gpu.backend(gpus)
    assert gpu.gpu_count() == 0


def test_real_import_without_cupy_gives_a_reason() -> None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("CuPy is installed here")
    reason = gpu.unavailable_reason()
    assert reason is not None and reason.startswith("CuPy is not installed")


BUILD_LOG = "\n".join(
    ["aesgcm.cu(12): warning: variable declared but never referenced"]
    + [f"aesgcm.cu({100 + i}): error: identifier undefined {i}" for i in range(14)]
    + ["14 errors detected in the compilation of aesgcm.cu."]
)


def test_a_build_failure_is_an_error_with_the_logs_error_lines(fake: Any) -> None:
    fake.Config.compile_error = BUILD_LOG
    for call in (gpu.require_gpu, gpu.unavailable_reason, gpu.gpu_available):
        with pytest.raises(GpuKernelError) as info:
            call(0)
        err = info.value
        assert not isinstance(err, GpuStagingUnavailableError)
        assert err.stage == "build" and err.device_id == 0
        assert len(err.log) == 10 and all("error" in line for line in err.log)
        assert err.log[0] == "aesgcm.cu(100): error: identifier undefined 0"
        assert "did not build for CUDA device 0" in str(err) and err.log[9] in str(err)
        assert exit_code_for(err) == 5
    fake.Config.compile_error = None
    assert gpu.gpu_available(0)  # not cached as a failure


def test_a_build_that_fails_its_known_answers_is_an_error(fake: Any) -> None:
    fake.Config.selftest_broken = True
    with pytest.raises(GpuKernelError, match="known-answer self-test") as info:
        gpu.unavailable_reason(1)
    assert info.value.stage == "known-answer" and info.value.device_id == 1
    fake.Config.selftest_broken = False
    assert gpu.gpu_available(1)


@pytest.mark.parametrize("bug", ["grid_loop_broken", "finalize_accepts_all"])
def test_the_production_kernels_are_checked_at_load(fake: Any, bug: str) -> None:
    """gcm_selftest passes; the production kernels at their launch shape do not."""
    setattr(fake.Config, bug, True)
    with pytest.raises(GpuKernelError, match="production AES-GCM kernels") as info:
        gpu.require_gpu(0)
    assert info.value.stage == "known-answer"
    setattr(fake.Config, bug, False)
    gpu.require_gpu(0)


def test_production_known_answers_shape_and_once_per_device_and_width(
    fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kat, "_KAT_TILES", 300)
    fake.Config.launches = []
    gpu.require_gpu(0)
    grid = fake.Config.sm_count * fake.Config.occupancy
    chunks = [x for x in fake.Config.launches if x[0] == "gcm_chunks"]
    # Clean and tampered: 16 KiB chunks, and chunks of 300 tiles, on the persistent grid.
    assert chunks == [("gcm_chunks", (grid,), (256,))] * 4
    assert kat._kat_shapes(256, grid) == [(16 * 1024, grid + 3), (300 * 16 * 1024 - 80, 3)]
    assert kat._kat_shapes(64, grid) == [(4096, grid + 3)]
    for cs, count in kat._kat_shapes(256, grid):
        case = kat._kat_case(cs, count)
        header = case.header
        assert rt._tiles(cs, 1024) * (count - 1) + 1 > grid  # CTAs loop back for more items
        assert header.chunk_length(header.chunk_count - 1) % 16  # a partial final block
        assert case.flip_ciphertext[0] != case.flip_tag[0]
        assert kat._kat_case(cs, count) is case  # computed once per shape
    # A first use at another width checks that width first, once per device.
    dataset, dk = _sealed(tmp_path, _data(3 * CS))
    for device, runs in ((0, 2), (0, 0), (1, 6)):  # device 1: width 256 at load, then 64
        fake.Config.launches = []
        gpu.stage_gpu(dataset, dk, device=device)
        widths = [block for name, _, block in fake.Config.launches if name == "gcm_chunks"]
        assert len(widths) == 1 + runs, (device, widths)
    assert ("gcm_chunks", 64, 0) in fake.Config.occupancy_calls


def test_a_build_that_cannot_be_resident_is_an_error(fake: Any, tmp_path: Path) -> None:
    fake.Config.occupancy = 0
    with pytest.raises(GpuKernelError, match="cannot be resident") as info:
        gpu.require_gpu(0)
    assert info.value.stage == "occupancy"
    fake.Config.occupancy = 5
    dataset, dk = _sealed(tmp_path, _data(40 * CS))
    fake.Config.launches = []
    gpu.stage_gpu(dataset, dk, batch_bytes=1 << 30)
    grids = {
        g for name, g, block in fake.Config.launches if block == (64,) and name == "gcm_chunks"
    }
    assert grids == {(fake.Config.sm_count * 5,)}  # the staging and its known answers


def test_device_selection_falls_back_only_without_a_device(
    fake: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from gpucc.staging import api

    caplog.set_level(logging.INFO, logger="gpucc.staging")
    assert api.select_backend("auto").name == "gpu"
    monkeypatch.setattr(rt, "_modules", {})
    fake.Config.compile_error = BUILD_LOG
    for device in ("auto", "gpu"):
        with pytest.raises(GpuKernelError) as info:
            api.select_backend(device)
        assert "not available" not in str(info.value)
    fake.Config.compile_error = None
    fake.Config.device_count = 0
    assert api.select_backend("auto").name == "cpu"
    assert "staging on the CPU (CUDA device 0 does not exist" in caplog.text
    with pytest.raises(GpuStagingUnavailableError, match="GPU staging not available"):
        api.select_backend("gpu")


# --- stream ordering ------------------------------------------------------------------------------


def test_the_fake_sees_a_buffer_initialised_on_the_wrong_stream(fake: Any) -> None:
    fake.Config.done_probability = 0.0
    compute = fake.cuda.Stream(non_blocking=True)
    status = fake.zeros(4, dtype=fake.uint32)  # memset queued on the default stream
    with compute, pytest.raises(fake.StreamRaceError):
        status.fill(1)
    ordered = fake.cuda.Event()
    ordered.record(fake.cuda.get_current_stream())
    compute.wait_event(ordered)
    with compute:
        status.fill(1)  # after the memset now
    assert list(fake.asnumpy(status)) == [1] * 4


def test_work_the_caller_queued_on_out_runs_before_the_kernels(fake: Any, tmp_path: Path) -> None:
    fake.Config.done_probability = 0.0
    data = _data(7 * CS + 5)
    dataset, dk = _sealed(tmp_path, data)
    gpu.stage_gpu(dataset, dk)  # the kernels built and checked (that synchronises)
    out = fake.empty(len(data), dtype=fake.uint8)
    out.fill(SENTINEL)  # queued on the caller's stream, not run yet
    gpu.stage_gpu(dataset, dk, out=out, batch_bytes=2 * (CS + 16), slots=2)
    assert _host(out) == data


def test_close_scrubs_after_the_kernels_on_their_stream(fake: Any, tmp_path: Path) -> None:
    fake.Config.done_probability = 0.0
    dataset, dk = _sealed(tmp_path, _data(5 * CS + 3))
    header = dataset.header
    raw = dataset.path.read_bytes()[header.chunks_offset :]
    stream = fake.cuda.Stream(non_blocking=True)
    chunk_key = fmt.derive_chunk_key(dk, header.dataset_id)
    gcm = rt.GcmDevice(fake, 0, header, chunk_key, stream=stream)
    records = fake.asarray(np.frombuffer(raw, dtype=np.uint8))
    out = fake.empty(header.plaintext_length, dtype=fake.uint8)
    with stream:
        status = fake.zeros(header.chunk_count, dtype=fake.uint32)
    gcm.launch(0, header.chunk_count, records, out, status, seal=False)
    ctx, partials = gcm.ctx, gcm.partials
    assert stream.executed < len(stream.ops)  # the kernels have not run yet
    gcm.close()  # queued behind them on their stream, then waited for
    assert not fake.asnumpy(ctx).any() and not fake.asnumpy(partials).any()
    assert not fake.asnumpy(status).any()


def test_backend_stages_and_scrubs(fake: Any, tmp_path: Path) -> None:
    data = _data(3 * CS + 1)
    dataset, dk = _sealed(tmp_path, data)
    be = gpu.backend()
    assert be.name == "gpu"
    buf = be.stage_sealed(dataset, dk, threads=2, progress=None)
    assert _host(buf) == data
    be.scrub(buf)
    assert not any(_host(buf))
    multi = gpu.backend(gpus=2)
    shards = multi.stage_sealed(dataset, dk, threads=None, progress=None)
    assert b"".join(_host(s.array) for s in shards) == data
    multi.scrub(shards)
    assert not any(b"".join(_host(s.array) for s in shards))
    (tmp_path / "p.bin").write_bytes(data)
    plain = be.stage_plaintext(tmp_path / "p.bin", chunk_size=CS, threads=2, progress=None)
    assert _host(plain) == data


def test_context_manager_scrubs_on_exit_and_on_error(fake: Any, tmp_path: Path) -> None:
    data = _data(2 * CS + 3)
    dataset, dk = _sealed(tmp_path, data)
    with gpu.gpu_staging(dataset, dk) as staged:
        arr = staged.array
        assert _host(arr) == data and staged.nbytes == len(data)
    assert not any(_host(arr))
    with pytest.raises(RuntimeError), gpu.gpu_staging(dataset, dk, gpus=2) as staged:
        shards = staged.shards
        with pytest.raises(UsageError):
            _ = staged.array
        raise RuntimeError("training failed")
    assert all(not any(_host(s.array)) for s in shards)
    (tmp_path / "p.bin").write_bytes(data)
    with gpu.gpu_staging(tmp_path / "p.bin", chunk_size=CS) as staged:
        assert _host(staged.array) == data
    with pytest.raises(UsageError), gpu.gpu_staging(tmp_path / "p.bin", dk):
        pass
    with pytest.raises(UsageError), gpu.gpu_staging(dataset):
        pass


def test_progress_is_in_order_and_complete(fake: Any, tmp_path: Path) -> None:
    data = _data(10 * CS + 5)
    dataset, dk = _sealed(tmp_path, data)
    seen: list[tuple[int, int]] = []
    gpu.stage_gpu(dataset, dk, batch_bytes=3 * (CS + 16), progress=lambda d, t: seen.append((d, t)))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert seen[-1] == (len(data), len(data))


def test_misaligned_buffers_are_refused(fake: Any, tmp_path: Path) -> None:
    data = _data(2 * CS)
    dataset, dk = _sealed(tmp_path, data)
    bigger = _poisoned(len(data) + 1)
    with pytest.raises(ValueError, match="16-byte boundary"):
        gpu.stage_gpu(dataset, dk, out=bigger[1:])
    with pytest.raises(ValueError, match="16-byte boundary"):
        gpu.seal_gpu(bigger[1:], dataset_key=dk, chunk_size=CS)


def test_geometry_helpers() -> None:
    assert rt._threads_for(4096) == 64  # 256 blocks: tiles of 4 x 64
    assert rt._threads_for(16384) == 256
    assert rt._threads_for(4 * 1024 * 1024) == 256
    assert rt._tiles(0, 1024) == 0 and rt._tiles(1, 1024) == 1
    assert rt._tiles(16 * 1024, 1024) == 1 and rt._tiles(16 * 1024 + 1, 1024) == 2
    rng = random.Random(7)
    header = fmt.Header(chunk_size=CS, dataset_id=rng.randbytes(16), plaintext_length=10 * CS + 3)
    assert gpu._count_records(header, 11 * (CS + 16) - CS + 3, 0) == (11, 10 * CS + 3)
    assert gpu._count_records(header, 2 * (CS + 16), 4) == (2, 2 * CS)


def test_benchmark_script_runs_end_to_end_on_the_fake(
    fake: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """benchmarks/bench_gpu.py runs once on a real GPU: make sure its code path works."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rc = bench.main(
        [
            "--size",
            "300KiB",
            "--chunk-sizes",
            "4KiB,64KiB",
            "--repeat",
            "1",
            "--tmp",
            str(tmp_path),
            "--json",
            str(tmp_path / "r.json"),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "kernel open, device-resident" in out and "GB/s (x line rate)" in out
    assert (tmp_path / "r.json").exists()


def test_benchmark_fails_on_broken_kernels(
    fake: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    fake.Config.compile_error = BUILD_LOG
    assert bench.main(["--size", "64KiB", "--tmp", str(tmp_path)]) == 5
    out = capsys.readouterr().out
    assert "kernels are broken" in out and "identifier undefined 0" in out


def test_benchmark_without_a_gpu_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("CuPy is installed here")
    import subprocess
    import sys

    root = ROOT
    result = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "bench_gpu.py"), "--size", "1MiB"],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("no GPU: CuPy is not installed")


def test_gpu_tests_collect_without_cupy_console_script_or_network(tmp_path: Path) -> None:
    """``pytest -m gpu`` on a checkout: no CuPy, no ``gpucc`` on PATH, no proxy reachable."""
    import subprocess
    import sys

    root = ROOT
    blocker = tmp_path / "cupy.py"
    blocker.write_text("raise ImportError('cupy is blocked for this test')\n")
    env = {
        "PATH": "/nonexistent",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)]),
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-m",
            "gpu",
            "-p",
            "no:cacheprovider",
            "tests/gpu/test_gpu_staging.py",
        ],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "error" not in result.stdout.lower()
    assert "skipped" in result.stdout and "passed" not in result.stdout


def test_gpu_tests_fail_rather_than_skip_when_the_build_fails(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = ROOT
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-m",
            "gpu",
            "-p",
            "no:cacheprovider",
            "-k",
            "build_and_pass or spec_vectors or every_chunk_boundary",
            "tests/gpu/test_gpu_staging.py",
        ],
        capture_output=True,
        text=True,
        cwd=root,
        env={
            **os.environ,
            "GPUCC_GPU_TESTS_ON_FAKE": "1",
            "GPUCC_FAKE_COMPILE_ERROR": "aesgcm.cu(7): error: expected a ';'",
        },
        check=False,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "6 failed" in result.stdout and "skipped" not in result.stdout, result.stdout
    assert "GpuKernelError" in result.stdout and "expected a ';'" in result.stdout


def test_the_known_answer_modules_import_nothing_of_their_callers() -> None:
    """Imports go one way: the runtime calls _gpu_kat, gpu_messages calls _gpu_msg_kat."""
    import ast

    for module, callers in (
        ("_gpu_kat", {"_gpu_runtime", "gpu", "gpu_messages", "_gpu_pipeline"}),
        ("_gpu_msg_kat", {"_gpu_runtime", "gpu", "gpu_messages", "_gpu_pipeline"}),
    ):
        tree = ast.parse((ROOT / "staging" / f"{module}.py").read_text())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names.add((node.module or "").split(".")[-1])
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.Import):
                names.update(alias.name.split(".")[-1] for alias in node.names)
        assert not names & callers, (module, names & callers)
