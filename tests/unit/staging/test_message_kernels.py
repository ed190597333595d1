"""The message-batch kernels' arithmetic (gcm_msgs, gcm_msgs_finalize), checked on the host.

The harness's ``msgs`` command emulates gcm_setup per key, then one launch of each kernel
over a batch (items visited last to first), with the same ``__host__ __device__`` code the
GPU runs. Every answer is compared with ``cryptography``'s AES-GCM; outputs start poisoned,
and every byte outside the messages' texts and tags must keep it.

Random inputs are fresh on every run; the seed is printed (set ``GPUCC_TEST_SEED`` to replay).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpucc.staging import gpu_messages
from tests.support.nvcc import Harness

pytestmark = pytest.mark.nvcc


@dataclass
class Msg:
    key: int
    nonce: bytes
    aad: bytes
    text: bytes


def _h(data: bytes) -> str:
    return data.hex() if data else "-"


def _b(text: str) -> bytes:
    return b"" if text == "-" else bytes.fromhex(text)


def _command(
    op: str, keys: list[bytes], msgs: list[Msg], tags: list[bytes] | None = None, *, T: int = 32
) -> str:
    parts = [f"msgs {op} 4 {T} 7 {_h(b''.join(keys))} {len(msgs)}"]
    for i, m in enumerate(msgs):
        parts.append(f"{m.key} {_h(m.nonce)} {_h(m.aad)} {_h(m.text)}")
        if tags is not None:
            parts.append(_h(tags[i]))
    return " ".join(parts)


def _seal(
    harness: Harness, keys: list[bytes], msgs: list[Msg], *, T: int = 32
) -> tuple[list[Msg], list[bytes]]:
    """Seal through the emulated launch; check every ciphertext and tag against
    ``cryptography``; return the sealed messages (ciphertext texts) and their tags."""
    fields = harness.one(_command("enc", keys, msgs, T=T)).split()
    assert fields[-1] == "stray=0"
    sealed, tags = [], []
    for i, m in enumerate(msgs):
        ct, tag = _b(fields[2 * i]), _b(fields[2 * i + 1])
        assert ct + tag == AESGCM(keys[m.key]).encrypt(m.nonce, m.text, m.aad), i
        sealed.append(Msg(m.key, m.nonce, m.aad, ct))
        tags.append(tag)
    return sealed, tags


def _open(
    harness: Harness, keys: list[bytes], msgs: list[Msg], tags: list[bytes], *, T: int = 32
) -> list[tuple[bytes, int]]:
    fields = harness.one(_command("dec", keys, msgs, tags, T=T)).split()
    assert fields[-1] == "stray=0"
    return [(_b(fields[2 * i]), int(fields[2 * i + 1])) for i in range(len(msgs))]


def _rng() -> random.Random:
    env = os.environ.get("GPUCC_TEST_SEED")
    seed = int(env) if env else int.from_bytes(os.urandom(8), "big")
    print(f"GPUCC_TEST_SEED={seed}")
    return random.Random(seed)


def test_the_descriptor_layout_matches_the_python_mirror(harness: Harness) -> None:
    fields = dict(kv.split("=") for kv in harness.one("layout").split())
    assert int(fields["msg_words"]) == gpu_messages.MSG_WORDS


def test_a_batch_of_many_keys_lengths_and_aads_matches_cryptography(harness: Harness) -> None:
    rng = _rng()
    keys = [rng.randbytes(32) for _ in range(3)]
    tile = 16 * 4 * 32  # bytes per tile at K=4, T=32
    lengths = [0, 1, 15, 16, 17, tile - 1, tile, tile + 1, 3 * tile + 7, 52, 0, 4096]
    msgs = [
        Msg(
            key=rng.randrange(3),
            nonce=rng.randbytes(12),
            aad=rng.randbytes(rng.choice([0, 1, 16, 17, 52])),
            text=rng.randbytes(n),
        )
        for n in lengths
    ]
    sealed, tags = _seal(harness, keys, msgs)
    assert _open(harness, keys, sealed, tags) == [(m.text, 0) for m in msgs]


def test_the_production_width_and_the_ddp_aad(harness: Harness) -> None:
    """T=256 (the width gcm_msgs runs at), 52-byte AADs, two keys in turn, several tiles."""
    rng = _rng()
    keys = [rng.randbytes(32) for _ in range(2)]
    msgs = [
        Msg(i % 2, rng.randbytes(12), rng.randbytes(52), rng.randbytes(n))
        for i, n in enumerate([16384 * 2 + 48, 16384, 100])
    ]
    sealed, tags = _seal(harness, keys, msgs, T=256)
    assert _open(harness, keys, sealed, tags, T=256) == [(m.text, 0) for m in msgs]


def test_each_tampered_message_is_flagged_and_zeroed_alone(harness: Harness) -> None:
    rng = _rng()
    keys = [rng.randbytes(32) for _ in range(2)]
    msgs = [Msg(i % 2, rng.randbytes(12), rng.randbytes(52), rng.randbytes(3000)) for i in range(6)]
    sealed, tags = _seal(harness, keys, msgs)
    bad = [Msg(m.key, m.nonce, m.aad, m.text) for m in sealed]
    bad_tags = list(tags)
    bad[0].text = bytes(c ^ (0x80 if i == 2999 else 0) for i, c in enumerate(bad[0].text))
    bad_tags[1] = bytes([tags[1][0] ^ 1]) + tags[1][1:]  # a tag bit
    bad[2].aad = bytes([bad[2].aad[0] ^ 4]) + bad[2].aad[1:]  # another position's AAD
    bad[3].nonce = bytes(12)  # another nonce: a replay from another position
    bad[4].key = 1 - bad[4].key  # another key
    # bad[5]: untouched
    opened = _open(harness, keys, bad, bad_tags)
    assert [s for _, s in opened] == [1, 1, 1, 1, 1, 0]
    for text, status in opened[:5]:
        assert status == 1 and text == bytes(3000)
    assert opened[5][0] == msgs[5].text


def test_a_batch_of_one_empty_message(harness: Harness) -> None:
    keys = [bytes(range(32))]
    msgs = [Msg(0, bytes(12), b"aad only", b"")]
    sealed, tags = _seal(harness, keys, msgs)
    assert _open(harness, keys, sealed, tags) == [(b"", 0)]
    assert _open(harness, keys, sealed, [bytes(16)]) == [(b"", 1)]
