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
from gpucc.staging.errors import ChunkAuthenticationError, GpuKernelError
from gpucc.staging.format import Header
from gpucc.staging.gpu_messages import DeviceKeyring, DeviceMessage
from gpucc.staging.model import digest_gpu
from gpucc.staging.seal import seal_bytes
from tests.support.cudacpu import backend
from tests.unit.staging import test_kernel_secrets as secret_tests


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


# --- faults on real work, after start-up: datasets -----------------------------------------------

CS = 4096
STRIDE = CS + 16
#: gcm_finalize writes a batch's verdicts 4 GiB off when the batch does not start at chunk 0.
#: Every start-up check opens its datasets from chunk 0, so they pass; staging in batches faults
#: at its second batch (an illegal address on a GPU).
_LATE_FINALIZE_FAULT = (
    "status[local] = bad;",
    "status[local + (first_chunk != 0ull ? (1u << 30) : 0u)] = bad;",
)
#: gcm_msgs_finalize writes past its status words in batches of more than seven messages (the
#: message known answers are seven).
_LATE_MESSAGE_FAULT = ("status[m] = bad;", "status[m + (nmsgs > 7u ? nmsgs : 0u)] = bad;")


def _host(arr: Any) -> bytes:
    return bytes(backend.asnumpy(arr).tobytes())


def _sealed(tmp_path: Path, data: bytes, *, tamper_chunk: int | None = None) -> tuple[Any, bytes]:
    """An opened sealed dataset of ``data`` (4 KiB chunks) and its key; optionally with one bit
    of ``tamper_chunk``'s tag flipped."""
    dk = fmt.new_dataset_key()
    blob = bytearray(seal_bytes(data, dataset_key=dk, chunk_size=CS, threads=1))
    if tamper_chunk is not None:
        header = Header.parse(bytes(blob[: fmt.HEADER_SIZE]))
        blob[header.chunks_offset + tamper_chunk * STRIDE + CS + 3] ^= 0x04
    path = tmp_path / "d.gcc"
    path.write_bytes(blob)
    return open_sealed(path), dk


def _poisoned(cp: Any, n: int) -> Any:
    return cp.ndarray(np.full(n, 0xA5, dtype=np.uint8), 0)


def _is_launch_fault(exc: GpuKernelError) -> bool:
    text = str(exc)
    return exc.stage == "launch" and "out-of-bounds" in text and "\n" not in text


