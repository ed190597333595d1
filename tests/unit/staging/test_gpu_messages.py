"""Message batches on a GPU (:mod:`staging.gpu_messages`), run against ``fake_cupy``.

The fake runs launches lazily and checks stream ordering per buffer; the kernels are emulated
with ``cryptography`` from the descriptors the keyring uploads, so a wrong offset, key index,
nonce or AAD fails authentication here. The kernels' own arithmetic is checked by
``test_message_kernels.py``; the real thing by ``tests/gpu/test_gpu_ddp.py`` on a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpucc.core.errors import UsageError
from gpucc.staging import _gpu_runtime as rt
from gpucc.staging import gpu_messages as gm
from gpucc.staging.errors import GpuKernelError
from gpucc.staging.gpu_messages import DeviceKeyring, DeviceMessage
from tests.support import fake_cupy


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    yield fake_cupy.install(monkeypatch, devices=2)
    fake_cupy.reset()


def _dev(data: bytes) -> Any:
    return fake_cupy.asarray(np.frombuffer(data, dtype=np.uint8))


def _host(arr: Any) -> bytes:
    return bytes(fake_cupy.asnumpy(arr).tobytes())


KEYS = [os.urandom(32) for _ in range(3)]


def _batch(lengths: list[int]) -> tuple[list[DeviceMessage], bytes, int]:
    """Messages over one plaintext buffer; frames (text | tag) at 16-aligned offsets."""
    msgs, src, dst = [], 0, 0
    for i, n in enumerate(lengths):
        msgs.append(
            DeviceMessage(
                key=i % 3,
                nonce=os.urandom(12),
                aad=os.urandom(52),
                src=src,
                dst=dst,
                tag=dst + n,
                length=n,
            )
        )
        src += -(-n // 16) * 16
        dst += -(-(n + 16) // 16) * 16
    return msgs, os.urandom(src), dst


def test_a_batch_seals_like_cryptography_and_opens_back(fake: Any) -> None:
    msgs, plain, frames = _batch([0, 1, 17, 5000, 16384 * 3 + 1, 64])
    stream = fake.cuda.Stream(non_blocking=True)
    with DeviceKeyring(KEYS, stream=stream) as ring, stream:
        sealed = fake.zeros(frames, dtype=fake.uint8)
        ring.seal(msgs, _dev(plain), sealed)
        out = _host(sealed)  # synchronises: the launches ran on `stream`
        for m in msgs:
            want = AESGCM(KEYS[m.key]).encrypt(m.nonce, plain[m.src : m.src + m.length], m.aad)
            assert out[m.dst : m.dst + m.length + 16] == want
        back = [DeviceMessage(m.key, m.nonce, m.aad, m.dst, m.src, m.tag, m.length) for m in msgs]
        opened = fake.empty(len(plain), dtype=fake.uint8)
        status = fake.empty(len(msgs), dtype=fake.uint32)
        ring.open(back, sealed, opened, status)
        assert [int(v) for v in fake.asnumpy(status)] == [0] * len(msgs)
        got = _host(opened)
        for m in msgs:
            assert got[m.src : m.src + m.length] == plain[m.src : m.src + m.length]
    names = [name for name, _, _ in fake.Config.launches]
    assert names.count("gcm_msgs_finalize") == 2 + 2  # the known answers seal and open too


def test_tampered_frames_are_flagged_and_zeroed_one_by_one(fake: Any) -> None:
    msgs, plain, frames = _batch([100, 200, 300, 400])
    ring = DeviceKeyring(KEYS)
    sealed = fake.zeros(frames, dtype=fake.uint8)
    ring.seal(msgs, _dev(plain), sealed)
    raw = bytearray(_host(sealed))
    raw[msgs[1].dst + 5] ^= 1  # ciphertext
    raw[msgs[2].tag] ^= 0x80  # tag
    back = [DeviceMessage(m.key, m.nonce, m.aad, m.dst, m.src, m.tag, m.length) for m in msgs]
    back[3] = DeviceMessage(
        (back[3].key + 1) % 3, back[3].nonce, back[3].aad, *_where(back[3])
    )  # wrong key
    out = fake.empty(len(plain), dtype=fake.uint8)
    status = fake.zeros(4, dtype=fake.uint32)
    ring.open(back, _dev(bytes(raw)), out, status)
    assert [int(v) for v in fake.asnumpy(status)] == [0, 1, 1, 1]
    got = _host(out)
    assert got[msgs[0].src : msgs[0].src + 100] == plain[:100]
    for m in msgs[1:]:
        assert got[m.src : m.src + m.length] == bytes(m.length)
    ring.close()
    assert ring.ctxs is None


def _where(m: DeviceMessage) -> tuple[int, int, int, int]:
    return m.src, m.dst, m.tag, m.length


def test_the_keyring_orders_its_work_on_its_own_stream(fake: Any) -> None:
    """Buffers made on the caller's stream must be ordered before the keyring's launches:
    the fake raises StreamRaceError when they are not."""
    msgs, plain, frames = _batch([4096])
    ring_stream = fake.cuda.Stream(non_blocking=True)
    ring = DeviceKeyring(KEYS, stream=ring_stream)
    other = fake.cuda.Stream(non_blocking=True)
    with other:
        sealed = fake.zeros(frames, dtype=fake.uint8)  # memset queued on `other`
    with pytest.raises(fake_cupy.StreamRaceError):
        ring.seal(msgs, _dev(plain), sealed)
    ready = fake.cuda.Event()
    ready.record(other)
    ring_stream.wait_event(ready)
    ring.seal(msgs, _dev(plain), sealed)
    ring.close()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"nonce": bytes(11)}, "nonce"),
        ({"src": 8}, "multiples of 16"),
        ({"length": 10**6}, "past the end"),
        ({"tag": 10**6}, "tag runs past"),
        ({"key": 3}, "key the keyring does not hold"),
    ],
)
def test_bad_descriptors_are_refused_before_any_launch(
    fake: Any, change: dict[str, Any], message: str
) -> None:
    msgs, plain, frames = _batch([64, 64])
    ring = DeviceKeyring(KEYS)
    before = len(fake.Config.launches)
    fields = {**msgs[1].__dict__, **change}
    with pytest.raises(UsageError, match=message):
        ring.seal([msgs[0], DeviceMessage(**fields)], _dev(plain), fake.zeros(frames, fake.uint8))
    assert len(fake.Config.launches) == before


def test_every_aad_starts_on_a_16_byte_boundary() -> None:
    """gcm_msgs_finalize reads an AAD's whole blocks as 16-byte vectors: an AAD packed at an
    odd offset (52 bytes after the previous one) is a misaligned-address fault on a GPU."""
    aads = [b"", bytes(range(52)), b"associated bytes.", b"x" * 16, bytes(range(33))]
    msgs = [DeviceMessage(0, bytes(12), a, src=0, dst=0, tag=0, length=0) for a in aads]
    desc, blob, items = gm._descriptors(msgs)
    rows = desc.reshape(len(msgs), gm.MSG_WORDS)
    assert items == 0
    for m, row in zip(msgs, rows, strict=True):
        at, n = int(row[14]), int(row[15])
        assert at % 16 == 0 and n == len(m.aad)
        assert blob[at : at + n] == m.aad
    assert [int(r[14]) for r in rows] == [0, 0, 64, 96, 112]


def test_overlapping_outputs_and_in_place_batches_are_refused(fake: Any) -> None:
    msgs, plain, frames = _batch([64, 64])
    ring = DeviceKeyring(KEYS)
    clash = DeviceMessage(**{**msgs[1].__dict__, "dst": msgs[0].dst + 16, "tag": 0})
    with pytest.raises(UsageError, match="overlap"):
        ring.seal([msgs[0], clash], _dev(plain), fake.zeros(frames, fake.uint8))
    buf = fake.zeros(4096, fake.uint8)
    with pytest.raises(UsageError, match="must not overlap"):
        ring.seal(msgs, buf[:2048], buf[1024:3072])


def test_a_broken_message_kernel_is_never_used(fake: Any) -> None:
    fake.Config.msgs_accept_all = True  # a tag comparison that passes everything
    with pytest.raises(GpuKernelError, match="message-batch"):
        DeviceKeyring(KEYS)
    fake.Config.msgs_accept_all = False
    rt._modules.clear()
    DeviceKeyring(KEYS).close()  # a failure is not cached


def test_keys_are_checked(fake: Any) -> None:
    with pytest.raises(UsageError, match="32 bytes"):
        DeviceKeyring([bytes(16)])
    with pytest.raises(UsageError, match="1 to"):
        DeviceKeyring([])
    assert gm.MAX_KEYS * rt._ctx_words(gm._CT) < 1 << 32  # the kernel's u32 context offsets


def test_the_gradient_sealing_benchmark_runs_end_to_end(
    fake: Any, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    """benchmarks/bench_ddp_gpu.py against the stand-in: its flow and its own check, not
    its numbers."""
    import importlib.util
    import json

    from tests.support.paths import ROOT

    spec = importlib.util.spec_from_file_location(
        "bench_ddp_gpu", ROOT / "benchmarks" / "bench_ddp_gpu.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "ddp.json"
    assert (
        bench.main(["--buckets", "1MB", "--ranks", "2,4", "--repeat", "1", "--json", str(out)]) == 0
    )
    rows = json.loads(out.read_text())
    assert [(r["shape"], r["messages"]) for r in rows] == [
        ("a2a N=2", 1),
        ("a2a N=4", 3),
        ("one message", 1),
    ]
    assert "seal+open" in capsys.readouterr().out
