"""GPU staging on a real GPU: the kernels and the pipeline end to end.

Every test is marked ``gpu`` and skips cleanly without CuPy or without a CUDA device. With a
device, a kernel build that fails (NVRTC) or fails its known answers is a test *failure*,
never a skip. The module imports neither CuPy nor the command line at import time and needs
no network, so ``pytest -m gpu`` collects from any checkout. What runs:

* the kernel build and both sets of load-time known answers (the spec vectors through
  gcm_selftest; the production kernels at every CTA width staging uses, tampering included);
* the GCM specification's AES-256 vectors and random messages through the device code;
* sealed round trips against ``cryptography`` over sizes from 0 bytes up, every chunk
  boundary, chunk sizes from 4 KiB to 16 MiB, into an output poisoned with 0xA5 that must be
  overwritten completely; the plaintext (host-sealed in transit) path; a multi-GiB case behind
  ``GPUCC_GPU_BIG=1`` (also marked ``slow``);
* sealing on the GPU opened by ``cryptography`` and the reverse, byte-identical to the CPU sealer;
* the tamper matrix, each case naming the right chunk and leaving no unverified plaintext;
* small (64 KiB) chunks batched per launch, DLPack export, scrubbing, several GPUs if present.

Inputs are fresh random bytes on every run; the seed is printed (``GPUCC_TEST_SEED`` replays).
``GPUCC_GPU_TESTS_ON_FAKE=1`` runs this module against ``tests/support/fake_cupy.py`` (a dry run of the
test code itself on a machine without a GPU; the kernels are then emulated, not tested).
"""

from __future__ import annotations

import importlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from gpucc.core.errors import IntegrityError
from gpucc.staging import _gpu_runtime as rt
from gpucc.staging import format as fmt
from gpucc.staging import gpu
from gpucc.staging.cpu import stage_cpu
from gpucc.staging.dataset import SealedDataset, open_sealed
from gpucc.staging.errors import (
    ChunkAuthenticationError,
    HeaderAuthenticationError,
    MalformedDatasetError,
)
from gpucc.staging.seal import seal_bytes
from tests.support.gpu import real_cupy
from tests.support.paths import DATA

pytestmark = pytest.mark.gpu

FAKE = os.environ.get("GPUCC_GPU_TESTS_ON_FAKE") == "1"
SENTINEL = 0xA5
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
VECTORS = DATA / "gcm_vectors.json"


@pytest.fixture(scope="module")
def cp() -> Iterator[Any]:
    """The cupy module with at least one CUDA device; the tests skip without either.

    The kernels are not built here: a build or known-answer failure must fail the tests that
    use them (and :func:`test_the_kernels_build_and_pass_their_known_answers`), not skip.
    """
    if FAKE:
        from tests.support import fake_cupy

        fake_cupy.reset(devices=2)
        # Lets a test of this module check that a broken build fails here rather than skips.
        fake_cupy.Config.compile_error = os.environ.get("GPUCC_FAKE_COMPILE_ERROR")
        saved = rt.import_cupy, rt._modules
        rt.import_cupy, rt._modules = (lambda: fake_cupy), {}
        try:
            yield fake_cupy
        finally:
            rt.import_cupy, rt._modules = saved
        return
    yield real_cupy()


def _bytes(rng: np.random.Generator, n: int) -> bytes:
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def _poisoned(cp: Any, n: int) -> Any:
    out = cp.empty(n, dtype=cp.uint8)
    out.fill(SENTINEL)
    return out


def _host(cp: Any, arr: Any) -> bytes:
    return bytes(cp.asnumpy(arr).tobytes())


def _sealed(
    tmp_path: Path, data: bytes, cs: int, name: str = "d.gcc"
) -> tuple[SealedDataset, bytes]:
    dk = fmt.new_dataset_key()
    path = tmp_path / name
    path.write_bytes(seal_bytes(data, dataset_key=dk, chunk_size=cs))
    return open_sealed(path), dk


def _kernels(cp: Any) -> Any:
    return rt._kernels(0)


