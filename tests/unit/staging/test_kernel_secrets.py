"""What no output of the AES-GCM kernels shows, observed in their CPU execution.

* Verdicts with teeth: tags changed in two bytes by the same delta (an XOR-accumulated compare
  cancels them), tags replaced whole, tags swapped between chunks and between messages; each
  must be rejected by the kernels' own status words (``gcm_finalize``, ``gcm_msgs_finalize``).
  One test builds the kernels with the compare's OR turned into XOR and shows that the
  same-delta case is then accepted: these cases catch that bug every time, not by chance.
* Scrubbing: the CPU execution hands over shared memory as every block of every kernel left
  it (``backend.observe``); no word of the key context (round keys, H, its powers), no key,
  and no run of plaintext may be there. Nor, once the runtime is done, in any device
  allocation but the caller's own output.
* Data independence: the per-thread trace of memory accesses (region, offset, size, direction;
  shared memory by bank) is the same for other keys, other texts and other wrong tags. This
  checks the source as compiled for the CPU, not the GPU's instruction stream (docs/GPU.md).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from gpucc.staging import _gpu_kat as kat
from gpucc.staging import _gpu_runtime as rt
from gpucc.staging import format as fmt
from gpucc.staging import gpu
from gpucc.staging.format import Header
from gpucc.staging.gpu_messages import DeviceKeyring, DeviceMessage
from gpucc.staging.model import digest_gpu
from gpucc.staging.seal import seal_bytes
from tests.support import fake_cupy
from tests.support.cudacpu import backend

CS = 4096
STRIDE = CS + 16
CHUNKS = 6


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    cp = backend.install(monkeypatch, sm_count=1, occupancy=2, seed=41)
    monkeypatch.setattr(kat, "_KAT_TILES", 3)
    yield cp


def _host(arr: Any) -> bytes:
    return bytes(backend.asnumpy(arr).tobytes())


def _dev(cp: Any, data: bytes) -> Any:
    return cp.asarray(np.frombuffer(data or b"\x00", dtype=np.uint8))


def _dataset(
    seed: int, length: int = (CHUNKS - 1) * CS + 1000
) -> tuple[Header, bytes, bytes, bytes]:
    """(header, chunk key, records, plaintext) of a dataset sealed by the host code."""
    rng = random.Random(seed)
    plain = rng.randbytes(length)
    dk, did = rng.randbytes(32), rng.randbytes(16)
    blob = bytes(seal_bytes(plain, dataset_key=dk, chunk_size=CS, dataset_id=did, threads=1))
    header = Header.parse(blob[: fmt.HEADER_SIZE])
    return header, fmt.derive_chunk_key(dk, did), blob[header.chunks_offset :], plain


def _dataset_key(seed: int, length: int = (CHUNKS - 1) * CS + 1000) -> bytes:
    """The dataset key of ``_dataset(seed, length)``."""
    rng = random.Random(seed)
    rng.randbytes(length)
    return rng.randbytes(32)


def _open_chunks(cp: Any, header: Header, key: bytes, records: bytes) -> tuple[bytes, list[int]]:
    gcm = rt.GcmDevice(cp, 0, header, key)
    try:
        return kat._open_on(gcm, cp, records)
    finally:
        gcm.close()


def _tag_at(header: Header, index: int) -> int:
    return index * STRIDE + header.chunk_length(index)


# --- verdicts with teeth ----------------------------------------------------------------------


def _chunk_tampers(header: Header, records: bytes) -> dict[str, tuple[bytes, set[int]]]:
    """name -> (tampered records, the chunks that must be rejected)."""
    out: dict[str, tuple[bytes, set[int]]] = {}
    r = bytearray(records)
    for at in (_tag_at(header, 1), _tag_at(header, 1) + 7):  # two tag bytes, the same delta
        r[at] ^= 0x5A
    out["tag-two-bytes-same-delta"] = (bytes(r), {1})
    r = bytearray(records)
    for k in range(16):  # every tag byte, the same delta
        r[_tag_at(header, 2) + k] ^= 0x01
    out["tag-all-bytes-same-delta"] = (bytes(r), {2})
    r = bytearray(records)
    for at in (3 * STRIDE + 100, 3 * STRIDE + 2000, 3 * STRIDE + 3000):  # three text bytes
        r[at] ^= 0x80
    out["text-three-bytes-same-delta"] = (bytes(r), {3})
    r = bytearray(records)
    last = header.chunk_count - 1
    r[_tag_at(header, last) : _tag_at(header, last) + 16] = random.Random(41).randbytes(16)
    out["tag-replaced-by-random"] = (bytes(r), {last})
    r = bytearray(records)
    a, b = _tag_at(header, 0), _tag_at(header, 4)
    r[a : a + 16], r[b : b + 16] = records[b : b + 16], records[a : a + 16]
    out["tags-swapped-between-chunks"] = (bytes(r), {0, 4})
    return out


#: The tag compare of aesgcm_math.cuh, and the one-character bug the cases above must catch.
_COMPARE = "diff |= ((computed[i >> 2]"
_XOR_BUG = "diff ^= ((computed[i >> 2]"


def test_every_multi_byte_chunk_tamper_is_rejected_and_zeroed(cpu: Any) -> None:
    header, key, records, plain = _dataset(1)
    assert _open_chunks(cpu, header, key, records) == (plain, [0] * CHUNKS)
    for name, (tampered, bad) in _chunk_tampers(header, records).items():
        got, status = _open_chunks(cpu, header, key, tampered)
        assert status == [int(i in bad) for i in range(CHUNKS)], name
        for i in range(CHUNKS):
            piece = plain[i * CS : i * CS + header.chunk_length(i)]
            want = bytes(len(piece)) if i in bad else piece
            assert got[i * CS : i * CS + len(piece)] == want, (name, i)


def _message_batch(seed: int) -> tuple[list[bytes], list[DeviceMessage], bytes, int]:
    rng = random.Random(seed)
    keys = [rng.randbytes(32) for _ in range(2)]
    msgs, src, dst = [], 0, 0
    for i, n in enumerate([100, 4096 + 3, 16, 700]):
        msgs.append(
            DeviceMessage(i % 2, rng.randbytes(12), rng.randbytes(20), src, dst, dst + n, n)
        )
        src += -(-n // 16) * 16
        dst += -(-(n + 16) // 16) * 16
    return keys, msgs, rng.randbytes(src), dst


def _message_tampers(
    opened: list[DeviceMessage], sealed: bytes
) -> dict[str, tuple[bytes, set[int]]]:
    out: dict[str, tuple[bytes, set[int]]] = {}
    r = bytearray(sealed)
    r[opened[0].tag + 3] ^= 0x33
    r[opened[0].tag + 12] ^= 0x33
    out["tag-two-bytes-same-delta"] = (bytes(r), {0})
    r = bytearray(sealed)
    t = opened[1].tag
    r[t : t + 16] = random.Random(7).randbytes(16)
    out["tag-replaced-by-random"] = (bytes(r), {1})
    r = bytearray(sealed)
    a, b = opened[2].tag, opened[3].tag  # messages under different keys
    r[a : a + 16], r[b : b + 16] = sealed[b : b + 16], sealed[a : a + 16]
    out["tags-swapped-between-messages"] = (bytes(r), {2, 3})
    return out


def test_every_multi_byte_message_tamper_is_rejected_and_zeroed(cpu: Any) -> None:
    keys, msgs, plain, frames = _message_batch(2)
    with DeviceKeyring(keys) as ring:
        sealed_d = cpu.zeros(frames, dtype=cpu.uint8)
        ring.seal(msgs, _dev(cpu, plain), sealed_d)
        sealed = _host(sealed_d)
        back = [DeviceMessage(m.key, m.nonce, m.aad, m.dst, m.src, m.tag, m.length) for m in msgs]
        for name, (tampered, bad) in _message_tampers(back, sealed).items():
            opened = cpu.empty(len(plain), dtype=cpu.uint8)
            status = ring.open(back, _dev(cpu, tampered), opened)
            assert [int(v) for v in cpu.asnumpy(status)] == [int(i in bad) for i in range(4)], name
            got = _host(opened)
            for i, m in enumerate(msgs):
                want = bytes(m.length) if i in bad else plain[m.src : m.src + m.length]
                assert got[m.src : m.src + m.length] == want, (name, i)


def test_an_xor_accumulated_tag_compare_is_caught_every_time(
    cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernels built with ``diff ^=`` pass the runtime's start-up checks (single flipped
    bits) but accept the same-delta tag: the case above fails that build deterministically."""
    source = rt._kernel_source()
    assert source.count(_COMPARE) == 1
    monkeypatch.setattr(rt, "_kernel_source", lambda: source.replace(_COMPARE, _XOR_BUG))
    monkeypatch.setattr(rt, "_modules", {})
    header, key, records, _ = _dataset(1)
    tampered, bad = _chunk_tampers(header, records)["tag-two-bytes-same-delta"]
    assert _open_chunks(cpu, header, key, tampered)[1] == [0] * CHUNKS  # accepted: the bug
    keys, msgs, plain, frames = _message_batch(2)
    with DeviceKeyring(keys) as ring:
        sealed_d = cpu.zeros(frames, dtype=cpu.uint8)
        ring.seal(msgs, _dev(cpu, plain), sealed_d)
        back = [DeviceMessage(m.key, m.nonce, m.aad, m.dst, m.src, m.tag, m.length) for m in msgs]
        tampered, _ = _message_tampers(back, _host(sealed_d))["tag-two-bytes-same-delta"]
        status = ring.open(back, _dev(cpu, tampered), cpu.empty(len(plain), dtype=cpu.uint8))
        assert int(cpu.asnumpy(status)[0]) == 0


