"""The dataset kernels of aesgcm.cu themselves, run on the CPU through the runtime's own launches.

``tests/support/cudacpu`` compiles the source text the runtime hands NVRTC as host C++ (the
device branches, fibers for threads, real barriers and warp shuffles, shared memory poisoned
before every block, the shared-memory race detector and alignment checks on every access), and
its CuPy-compatible backend runs ``_gpu_runtime``, ``_gpu_pipeline`` and ``gpu`` unchanged: the
start-up self-test and production known answers, staging, device-resident records and sealing,
compared bit for bit with ``cryptography`` (through ``seal_bytes``), at one CTA and at several
CTAs per SM. The existing tamper matrix of ``test_gpu_pipeline.py`` runs here as well.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpucc.staging import _gpu_kat as kat
from gpucc.staging import _gpu_runtime as rt
from gpucc.staging import format as fmt
from gpucc.staging import gpu
from gpucc.staging.dataset import open_sealed
from gpucc.staging.errors import ChunkAuthenticationError
from gpucc.staging.format import HEADER_SIZE, Header
from gpucc.staging.seal import seal_bytes
from tests.support.cudacpu import backend
from tests.unit.staging import test_gpu_pipeline as pipeline_tests

#: (SMs, CTAs per SM): one CTA for the whole grid (every CTA loops over many items, with the
#: same key), and several CTAs per SM.
GEOMETRIES = [(1, 1), (2, 3)]


def _install(monkeypatch: pytest.MonkeyPatch, sms: int, per_sm: int, devices: int = 1) -> Any:
    cp = backend.install(monkeypatch, devices=devices, sm_count=sms, occupancy=per_sm)
    # Known-answer chunks of 3 tiles keep each test's start-up cheap; the real shape (300
    # tiles, the combine's Horner step over G^256) runs in its own test below.
    monkeypatch.setattr(kat, "_KAT_TILES", 3)
    return cp


@pytest.fixture(params=GEOMETRIES, ids=lambda g: f"{g[0]}sm-x{g[1]}")
def cpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    yield _install(monkeypatch, *request.param)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The tamper tests of test_gpu_pipeline.py take their backend by this name."""
    yield _install(monkeypatch, 1, 2, devices=3)


def _host(arr: Any) -> bytes:
    return bytes(backend.asnumpy(arr).tobytes())


def test_start_up_checks_run_the_real_kernels(cpu: Any) -> None:
    """The self-test and the production known answers (clean and tampered) at width 256 and,
    on first use, 64; the persistent grid is SMs x occupancy."""
    gpu.require_gpu(0)
    rt._kernels_at(0, 64)
    names = {name for name, _, _ in backend.launches}
    assert names == {"gcm_selftest", "gcm_setup", "gcm_chunks", "gcm_finalize"}
    grid = cpu.Config.sm_count * cpu.Config.occupancy
    chunks = [(g, b) for name, g, b in backend.launches if name == "gcm_chunks"]
    assert ((grid, 1, 1), (256, 1, 1)) in chunks and ((grid, 1, 1), (64, 1, 1)) in chunks


@pytest.mark.slow
def test_production_known_answers_at_their_real_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """300-tile chunks: gcm_finalize's 256 combine threads run Horner over G^256."""
    backend.install(monkeypatch, sm_count=1, occupancy=1)
    assert kat._KAT_TILES == 300
    gpu.require_gpu(0)


# key, iv, aad lengths, text lengths: every branch of gcm_selftest (96-bit and other IVs, AAD and
# text with partial blocks, several tiles of 256 blocks).
SELFTEST = [
    (12, 0, 0),
    (12, 17, 1),
    (8, 16, 15),
    (16, 52, 16),
    (60, 3, 4097),
    (12, 0, 4096 * 3 + 5),
]


@pytest.mark.parametrize(("iv_len", "aad_len", "length"), SELFTEST)
def test_gcm_selftest_matches_cryptography(
    cpu: Any, iv_len: int, aad_len: int, length: int
) -> None:
    kernels = rt._build(cpu, 0, 1)
    key, iv, aad, text = (os.urandom(n) for n in (32, iv_len, aad_len, length))
    sealed = AESGCM(key).encrypt(iv, text, aad)
    assert rt._gcm_message(kernels, cpu, key, iv, aad, text, seal=True) == (
        sealed[:-16],
        sealed[-16:],
    )
    assert rt._gcm_message(kernels, cpu, key, iv, aad, sealed[:-16], seal=False) == (
        text,
        sealed[-16:],
    )


CS = 4096
# Dataset lengths: empty, one byte, not a multiple of 16, a partial last chunk, whole chunks.
LENGTHS = [0, 1, 15, 17, CS - 1, CS, 5 * CS + 7]
# Chunk sizes and the CTA widths they give: 64 (one tile per chunk), 256 (4 tiles), 256 with
# a last chunk of one partial tile.
CHUNK_SIZES = [4096, 16384 * 4]