def _gcm(key: bytes, iv: bytes, pt: bytes, aad: bytes) -> tuple[bytes, bytes]:
    enc = Cipher(algorithms.AES(key), modes.GCM(iv)).encryptor()
    enc.authenticate_additional_data(aad)
    ct = enc.update(pt) + enc.finalize()
    return ct, enc.tag


# --- the build and the load-time known answers ---------------------------------------------------


def test_the_kernels_build_and_pass_their_known_answers(cp: Any) -> None:
    """Fails (with the build log's error lines) where the kernels do not build."""
    gpu.require_gpu(0)
    assert gpu.unavailable_reason(0) is None
    kernels = rt._kernels(0)
    assert 256 in kernels.grids  # the production known answers ran at load
    for width in (64, 128, 256):  # every width of chunk sizes 4 KiB and up
        got, grid = rt._kernels_at(0, width)
        assert got is kernels and grid == kernels.grids[width]
        assert grid >= kernels.sm_count and grid % kernels.sm_count == 0
        print(f"persistent grid at {width} threads: {grid} CTAs on {kernels.sm_count} SMs")


# --- the device code on plain GCM messages -------------------------------------------------------


def test_spec_vectors_through_the_device_code(cp: Any) -> None:
    cases = json.loads(VECTORS.read_text())["cases"]
    assert len(cases) == 6
    for c in cases:
        key, iv, aad, pt, ct, tag = (
            bytes.fromhex(c[k]) for k in ("key", "iv", "aad", "plaintext", "ciphertext", "tag")
        )
        assert _gcm(key, iv, pt, aad) == (ct, tag), c["name"]  # the file itself
        assert rt._gcm_message(_kernels(cp), cp, key, iv, aad, pt, seal=True) == (ct, tag)
        assert rt._gcm_message(_kernels(cp), cp, key, iv, aad, ct, seal=False) == (pt, tag)


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 255, 256, 257, 1023, 1024, 1025, 4096, 70001])
def test_random_messages_through_the_device_code(cp: Any, rng: np.random.Generator, n: int) -> None:
    for aad_len in (0, 1, 41):
        key, iv, aad, pt = _bytes(rng, 32), _bytes(rng, 12), _bytes(rng, aad_len), _bytes(rng, n)
        ct, tag = _gcm(key, iv, pt, aad)
        assert rt._gcm_message(_kernels(cp), cp, key, iv, aad, pt, seal=True) == (ct, tag)
        assert rt._gcm_message(_kernels(cp), cp, key, iv, aad, ct, seal=False) == (pt, tag)
        wrong = bytes([ct[0] ^ 1]) + ct[1:] if ct else ct
        if ct:
            assert rt._gcm_message(_kernels(cp), cp, key, iv, aad, wrong, seal=False)[1] != tag


# --- sealed round trips --------------------------------------------------------------------------


def _boundaries(cs: int) -> list[int]:
    return [0, 1, 15, 16, 17, cs - 16, cs - 1, cs, cs + 1, cs + 16, 2 * cs - 1, 3 * cs, 5 * cs + 7]


@pytest.mark.parametrize("cs", [4 * KIB, 4 * KIB + 16, 64 * KIB, 1 * MIB])
def test_every_chunk_boundary_round_trips(
    cp: Any, tmp_path: Path, rng: np.random.Generator, cs: int
) -> None:
    for size in _boundaries(cs):
        data = _bytes(rng, size)
        dataset, dk = _sealed(tmp_path, data, cs, name=f"{size}.gcc")
        out = _poisoned(cp, size)
        assert gpu.stage_gpu(dataset, dk, out=out, batch_bytes=3 * (cs + 16)) is out
        assert _host(cp, out) == data, size


@pytest.mark.parametrize(
    ("size", "cs"),
    [(64 * MIB + 3, 4 * MIB), (48 * MIB, 16 * MIB), (32 * MIB + 100, 64 * KIB), (9 * MIB, 4 * KIB)],
)
def test_larger_round_trips(
    cp: Any, tmp_path: Path, rng: np.random.Generator, size: int, cs: int
) -> None:
    data = _bytes(rng, size)
    dataset, dk = _sealed(tmp_path, data, cs)
    out = _poisoned(cp, size)
    gpu.stage_gpu(dataset, dk, out=out)
    assert _host(cp, out) == data


