"""Encrypted DDP: known answers (also printed in docs/DDP.md), recomputed independently
(hmac-based HKDF, struct packing), and the single-process rules of keys and messages."""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpucc.core.errors import IntegrityError, UsageError
from gpucc.ddp import (
    GradientAuthenticationError,
    GroupKeys,
    KeyUsageExceededError,
    MessageId,
    Phase,
    UsageLimits,
    choose_algorithm,
)
from gpucc.ddp.hook import A2A_MAX_BYTES
from gpucc.ddp.messages import (
    AAD_SIZE,
    derive_edge_key,
    encode_group_transcript,
    group_challenge,
    group_transcript_hash,
)
from tests.support.paths import ROOT

DOC = ROOT / "docs" / "DDP.md"

SCALAR_A = int("11" * 48, 16)
SCALAR_B = int("22" * 48, 16)
KAT = {
    "shared": "2ac3da23c114b5b1f3aa200cf3c57bebd1b3b880a0e68066ab5d00dda50dcfe6"
    "cd03410292346187a84b1f12d53569c0",
    "challenge": "bb33f31c3f87072f6ba6c0e6b475f15b229d300a5a3de7b2123b940c405195c7",
    "transcript_hash": "c3259bacc38984790ec5c47fbc9040b8fb299944032374e99285a305717db213"
    "7612f2baa1ede16c924f849bb9545455",
    "key_0_1_0": "faca398758757f0335313e0c5f8c7a5045ffa21fd8c3d4cabdff11cc10648fba",
    "key_1_0_0": "c79d9077ce2e20d7d564a2867e2ffcb9cb26fce8b9743db8b152c9ba54c7b727",
    "key_0_1_1": "d628437e0834f03cb12ce41c456768364637703b9ee7e16f4d7e461cf47d5241",
    "nonce": "000001000000070003020000",
    "aad": "67707563632f6464702f76312f616164010000000100000000000000070000000302"
    "000000000000000000010000000000000010",
    "nonce2": "000000010203040506030708",
    "aad2": "67707563632f6464702f76312f616164010000000000000000010203040000050603"
    "070800000002000000030000000000001000",
    "frame": "641b39867a2d28ba386eebda66768a35627bc5569f4a57b1168a521c09c2fddc",
}
OFFERS = [b"offer of rank 0", b"offer of rank 1"]
MSG = MessageId(
    epoch=1, step=7, bucket=3, phase=Phase.A2A_GATHER, hop=0, sender=0, receiver=1, length=16
)
MSG2 = MessageId(
    epoch=0,
    step=0x01020304,
    bucket=0x0506,
    phase=Phase.RING_SCATTER,
    hop=0x0708,
    sender=2,
    receiver=3,
    length=4096,
)


def _hkdf_sha384(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    prk = hmac.new(salt, ikm, hashlib.sha384).digest()
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha384).digest()
        out += block
        i += 1
    return out[:length]


def _shared() -> bytes:
    a = ec.derive_private_key(SCALAR_A, ec.SECP384R1())
    b = ec.derive_private_key(SCALAR_B, ec.SECP384R1())
    z = a.exchange(ec.ECDH(), b.public_key())
    assert z == b.exchange(ec.ECDH(), a.public_key())
    return z


def _transcript_hash() -> bytes:
    challenge = group_challenge([b"\x01" * 32, b"\x02" * 32], epoch=0)
    return group_transcript_hash(encode_group_transcript(OFFERS, challenge=challenge, epoch=0))


def test_known_answers_match_the_code() -> None:
    z = _shared()
    assert z.hex() == KAT["shared"]
    challenge = group_challenge([b"\x01" * 32, b"\x02" * 32], epoch=0)
    assert challenge.hex() == KAT["challenge"]
    th = _transcript_hash()
    assert th.hex() == KAT["transcript_hash"]
    for s, r, e in ((0, 1, 0), (1, 0, 0), (0, 1, 1)):
        key = derive_edge_key(z, transcript_hash=th, sender=s, receiver=r, world_size=2, epoch=e)
        assert key.hex() == KAT[f"key_{s}_{r}_{e}"]
    assert MSG.nonce.hex() == KAT["nonce"] and MSG.aad.hex() == KAT["aad"]
    assert MSG2.nonce.hex() == KAT["nonce2"] and MSG2.aad.hex() == KAT["aad2"]
    key = bytes.fromhex(KAT["key_0_1_1"])
    assert AESGCM(key).encrypt(MSG.nonce, bytes(range(16)), MSG.aad).hex() == KAT["frame"]


