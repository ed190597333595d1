"""The CPU execution of CUDA sources itself (tests/support/cudacpu): small kernels with one
known fault each must fail their launch, and their correct twins must compute the right thing.

A test tool that cannot fail proves nothing: these are the faults the kernel tests rely on it
to find (a shared-memory race, a divergent barrier, a shuffle without the whole warp, a
misaligned vector load, a read of shared memory nobody wrote).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.support.cudacpu import backend

SOURCE = r"""
typedef unsigned int u32;

// Each thread publishes a word, then reads its neighbour's: needs the barrier.
extern "C" __global__ void __launch_bounds__(128)
    neighbour(u32* __restrict__ out, u32 barrier) {
    __shared__ u32 s[128];
    s[threadIdx.x] = threadIdx.x * 3u + blockIdx.x;
    if (barrier != 0u) {
        __syncthreads();
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = s[(threadIdx.x + 1u) % blockDim.x];
}

// Thread 0 reads a word another thread then overwrites in the same barrier interval.
extern "C" __global__ void __launch_bounds__(64) overwrite(u32* __restrict__ out, u32 barrier) {
    __shared__ u32 s[64];
    s[threadIdx.x] = threadIdx.x;
    __syncthreads();
    if (threadIdx.x == 0u) {
        out[0] = s[40];
    }
    if (barrier != 0u) {
        __syncthreads();
    }
    if (threadIdx.x == 40u) {
        s[40] = 7u;
    }
}

// A warp sum by butterfly shuffles; `mask` is the shuffle mask.
extern "C" __global__ void __launch_bounds__(64) warp_sum(u32* __restrict__ out, u32 mask) {
    u32 v = threadIdx.x + 1u;
    for (int off = 16; off > 0; off >>= 1) {
        v += __shfl_xor_sync(mask, v, off);
    }
    out[threadIdx.x] = v;
}

// Threads of one block at two different barriers, or at one while the others have exited.
extern "C" __global__ void __launch_bounds__(64) divergent(u32* __restrict__ out, u32 how) {
    if (how == 0u) {
        __syncthreads();
    } else if (how == 1u) {
        if (threadIdx.x < 32u) {
            out[threadIdx.x + 64u] = 2u;
            __syncthreads();
        } else {
            __syncthreads();
            out[threadIdx.x + 64u] = 3u;
        }
    } else {
        if (threadIdx.x >= 32u) {
            return;
        }
        __syncthreads();
    }
    out[threadIdx.x] = 1u;
}

// A 16-byte vector load at `offset` bytes into `in`.
extern "C" __global__ void __launch_bounds__(32)
    vector_load(const unsigned char* __restrict__ in, u32* __restrict__ out, u32 offset) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(in + offset));
    out[threadIdx.x] = v.x ^ v.y ^ v.z ^ v.w;
}

// Reads word n + t of `in`.
extern "C" __global__ void __launch_bounds__(32)
    gather(const u32* __restrict__ in, u32* __restrict__ out, u32 n) {
    out[threadIdx.x] = in[n + threadIdx.x];
}

