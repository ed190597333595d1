"""The GPU digest path: real CuPy where a GPU exists, and its orchestration everywhere nvcc is.

* ``gpu`` tests run ``staging.model.digest_gpu`` on a real device (skipped cleanly without CuPy
  or a GPU) and compare every digest with the CPU path, hashlib and the blake3 package.
* ``nvcc`` tests swap in ``tests/support/fake_hash_cupy.py``: the same launches, run through the host
  build of the kernels' job functions, so offsets, batching and the per-level BLAKE3 tree
  launches are checked without a GPU.
"""

from __future__ import annotations

import hashlib
import importlib
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest

from gpucc.cli.exitcodes import exit_code_for
from gpucc.staging.errors import GpuStagingUnavailableError
from gpucc.staging.model import digest_gpu, digest_model, make_serialization, verify_model
from tests.support import fake_hash_cupy
from tests.support.paths import ROOT
from tests.unit.staging.test_model_library import make_model

KERNELS = ROOT / "staging" / "kernels"
NVCC = shutil.which("nvcc")


def _big_model(root: Path) -> Path:
    make_model(root)
    rng = random.Random(7)
    (root / "big.bin").write_bytes(rng.randbytes(300 * 1024 + 5))  # a 9-level BLAKE3 tree
    (root / "one-chunk.bin").write_bytes(rng.randbytes(1024))
    return root