def test_known_answers_recomputed_independently() -> None:
    z = bytes.fromhex(KAT["shared"])
    challenge = hashlib.sha256(
        b"gpucc/ddp/v1/challenge" + struct.pack(">IQ", 2, 0) + b"\x01" * 32 + b"\x02" * 32
    ).digest()
    assert challenge.hex() == KAT["challenge"]

    def field(v: bytes) -> bytes:
        return struct.pack(">I", len(v)) + v

    transcript = b"".join(
        field(v)
        for v in (
            b"gpucc/ddp/v1/transcript",
            struct.pack(">H", 1),
            struct.pack(">I", 2),
            struct.pack(">Q", 0),
            challenge,
            *OFFERS,
        )
    )
    th = hashlib.sha384(transcript).digest()
    assert th.hex() == KAT["transcript_hash"]
    info = b"gpucc/ddp/v1/edge-key" + struct.pack(">IIIQ", 0, 1, 2, 1)
    assert _hkdf_sha384(z, th, info, 32).hex() == KAT["key_0_1_1"]
    nonce = struct.pack(">I", 1)[1:] + struct.pack(">IHBH", 7, 3, 2, 0)
    assert nonce.hex() == KAT["nonce"]
    aad = b"gpucc/ddp/v1/aad" + struct.pack(">BIQIBHIIQ", 1, 1, 7, 3, 2, 0, 0, 1, 16)
    assert aad.hex() == KAT["aad"] and len(aad) == AAD_SIZE


def test_known_answers_are_printed_in_the_docs() -> None:
    text = "".join(DOC.read_text().split())
    for name, value in KAT.items():
        assert value in text, f"docs/DDP.md lacks the {name} vector"


# --- keys and messages in one process ------------------------------------------------


def _pair(**kwargs: object) -> tuple[GroupKeys, GroupKeys]:
    z, th = _shared(), _transcript_hash()
    a = GroupKeys(rank=0, world_size=2, shared_secrets={1: z}, transcript_hash=th, **kwargs)  # type: ignore[arg-type]
    b = GroupKeys(rank=1, world_size=2, shared_secrets={0: z}, transcript_hash=th, **kwargs)  # type: ignore[arg-type]
    return a, b


def _msg(**changes: object) -> MessageId:
    base: dict[str, object] = {"epoch": 0, "step": 0, "bucket": 0, "phase": Phase.A2A_SCATTER}
    base.update(hop=0, sender=0, receiver=1, length=8)
    base.update(changes)
    return MessageId(**base)  # type: ignore[arg-type]


def test_seal_open_round_trip_and_key_separation() -> None:
    a, b = _pair()
    frame = a.seal(_msg(), b"gradient")
    assert b.open(_msg(), frame) == b"gradient"
    assert "key" not in repr(a).lower().replace("groupkeys", "")


@pytest.mark.parametrize(
    "change",
    [
        {"step": 1},
        {"bucket": 1},
        {"phase": Phase.A2A_GATHER},
        {"hop": 1},
        {"epoch": 1},
    ],
)
def test_a_frame_opens_only_at_its_place_in_the_schedule(change: dict[str, object]) -> None:
    a, b = _pair()
    frame = a.seal(_msg(), b"gradient")
    if "epoch" in change:
        b.rotate()
    with pytest.raises(GradientAuthenticationError) as err:
        b.open(_msg(**change), frame)
    assert isinstance(err.value, IntegrityError)
    assert err.value.sender == 0 and err.value.receiver == 1


def test_flipped_bits_truncation_and_reflection_fail() -> None:
    a, b = _pair()
    frame = bytearray(a.seal(_msg(), b"gradient"))
    for i in (0, len(frame) - 1):
        bad = bytearray(frame)
        bad[i] ^= 1
        with pytest.raises(GradientAuthenticationError):
            b.open(_msg(), bytes(bad))
    with pytest.raises(GradientAuthenticationError):
        b.open(_msg(), bytes(frame[:-1]))
    # a's own frame handed back to a as if b had sent it
    with pytest.raises(GradientAuthenticationError):
        a.open(_msg(sender=1, receiver=0), bytes(frame))