def test_small_chunks_are_batched_and_not_much_slower(
    cp: Any, tmp_path: Path, rng: np.random.Generator
) -> None:
    """64 KiB chunks: many per launch. Correct, and reported beside 4 MiB chunks."""
    data = _bytes(rng, 128 * MIB)
    times = {}
    for cs in (64 * KIB, 4 * MIB):
        dataset, dk = _sealed(tmp_path, data, cs, name=f"{cs}.gcc")
        raw = dataset.path.read_bytes()[dataset.header.chunks_offset :]
        records = cp.asarray(np.frombuffer(raw, dtype=np.uint8))
        out = _poisoned(cp, len(data))
        gpu.decrypt_records_gpu(records, dataset.header, dk, out=out)  # warm up
        start = time.perf_counter()
        gpu.decrypt_records_gpu(records, dataset.header, dk, out=out)
        times[cs] = time.perf_counter() - start
        assert _host(cp, out) == data
    print(
        f"device-resident open, 128 MiB: 64 KiB chunks {times[64 * KIB] * 1e3:.1f} ms, "
        f"4 MiB chunks {times[4 * MIB] * 1e3:.1f} ms"
    )


@pytest.mark.parametrize("size", [0, 1, 4 * KIB - 1, 4 * KIB, 4 * KIB + 1, 3 * MIB + 11])
def test_plaintext_input_round_trips(
    cp: Any, tmp_path: Path, rng: np.random.Generator, size: int
) -> None:
    data = _bytes(rng, size)
    (tmp_path / "p.bin").write_bytes(data)
    out = _poisoned(cp, size)
    gpu.stage_plaintext_gpu(tmp_path / "p.bin", chunk_size=4 * KIB, out=out, batch_bytes=64 * KIB)
    assert _host(cp, out) == data


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("GPUCC_GPU_BIG") != "1", reason="set GPUCC_GPU_BIG=1")
def test_multi_gib_round_trip(cp: Any, tmp_path: Path, rng: np.random.Generator) -> None:
    size = 4 * GIB + 12345
    data = _bytes(rng, size)
    dataset, dk = _sealed(tmp_path, data, 4 * MIB)
    out = _poisoned(cp, size)
    gpu.stage_gpu(dataset, dk, out=out)
    # Compare on the device, then spot-check on the host.
    expect = cp.asarray(np.frombuffer(data, dtype=np.uint8))
    assert bool((out == expect).all())
    del expect
    for at in (0, GIB, size - 4 * MIB):
        assert _host(cp, out[at : at + 4 * MIB]) == data[at : at + 4 * MIB]


# --- sealing on the GPU --------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 4 * KIB, 4 * KIB + 1, 10 * MIB + 5])
def test_gpu_sealed_opens_with_cryptography_and_matches_the_cpu_sealer(
    cp: Any, tmp_path: Path, rng: np.random.Generator, size: int
) -> None:
    data = _bytes(rng, size)
    kek = fmt.new_dataset_key()
    dev = cp.asarray(np.frombuffer(data, dtype=np.uint8))
    blob = gpu.seal_gpu(dev, kek=kek, chunk_size=64 * KIB)
    (tmp_path / "g.gcc").write_bytes(blob)
    dataset = open_sealed(tmp_path / "g.gcc")
    dk = dataset.unwrap(kek)
    assert stage_cpu(dataset, dk).tobytes() == data  # cryptography opens what the GPU sealed
    same = gpu.seal_gpu(dev, dataset_key=dk, chunk_size=64 * KIB, dataset_id=dataset.dataset_id)
    cpu = seal_bytes(data, dataset_key=dk, chunk_size=64 * KIB, dataset_id=dataset.dataset_id)
    assert same == cpu
    # and the reverse: the GPU opens what cryptography sealed
    out = _poisoned(cp, size)
    (tmp_path / "c.gcc").write_bytes(cpu)
    gpu.stage_gpu(open_sealed(tmp_path / "c.gcc"), dk, out=out)
    assert _host(cp, out) == data


# --- the tamper matrix ---------------------------------------------------------------------------

