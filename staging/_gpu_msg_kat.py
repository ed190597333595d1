"""Known answers of the message-batch kernels (gcm_msgs, gcm_msgs_finalize) at their launch shape.

Before the first :class:`~staging.gpu_messages.DeviceKeyring` on a device, a fixed batch is
sealed on the device and compared with ``cryptography``: three keys used in turn, texts of 0,
1, 16 and 17 bytes, one of several tiles ending in a partial block, and one with more tiles
than the persistent grid has CTAs (so CTAs loop, and change keys between items); associated
data of 0, 52 and 17 bytes. The result is opened back, then one ciphertext bit and one tag
bit are flipped: exactly those two messages must be flagged and zeroed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ._gpu_geometry import _K, _MAX_THREADS, _one_line
from .errors import GpuKernelError

_KEYS = tuple(hashlib.sha256(b"gpucc message kat key %d" % i).digest() for i in range(3))
_AADS = (b"", bytes(range(52)), b"associated bytes.")


def _layout(lengths: list[int]) -> tuple[list[int], list[int], int, int]:
    """Offsets of the texts (16-aligned) and of the sealed frames (text, then tag)."""
    src, dst, s, d = [], [], 0, 0
    for n in lengths:
        src.append(s)
        dst.append(d)
        s += -(-n // 16) * 16 + 16
        d += -(-(n + 16) // 16) * 16
    return src, dst, s, d


def _text(n: int, i: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(b"gpucc message kat %d %d" % (i, counter)).digest()
        counter += 1
    return bytes(out[:n])


#: Opens a DeviceKeyring for these keys with the kernels and grid under test.
OpenKeyring = Callable[[Sequence[bytes]], Any]


def check_messages(
    cupy: Any, device_id: int, grid: int, open_keyring: OpenKeyring, message_type: Any
) -> None:
    """Run the known answers on a persistent grid of ``grid`` CTAs of 256 threads.

    ``open_keyring`` and ``message_type`` (the DeviceMessage class) come from
    :mod:`staging.gpu_messages`, which calls this: this module imports nothing of it.

    Raises:
        GpuKernelError: a launch failed or an answer is wrong.
    """
    tile = 16 * _K * _MAX_THREADS
    lengths = [0, 1, 16, 17, 3 * tile - 5, (grid + 3) * tile, 100]
    texts = [_text(n, i) for i, n in enumerate(lengths)]
    src_at, dst_at, src_size, dst_size = _layout(lengths)
    messages = [
        message_type(
            key=i % 3,
            nonce=i.to_bytes(4, "big") + b"kat-msg!",
            aad=_AADS[i % 3],
            src=src_at[i],
            dst=dst_at[i],
            tag=dst_at[i] + n,
            length=n,
        )
        for i, n in enumerate(lengths)
    ]
    plain = bytearray(src_size)
    for m, t in zip(messages, texts, strict=True):
        plain[m.src : m.src + m.length] = t
    expected = bytearray(dst_size)
    for m, t in zip(messages, texts, strict=True):
        sealed = AESGCM(_KEYS[m.key]).encrypt(m.nonce, t, m.aad)
        expected[m.dst : m.dst + len(sealed)] = sealed
    opened_msgs = [
        message_type(m.key, m.nonce, m.aad, src=m.dst, dst=m.src, tag=m.tag, length=m.length)
        for m in messages
    ]
    flip_ct, flip_tag = 4, 5
    try:
        keyring = open_keyring(_KEYS)
        try:
            d_plain = cupy.asarray(np.frombuffer(bytes(plain), dtype=np.uint8))
            d_sealed = cupy.zeros(dst_size, dtype=cupy.uint8)
            keyring.seal(messages, d_plain, d_sealed)
            sealed_ok = bytes(cupy.asnumpy(d_sealed).tobytes()) == bytes(expected)
            tampered = bytearray(expected)
            tampered[messages[flip_ct].dst + 1000] ^= 0x20
            tampered[messages[flip_tag].tag + 15] ^= 0x01
            d_in = cupy.asarray(np.frombuffer(bytes(tampered), dtype=np.uint8))
            d_out = cupy.empty(src_size, dtype=cupy.uint8)
            d_out.fill(0xA5)
            status = cupy.zeros(len(messages), dtype=cupy.uint32)
            keyring.open(opened_msgs, d_in, d_out, status)
            out = bytes(cupy.asnumpy(d_out).tobytes())
            verdicts = [int(v) for v in cupy.asnumpy(status)]
        finally:
            keyring.close()
    except GpuKernelError as exc:
        if exc.stage != "launch":
            raise
        # The keyring names a fault on real work "launch"; here it is the known answers'.
        raise GpuKernelError(
            f"the message-batch known answers could not run on CUDA device {device_id}: "
            f"{_one_line(exc)}",
            device_id=device_id,
            stage="known-answer",
        ) from None
    except Exception as exc:  # noqa: BLE001 - a launch or copy failed
        raise GpuKernelError(
            f"the message-batch known answers could not run on CUDA device {device_id}: "
            f"{_one_line(exc)}",
            device_id=device_id,
            stage="known-answer",
        ) from None
    want = [1 if i in (flip_ct, flip_tag) else 0 for i in range(len(messages))]
    opened_ok = verdicts == want and all(
        out[m.src : m.src + m.length] == (bytes(m.length) if want[i] else texts[i])
        for i, m in enumerate(messages)
    )
    if not (sealed_ok and opened_ok):
        raise GpuKernelError(
            f"the message-batch AES-GCM kernels failed their known answers on CUDA device "
            f"{device_id} ({'sealing' if not sealed_ok else 'opening'}); refusing to use them",
            device_id=device_id,
            stage="known-answer",
        )