@pytest.fixture
def fake_gpu(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    lib = tmp_path_factory.mktemp("hh") / "hash_harness.so"
    subprocess.run(
        [NVCC, "-x", "cu", "-std=c++17", "-O2", "-shared", "-Xcompiler", "-fPIC",
         "-DHASH_HARNESS_LIBRARY", "-o", str(lib), str(KERNELS / "hash_harness.cu")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    import ctypes

    monkeypatch.setattr(fake_hash_cupy, "LIBRARY", ctypes.CDLL(str(lib)))
    monkeypatch.setitem(sys.modules, "cupy", fake_hash_cupy)
    monkeypatch.setattr(digest_gpu, "_built", {})
    fake_hash_cupy.launches.clear()
    yield fake_hash_cupy


@pytest.mark.nvcc
@pytest.mark.parametrize(
    ("hash_type", "shard"), [("sha256", 4096), ("sha256", None), ("blake3", None)]
)
def test_gpu_path_equals_cpu_path(
    fake_gpu: Any, tmp_path: Path, hash_type: str, shard: int | None
) -> None:
    model = _big_model(tmp_path / "m")
    ser = make_serialization(model, hash_type=hash_type, shard_size=shard)
    assert digest_gpu.available()
    gpu = digest_model(model, ser, device="gpu")
    assert gpu.to_bytes() == digest_model(model, ser, device="cpu").to_bytes()
    if hash_type == "blake3":
        levels = [n for name, n in fake_gpu.launches if name == "blake3_parents"]
        assert len(levels) >= 9  # one launch per tree level of big.bin


@pytest.mark.nvcc
def test_gpu_path_batches_and_detects_tampering(
    fake_gpu: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _big_model(tmp_path / "m")
    monkeypatch.setattr(digest_gpu, "_BATCH", 10_000)  # many uploads
    ser = make_serialization(model, shard_size=1000)
    trusted = digest_model(model, ser, device="cpu")
    assert verify_model(model, trusted, device="gpu").ok
    data = bytearray((model / "big.bin").read_bytes())
    data[123_456] ^= 2
    (model / "big.bin").write_bytes(data)
    result = verify_model(model, trusted, device="gpu")
    assert [(p.kind, p.name) for p in result.problems] == [("mismatch", "big.bin:123000:124000")]


@pytest.mark.nvcc
def test_device_buffers_and_dlpack(fake_gpu: Any, tmp_path: Path) -> None:
    rng = random.Random(3)
    blobs = [rng.randbytes(n) for n in (0, 1, 5000, 70_000)]
    arrays = [np.frombuffer(b, dtype=np.uint8).copy() for b in blobs]  # DLPack producers
    got = digest_gpu.digest_device_buffers(arrays, "sha256", shard_size=4096)
    assert got == [
        [hashlib.sha256(b[s : s + 4096]).digest() for s in range(0, len(b), 4096)] for b in blobs
    ]
    assert digest_gpu.digest_device_buffers(arrays, "blake3") == [
        [blake3.blake3(b).digest()] for b in blobs
    ]
    floats = np.arange(1000, dtype=np.float32)  # any dtype: its bytes are hashed
    (digest,) = digest_gpu.digest_device_buffers([floats])[0]
    assert digest == hashlib.sha256(floats.tobytes()).digest()


@pytest.mark.nvcc
def test_verify_device_buffers_against_a_manifest(fake_gpu: Any, tmp_path: Path) -> None:
    model = _big_model(tmp_path / "m")
    trusted = digest_model(model, make_serialization(model, shard_size=4096))
    loaded = {
        name: np.frombuffer((model / name).read_bytes(), dtype=np.uint8).copy()
        for name in ("big.bin", "weights.bin")
    }
    assert not digest_gpu.verify_device_buffers(loaded, trusted).ok  # the rest is missing
    assert digest_gpu.verify_device_buffers(loaded, trusted, partial=True).ok
    loaded["weights.bin"][7] ^= 1
    result = digest_gpu.verify_device_buffers(loaded, trusted, partial=True)
    assert [(p.kind, p.name) for p in result.problems] == [("mismatch", "weights.bin:0:4096")]


def test_no_cupy_is_a_clean_environment_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    monkeypatch.setattr(digest_gpu, "_built", {})
    assert not digest_gpu.available()
    model = make_model(tmp_path / "m")
    with pytest.raises(GpuStagingUnavailableError) as info:
        digest_model(model, make_serialization(model), device="gpu")
    assert exit_code_for(info.value) == 5
    assert digest_model(model, make_serialization(model), device="auto").resources


# --- a real GPU ------------------------------------------------------------------------------


def _real_gpu() -> None:
    try:
        importlib.import_module("cupy")
    except ImportError:
        pytest.skip("CuPy is not installed")
    if not digest_gpu.available():
        pytest.skip("no usable CUDA GPU")


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("hash_type", "shard"), [("sha256", 4096), ("sha256", None), ("blake3", None)]
)
def test_real_gpu_equals_cpu(tmp_path: Path, hash_type: str, shard: int | None) -> None:
    _real_gpu()
    model = _big_model(tmp_path / "m")
    ser = make_serialization(model, hash_type=hash_type, shard_size=shard)
    assert digest_model(model, ser, device="gpu").to_bytes() == digest_model(model, ser).to_bytes()


@pytest.mark.gpu
def test_real_gpu_device_buffers(tmp_path: Path) -> None:
    _real_gpu()
    cupy: Any = importlib.import_module("cupy")
    rng = random.Random(5)
    blobs = [rng.randbytes(n) for n in (0, 3, 1024, 1025, 3 * 1024 * 1024 + 11)]
    arrays = [cupy.asarray(np.frombuffer(b, dtype=np.uint8)) for b in blobs]
    assert digest_gpu.digest_device_buffers(arrays, "blake3") == [
        [blake3.blake3(b).digest()] for b in blobs
    ]
    got = digest_gpu.digest_device_buffers(arrays, "sha256", shard_size=1 << 20)
    assert got == [
        [hashlib.sha256(b[s : s + (1 << 20)]).digest() for s in range(0, len(b), 1 << 20)]
        for b in blobs
    ]
    try:
        torch: Any = importlib.import_module("torch")
    except ImportError:
        return
    t = torch.arange(10_000, dtype=torch.float16, device="cuda")
    (d,) = digest_gpu.digest_device_buffers([t])[0]
    assert d == hashlib.sha256(t.cpu().numpy().tobytes()).digest()