@pytest.mark.parametrize("cs", CHUNK_SIZES)
@pytest.mark.parametrize("length", LENGTHS)
def test_sealing_and_staging_are_bit_exact(cpu: Any, tmp_path: Path, cs: int, length: int) -> None:
    data = os.urandom(length)
    dk, did = fmt.new_dataset_key(), os.urandom(16)
    want = bytes(seal_bytes(data, dataset_key=dk, chunk_size=cs, dataset_id=did, threads=1))
    device = cpu.asarray(np.frombuffer(data or b"\x00", dtype=np.uint8)[: len(data)])
    assert bytes(gpu.seal_gpu(device, dataset_key=dk, chunk_size=cs, dataset_id=did)) == want
    path = tmp_path / "d.gcc"
    path.write_bytes(want)
    out = cpu.ndarray(np.full(length, 0xA5, dtype=np.uint8), 0)
    gpu.stage_gpu(open_sealed(path), dk, out=out, batch_bytes=3 * (cs + 16), slots=2)
    assert _host(out) == data


def test_device_resident_records_open_and_a_tamper_zeroes_from_there(cpu: Any) -> None:
    data = os.urandom(7 * CS + 100)
    dk = fmt.new_dataset_key()
    blob = bytes(seal_bytes(data, dataset_key=dk, chunk_size=CS, threads=1))
    header = Header.parse(blob[:HEADER_SIZE])
    raw = bytearray(blob[header.chunks_offset :])
    records = cpu.asarray(np.frombuffer(bytes(raw), np.uint8))
    assert _host(gpu.decrypt_records_gpu(records, header, dk)) == data
    raw[4 * (CS + 16) + CS + 3] ^= 0x80  # chunk 4's tag
    out = cpu.ndarray(np.full(len(data), 0xA5, dtype=np.uint8), 0)
    with pytest.raises(ChunkAuthenticationError) as info:
        gpu.decrypt_records_gpu(
            cpu.asarray(np.frombuffer(bytes(raw), np.uint8)), header, dk, out=out
        )
    assert info.value.chunk_index == 4
    host = _host(out)
    assert host[: 4 * CS] == data[: 4 * CS] and not any(host[4 * CS :])


def test_gcm_finalize_flags_and_zeroes_exactly_the_tampered_chunks(cpu: Any) -> None:
    """The kernels' own verdict words and zeroing, below the pipeline's first-failure rule."""
    kernels, grid = rt._kernels_at(0, 64)
    case = kat._kat_case(CS, 9)
    records = bytearray(case.records)
    stride = CS + 16
    bad = {1: 5, 4: CS + 2, 8: case.header.chunk_length(8) + 15}  # ciphertext, tag, last tag
    for index, at in bad.items():
        records[index * stride + at] ^= 0x01
    gcm = rt.GcmDevice(cpu, 0, case.header, case.chunk_key)
    try:
        plain, status = kat._open_on(gcm, cpu, records)
    finally:
        gcm.close()
    assert status == [1 if i in bad else 0 for i in range(9)]
    for i in range(9):
        got = plain[i * CS : i * CS + case.header.chunk_length(i)]
        want = case.plaintext[i * CS : i * CS + case.header.chunk_length(i)]
        assert got == (bytes(len(want)) if i in bad else want), i


# --- the tamper matrix of test_gpu_pipeline.py, through the real kernels ------------------------


@pytest.mark.parametrize("index", range(pipeline_tests.N))
@pytest.mark.parametrize("where", ["ciphertext", "tag"])
def test_flipped_bit_names_the_chunk_and_leaves_nothing_unverified(
    fake: Any, tmp_path: Path, index: int, where: str
) -> None:
    pipeline_tests.test_flipped_bit_names_the_chunk_and_leaves_nothing_unverified(
        fake, tmp_path, index, where
    )


@pytest.mark.parametrize("pipe", range(len(pipeline_tests.PIPELINES)))
def test_the_lowest_failing_chunk_is_named_whatever_the_timing(
    fake: Any, tmp_path: Path, pipe: int
) -> None:
    pipeline_tests.test_the_lowest_failing_chunk_is_named_whatever_the_timing(
        fake, tmp_path, pipe, 0.5
    )


def test_swapped_and_spliced_chunks(fake: Any, tmp_path: Path) -> None:
    pipeline_tests.test_swapped_and_spliced_chunks(fake, tmp_path)


def test_device_resident_records_tampered(fake: Any, tmp_path: Path) -> None:
    pipeline_tests.test_device_resident_records_tampered(fake, tmp_path)