CS = 64 * KIB
N = 7


@pytest.fixture
def tamper(tmp_path: Path, rng: np.random.Generator) -> tuple[Path, bytes, bytes]:
    data = _bytes(rng, (N - 1) * CS + 3 * CS // 4 + 5)
    dataset, dk = _sealed(tmp_path, data, CS)
    return dataset.path, data, dk


def _flip(path: Path, offset: int, bit: int = 0) -> None:
    blob = bytearray(path.read_bytes())
    blob[offset] ^= 1 << bit
    path.write_bytes(bytes(blob))


def _assert_failed_at(cp: Any, path: Path, dk: bytes, data: bytes, index: int) -> None:
    out = _poisoned(cp, len(data))
    with pytest.raises(ChunkAuthenticationError) as info:
        gpu.stage_gpu(open_sealed(path), dk, out=out, batch_bytes=2 * (CS + 16))
    assert info.value.chunk_index == index and isinstance(info.value, IntegrityError)
    host = _host(cp, out)
    assert host[: index * CS] == data[: index * CS]
    assert not any(host[index * CS :])  # no unverified plaintext, not even the sentinel


@pytest.mark.parametrize("index", range(N))
@pytest.mark.parametrize("where", ["first", "middle", "last", "tag"])
def test_flipped_bit_in_a_chunk_or_its_tag(
    cp: Any, tamper: tuple[Path, bytes, bytes], index: int, where: str
) -> None:
    path, data, dk = tamper
    header = open_sealed(path).header
    start, length = header.chunk_offset(index), header.chunk_length(index)
    offset = {"first": 0, "middle": length // 2, "last": length - 1, "tag": length + 15}[where]
    _flip(path, start + offset, bit=index % 8)
    _assert_failed_at(cp, path, dk, data, index)


@pytest.mark.parametrize("offset", [0, 8, 10, 12, 16, 20, 32, 40, 48, 52, 63, 64, 79])
def test_flipped_bit_in_a_header_field(
    cp: Any, tamper: tuple[Path, bytes, bytes], offset: int
) -> None:
    path, data, dk = tamper
    _flip(path, offset)
    out = _poisoned(cp, len(data))
    with pytest.raises((MalformedDatasetError, HeaderAuthenticationError)):
        gpu.stage_gpu(open_sealed(path), dk, out=out)
    assert _host(cp, out) == bytes([SENTINEL]) * len(data)  # nothing was decrypted


def test_swapped_chunks(cp: Any, tamper: tuple[Path, bytes, bytes]) -> None:
    path, data, dk = tamper
    header = open_sealed(path).header
    blob = bytearray(path.read_bytes())
    a, b, rec = header.chunk_offset(2), header.chunk_offset(3), CS + 16
    blob[a : a + rec], blob[b : b + rec] = blob[b : b + rec], blob[a : a + rec]
    path.write_bytes(bytes(blob))
    _assert_failed_at(cp, path, dk, data, 2)


def test_dropped_and_truncated(cp: Any, tamper: tuple[Path, bytes, bytes]) -> None:
    path, data, dk = tamper
    header = open_sealed(path).header
    blob = path.read_bytes()
    start = header.chunk_offset(3)
    # The length is judged against the authenticated header: missing chunks are named.
    path.write_bytes(blob[:start] + blob[start + CS + 16 :])  # a chunk dropped
    with pytest.raises(ChunkAuthenticationError):
        open_sealed(path).check_key(dk)
    path.write_bytes(blob[: header.chunk_offset(N - 1)])  # the last chunk dropped
    with pytest.raises(ChunkAuthenticationError, match=f"chunk {N - 1} is missing"):
        open_sealed(path).check_key(dk)
    path.write_bytes(blob[:-7])  # truncated
    with pytest.raises(ChunkAuthenticationError, match=f"chunk {N - 1} is cut off"):
        open_sealed(path).check_key(dk)
    # Past the framing checks (records already on the device), the chunk AAD still catches it:
    records = blob[header.chunks_offset :]
    rec = CS + 16
    dropped = records[: 3 * rec] + records[4 * rec :]
    with pytest.raises(ChunkAuthenticationError) as info:
        gpu.decrypt_records_gpu(
            cp.asarray(np.frombuffer(dropped, np.uint8)),
            fmt.Header(
                chunk_size=CS,
                dataset_id=header.dataset_id,
                plaintext_length=header.plaintext_length - CS,
            ),
            dk,
        )
    assert info.value.chunk_index == 0  # another header digest: nothing verifies
    # The dataset's own records open (the final chunk's flag and length included).
    opened = gpu.decrypt_records_gpu(cp.asarray(np.frombuffer(records, np.uint8)), header, dk)
    assert _host(cp, opened) == data
    # A middle run of records opens in place (first_chunk) and nowhere else.
    middle = cp.asarray(np.frombuffer(records[2 * rec : 5 * rec], np.uint8))
    assert (
        _host(cp, gpu.decrypt_records_gpu(middle, header, dk, first_chunk=2))
        == data[2 * CS : 5 * CS]
    )
    with pytest.raises(ChunkAuthenticationError) as info:
        gpu.decrypt_records_gpu(middle, header, dk, first_chunk=1)
    assert info.value.chunk_index == 1


def test_spliced_from_another_dataset_and_wrong_key(
    cp: Any, tmp_path: Path, tamper: tuple[Path, bytes, bytes], rng: np.random.Generator
) -> None:
    path, data, dk = tamper
    header = open_sealed(path).header
    other = seal_bytes(_bytes(rng, len(data)), dataset_key=dk, chunk_size=CS)
    blob = bytearray(path.read_bytes())
    at = header.chunk_offset(4)
    blob[at : at + CS + 16] = other[at : at + CS + 16]
    path.write_bytes(bytes(blob))
    _assert_failed_at(cp, path, dk, data, 4)
    out = _poisoned(cp, len(data))
    with pytest.raises(HeaderAuthenticationError):
        gpu.stage_gpu(open_sealed(path), fmt.new_dataset_key(), out=out)
    assert _host(cp, out) == bytes([SENTINEL]) * len(data)
    records = cp.asarray(np.frombuffer(bytes(blob[header.chunks_offset :]), np.uint8))
    with pytest.raises(ChunkAuthenticationError) as info:
        gpu.decrypt_records_gpu(records, header, fmt.new_dataset_key(), out=out)
    assert info.value.chunk_index == 0 and not any(_host(cp, out))


def test_two_bad_chunks_name_the_lower(cp: Any, tamper: tuple[Path, bytes, bytes]) -> None:
    path, data, dk = tamper
    header = open_sealed(path).header
    for index in (5, 1):
        _flip(path, header.chunk_offset(index) + 100)
    for _ in range(3):
        _assert_failed_at(cp, path, dk, data, 1)


# --- interop, scrubbing, several GPUs ------------------------------------------------------------


def test_dlpack_and_scrub(cp: Any, tmp_path: Path, rng: np.random.Generator) -> None:
    data = _bytes(rng, 3 * MIB + 1)
    dataset, dk = _sealed(tmp_path, data, 1 * MIB)
    with gpu.gpu_staging(dataset, dk) as staged:
        arr = staged.array
        if not FAKE:
            try:
                torch: Any = importlib.import_module("torch")
            except ImportError:
                view = cp.from_dlpack(arr)
                assert _host(cp, view) == data
            else:
                tensor = torch.from_dlpack(arr)
                assert tensor.is_cuda and tensor.numel() == len(data)
                assert bytes(tensor.cpu().numpy().tobytes()) == data
        assert _host(cp, arr) == data
    assert not any(_host(cp, arr))  # zeroed on exit


def test_several_gpus(cp: Any, tmp_path: Path, rng: np.random.Generator) -> None:
    count = gpu.gpu_count()
    if count < 2:
        pytest.skip("needs two GPUs")
    data = _bytes(rng, 33 * MIB + 5)
    dataset, dk = _sealed(tmp_path, data, 1 * MIB)
    shards = gpu.stage_gpu_sharded(dataset, dk, gpus=count)
    assert [s.device for s in shards] == list(range(count))
    assert b"".join(_host(cp, s.array) for s in shards) == data