// Reads shared memory only half of the threads wrote.
extern "C" __global__ void __launch_bounds__(64) half_written(u32* __restrict__ out) {
    __shared__ u32 s[64];
    if (threadIdx.x < 32u) {
        s[threadIdx.x] = 0u;
    }
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}
"""


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    yield backend.install(monkeypatch)


def _run(cp: Any, name: str, grid: int, block: int, *args: Any, words: int = 512) -> list[int]:
    module = cp.RawModule(code=SOURCE)
    out = cp.zeros(words, dtype=cp.uint32)
    module.get_function(name)((grid,), (block,), (out, *args))
    return [int(v) for v in cp.asnumpy(out)]


def test_a_barrier_publishes_shared_memory_across_blocks(cpu: Any) -> None:
    got = _run(cpu, "neighbour", 3, 128, np.uint32(1))
    want = [((t + 1) % 128) * 3 + b for b in range(3) for t in range(128)]
    assert got[: 3 * 128] == want


racecheck = pytest.mark.skipif(
    backend.variant() != "check",
    reason="the race detector and bounds checks are in the 'check' build only",
)


@racecheck
def test_a_missing_barrier_is_a_race(cpu: Any) -> None:
    with pytest.raises(backend.LaunchError, match="shared-memory race: (read|write)-after-"):
        _run(cpu, "neighbour", 1, 128, np.uint32(0))


@racecheck
def test_a_write_and_another_threads_read_in_one_interval_is_a_race(cpu: Any) -> None:
    """Whichever warp runs first (the order is random), the pair is reported."""
    assert _run(cpu, "overwrite", 1, 64, np.uint32(1))[0] == 40
    with pytest.raises(backend.LaunchError, match="shared-memory race: (read|write)-after-"):
        _run(cpu, "overwrite", 1, 64, np.uint32(0))


def test_warp_shuffles_exchange_within_each_warp(cpu: Any) -> None:
    got = _run(cpu, "warp_sum", 1, 64, np.uint32(0xFFFFFFFF))
    assert got[:64] == [sum(range(1, 33))] * 32 + [sum(range(33, 65))] * 32
    with pytest.raises(backend.LaunchError, match="mask 0xffff "):
        _run(cpu, "warp_sum", 1, 64, np.uint32(0xFFFF))


def test_divergent_barriers_are_reported(cpu: Any) -> None:
    assert _run(cpu, "divergent", 2, 64, np.uint32(0))[:64] == [1] * 64
    with pytest.raises(backend.LaunchError, match="divergent __syncthreads"):
        _run(cpu, "divergent", 1, 64, np.uint32(1))
    with pytest.raises(backend.LaunchError, match="exited"):
        _run(cpu, "divergent", 1, 64, np.uint32(2))


def test_a_misaligned_vector_load_faults(cpu: Any) -> None:
    module = cpu.RawModule(code=SOURCE)
    data = cpu.asarray(np.arange(64, dtype=np.uint8))
    out = cpu.zeros(32, dtype=cpu.uint32)
    kernel = module.get_function("vector_load")
    kernel((1,), (32,), (data, out, np.uint32(16)))
    assert int(cpu.asnumpy(out)[0]) == _xor16(16)
    with pytest.raises(backend.LaunchError, match="misaligned"):
        kernel((1,), (32,), (data, out, np.uint32(4)))
        cpu.asnumpy(out)


def _xor16(start: int) -> int:
    words = np.frombuffer(bytes(range(start, start + 16)), dtype="<u4")
    return int(words[0] ^ words[1] ^ words[2] ^ words[3])


def test_shared_memory_nobody_wrote_holds_random_bytes(cpu: Any) -> None:
    got = _run(cpu, "half_written", 1, 64)
    assert got[:32] == [0] * 32
    assert sum(v != 0 for v in got[32:64]) >= 30  # poisoned before the block, not zeroed


@racecheck
def test_an_access_outside_the_launchs_buffers_faults(cpu: Any) -> None:
    """As compute-sanitizer's memcheck: the whole allocation behind a pointer argument is
    fair game (here a view of its first half), one word past its end is not."""
    module = cpu.RawModule(code=SOURCE)
    words = cpu.asarray(np.arange(64, dtype=np.uint32))
    out = cpu.zeros(32, dtype=cpu.uint32)
    kernel = module.get_function("gather")
    kernel((1,), (32,), (words[:32], out, np.uint32(32)))
    assert [int(v) for v in cpu.asnumpy(out)] == list(range(32, 64))
    with pytest.raises(backend.LaunchError, match="out-of-bounds access of 4 bytes"):
        kernel((1,), (32,), (words, out, np.uint32(33)))
        cpu.asnumpy(out)
