"""The stream's GPU path (device="cuda") against the CuPy stand-in of ``tests/support/fake_cupy.py``.

This checks the orchestration without a GPU: chunks read into host memory, opened by
``decrypt_records_gpu`` into a device array of their own, exposed through DLPack (emulated
here by a view of the stand-in's host array) and verified before they are yielded. The real device is covered by the ``gpu`` tests in ``test_torch_dataset.py``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gpucc.staging import seal_file
from gpucc.staging import torch_dataset as td
from gpucc.staging.errors import ChunkAuthenticationError
from gpucc.staging.shards import open_shard_set
from tests.support import fake_cupy

CHUNK = 4096
KEY = bytes(range(32))
DATA = b"".join(hashlib.sha256(i.to_bytes(4, "little")).digest() for i in range(700))[:21_000]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    fake_cupy.install(monkeypatch, seed=5)
    monkeypatch.setattr(torch.utils.dlpack, "from_dlpack", lambda a: torch.from_numpy(a._a))
    yield fake_cupy
    fake_cupy.reset()


@pytest.fixture
def sealed(tmp_path: Path) -> Path:
    src = tmp_path / "d.bin"
    src.write_bytes(DATA)
    dst = tmp_path / "d.gcc"
    seal_file(src, dst, dataset_key=KEY, chunk_size=CHUNK)
    return dst


def test_cuda_stream_yields_verified_chunks_of_their_own(fake: Any, sealed: Path) -> None:
    stream = td.SealedChunkStream(sealed, key=KEY, device="cuda", seed=2)
    order = stream.chunks()
    kept = list(stream)  # each in device memory of its own: intact after later chunks
    assert [bytes(t.numpy()) for t in kept] == [DATA[g * CHUNK : (g + 1) * CHUNK] for g in order]
    assert len({t.data_ptr() for t in kept}) == len(kept) == 6


def test_cuda_stream_tampered_chunk(fake: Any, sealed: Path) -> None:
    raw = bytearray(sealed.read_bytes())
    raw[open_shard_set(sealed, key=KEY).parts[0].header.chunk_offset(3) + 9] ^= 2
    sealed.write_bytes(bytes(raw))
    stream = td.SealedChunkStream(sealed, key=KEY, device="cuda", shuffle=False)
    got: list[bytes] = []
    kept: list[torch.Tensor] = []
    with pytest.raises(ChunkAuthenticationError) as info:
        for t in stream:
            got.append(bytes(t.numpy()))
            kept.append(t)
    assert (info.value.chunk_index, info.value.path) == (3, sealed)
    assert got == [DATA[g * CHUNK : (g + 1) * CHUNK] for g in range(3)]
    assert [bytes(t.numpy()) for t in kept] == got
