"""The message-batch kernels (gcm_msgs, gcm_msgs_finalize), DDP's DeviceCrypt over them, and the
model-digest kernels (sha256.cu, blake3.cu), run on the CPU through their own launch code.

See ``test_kernels_on_cpu.py`` for what the CPU execution checks on every launch. Here: sealed
frames bit for bit against ``cryptography`` for many keys, text and AAD lengths (the AADs of a
batch laid out by ``gpu_messages._descriptors``), each tampered message flagged and zeroed
alone, gradient pieces through ``DeviceCrypt``, and digests against ``hashlib`` and ``blake3``.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from typing import Any

import blake3
import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpucc.ddp.crypt import DeviceCrypt, Piece
from gpucc.ddp.messages import TAG_SIZE
from gpucc.staging import _gpu_kat as kat
from gpucc.staging import gpu_messages as gm
from gpucc.staging.gpu_messages import DeviceKeyring, DeviceMessage
from gpucc.staging.model import digest_gpu
from tests.support.cudacpu import backend
from tests.unit.ddp import test_ddp_kat as ddp_kat

GEOMETRIES = [(1, 1), (2, 3)]


@pytest.fixture(params=GEOMETRIES, ids=lambda g: f"{g[0]}sm-x{g[1]}")
def cpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    sms, per_sm = request.param
    cp = backend.install(monkeypatch, sm_count=sms, occupancy=per_sm)
    monkeypatch.setattr(kat, "_KAT_TILES", 3)  # the dataset start-up checks, kept cheap
    yield cp


def _dev(cp: Any, data: bytes) -> Any:
    return cp.asarray(np.frombuffer(data or b"\x00", dtype=np.uint8))


def _host(cp: Any, arr: Any) -> bytes:
    return bytes(cp.asnumpy(arr).tobytes())


def _batch(
    rng: random.Random, lengths: list[int], keys: int
) -> tuple[list[DeviceMessage], bytes, int]:
    msgs, src, dst = [], 0, 0
    for i, n in enumerate(lengths):
        aad = rng.randbytes(rng.choice([0, 1, 15, 16, 17, 52]))
        msgs.append(DeviceMessage(i % keys, rng.randbytes(12), aad, src, dst, dst + n, n))
        src += -(-n // 16) * 16
        dst += -(-(n + 16) // 16) * 16
    return msgs, rng.randbytes(max(src, 16)), max(dst, 16)


LENGTHS = [0, 1, 15, 16, 17, 100, 4096 + 3, 16384 * 2 + 1, 16384 * 5]


def test_message_batches_are_bit_exact_and_each_tamper_is_caught_alone(cpu: Any) -> None:
    rng = random.Random(25)
    keys = [rng.randbytes(32) for _ in range(4)]
    msgs, plain, frames = _batch(rng, LENGTHS, len(keys))
    with DeviceKeyring(keys) as ring:  # the message known answers run first
        sealed = cpu.zeros(frames, dtype=cpu.uint8)
        ring.seal(msgs, _dev(cpu, plain), sealed)
        out = _host(cpu, sealed)
        for m in msgs:
            want = AESGCM(keys[m.key]).encrypt(m.nonce, plain[m.src : m.src + m.length], m.aad)
            assert out[m.dst : m.dst + m.length + 16] == want, m.length
        back = [DeviceMessage(m.key, m.nonce, m.aad, m.dst, m.src, m.tag, m.length) for m in msgs]
        tampered = bytearray(out)
        bad = {2: back[2].src, 5: back[5].tag + 15, 7: back[7].src + 16384}  # text, tag, text
        for at in bad.values():
            tampered[at] ^= 0x40
        opened = cpu.empty(len(plain), dtype=cpu.uint8)
        status = ring.open(back, _dev(cpu, bytes(tampered)), opened)
        verdicts = [int(v) for v in cpu.asnumpy(status)]
        got = _host(cpu, opened)
    assert verdicts == [1 if i in bad else 0 for i in range(len(msgs))]
    for i, m in enumerate(msgs):
        text = got[m.src : m.src + m.length]
        assert text == (bytes(m.length) if i in bad else plain[m.src : m.src + m.length]), i


def test_a_wrong_aad_or_key_fails_only_its_message(cpu: Any) -> None:
    rng = random.Random(5)
    keys = [rng.randbytes(32) for _ in range(3)]
    msgs, plain, frames = _batch(rng, [52, 52, 52, 52], len(keys))
    with DeviceKeyring(keys) as ring:
        sealed = cpu.zeros(frames, dtype=cpu.uint8)
        ring.seal(msgs, _dev(cpu, plain), sealed)
        back = [DeviceMessage(m.key, m.nonce, m.aad, m.dst, m.src, m.tag, m.length) for m in msgs]
        back[1] = DeviceMessage(back[1].key, back[1].nonce, back[1].aad + b"!", *_where(back[1]))
        back[3] = DeviceMessage((back[3].key + 1) % 3, back[3].nonce, back[3].aad, *_where(back[3]))
        status = ring.open(back, sealed, cpu.empty(len(plain), dtype=cpu.uint8))
        assert [int(v) for v in cpu.asnumpy(status)] == [0, 1, 0, 1]


def _where(m: DeviceMessage) -> tuple[int, int, int, int]:
    return m.src, m.dst, m.tag, m.length


def test_gradient_pieces_through_device_crypt(cpu: Any) -> None:
    """DDP's DeviceCrypt seals pieces of a byte tensor exactly as the host path (GroupKeys.seal)
    does, and the peer's DeviceCrypt opens them; one flipped ciphertext byte is reported by
    collect() as a GradientAuthenticationError and its piece is zeroed."""
    sender, receiver = ddp_kat._pair()
    lengths = [4096, 1000, 17]
    rng = random.Random(9)
    grads = torch.tensor(
        list(rng.randbytes(sum(-(-n // 16) * 16 for n in lengths))), dtype=torch.uint8
    )
    pieces, at, out = [], 0, 0
    for bucket, n in enumerate(lengths):
        pieces.append(Piece(ddp_kat._msg(bucket=bucket, length=n), at, out))
        at += -(-n // 16) * 16
        out += -(-(n + TAG_SIZE) // 16) * 16
    wire = torch.zeros(out, dtype=torch.uint8)
    sealing = DeviceCrypt(sender)
    sealing.seal(pieces, grads, wire)
    sealing.close()
    raw = bytes(wire.numpy().tobytes())
    for p in pieces:
        n = p.msg.length
        plain = bytes(grads.numpy()[p.src : p.src + n].tobytes())
        assert raw[p.dst : p.dst + n + TAG_SIZE] == sender.seal(p.msg, plain)
    wire[pieces[1].dst + 3] ^= 1
    back = [Piece(p.msg, p.dst, p.src) for p in pieces]
    opened = torch.full_like(grads, 0xA5)
    opening = DeviceCrypt(receiver)
    opening.open(back, wire, opened, [])
    failures = opening.collect()
    opening.close()
    assert [type(f).__name__ for f in failures] == ["GradientAuthenticationError"]
    assert (failures[0].sender, failures[0].receiver, failures[0].bucket) == (0, 1, 1)
    got = bytes(opened.numpy().tobytes())
    for i, p in enumerate(pieces):
        n = p.msg.length
        want = bytes(n) if i == 1 else bytes(grads.numpy()[p.src : p.src + n].tobytes())
        assert got[p.src : p.src + n] == want


# --- model digests -------------------------------------------------------------------------------

SIZES = [0, 1, 63, 64, 65, 1023, 1024, 1025, 2048, 3 * 1024 + 5, 17 * 1024 + 1, 300 * 1024 + 5]


def test_digests_of_device_buffers_match_hashlib_and_blake3(cpu: Any) -> None:
    rng = random.Random(3)
    blobs = [rng.randbytes(n) for n in SIZES]
    buffers = [cpu.asarray(np.frombuffer(b, dtype=np.uint8)) for b in blobs]
    sha = digest_gpu.digest_device_buffers(buffers, "sha256")
    b3 = digest_gpu.digest_device_buffers(buffers, "blake3")
    assert sha == [[hashlib.sha256(b).digest()] for b in blobs]
    assert b3 == [[blake3.blake3(b).digest()] for b in blobs]
    shards = digest_gpu.digest_device_buffers(buffers[-3:], "sha256", shard_size=1000)
    for blob, got in zip(blobs[-3:], shards, strict=True):
        want = [hashlib.sha256(blob[s : s + 1000]).digest() for s in range(0, len(blob), 1000)]
        assert got == want
    names = {name for name, _, _ in backend.launches}
    assert names == {"sha256_shards", "blake3_chunks", "blake3_parents"}


def test_message_kernels_use_their_own_geometry(cpu: Any) -> None:
    rng = random.Random(1)
    keys = [rng.randbytes(32)]
    msgs, plain, frames = _batch(rng, [16384 * 9], 1)
    with DeviceKeyring(keys) as ring:
        backend.launches.clear()
        ring.seal(msgs, _dev(cpu, plain), cpu.zeros(frames, dtype=cpu.uint8))
        ring.stream.synchronize()
    grid = cpu.Config.sm_count * cpu.Config.occupancy
    assert ("gcm_msgs", (min(9, grid), 1, 1), (gm.WIDTH, 1, 1)) in backend.launches
    assert ("gcm_msgs_finalize", (1, 1, 1), (256, 1, 1)) in backend.launches