# --- scrubbing ----------------------------------------------------------------------------------


def _windows(blob: bytes, step: int) -> set[bytes]:
    """8-byte runs of ``blob`` at every ``step``-th offset, less those too plain to be telling
    (the identity element of GF(2^128), zero padding)."""
    runs = {blob[i : i + 8] for i in range(0, len(blob) - 7, step)}
    return {w for w in runs if w.count(0) < 4}


def _leaks(shm: bytes, secrets: set[bytes]) -> bool:
    return not _windows(shm, 4).isdisjoint(secrets)


def _context_secrets(ctx_words: np.ndarray[Any, Any], *keys: bytes) -> set[bytes]:
    """Every word of a key context (round keys, H, H^n, the powers of H and G), and the keys."""
    found = _windows(ctx_words.astype("<u4").tobytes(), 4)
    for key in keys:
        found |= _windows(key, 1)
    return found


def _sbox() -> list[int]:
    """The AES S-box (FIPS 197: the inverse in GF(2^8), then the affine map)."""

    def mul(a: int, b: int) -> int:
        r = 0
        while b:
            r ^= a if b & 1 else 0
            a = ((a << 1) ^ 0x11B) if a & 0x80 else a << 1
            b >>= 1
        return r

    box = []
    for x in range(256):
        inv = next((y for y in range(1, 256) if mul(x, y) == 1), 0)
        rot = [((inv << k) | (inv >> (8 - k))) & 0xFF for k in range(5)]
        box.append(rot[0] ^ rot[1] ^ rot[2] ^ rot[3] ^ rot[4] ^ 0x63)
    return box


