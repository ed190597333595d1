"""Faults named right: a kernel that does not build, a self-test that faults or computes a wrong
answer, and a launch that faults on real work are distinct :class:`GpuKernelError` stages, for
the dataset kernels, the message kernels and the model-digest kernels alike.

Faults are injected where they happen on a GPU: a build error from the compiler, an
out-of-bounds access compiled into one kernel (the CPU execution stops that launch, as an
illegal-address error stops a CUDA launch), a kernel that computes a wrong answer, and a
launch fault on the first launch after start-up.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from gpucc.staging import _gpu_kat as kat
from gpucc.staging import _gpu_runtime as rt
from gpucc.staging.errors import GpuKernelError
from gpucc.staging.gpu_messages import DeviceKeyring
from gpucc.staging.model import digest_gpu
from tests.support.cudacpu import backend


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    cp = backend.install(monkeypatch, sm_count=1, occupancy=1, seed=7)
    monkeypatch.setattr(kat, "_KAT_TILES", 3)
    yield cp


def _mutate(monkeypatch: pytest.MonkeyPatch, module: Any, old: str, new: str) -> None:
    source = module._kernel_source() if module is rt else module.kernel_source()
    assert source.count(old) == 1, old
    name = "_kernel_source" if module is rt else "kernel_source"
    monkeypatch.setattr(module, name, lambda: source.replace(old, new))


def _fault_after_start_up(monkeypatch: pytest.MonkeyPatch, kernel: str) -> None:
    """From now on, every launch of ``kernel`` faults (as an illegal address would)."""
    run = backend.RawKernel._run

    def faulting(self: Any, *args: Any) -> None:
        if self.name == kernel:
            raise backend.LaunchError(f"{kernel}: injected illegal-address fault")
        run(self, *args)

    monkeypatch.setattr(backend.RawKernel, "_run", faulting)


# --- the dataset and message kernels (one module) -------------------------------------------------


def test_dataset_kernels_that_do_not_build(cpu: Any) -> None:
    cpu.Config.compile_error = "aesgcm.cu(12): error: injected"
    with pytest.raises(GpuKernelError) as info:
        rt.require_gpu(0)
    assert info.value.stage == "build" and "did not build" in str(info.value)


def test_a_faulting_self_test_is_a_known_answer_failure_not_a_build_failure(
    cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gcm_selftest writes one byte past its 16-byte tag buffer.
    _mutate(monkeypatch, rt, "for (int i = 0; i < 16; ++i) {\n            tag_out[i]",
            "for (int i = 0; i < 17; ++i) {\n            tag_out[i]")  # fmt: skip
    with pytest.raises(GpuKernelError) as info:
        rt.require_gpu(0)
    assert info.value.stage == "known-answer"
    assert "could not run" in str(info.value) and "out-of-bounds" in str(info.value)


def test_a_wrong_self_test_answer_is_a_known_answer_failure(
    cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _mutate(monkeypatch, rt, "tag_out[i] = static_cast<u8>(tag[i >> 2] >> (8 * (i & 3)));",
            "tag_out[i] = static_cast<u8>(tag[i >> 2] >> (8 * (i & 3))) ^ 1u;")  # fmt: skip
    with pytest.raises(GpuKernelError) as info:
        rt.require_gpu(0)
    assert info.value.stage == "known-answer" and "failed their known-answer" in str(info.value)


def test_a_faulting_message_self_test_is_a_known_answer_failure(
    cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gcm_msgs_finalize writes its verdicts one message past the status buffer.
    _mutate(monkeypatch, rt, "status[m] = bad;", "status[m + nmsgs] = bad;")
    rt.require_gpu(0)  # the dataset kernels pass: the message kernels are checked on first use
    with pytest.raises(GpuKernelError) as info:
        DeviceKeyring([os.urandom(32)])
    assert info.value.stage == "known-answer" and "could not run" in str(info.value)


# --- the model-digest kernels ---------------------------------------------------------------------


def test_digest_kernels_that_do_not_build(cpu: Any) -> None:
    cpu.Config.compile_error = "sha256.cu(3): error: injected"
    with pytest.raises(GpuKernelError) as info:
        digest_gpu.digest_device_buffers([cpu.zeros(4, dtype=cpu.uint8)])
    assert info.value.stage == "build" and info.value.log


def test_a_faulting_digest_self_test_is_not_reported_as_a_build_failure(
    cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread past the shards reads an offset out of bounds during the self-test."""
    _mutate(monkeypatch, digest_gpu, "if (i < count) {", "if (i <= count) {")
    with pytest.raises(GpuKernelError) as info:
        digest_gpu.digest_device_buffers([cpu.zeros(4, dtype=cpu.uint8)])
    assert info.value.stage == "known-answer"
    assert "self-test could not run" in str(info.value) and "out-of-bounds" in str(info.value)


def test_a_wrong_digest_self_test_answer_is_a_known_answer_failure(
    cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _mutate(monkeypatch, digest_gpu, "hashk::sha256_shard_job(base, offset, len, i, out);",
            "hashk::sha256_shard_job(base, offset, len, i, out);\n        out[8 * i] ^= 1u;")  # fmt: skip
    with pytest.raises(GpuKernelError) as info:
        digest_gpu.digest_device_buffers([cpu.zeros(4, dtype=cpu.uint8)])
    assert info.value.stage == "known-answer" and "failed" in str(info.value)


@pytest.mark.parametrize(
    "hash_type,kernel", [("sha256", "sha256_shards"), ("blake3", "blake3_chunks")]
)
def test_a_digest_launch_fault_after_start_up_is_a_launch_failure(
    cpu: Any, monkeypatch: pytest.MonkeyPatch, hash_type: str, kernel: str
) -> None:
    data = cpu.asarray(np.frombuffer(os.urandom(3000), dtype=np.uint8))
    assert digest_gpu.digest_device_buffers([data], hash_type)  # start-up passed
    _fault_after_start_up(monkeypatch, kernel)
    with pytest.raises(GpuKernelError) as info:
        digest_gpu.digest_device_buffers([data], hash_type)
    assert info.value.stage == "launch" and "injected" in str(info.value)
