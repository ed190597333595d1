"""Verifying without holding the dataset (staging/verify.py): the same verdicts as staging,
bounded memory, and every buffer that held plaintext zeroed on success and on failure."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from gpucc import staging
from gpucc.core.errors import MalformedInputError
from gpucc.staging import format as fmt
from gpucc.staging import verify
from gpucc.staging.chunks import zero
from gpucc.staging.cpu import stage_cpu
from gpucc.staging.dataset import open_sealed
from gpucc.staging.errors import (
    ChunkAuthenticationError,
    HeaderAuthenticationError,
    MalformedDatasetError,
)
from gpucc.staging.seal import seal_file

CS = 4096
SIZES = [0, 1, 17, CS - 1, CS, CS + 1, 5 * CS + 7, 8 * CS]


def _sealed(tmp_path: Path, size: int, seed: int = 1) -> tuple[Path, bytes]:
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    (tmp_path / "p.bin").write_bytes(data)
    kek = fmt.new_dataset_key()
    seal_file(tmp_path / "p.bin", tmp_path / "p.gcc", kek=kek, chunk_size=CS)
    return tmp_path / "p.gcc", open_sealed(tmp_path / "p.gcc").unwrap(kek)


class _Zeroes:
    """Records every buffer verify.py zeroes (through the real zero)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.buffers: list[bytearray] = []
        real = zero

        def spy(buf: bytearray) -> None:
            real(buf)
            self.buffers.append(buf)

        monkeypatch.setattr(verify, "zero", spy)

    def all_zero(self) -> bool:
        return bool(self.buffers) and all(not any(buf) for buf in self.buffers)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("threads", [1, 3])
def test_every_chunk_verified_in_a_bounded_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, threads: int
) -> None:
    path, key = _sealed(tmp_path, size)
    zeroes = _Zeroes(monkeypatch)
    seen: list[tuple[int, int]] = []
    result = verify.verify_cpu(
        open_sealed(path), key, threads=threads, progress=lambda d, t: seen.append((d, t))
    )
    header = open_sealed(path).header
    assert result.plaintext_length == size and result.chunk_count == header.chunk_count
    window = min(threads, header.chunk_count)
    assert result.held_bytes == window * min(CS, size)
    # two buffers per slot (ct || tag, and the plaintext it opens into), never overlapping
    assert result.scrubbed and zeroes.all_zero() and len(zeroes.buffers) == 2 * window
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[-1] == (size, size)


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("where", ["first", "middle", "last", "tag"])
def test_a_tampered_chunk_fails_like_staging_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int, where: str
) -> None:
    path, key = _sealed(tmp_path, 6 * CS + 100)
    header = open_sealed(path).header
    index = {"first": 0, "middle": 3, "last": header.chunk_count - 1, "tag": 2}[where]
    offset = header.chunk_offset(index) + (
        header.chunk_length(index) + 5 if where == "tag" else header.chunk_length(index) // 2
    )
    sealed = bytearray(path.read_bytes())
    sealed[offset] ^= 0x40
    path.write_bytes(sealed)
    with pytest.raises(ChunkAuthenticationError) as staged:
        stage_cpu(open_sealed(path), key, threads=threads)
    zeroes = _Zeroes(monkeypatch)
    with pytest.raises(ChunkAuthenticationError) as verified:
        verify.verify_cpu(open_sealed(path), key, threads=threads)
    assert verified.value.chunk_index == staged.value.chunk_index == index
    assert zeroes.all_zero()


def test_the_lowest_failing_chunk_is_reported(tmp_path: Path) -> None:
    path, key = _sealed(tmp_path, 9 * CS)
    header = open_sealed(path).header
    sealed = bytearray(path.read_bytes())
    for index in (7, 2, 5):
        sealed[header.chunk_offset(index)] ^= 1
    path.write_bytes(sealed)
    for threads in (1, 2, 4):
        with pytest.raises(ChunkAuthenticationError) as failed:
            verify.verify_cpu(open_sealed(path), key, threads=threads)
        assert failed.value.chunk_index == 2


def test_swapped_chunks_fail(tmp_path: Path) -> None:
    path, key = _sealed(tmp_path, 4 * CS)
    header = open_sealed(path).header
    sealed = bytearray(path.read_bytes())
    a, b = header.chunk_offset(1), header.chunk_offset(2)
    step = CS + fmt.TAG_SIZE
    sealed[a : a + step], sealed[b : b + step] = sealed[b : b + step], sealed[a : a + step]
    path.write_bytes(sealed)
    with pytest.raises(ChunkAuthenticationError) as failed:
        verify.verify_cpu(open_sealed(path), key, threads=2)
    assert failed.value.chunk_index == 1


def test_wrong_key_decrypts_nothing(tmp_path: Path) -> None:
    path, _key = _sealed(tmp_path, 3 * CS)
    with pytest.raises(HeaderAuthenticationError):
        verify.verify_cpu(open_sealed(path), fmt.new_dataset_key())


@pytest.mark.parametrize("change", ["truncated", "grown", "header"])
def test_a_file_changed_after_it_was_opened_is_refused(tmp_path: Path, change: str) -> None:
    path, key = _sealed(tmp_path, 3 * CS)
    dataset = open_sealed(path)
    sealed = bytearray(path.read_bytes())
    if change == "truncated":
        sealed = sealed[:-1]
    elif change == "grown":
        sealed += b"\0"
    else:
        sealed[fmt.HEADER_SIZE - 1] ^= 1
    path.write_bytes(sealed)
    with pytest.raises(MalformedDatasetError, match="changed after it was opened"):
        verify.verify_cpu(dataset, key)


@pytest.mark.parametrize("size", [0, 1, CS, 3 * CS + 5])
def test_plaintext_is_sealed_in_transit_and_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    (tmp_path / "p.bin").write_bytes(os.urandom(size))
    zeroes = _Zeroes(monkeypatch)
    result = verify.verify_plaintext_cpu(tmp_path / "p.bin", chunk_size=CS, threads=2)
    assert result.plaintext_length == size and result.scrubbed and zeroes.all_zero()
    assert result.chunk_count == fmt.Header.new(size, chunk_size=CS).chunk_count


def test_plaintext_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MalformedInputError, match="not a regular file"):
        verify.verify_plaintext_cpu(tmp_path, chunk_size=CS)


def test_plan_verify_uses_the_window_on_the_cpu(tmp_path: Path) -> None:
    path, key = _sealed(tmp_path, 10 * CS)
    plan = staging.plan_stage(path, key=key, device="cpu")
    result = plan.verify(threads=2)
    assert result.held_bytes == 2 * CS < result.plaintext_length == 10 * CS