def _te0() -> set[int]:
    """The entries of the public T-table (aes_te0 of aesgcm_math.cuh)."""
    out = set()
    for s in _sbox():
        s2 = ((s << 1) ^ 0x11B) & 0xFF if s & 0x80 else s << 1
        out.add(s2 | (s << 8) | (s << 16) | ((s2 ^ s) << 24))
    return out


_PUBLIC = _te0()


def _left_behind(after: bytes, before: bytes) -> list[tuple[int, int]]:
    """(offset, word) of the shared-memory words a block wrote and left neither zero, nor a
    T-table entry, nor a small number (a verdict, a message or key index)."""
    a = np.frombuffer(after[: len(after) // 4 * 4], dtype="<u4")
    b = np.frombuffer(before[: len(before) // 4 * 4], dtype="<u4")
    return [
        (4 * int(i), int(a[i]))
        for i in np.flatnonzero(a != b)
        if int(a[i]) >= 1 << 16 and int(a[i]) not in _PUBLIC
    ]


def _assert_no_block_leaks(
    obs: backend.Observer, kernels: set[str], secrets: set[bytes], plain: bytes
) -> None:
    assert {name for name, _, _, _ in obs.blocks} >= kernels
    text = _windows(plain, 1)
    for name, block, shm, before in obs.blocks:
        assert not _leaks(shm, secrets), f"{name} block {block} left key material in shared memory"
        assert not _leaks(shm, text), f"{name} block {block} left plaintext in shared memory"
        left = _left_behind(shm, before)
        assert not left, f"{name} block {block} left words in shared memory: {left[:4]}"


def test_no_dataset_kernel_leaves_a_secret_in_shared_memory(cpu: Any) -> None:
    header, key, records, plain = _dataset(3)
    rt._kernels_at(0, rt._threads_for(CS))  # start-up checks first, outside the observer
    tampered = bytearray(records)
    tampered[_tag_at(header, 2)] ^= 1
    with backend.observe() as obs:
        gcm = rt.GcmDevice(cpu, 0, header, key)
        try:
            secrets = _context_secrets(cpu.asnumpy(gcm.ctx), key)
            assert kat._open_on(gcm, cpu, records)[0] == plain
            kat._open_on(gcm, cpu, bytes(tampered))
            with cpu.cuda.Device(0), gcm.stream:  # sealing: plaintext in, records out
                out = cpu.empty(len(records), dtype=cpu.uint8)
                status = cpu.zeros(CHUNKS, dtype=cpu.uint32)
                gcm.launch(0, CHUNKS, _dev(cpu, plain), out, status, seal=True)
                assert _host(out) == records
        finally:
            gcm.close()
    _assert_no_block_leaks(obs, {"gcm_setup", "gcm_chunks", "gcm_finalize"}, secrets, plain)


def test_no_message_kernel_leaves_a_secret_in_shared_memory(cpu: Any) -> None:
    keys, msgs, plain, frames = _message_batch(4)
    with DeviceKeyring(keys) as ring, backend.observe() as obs:
        secrets = _context_secrets(cpu.asnumpy(ring.ctxs), *keys)
        sealed = cpu.zeros(frames, dtype=cpu.uint8)
        ring.seal(msgs, _dev(cpu, plain), sealed)
        back = [DeviceMessage(m.key, m.nonce, m.aad, m.dst, m.src, m.tag, m.length) for m in msgs]
        opened = cpu.empty(len(plain), dtype=cpu.uint8)
        ring.open(back, sealed, opened)
        got = _host(opened)
        assert all(got[m.src : m.src + m.length] == plain[m.src : m.src + m.length] for m in msgs)
    _assert_no_block_leaks(obs, {"gcm_msgs", "gcm_msgs_finalize"}, secrets, plain)


def test_the_self_test_kernel_leaves_no_secret_in_shared_memory(cpu: Any) -> None:
    """gcm_selftest (any IV length: J0 from GHASH) must leave neither its round keys nor H
    nor J0 behind."""
    kernels = rt._build(cpu, 0, 1)
    key, iv, aad, text = (os.urandom(n) for n in (32, 20, 17, 3000))
    ctx = cpu.zeros(rt._ctx_words(256), dtype=cpu.uint32)
    kernels.setup((1,), (256,), (_dev(cpu, key), ctx, np.uint32(256), np.uint64(1), np.uint64(1)))
    secrets = _context_secrets(cpu.asnumpy(ctx)[: rt._CTX_HPOW], key)
    with backend.observe() as obs:
        sealed, tag = rt._gcm_message(kernels, cpu, key, iv, aad, text, seal=True)
        rt._gcm_message(kernels, cpu, key, iv, aad, sealed, seal=False)
    _assert_no_block_leaks(obs, {"gcm_selftest"}, secrets, text)
    j0 = _ghash_j0(key, iv)
    assert not any(_leaks(shm, j0) for _, _, shm, _ in obs.blocks), "J0 left in shared memory"


def _ghash_j0(key: bytes, iv: bytes) -> set[bytes]:
    """J0 of a non-96-bit IV (GHASH of the padded IV and its length), in the byte orders a
    kernel might hold it in."""
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()  # noqa: S305 - H = E(K, 0)
    h = int.from_bytes(enc.update(bytes(16)) + enc.finalize(), "big")
    blocks = iv + bytes(-len(iv) % 16) + bytes(8) + (8 * len(iv)).to_bytes(8, "big")
    y = 0
    for i in range(0, len(blocks), 16):
        y = gf_mul(y ^ int.from_bytes(blocks[i : i + 16], "big"), h)
    be = y.to_bytes(16, "big")
    swapped = b"".join(be[i : i + 4][::-1] for i in range(0, 16, 4))
    return _windows(be, 4) | _windows(swapped, 4) | _windows(be[::-1], 4)


def gf_mul(x: int, y: int) -> int:
    """GCM's multiplication in GF(2^128) (bit-reflected, as SP 800-38D writes it)."""
    z, v = 0, y
    for i in range(127, -1, -1):
        if (x >> i) & 1:
            z ^= v
        v = (v >> 1) ^ (0xE1 << 120) if v & 1 else v >> 1
    return z


def _tracked_allocations(monkeypatch: pytest.MonkeyPatch) -> list[np.ndarray[Any, Any]]:
    """Every device allocation made from now on (roots), kept alive for inspection: on a GPU a
    freed buffer goes back to the pool as it is."""
    seen: list[np.ndarray[Any, Any]] = []
    init: Callable[..., None] = fake_cupy.ndarray.__init__

    def tracking(self: Any, a: np.ndarray[Any, Any], device: int) -> None:
        init(self, a, device)
        seen.append(fake_cupy._root(a))

    monkeypatch.setattr(fake_cupy.ndarray, "__init__", tracking)
    return seen


def test_no_device_buffer_keeps_key_material_once_staging_is_done(
    cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key context, the chunk key's device copy and the GHASH scratch are zeroed; only the
    caller's output holds plaintext."""
    header, key, records, plain = _dataset(5)
    rt._kernels_at(0, rt._threads_for(CS))
    gcm = rt.GcmDevice(cpu, 0, header, key)
    secrets = _context_secrets(cpu.asnumpy(gcm.ctx), key)
    gcm.close()
    allocations = _tracked_allocations(monkeypatch)
    out = gpu.decrypt_records_gpu(_dev(cpu, records), header, _dataset_key(5))
    assert _host(out) == plain
    text = _windows(plain, 1)
    for a in allocations:
        raw = a.view(np.uint8).tobytes()
        assert not _leaks(raw, secrets), f"a device buffer of {a.nbytes} bytes keeps key material"
        if a is not fake_cupy._root(out._a):
            assert not _leaks(raw, text), f"a device buffer of {a.nbytes} bytes keeps plaintext"


# --- data independence ----------------------------------------------------------------------------


def _traces(obs: backend.Observer, kernels: set[str]) -> list[tuple[str, tuple[int, ...]]]:
    return [(name, trace) for name, trace in obs.traces if name in kernels]


def _observed_open(
    cp: Any, header: Header, key: bytes, records: bytes, *, banks: bool
) -> backend.Observer:
    with backend.observe(banks=banks) as obs:
        _open_chunks(cp, header, key, records)
    return obs


def test_dataset_access_traces_do_not_depend_on_keys_texts_or_tags(cpu: Any) -> None:
    """Same shape, other key, text and dataset id: every thread of gcm_setup, gcm_chunks and
    gcm_finalize touches the same addresses, and in gcm_chunks the same shared-memory banks
    (gcm_setup's and gcm_finalize's single-thread T-table lookups index shared memory by key
    bytes: one lane cannot conflict with itself, so their shared offsets are not compared).
    Two wrong tags, wrong in the first and in the last byte: the compare reads the same
    bytes in the same order (no early exit)."""
    rt._kernels_at(0, rt._threads_for(CS))
    a, b = _dataset(10), _dataset(11)
    assert a[1] != b[1] and a[3] != b[3]
    every = {"gcm_setup", "gcm_chunks", "gcm_finalize"}
    for banks, kernels in ((True, {"gcm_chunks"}), (False, every)):
        ta = _traces(_observed_open(cpu, a[0], a[1], a[2], banks=banks), kernels)
        tb = _traces(_observed_open(cpu, b[0], b[1], b[2], banks=banks), kernels)
        assert {name for name, _ in ta} == kernels
        assert all(any(trace) for _, trace in ta)
        assert ta == tb, f"the access trace depends on the data (banks={banks})"
    header, key, records, _ = a
    wrong = []
    for k in (0, 15):
        r = bytearray(records)
        r[_tag_at(header, 2) + k] ^= 0x10
        wrong.append(_traces(_observed_open(cpu, header, key, bytes(r), banks=False), every))
    assert wrong[0] == wrong[1], "the tag compare's accesses depend on where the tags differ"


def test_message_access_traces_do_not_depend_on_keys_or_texts(cpu: Any) -> None:
    """As above for gcm_msgs (banks too) and gcm_msgs_finalize."""
    rt._kernels_at(0, rt._threads_for(CS))
    every = {"gcm_msgs", "gcm_msgs_finalize"}
    for banks, kernels in ((True, {"gcm_msgs"}), (False, every)):
        runs = []
        for seed in (20, 21):
            keys, msgs, plain, frames = _message_batch(seed)
            with DeviceKeyring(keys) as ring, backend.observe(banks=banks) as obs:
                sealed = cpu.zeros(frames, dtype=cpu.uint8)
                ring.seal(msgs, _dev(cpu, plain), sealed)
                back = [
                    DeviceMessage(m.key, m.nonce, m.aad, m.dst, m.src, m.tag, m.length)
                    for m in msgs
                ]
                status = ring.open(back, sealed, cpu.empty(len(plain), dtype=cpu.uint8))
                assert not cpu.asnumpy(status).any()
            runs.append(_traces(obs, kernels))
        assert {name for name, _ in runs[0]} == kernels
        assert all(any(trace) for _, trace in runs[0])
        assert runs[0] == runs[1], f"the message kernels' accesses depend on the data ({banks=})"


def test_the_digest_kernels_leave_nothing_in_shared_memory(cpu: Any) -> None:
    """sha256_shards, blake3_chunks and blake3_parents keep their state in registers and their
    thread's stack: every block leaves shared memory as it found it."""
    data = random.Random(6).randbytes(5 * 1024 + 9)
    digest_gpu.digest_device_buffers([_dev(cpu, data)])  # the self-test first
    with backend.observe() as obs:
        for kind in ("sha256", "blake3"):
            digest_gpu.digest_device_buffers([_dev(cpu, data)], kind)
    assert {name for name, _, _, _ in obs.blocks} == {
        "sha256_shards",
        "blake3_chunks",
        "blake3_parents",
    }
    for name, block, shm, before in obs.blocks:
        assert shm == before, f"{name} block {block} wrote shared memory"