def test_a_dataset_launch_fault_is_a_launch_failure_and_the_output_is_zeroed(
    cpu: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _mutate(monkeypatch, rt, *_LATE_FINALIZE_FAULT)
    data = os.urandom(6 * CS + 100)
    dataset, dk = _sealed(tmp_path, data)
    out = _poisoned(cpu, len(data))
    with pytest.raises(GpuKernelError) as info:
        gpu.stage_gpu(dataset, dk, out=out, batch_bytes=2 * STRIDE, slots=2)
    assert _is_launch_fault(info.value), str(info.value)
    assert _host(out) == bytes(len(data))  # the verified first batch too


def test_after_a_dataset_launch_fault_no_device_buffer_keeps_plaintext_or_keys(
    cpu: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Staging's own output, the key context and the GHASH scratch are all zeroed."""
    _mutate(monkeypatch, rt, *_LATE_FINALIZE_FAULT)
    data = os.urandom(6 * CS + 100)
    dataset, dk = _sealed(tmp_path, data)
    chunk_key = fmt.derive_chunk_key(dk, dataset.header.dataset_id)
    rt._kernels_at(0, rt._threads_for(CS))
    gcm = rt.GcmDevice(cpu, 0, dataset.header, chunk_key)
    secrets = secret_tests._context_secrets(cpu.asnumpy(gcm.ctx), chunk_key)
    gcm.close()
    allocations = secret_tests._tracked_allocations(monkeypatch)
    with pytest.raises(GpuKernelError) as info:
        gpu.stage_gpu(dataset, dk, batch_bytes=2 * STRIDE, slots=2)
    assert _is_launch_fault(info.value), str(info.value)
    text = secret_tests._windows(data, 1)
    assert allocations
    for a in allocations:
        raw = a.view(np.uint8).tobytes()
        assert not secret_tests._leaks(raw, secrets), f"{a.nbytes} bytes keep key material"
        assert not secret_tests._leaks(raw, text), f"{a.nbytes} bytes keep plaintext"


def test_a_chunk_rejected_before_a_launch_fault_is_still_an_authentication_failure(
    cpu: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Chunk 0's tag is wrong; the fault of the second batch surfaces first (the pipeline reads
    no verdict before its final wait here): the rejection is what is raised, not hidden."""
    _mutate(monkeypatch, rt, *_LATE_FINALIZE_FAULT)
    monkeypatch.setattr(cpu.Config, "done_probability", 0.0)
    data = os.urandom(6 * CS + 100)
    dataset, dk = _sealed(tmp_path, data, tamper_chunk=0)
    out = _poisoned(cpu, len(data))
    with pytest.raises(ChunkAuthenticationError) as info:
        gpu.stage_gpu(dataset, dk, out=out, batch_bytes=2 * STRIDE, slots=8)
    assert info.value.chunk_index == 0
    assert _host(out) == bytes(len(data))


def test_a_launch_fault_opening_device_resident_records_zeroes_the_output(
    cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _mutate(monkeypatch, rt, *_LATE_FINALIZE_FAULT)
    data = os.urandom(6 * CS + 100)
    dk = fmt.new_dataset_key()
    blob = bytes(seal_bytes(data, dataset_key=dk, chunk_size=CS, threads=1))
    header = Header.parse(blob[: fmt.HEADER_SIZE])
    records = blob[header.chunks_offset + STRIDE :]  # chunks 1.., where they are
    out = _poisoned(cpu, len(data) - CS)
    d_records = cpu.asarray(np.frombuffer(records, dtype=np.uint8))
    with pytest.raises(GpuKernelError) as info:
        gpu.decrypt_records_gpu(d_records, header, dk, out=out, first_chunk=1)
    assert _is_launch_fault(info.value), str(info.value)
    assert _host(out) == bytes(len(data) - CS)


def test_a_launch_fault_while_sealing_on_the_gpu_is_a_launch_failure(
    cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt._kernels_at(0, rt._threads_for(CS))  # start-up passed
    _fault_after_start_up(monkeypatch, "gcm_chunks")
    data = cpu.asarray(np.frombuffer(os.urandom(3 * CS), dtype=np.uint8))
    with pytest.raises(GpuKernelError) as info:
        gpu.seal_gpu(data, dataset_key=fmt.new_dataset_key(), chunk_size=CS)
    assert info.value.stage == "launch" and "injected" in str(info.value)


# --- faults on real work, after start-up: message batches ----------------------------------------


def _batch(count: int) -> tuple[list[bytes], list[DeviceMessage], bytes, list[bytes]]:
    """Keys, ``count`` messages (key i % 2), their sealed records back to back, their texts."""
    keys = [os.urandom(32), os.urandom(32)]
    texts = [os.urandom(100 + 700 * i) for i in range(count)]
    messages, records, at = [], bytearray(), 0
    for i, text in enumerate(texts):
        nonce, aad = i.to_bytes(12, "big"), b"step 7 piece %d" % i
        sealed = AESGCM(keys[i % 2]).encrypt(nonce, text, aad)
        src = len(records)
        records += sealed + bytes(-len(sealed) % 16)
        messages.append(DeviceMessage(i % 2, nonce, aad, src, at, src + len(text), len(text)))
        at += -(-len(text) // 16) * 16
    return keys, messages, bytes(records), texts


def test_a_message_launch_fault_is_a_launch_failure_and_the_batch_output_is_zeroed(
    cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _mutate(monkeypatch, rt, *_LATE_MESSAGE_FAULT)
    keys, messages, records, texts = _batch(2)
    src = cpu.asarray(np.frombuffer(records, dtype=np.uint8))
    size = messages[-1].dst + len(texts[-1]) + 16
    with DeviceKeyring(keys) as ring:  # the message known answers pass
        dst = _poisoned(cpu, size)
        assert list(ring.verdicts(ring.open(messages, src, dst), dst)) == [0, 0]
        assert _host(dst)[messages[1].dst : messages[1].dst + len(texts[1])] == texts[1]
    keys, messages, records, texts = _batch(8)
    src = cpu.asarray(np.frombuffer(records, dtype=np.uint8))
    size = messages[-1].dst + len(texts[-1]) + 16
    ring = DeviceKeyring(keys)
    ctxs = ring.ctxs
    dst = _poisoned(cpu, size)
    status = ring.open(messages, src, dst)
    with pytest.raises(GpuKernelError) as info:
        ring.verdicts(status, dst)
    assert _is_launch_fault(info.value), str(info.value)
    assert _host(dst) == bytes(size)  # unverified text written before the fault is gone
    assert not any(_host(ctxs)) and ring.ctxs is None


def test_a_message_launch_fault_seen_when_the_keyring_closes_is_a_launch_failure(
    cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _mutate(monkeypatch, rt, *_LATE_MESSAGE_FAULT)
    keys, messages, records, texts = _batch(8)
    src = cpu.asarray(np.frombuffer(records, dtype=np.uint8))
    ring = DeviceKeyring(keys)
    ctxs, dst = ring.ctxs, _poisoned(cpu, messages[-1].dst + len(texts[-1]) + 16)
    ring.open(messages, src, dst)
    with pytest.raises(GpuKernelError) as info:
        ring.close()
    assert _is_launch_fault(info.value), str(info.value)
    assert not any(_host(ctxs))