def test_usage_limits_refuse_and_rotation_resets_them() -> None:
    limits = UsageLimits(rotate_invocations=2, max_invocations=3, rotate_bytes=64, max_bytes=64)
    a, _ = _pair(limits=limits)
    for step in range(3):
        a.seal(_msg(step=step), b"12345678")
    with pytest.raises(KeyUsageExceededError):
        a.seal(_msg(step=3), b"12345678")
    assert a.usage(0, 1).invocations == 3
    a.rotate()
    a.seal(_msg(epoch=1, step=3), b"12345678")
    assert a.usage(0, 1).invocations == 1


def test_claim_step_rotates_from_the_shared_usage_bound() -> None:
    a, b = _pair(limits=UsageLimits(rotate_invocations=4))
    for keys in (a, b):
        assert keys.claim_step() == (0, 0)
        keys.charge(invocations=4, nbytes=10)
        assert keys.claim_step() == (1, 0)
        assert keys.claim_step() == (1, 1)


def test_limits_and_schedule_bounds_are_enforced() -> None:
    with pytest.raises(UsageError):
        UsageLimits(max_invocations=1 << 29)
    with pytest.raises(UsageError):
        UsageLimits(rotate_bytes=2, max_bytes=1)
    with pytest.raises(UsageError):
        _msg(bucket=1 << 16)
    with pytest.raises(UsageError):
        _msg(epoch=1 << 24)
    with pytest.raises(UsageError):
        _msg(receiver=0)
    a, _ = _pair()
    with pytest.raises(UsageError):
        a.rotate(0)
    with pytest.raises(UsageError):
        a.seal(_msg(length=9), b"12345678")
    with pytest.raises(UsageError):
        a.open(_msg(), b"x" * 24)  # a rank does not open messages it sent


def test_auto_choice() -> None:
    assert choose_algorithm(1 << 20, 2) == "a2a"
    assert choose_algorithm(A2A_MAX_BYTES, 8) == "a2a"
    assert choose_algorithm(A2A_MAX_BYTES + 1, 2) == "ring"
    assert choose_algorithm(25 << 20, 3) == "ring"
    with pytest.raises(UsageError):
        choose_algorithm(1, 1)


def test_open_into_zeroes_its_output_when_the_tag_fails() -> None:
    a, b = _pair()
    frame = bytearray(24)
    a.seal_into(_msg(), b"gradient", frame)
    a2, _ = _pair()
    assert bytes(frame) == a2.seal(_msg(), b"gradient")
    out = bytearray(b"\xff" * 8)
    b.open_into(_msg(), bytes(frame), out)
    assert out == b"gradient"
    frame[0] ^= 1
    out = bytearray(b"\xff" * 8)
    with pytest.raises(GradientAuthenticationError):
        b.open_into(_msg(), bytes(frame), out)
    assert out == bytes(8)


def _refuses(device: str, match: str, **options: Any) -> None:
    import torch

    from gpucc.ddp import EncryptedAllReduce

    a, _ = _pair()
    state = EncryptedAllReduce(a, **options)
    with pytest.raises(UsageError, match=match):
        state.allreduce(torch.zeros(8, device=device), 0, last=True)
    assert a.claim_step() == (0, 0)  # nothing was consumed


def test_buckets_off_the_cpu_and_cuda_are_refused() -> None:
    _refuses("meta", "takes CPU and CUDA tensors")


@pytest.mark.gpu
def test_cuda_buckets_are_never_copied_to_the_host_in_plaintext() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _refuses("cuda", "not copied to the host in plaintext", device_crypto=False)


def test_a_step_broken_mid_way_is_never_resumed_with_the_same_nonces() -> None:
    import torch

    from gpucc.ddp import EncryptedAllReduce

    a, _ = _pair()
    state = EncryptedAllReduce(a)
    # no process group exists here: the exchange fails after sealing
    with pytest.raises(ValueError):
        state.allreduce(torch.ones(8), 0, last=False)
    assert a.claim_step() == (0, 1)  # step 0 is burnt, not reused
