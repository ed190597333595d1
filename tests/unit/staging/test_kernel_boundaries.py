"""The kernels at the 2^32 boundaries their counters cross only at scale, reached by start
offsets instead of 2^32 blocks of data, bit-exact against the reference libraries.

* AES-GCM's 32-bit block counter wrapping (inc32): gcm_selftest with a 16-byte IV chosen so
  that J0 = GHASH(IV) ends a few blocks (or a tile and more) before 2^32. A dataset chunk's
  counter never gets there (its nonce is 96 bits, so J0 ends in 1); the wrap is in the tile
  code every kernel shares. Against ``cryptography``'s AESGCM with the same IV.
* Dataset chunk indices across 2^32 (the nonce's index and the AAD's): a header of 2^32 + 1
  chunks, and records of its chunks 2^32 - 2 .. 2^32 opened (``decrypt_records_gpu``'s
  ``first_chunk``) and sealed (``GcmDevice.launch``'s first chunk) where they are.
* BLAKE3 chunk counters across the high word: ``blake3_chunks`` with an input whose chunks
  start (``chunk_start``) 2^32 - 1 jobs before the first job, so job j compresses chunk
  2^32 - 1 + j (the 64-bit job arithmetic wraps exactly as on the GPU). Against a plain
  Python BLAKE3 compression checked against the ``blake3`` package first.
* SHA-256 of a 512 MiB + 3 byte message (its bit length needs the high length word) through
  ``sha256_shards``: the buffer is zero pages, untouched until the kernel reads them.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Iterator
from typing import Any

import blake3
import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpucc.staging import _gpu_kat as kat
from gpucc.staging import _gpu_runtime as rt
from gpucc.staging import format as fmt
from gpucc.staging import gpu
from gpucc.staging import gpu_messages as gm
from gpucc.staging.errors import ChunkAuthenticationError
from gpucc.staging.format import Header
from gpucc.staging.model import digest_gpu
from gpucc.staging.seal import seal_bytes
from tests.support import fake_cupy
from tests.support.cudacpu import backend
from tests.unit.staging.test_kernel_secrets import gf_mul


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    cp = backend.install(monkeypatch, sm_count=1, occupancy=2, seed=32)
    monkeypatch.setattr(kat, "_KAT_TILES", 3)
    yield cp


def _host(arr: Any) -> bytes:
    return bytes(backend.asnumpy(arr).tobytes())


def _dev(cp: Any, data: bytes) -> Any:
    return cp.asarray(np.frombuffer(data or b"\x00", dtype=np.uint8))


# --- AES-GCM: the 32-bit block counter ----------------------------------------------------------


def _gf_inverse(h: int) -> int:
    """h^(2^128 - 2) = h^-1 in GF(2^128)."""
    result, base, e = 1 << 127, h, (1 << 128) - 2  # 1 << 127 is GCM's one
    while e:
        if e & 1:
            result = gf_mul(result, base)
        base = gf_mul(base, base)
        e >>= 1
    return result


def _iv_for_j0(key: bytes, j0: bytes) -> bytes:
    """The 16-byte IV whose J0 = GHASH_H(IV || 0^64 || [128]_64) is ``j0``."""
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()  # noqa: S305 - H = E(K, 0)
    h = int.from_bytes(enc.update(bytes(16)) + enc.finalize(), "big")
    hinv = _gf_inverse(h)
    assert gf_mul(h, hinv) == 1 << 127
    length = 128  # bits of the IV, in the low 64 bits of the length block
    x = gf_mul(gf_mul(int.from_bytes(j0, "big"), hinv) ^ length, hinv)
    iv = x.to_bytes(16, "big")
    assert gf_mul(gf_mul(x, h) ^ length, h) == int.from_bytes(j0, "big")
    return iv


@pytest.mark.parametrize("before", [1, 3, 200, 256 + 7])
def test_the_block_counter_wraps_modulo_2_to_the_32(cpu: Any, before: int) -> None:
    """J0's counter word ``before`` blocks short of 2^32: the text (two tiles of the 64-thread
    self-test CTA, 4 blocks a thread) runs across the wrap, in the first or the second tile."""
    kernels = rt._build(cpu, 0, 1)
    rng = random.Random(before)
    key, aad, text = rng.randbytes(32), rng.randbytes(20), rng.randbytes(2 * 4096 - 5)
    j0 = rng.randbytes(12) + (2**32 - before).to_bytes(4, "big")
    iv = _iv_for_j0(key, j0)
    sealed = AESGCM(key).encrypt(iv, text, aad)
    got = rt._gcm_message(kernels, cpu, key, iv, aad, text, seal=True)
    assert got == (sealed[:-16], sealed[-16:])
    assert rt._gcm_message(kernels, cpu, key, iv, aad, sealed[:-16], seal=False) == (
        text,
        sealed[-16:],
    )


# --- AES-GCM: dataset chunk indices ---------------------------------------------------------------

CS = 4096
LAST = 100
HUGE = Header(chunk_size=CS, dataset_id=bytes(range(16)), plaintext_length=2**32 * CS + LAST)


def _reference_records(dk: bytes, first: int, texts: list[bytes], header: Header = HUGE) -> bytes:
    key = fmt.derive_chunk_key(dk, header.dataset_id)
    out = b""
    for i, text in enumerate(texts, start=first):
        final = i == header.chunk_count - 1
        nonce = fmt.chunk_nonce(header.dataset_id, i)
        out += AESGCM(key).encrypt(nonce, text, fmt.chunk_aad(header.digest, i, final))
    return out


@pytest.mark.parametrize("first", [2**32 - 2, 2**32 - 1, 2**32])
def test_chunk_indices_across_2_to_the_32_open_and_seal_bit_exact(cpu: Any, first: int) -> None:
    assert HUGE.chunk_count == 2**32 + 1
    rng = random.Random(first)
    dk = rng.randbytes(32)
    texts = [rng.randbytes(HUGE.chunk_length(i)) for i in range(first, HUGE.chunk_count)]
    records = _reference_records(dk, first, texts)
    out = gpu.decrypt_records_gpu(_dev(cpu, records), HUGE, dk, first_chunk=first)
    assert _host(out) == b"".join(texts)
    key = fmt.derive_chunk_key(dk, HUGE.dataset_id)
    gcm = rt.GcmDevice(cpu, 0, HUGE, key)
    try:
        with cpu.cuda.Device(0), gcm.stream:
            sealed = cpu.zeros(len(records), dtype=cpu.uint8)
            status = cpu.zeros(len(texts), dtype=cpu.uint32)
            gcm.launch(first, len(texts), _dev(cpu, b"".join(texts)), sealed, status, seal=True)
            assert _host(sealed) == records
    finally:
        gcm.close()


def test_a_chunk_index_past_2_to_the_32_is_not_taken_modulo(cpu: Any) -> None:
    """Chunk 2^32 + 5's records under chunk 5's index fail (the index's high word counts)."""
    huger = Header(chunk_size=CS, dataset_id=bytes(16), plaintext_length=2**33 * CS)
    rng = random.Random(5)
    dk = rng.randbytes(32)
    text = rng.randbytes(CS)
    records = _dev(cpu, _reference_records(dk, 2**32 + 5, [text], huger))
    with pytest.raises(ChunkAuthenticationError) as info:
        gpu.decrypt_records_gpu(records, huger, dk, first_chunk=5)
    assert info.value.chunk_index == 5
    assert _host(gpu.decrypt_records_gpu(records, huger, dk, first_chunk=2**32 + 5)) == text


# --- BLAKE3: the chunk counter's high word ----------------------------------------------------------

_B3_IV = (
    0x6A09E667,
    0xBB67AE85,
    0x3C6EF372,
    0xA54FF53A,
    0x510E527F,
    0x9B05688C,
    0x1F83D9AB,
    0x5BE0CD19,
)
_B3_PERM = (2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8)
_M32 = 0xFFFFFFFF


def _b3_compress(cv: list[int], block: bytes, counter: int, length: int, flags: int) -> list[int]:
    """BLAKE3's compression function, from the specification (first 8 output words)."""

    def rotr(x: int, n: int) -> int:
        return ((x >> n) | (x << (32 - n))) & _M32

    def g(v: list[int], a: int, b: int, c: int, d: int, x: int, y: int) -> None:
        v[a] = (v[a] + v[b] + x) & _M32
        v[d] = rotr(v[d] ^ v[a], 16)
        v[c] = (v[c] + v[d]) & _M32
        v[b] = rotr(v[b] ^ v[c], 12)
        v[a] = (v[a] + v[b] + y) & _M32
        v[d] = rotr(v[d] ^ v[a], 8)
        v[c] = (v[c] + v[d]) & _M32
        v[b] = rotr(v[b] ^ v[c], 7)

    m = [int.from_bytes(block[4 * i : 4 * i + 4], "little") for i in range(16)]
    v = [*cv, *_B3_IV[:4], counter & _M32, counter >> 32, length, flags]
    for r in range(7):
        g(v, 0, 4, 8, 12, m[0], m[1])
        g(v, 1, 5, 9, 13, m[2], m[3])
        g(v, 2, 6, 10, 14, m[4], m[5])
        g(v, 3, 7, 11, 15, m[6], m[7])
        g(v, 0, 5, 10, 15, m[8], m[9])
        g(v, 1, 6, 11, 12, m[10], m[11])
        g(v, 2, 7, 8, 13, m[12], m[13])
        g(v, 3, 4, 9, 14, m[14], m[15])
        if r < 6:
            m = [m[p] for p in _B3_PERM]
    return [v[i] ^ v[i + 8] for i in range(8)]


def _b3_chunk_cv(chunk: bytes, counter: int) -> list[int]:
    cv = list(_B3_IV)
    blocks = [chunk[i : i + 64] for i in range(0, len(chunk), 64)] or [b""]
    for k, block in enumerate(blocks):
        flags = (1 if k == 0 else 0) | (2 if k == len(blocks) - 1 else 0)
        cv = _b3_compress(cv, block.ljust(64, b"\0"), counter, len(block), flags)
    return cv


def _b3_root(cvs: list[list[int]]) -> bytes:
    """The root of a left-complete tree over chunk values (more than one)."""

    def node(lo: int, hi: int, root: bool) -> list[int]:
        if hi - lo == 1:
            return cvs[lo]
        split = 1 << ((hi - lo - 1).bit_length() - 1)
        block = b"".join(
            w.to_bytes(4, "little")
            for w in node(lo, lo + split, False) + node(lo + split, hi, False)
        )
        return _b3_compress(list(_B3_IV), block, 0, 64, 4 | (8 if root else 0))

    return b"".join(w.to_bytes(4, "little") for w in node(0, len(cvs), True))


def test_the_python_blake3_reference_matches_the_blake3_package() -> None:
    data = random.Random(3).randbytes(3 * 1024 + 77)
    cvs = [_b3_chunk_cv(data[i : i + 1024], i // 1024) for i in range(0, len(data), 1024)]
    assert _b3_root(cvs) == blake3.blake3(data).digest()


def test_blake3_chunk_counters_across_the_high_word(cpu: Any) -> None:
    """Jobs 0..4 are chunks 2^32 - 2 .. 2^32 + 2 of one long input (the last one partial)."""
    k = digest_gpu._kernels()
    start = 2**32 - 2
    data = random.Random(9).randbytes(4 * 1024 + 300)
    base = _dev(cpu, data)
    wrap = 2**64
    offset = (-start * 1024) % wrap  # base + offset + 1024 * (start + j) = base + 1024 * j
    length = start * 1024 + len(data)
    cvs = cpu.zeros(8 * 5, dtype=cpu.uint32)
    u64 = digest_gpu._u64
    k.chunks(
        (1,),
        (128,),
        (base, u64(k, [offset]), u64(k, [length]), u64(k, [(-start) % wrap]), np.uint32(1),
         np.uint64(5), cvs),
    )  # fmt: skip
    got = cpu.asnumpy(cvs).reshape(5, 8)
    for j in range(5):
        want = _b3_chunk_cv(data[1024 * j : 1024 * (j + 1)], start + j)
        assert [int(w) for w in got[j]] == want, j


# --- SHA-256: a bit length past 2^32 ------------------------------------------------------------------


@pytest.mark.slow
def test_sha256_of_a_message_past_512_mib_uses_the_high_length_word(
    cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2^29 + 3 bytes (bit length 2^32 + 24): the zero-filled message of that length, and a
    last byte of 1 in the tail block."""
    monkeypatch.setenv("CUDACPU_VARIANT", "fast")  # 8 M compressions: no per-access checks
    k = digest_gpu._kernels()
    n = 2**29 + 3
    host = np.zeros(n + 13, dtype=np.uint8)  # zero pages, untouched until read
    host[n - 1] = 1
    buf = fake_cupy.ndarray(host, 0)
    got = digest_gpu._launch(k, "sha256", buf, [0], [n])
    want = hashlib.sha256()
    zeros = bytes(1 << 20)
    for _ in range((n - 3) >> 20):
        want.update(zeros)
    want.update(b"\0\0\1")
    assert got == [want.digest()]
    assert os.environ["CUDACPU_VARIANT"] == "fast"


# --- more tiles than gcm_finalize has threads, with little data --------------------------------

#: Tiles per chunk (and per message): more than the 256 combine threads, so each combine thread
#: runs Horner with G^256 (the context's highest power of G) over two or more tiles.
MANY_TILES = 300
#: CTA width of these launches: the narrowest the kernels take (tiles of 4 x 32 blocks, 2 KiB),
#: so 300 tiles are 600 KiB instead of the 4.7 MiB of the production known answers' shape.
NARROW = 32


def test_chunks_of_more_than_256_tiles_open_and_seal_bit_exact(
    cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gcm_chunks at 32 threads and gcm_finalize over chunks of 300 tiles (5 blocks short of
    whole tiles) and a short last chunk: opened, sealed and a tag rejected, against
    ``cryptography`` (``seal_bytes``)."""
    monkeypatch.setattr(rt, "_threads_for", lambda _chunk_size: NARROW)
    cs = MANY_TILES * rt._K * NARROW * 16 - 5 * 16
    plain = random.Random(256).randbytes(2 * cs + 1000 + 5)
    dk, did = fmt.new_dataset_key(), os.urandom(16)
    blob = bytes(seal_bytes(plain, dataset_key=dk, chunk_size=cs, dataset_id=did, threads=1))
    header = Header.parse(blob[: fmt.HEADER_SIZE])
    records = blob[header.chunks_offset :]
    kernels = rt._build(cpu, 0, 1)
    gcm = rt.GcmDevice(cpu, 0, header, fmt.derive_chunk_key(dk, did), _unchecked=(kernels, 2))
    try:
        assert gcm.width == NARROW and gcm.tiles_full == MANY_TILES
        assert kat._open_on(gcm, cpu, records) == (plain, [0, 0, 0])
        tampered = bytearray(records)
        tampered[cs + 15] ^= 0x80  # the last byte of chunk 0's tag
        opened, status = kat._open_on(gcm, cpu, tampered)
        assert status == [1, 0, 0] and opened == bytes(cs) + plain[cs:]
        with cpu.cuda.Device(0), gcm.stream:
            sealed = cpu.zeros(len(records), dtype=cpu.uint8)
            words = cpu.zeros(header.chunk_count, dtype=cpu.uint32)
            gcm.launch(0, header.chunk_count, _dev(cpu, plain), sealed, words, seal=True)
            assert _host(sealed) == records
    finally:
        gcm.close()


def test_messages_of_more_than_256_tiles_open_and_seal_bit_exact(
    cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gcm_msgs at 32 threads and gcm_msgs_finalize over messages of 300 tiles and more under
    two keys, against ``cryptography``'s AESGCM; a tag changed in one is rejected."""
    monkeypatch.setattr(gm, "WIDTH", NARROW)
    monkeypatch.setattr(gm, "_CT", rt._K * NARROW)
    tile = rt._K * NARROW * 16
    rng = random.Random(300)
    keys = [rng.randbytes(32), rng.randbytes(32)]
    texts = [rng.randbytes(MANY_TILES * tile - 5 * 16 - 3), rng.randbytes(257 * tile + 1)]
    messages, sealed, at = [], bytearray(), 0
    for i, text in enumerate(texts):
        nonce, aad = rng.randbytes(12), rng.randbytes(20 + i)
        record = AESGCM(keys[i]).encrypt(nonce, text, aad)
        src = len(sealed)
        sealed += record + bytes(-len(record) % 16)
        messages.append(gm.DeviceMessage(i, nonce, aad, src, at, src + len(text), len(text)))
        at += -(-len(text) // 16) * 16
    plain = bytearray(at)
    for m, text in zip(messages, texts, strict=True):
        plain[m.dst : m.dst + m.length] = text
    kernels = rt._build(cpu, 0, 1)
    with gm.DeviceKeyring(keys, _unchecked=(kernels, 2)) as ring:
        assert gm._tiles(len(texts[0])) == MANY_TILES and gm._tiles(len(texts[1])) == 258
        out = cpu.zeros(at, dtype=cpu.uint8)
        assert list(ring.verdicts(ring.open(messages, _dev(cpu, bytes(sealed)), out), out)) == [
            0,
            0,
        ]
        assert _host(out) == bytes(plain)
        tampered = bytearray(sealed)
        tampered[messages[1].tag] ^= 0x01
        status = ring.open(messages, _dev(cpu, bytes(tampered)), out)
        assert list(ring.verdicts(status, out)) == [0, 1]
        reseal = [gm.DeviceMessage(m.key, m.nonce, m.aad, m.dst, m.src, m.tag, m.length)
                  for m in messages]  # fmt: skip
        back = cpu.zeros(len(sealed), dtype=cpu.uint8)
        ring.seal(reseal, _dev(cpu, bytes(plain)), back)
        with cpu.cuda.Device(0), ring.stream:
            assert _host(back) == bytes(sealed)
