"""The model-digest kernels' arithmetic, checked on the host: no GPU needed, only ``nvcc``.

``staging/kernels/hash_harness.cu`` compiles the ``__host__ __device__`` job functions of
``hash_math.cuh`` (the same ones ``sha256.cu`` and ``blake3.cu`` run per GPU thread) into a host
program that emulates whole launches. Every answer is compared with ``hashlib`` and the
``blake3`` package. A second group compiles the kernels for ``sm_90`` and reads ptxas' report:
no spills, no stack frame; and the single source NVRTC builds must compile too.

Random inputs are fresh on every run; the seed is printed (set ``GPUCC_TEST_SEED`` to replay).
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import blake3
import pytest

from gpucc.staging.model import digest_gpu
from tests.support.nvcc import Harness, build_harness, ptxas_functions
from tests.support.paths import ROOT

pytestmark = pytest.mark.nvcc

KERNELS = ROOT / "staging" / "kernels"
NVCC = shutil.which("nvcc")


def _seed() -> int:
    env = os.environ.get("GPUCC_TEST_SEED")
    seed = int(env) if env else int.from_bytes(os.urandom(8), "big")
    print(f"GPUCC_TEST_SEED={seed}")
    return seed


@pytest.fixture(scope="session")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    exe = build_harness(
        tmp_path_factory, KERNELS / "hash_harness.cu", KERNELS / "hash_math.cuh", "hash-harness"
    )
    yield Harness(exe)


def _h(data: bytes) -> str:
    return data.hex() or "-"


def _list(values: Sequence[int]) -> str:
    return ",".join(map(str, values)) or "-"


# Lengths around every SHA-256 padding and BLAKE3 block/chunk/tree boundary.
EDGE_LENGTHS = [0, 1, 55, 56, 63, 64, 65, 119, 120, 127, 128, 1023, 1024, 1025, 2047, 2048, 2049,
                3072, 3073, 4096, 4097, 8 * 1024, 8 * 1024 + 1, 31 * 1024 + 7]  # fmt: skip


def test_sha256_messages_match_hashlib(harness: Harness) -> None:
    rng = random.Random(_seed())
    data = [rng.randbytes(n) for n in EDGE_LENGTHS + [rng.randrange(1, 20000) for _ in range(20)]]
    got = harness.run([f"sha256 {_h(d)}" for d in data])
    assert got == [hashlib.sha256(d).hexdigest() for d in data]


def test_sharded_launch_matches_hashlib_at_any_alignment(harness: Harness) -> None:
    rng = random.Random(_seed())
    buf = rng.randbytes(64 * 1024)
    for _ in range(10):
        offsets, lengths = [], []
        for _ in range(rng.randrange(1, 40)):
            start = rng.randrange(0, len(buf))
            offsets.append(start)
            room = len(buf) - start
            lengths.append(rng.choice([0, min(64, room), rng.randrange(0, room + 1)]))
        (line,) = harness.run([f"shards {_list(offsets)} {_list(lengths)} {buf.hex()}"])
        expect = [hashlib.sha256(buf[o : o + n]).hexdigest() for o, n in zip(offsets, lengths, strict=True)]  # fmt: skip
        assert line.split(",") == expect


def test_blake3_single_inputs_match_the_package(harness: Harness) -> None:
    rng = random.Random(_seed())
    data = [rng.randbytes(n) for n in EDGE_LENGTHS + [rng.randrange(1, 100_000) for _ in range(8)]]
    got = harness.run([f"blake3 0 {len(d)} {_h(d)}" for d in data])
    assert got == [blake3.blake3(d).hexdigest() for d in data]


def test_blake3_tree_shapes_up_to_many_chunks(harness: Harness) -> None:
    """Chunk counts 1..70 and around powers of two: every left-complete tree shape."""
    rng = random.Random(_seed())
    counts = list(range(1, 71)) + [127, 128, 129, 255, 256, 257]
    data = [rng.randbytes(1024 * (c - 1) + rng.randrange(1, 1025)) for c in counts]
    got = harness.run([f"blake3 0 {len(d)} {d.hex()}" for d in data])
    assert got == [blake3.blake3(d).hexdigest() for d in data]


def test_blake3_many_inputs_in_one_launch(harness: Harness) -> None:
    """Inputs of different sizes (some empty, some one chunk) finish at different levels."""
    rng = random.Random(_seed())
    for _ in range(5):
        lengths = [
            rng.choice([0, 1, 1024, rng.randrange(1, 40_000)]) for _ in range(rng.randrange(1, 12))
        ]
        pad = [rng.randrange(0, 20) for _ in lengths]  # gaps: arbitrary alignment
        offsets, pos = [], 0
        for n, gap in zip(lengths, pad, strict=True):
            pos += gap
            offsets.append(pos)
            pos += n
        buf = rng.randbytes(pos)
        (line,) = harness.run([f"blake3 {_list(offsets)} {_list(lengths)} {_h(buf)}"])
        expect = [blake3.blake3(buf[o : o + n]).hexdigest() for o, n in zip(offsets, lengths, strict=True)]  # fmt: skip
        assert line.split(",") == expect


def test_blake3_chunk_counter_and_root_flag(harness: Harness) -> None:
    """A chunk's chaining value depends on its index (the counter) and on the root flag."""
    rng = random.Random(_seed())
    chunk = rng.randbytes(1024)
    got = harness.run([f"b3chunk {chunk.hex()} {i} 0" for i in (0, 1, 2**32 + 5)])
    assert len(set(got)) == 3
    (root,) = harness.run([f"b3chunk {chunk.hex()} 0 1"])
    assert root == blake3.blake3(chunk).hexdigest()
    # Two chunks: the root is the parent of chunk 0 (index 0) and chunk 1 (index 1).
    two = chunk + rng.randbytes(1024)
    assert harness.run([f"blake3 0 2048 {two.hex()}"]) == [blake3.blake3(two).hexdigest()]


# --- the CUDA kernels themselves -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "kernels"),
    [("sha256.cu", {"sha256_shards"}), ("blake3.cu", {"blake3_chunks", "blake3_parents"})],
)
def test_kernels_compile_for_sm90_without_spills(
    tmp_path: Path, source: str, kernels: set[str]
) -> None:
    funcs = ptxas_functions(KERNELS / source, tmp_path / "k.cubin")
    assert set(funcs) == kernels
    for name, props in funcs.items():
        assert props["spill_stores"] == 0 and props["spill_loads"] == 0, (name, props)
        assert props["stack"] == 0, (name, props)
        # __launch_bounds__(128): at most 255 registers, and we stay well under it.
        assert props["registers"] <= 128, (name, props)


def test_the_source_cupy_compiles_is_the_same_kernels(tmp_path: Path) -> None:
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    source = tmp_path / "inlined.cu"
    source.write_text(digest_gpu.kernel_source())
    assert '#include "hash_math.cuh"' not in source.read_text()
    result = subprocess.run(
        [NVCC, "-arch=sm_90", "-ptx", "-std=c++17", "-o", str(tmp_path / "k.ptx"), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    ptx = (tmp_path / "k.ptx").read_text()
    for name in ("sha256_shards", "blake3_chunks", "blake3_parents"):
        assert f".entry {name}(" in ptx
