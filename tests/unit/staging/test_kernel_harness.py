"""The GPU kernels' arithmetic, checked on the host: no GPU needed, only ``nvcc``.

``staging/kernels/harness.cu`` compiles the same ``__host__ __device__`` functions the kernels
run (AES-256, the constant-time GF(2^128) multiply, the tiled GHASH decomposition and its
combine schedule, a whole emulated launch over sealed-format chunks) into a host program.
These tests drive it and compare every answer with independent references: ``cryptography``,
the GCM specification's AES-256 test vectors (``tests/data/gcm_vectors.json``, themselves
cross-checked against ``cryptography``), and small pure-Python models written here.

A second group compiles the CUDA kernels themselves for ``sm_90`` and checks ptxas' report:
no spills and no stack frame.

Random inputs are fresh on every run; the seed is printed (set ``GPUCC_TEST_SEED`` to replay).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpucc.staging import _gpu_runtime as gpu
from gpucc.staging import format as fmt
from tests.support.nvcc import Harness, ptxas_functions
from tests.support.paths import DATA, ROOT

pytestmark = pytest.mark.nvcc

KERNELS = ROOT / "staging" / "kernels"
VECTORS = DATA / "gcm_vectors.json"
NVCC = shutil.which("nvcc")


def _seed() -> int:
    env = os.environ.get("GPUCC_TEST_SEED")
    seed = int(env) if env else int.from_bytes(os.urandom(8), "big")
    print(f"GPUCC_TEST_SEED={seed}")
    return seed


# --- building and driving the harness -------------------------------------------------------


def _h(data: bytes) -> str:
    return data.hex() if data else "-"


def _b(text: str) -> bytes:
    return b"" if text == "-" else bytes.fromhex(text)


def _gcm(key: bytes, iv: bytes, plaintext: bytes, aad: bytes) -> tuple[bytes, bytes]:
    """``cryptography``'s AES-GCM (any IV length): ciphertext and tag."""
    enc = Cipher(algorithms.AES(key), modes.GCM(iv)).encryptor()
    enc.authenticate_additional_data(aad)
    ct = enc.update(plaintext) + enc.finalize()
    return ct, enc.tag


# --- independent pure-Python models -------------------------------------------------------------


def _gf8_mul(a: int, b: int) -> int:
    r = 0
    while b:
        if b & 1:
            r ^= a
        a = (a << 1) ^ (0x11B if a & 0x80 else 0)
        b >>= 1
    return r


def _sbox_model() -> list[int]:
    inverse = {0: 0}
    for x in range(1, 256):
        inverse[x] = next(y for y in range(1, 256) if _gf8_mul(x, y) == 1)
    out = []
    for x in range(256):
        b = inverse[x]
        s = b
        for k in range(1, 5):
            s ^= ((b << k) | (b >> (8 - k))) & 0xFF
        out.append(s ^ 0x63)
    return out


def _clmul_model(a: int, b: int) -> int:
    r = 0
    for i in range(32):
        if (b >> i) & 1:
            r ^= a << i
    return r


def _gf128_model(x: bytes, y: bytes) -> bytes:
    """SP 800-38D, Algorithm 1, on blocks read as big-endian integers."""
    xi, v = int.from_bytes(x, "big"), int.from_bytes(y, "big")
    z = 0
    for i in range(128):
        if (xi >> (127 - i)) & 1:
            z ^= v
        v = (v >> 1) ^ (0xE1 << 120) if v & 1 else v >> 1
    return z.to_bytes(16, "big")


# --- the arithmetic, piece by piece ---------------------------------------------------------------


def test_layout_matches_the_python_mirror(harness: Harness) -> None:
    fields = dict(kv.split("=") for kv in harness.one("layout").split())
    assert int(fields["ctx_hpow"]) == gpu._CTX_HPOW
    assert int(fields["combine_threads"]) == gpu._COMBINE_THREADS
    assert int(fields["ctx_words_1024"]) == gpu._ctx_words(1024)
    assert int(fields["aad_bytes"]) == len(fmt.chunk_aad(bytes(32), 0, False))


def test_sbox_is_computed_correctly(harness: Harness) -> None:
    sbox = bytes.fromhex(harness.one("sbox"))
    assert list(sbox) == _sbox_model()
    assert (sbox[0x00], sbox[0x01], sbox[0x53], sbox[0xFF]) == (0x63, 0x7C, 0xED, 0x16)


def test_clmul32_matches_the_bitwise_model(harness: Harness) -> None:
    rng = random.Random(_seed())
    edge = [0, 1, 0xFFFFFFFF, 0x80000000, 0x55555555, 0xAAAAAAAA, 0x11111111, 0x88888888]
    pairs = [(a, b) for a in edge for b in edge]
    pairs += [(rng.getrandbits(32), rng.getrandbits(32)) for _ in range(300)]
    got = harness.run([f"clmul32 {a:#x} {b:#x}" for a, b in pairs])
    for (a, b), line in zip(pairs, got, strict=True):
        assert int(line, 16) == _clmul_model(a, b), (hex(a), hex(b))


def test_gf128_multiply_matches_sp800_38d_algorithm_1(harness: Harness) -> None:
    rng = random.Random(_seed())
    one = bytes([0x80]) + bytes(15)  # the polynomial 1 in GCM bit order
    edge = [bytes(16), one, b"\xff" * 16, bytes(15) + b"\x01", b"\x01" + bytes(15)]
    pairs = [(a, b) for a in edge for b in edge]
    pairs += [(rng.randbytes(16), rng.randbytes(16)) for _ in range(200)]
    got = harness.run([f"gfmul {a.hex()} {b.hex()}" for a, b in pairs])
    for (a, b), line in zip(pairs, got, strict=True):
        assert bytes.fromhex(line) == _gf128_model(a, b)


def test_gf128_powers(harness: Harness) -> None:
    rng = random.Random(_seed())
    h = rng.randbytes(16)
    exps = [0, 1, 2, 3, 7, 64, 255, 1024, 1025]
    got = harness.run([f"gfpow {h.hex()} {e}" for e in exps])
    acc = bytes([0x80]) + bytes(15)
    power = {0: acc}
    for e in range(1, max(exps) + 1):
        acc = _gf128_model(acc, h)
        power[e] = acc
    assert [bytes.fromhex(x) for x in got] == [power[e] for e in exps]


def test_aes256_block_matches_cryptography(harness: Harness) -> None:
    rng = random.Random(_seed())
    cases = [(bytes(32), bytes(16))] + [(rng.randbytes(32), rng.randbytes(16)) for _ in range(64)]
    # FIPS-197 Appendix C.3 (AES-256), as a fixed anchor beside the random cases.
    fips_key = bytes(range(32))
    fips_pt = bytes.fromhex("00112233445566778899aabbccddeeff")
    cases.append((fips_key, fips_pt))
    got = harness.run([f"aes {k.hex()} {p.hex()}" for k, p in cases])
    for (k, p), line in zip(cases, got, strict=True):
        ecb = Cipher(algorithms.AES(k), modes.ECB()).encryptor()  # noqa: S305 - one block
        assert bytes.fromhex(line) == ecb.update(p) + ecb.finalize()
    assert got[-1] == "8ea2b7ca516745bfeafc49904b496089"


# --- the GCM specification's vectors -------------------------------------------------------------


def _vectors() -> list[dict[str, str]]:
    cases: list[dict[str, str]] = json.loads(VECTORS.read_text())["cases"]
    return cases


def test_vectors_file_agrees_with_cryptography() -> None:
    """A transcription error in the JSON cannot pass: every case is recomputed."""
    cases = _vectors()
    assert [c["name"] for c in cases] == [f"Test Case {n}" for n in range(13, 19)]
    for c in cases:
        ct, tag = _gcm(_b(c["key"]), _b(c["iv"]), _b(c["plaintext"]), _b(c["aad"]))
        assert (ct, tag) == (_b(c["ciphertext"]), _b(c["tag"])), c["name"]
        h = Cipher(algorithms.AES(_b(c["key"])), modes.ECB()).encryptor().update(bytes(16))  # noqa: S305
        assert h == _b(c["h"]), c["name"]


def test_the_device_self_test_answers_are_right() -> None:
    """gpu.py refuses a device whose kernels miss these; they must be right themselves."""
    for key, iv, aad, pt, ct, tag in gpu._KATS:
        got = _gcm(bytes.fromhex(key), bytes.fromhex(iv), bytes.fromhex(pt), bytes.fromhex(aad))
        assert got == (bytes.fromhex(ct), bytes.fromhex(tag))


GEOMETRIES = [(1, 1, 1), (1, 3, 2), (2, 5, 7), (4, 32, 256), (4, 64, 3), (8, 7, 33)]


@pytest.mark.parametrize("case", _vectors(), ids=lambda c: c["name"])
def test_spec_vectors_serial_and_tiled(harness: Harness, case: dict[str, str]) -> None:
    key, iv, pt, aad = case["key"], case["iv"], case["plaintext"], case["aad"]
    want = f"{case['ciphertext'] or '-'} {case['tag']}"
    cmds = [f"ref enc {key} {iv} {aad or '-'} {pt or '-'}"]
    cmds += [
        f"tiled enc {k} {t} {ft} {key} {iv} {aad or '-'} {pt or '-'}" for k, t, ft in GEOMETRIES
    ]
    assert harness.run(cmds) == [want] * len(cmds)
    # Opening: the plaintext comes back and the computed tag is the published one.
    back = harness.run(
        [
            f"tiled dec {k} {t} {ft} {key} {iv} {aad or '-'} {case['ciphertext'] or '-'}"
            for k, t, ft in GEOMETRIES
        ]
    )
    assert back == [f"{pt or '-'} {case['tag']}"] * len(GEOMETRIES)
    assert harness.one(f"aes {key} {'00' * 16}") == case["h"]


# --- random messages, every length class, many partitions ---------------------------------------

LENGTHS = [0, 1, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 255, 256, 257, 1000, 4095, 4096, 4097]


def test_random_messages_match_cryptography(harness: Harness) -> None:
    rng = random.Random(_seed())
    cmds: list[str] = []
    expect: list[str] = []
    for n in LENGTHS:
        for aad_len in (0, 1, 16, 41, 100):
            key, iv = rng.randbytes(32), rng.randbytes(12)
            pt, aad = rng.randbytes(n), rng.randbytes(aad_len)
            ct, tag = _gcm(key, iv, pt, aad)
            k, t, ft = rng.choice(GEOMETRIES)
            cmds.append(f"tiled enc {k} {t} {ft} {key.hex()} {iv.hex()} {_h(aad)} {_h(pt)}")
            expect.append(f"{_h(ct)} {tag.hex()}")
            cmds.append(f"tiled dec {k} {t} {ft} {key.hex()} {iv.hex()} {_h(aad)} {_h(ct)}")
            expect.append(f"{_h(pt)} {tag.hex()}")
            cmds.append(f"ref enc {key.hex()} {iv.hex()} {_h(aad)} {_h(pt)}")
            expect.append(f"{_h(ct)} {tag.hex()}")
    assert harness.run(cmds) == expect


def test_other_iv_lengths(harness: Harness) -> None:
    """J0 from GHASH(IV) (never used by the format, but the math must still be right)."""
    rng = random.Random(_seed())
    cmds, expect = [], []
    for iv_len in (8, 11, 13, 16, 60, 100, 128):
        key, iv, pt, aad = rng.randbytes(32), rng.randbytes(iv_len), rng.randbytes(77), b"x"
        ct, tag = _gcm(key, iv, pt, aad)
        cmds.append(f"tiled enc 4 8 5 {key.hex()} {iv.hex()} {aad.hex()} {pt.hex()}")
        expect.append(f"{ct.hex()} {tag.hex()}")
    assert harness.run(cmds) == expect


def test_combine_schedule_with_many_partitions(harness: Harness) -> None:
    """One long message through many (K, T, FT): tiles of 1..2048 blocks, 1..256 combiners,
    more combiners than tiles, a final tile of one block, counts that divide and do not."""
    rng = random.Random(_seed())
    key, iv, aad = rng.randbytes(32), rng.randbytes(12), rng.randbytes(41)
    for n in (16 * 5003, 16 * 4096 + 5):
        pt = rng.randbytes(n)
        ct, tag = _gcm(key, iv, pt, aad)
        geometries = [
            (1, 1, 256),
            (1, 7, 1),
            (2, 13, 5),
            (4, 32, 32),
            (4, 64, 256),
            (4, 256, 256),
            (8, 3, 100),
            (8, 256, 7),
        ]
        cmds = [
            f"tiled enc {k} {t} {ft} {key.hex()} {iv.hex()} {aad.hex()} {pt.hex()}"
            for k, t, ft in geometries
        ]
        assert harness.run(cmds) == [f"{ct.hex()} {tag.hex()}"] * len(cmds)


def test_counter_wraps_only_the_low_32_bits(harness: Harness) -> None:
    """inc32 (SP 800-38D): block c uses J0's last word + 1 + c modulo 2^32, big-endian."""
    rng = random.Random(_seed())
    cases = []
    for low in (0x00000001, 0xFFFFFFFE, 0xFFFFFFFF, 0x7FFFFFFF, rng.getrandbits(32)):
        j0 = rng.randbytes(12) + low.to_bytes(4, "big")
        for c in (0, 1, 2, 5, 2**32 - 1, 2**32 + 3):
            cases.append((j0, c))
    got = harness.run([f"ctrblock {j0.hex()} {c}" for j0, c in cases])
    for (j0, c), line in zip(cases, got, strict=True):
        low = (int.from_bytes(j0[12:], "big") + 1 + c) % 2**32
        assert bytes.fromhex(line) == j0[:12] + low.to_bytes(4, "big")


# --- Wycheproof-style edge cases -----------------------------------------------------------------


def test_empty_plaintext_empty_aad_and_tag_mismatch(harness: Harness) -> None:
    rng = random.Random(_seed())
    key, iv = rng.randbytes(32), rng.randbytes(12)
    aad = rng.randbytes(20)
    _, tag_empty = _gcm(key, iv, b"", b"")
    _, tag_aad_only = _gcm(key, iv, b"", aad)
    pt = rng.randbytes(33)
    ct, tag_no_aad = _gcm(key, iv, pt, b"")
    got = harness.run(
        [
            f"tiled enc 4 32 256 {key.hex()} {iv.hex()} - -",
            f"tiled enc 4 32 256 {key.hex()} {iv.hex()} {aad.hex()} -",
            f"tiled enc 4 32 256 {key.hex()} {iv.hex()} - {pt.hex()}",
        ]
    )
    assert got == [
        f"- {tag_empty.hex()}",
        f"- {tag_aad_only.hex()}",
        f"{ct.hex()} {tag_no_aad.hex()}",
    ]
    # Tag mismatch: any change to the ciphertext, the AAD or the IV changes the computed tag.
    flipped_ct = bytes([ct[0] ^ 1]) + ct[1:]
    flipped_aad = bytes([aad[-1] ^ 0x80]) + aad[:-1]
    other_iv = bytes([iv[0] ^ 1]) + iv[1:]
    tags = [
        line.split()[1]
        for line in harness.run(
            [
                f"tiled dec 4 32 256 {key.hex()} {iv.hex()} - {flipped_ct.hex()}",
                f"tiled dec 4 32 256 {key.hex()} {iv.hex()} {flipped_aad.hex()} {ct.hex()}",
                f"tiled dec 4 32 256 {key.hex()} {other_iv.hex()} - {ct.hex()}",
            ]
        )
    ]
    assert tag_no_aad.hex() not in tags


# --- whole emulated launches over sealed-format chunks ------------------------------------------


def _seal_records(ck: bytes, header: fmt.Header, data: bytes, first: int, count: int) -> bytes:
    """Records of chunks [first, first+count), made with `cryptography` and format.py."""
    aead = AESGCM(ck)
    out = bytearray()
    for i in range(first, first + count):
        chunk = data[i * header.chunk_size : i * header.chunk_size + header.chunk_length(i)]
        out += aead.encrypt(
            fmt.chunk_nonce(header.dataset_id, i),
            chunk,
            fmt.chunk_aad(header.digest, i, header.is_final(i)),
        )
    return bytes(out)


def _batch_cmd(
    mode: str,
    geometry: tuple[int, int, int],
    ck: bytes,
    header: fmt.Header,
    first: int,
    count: int,
    data: bytes,
    *,
    total: int | None = None,
    last_len: int | None = None,
) -> str:
    k, t, ft = geometry
    prefix = int.from_bytes(header.dataset_id[:4], "little")
    total = header.chunk_count if total is None else total
    last = header.chunk_length(header.chunk_count - 1) if last_len is None else last_len
    return (
        f"batch {mode} {k} {t} {ft} {ck.hex()} {prefix} {header.digest.hex()} "
        f"{header.chunk_size} {total} {last} {first} {count} {_h(data)}"
    )


BATCH_GEOMETRIES = [(4, 64, 256), (4, 3, 7), (1, 32, 1), (1, 5, 256)]


@pytest.mark.parametrize("chunk_size", [4096, 4112, 8192])
def test_emulated_launch_seals_and_opens_like_the_format(harness: Harness, chunk_size: int) -> None:
    rng = random.Random(_seed())
    ck = rng.randbytes(32)
    cs = chunk_size
    for length in (0, 1, 15, 16, 17, cs - 1, cs, cs + 1, 3 * cs + 5, 4 * cs):
        header = fmt.Header(chunk_size=cs, dataset_id=rng.randbytes(16), plaintext_length=length)
        data = rng.randbytes(length)
        n = header.chunk_count
        # The whole dataset, and a batch in the middle / at the end when there are several.
        ranges = {(0, n), (n - 1, 1)} | ({(1, n - 2), (n // 2, n - n // 2)} if n > 2 else set())
        for first, count in sorted(ranges):
            geometry = rng.choice(BATCH_GEOMETRIES)
            records = _seal_records(ck, header, data, first, count)
            lo = first * cs
            plain = data[lo : lo + sum(header.chunk_length(i) for i in range(first, first + count))]
            sealed, opened = harness.run(
                [
                    _batch_cmd("enc", geometry, ck, header, first, count, plain),
                    _batch_cmd("dec", geometry, ck, header, first, count, records),
                ]
            )
            assert sealed == f"{_h(records)} {','.join(['0'] * count)}"
            assert opened == f"{_h(plain)} {','.join(['0'] * count)}"


@pytest.mark.parametrize(
    ("chunk_size", "threads"), [(8192, 128), (16384, 256), (65536, 256), (262144, 256)]
)
def test_emulated_launch_at_the_production_geometry(
    harness: Harness, chunk_size: int, threads: int
) -> None:
    """The CTA widths staging launches for these chunk sizes (4 blocks per thread, 256 combine
    threads): several tiles per chunk, a final chunk with a partial block, and a tamper."""
    rng = random.Random(_seed())
    ck, cs = rng.randbytes(32), chunk_size
    geometry = (4, threads, 256)
    header = fmt.Header(chunk_size=cs, dataset_id=rng.randbytes(16), plaintext_length=2 * cs + 37)
    data = rng.randbytes(header.plaintext_length)
    n = header.chunk_count
    records = _seal_records(ck, header, data, 0, n)
    sealed, opened = harness.run(
        [
            _batch_cmd("enc", geometry, ck, header, 0, n, data),
            _batch_cmd("dec", geometry, ck, header, 0, n, records),
        ]
    )
    assert sealed == f"{_h(records)} {','.join(['0'] * n)}"
    assert opened == f"{_h(data)} {','.join(['0'] * n)}"
    bad = bytearray(records)
    bad[(cs + 16) + cs // 2] ^= 0x01  # one ciphertext bit of chunk 1
    out, status = harness.one(_batch_cmd("dec", geometry, ck, header, 0, n, bytes(bad))).split()
    assert status == "0,1,0"
    plain = bytes.fromhex(out)
    assert plain[cs : 2 * cs] == bytes(cs)
    assert plain[:cs] == data[:cs] and plain[2 * cs :] == data[2 * cs :]


def test_emulated_launch_flags_and_zeroes_each_tampered_chunk(harness: Harness) -> None:
    rng = random.Random(_seed())
    ck, cs = rng.randbytes(32), 4096
    header = fmt.Header(chunk_size=cs, dataset_id=rng.randbytes(16), plaintext_length=5 * cs + 100)
    data = rng.randbytes(header.plaintext_length)
    records = bytearray(_seal_records(ck, header, data, 0, header.chunk_count))
    stride = cs + 16
    # Flip a ciphertext bit in chunk 1, a tag bit in chunk 3, the last byte of the final tag.
    for pos in (1 * stride + 77, 3 * stride + cs + 5, len(records) - 1):
        records[pos] ^= 0x10
    out, status = harness.one(
        _batch_cmd("dec", (4, 64, 256), ck, header, 0, header.chunk_count, bytes(records))
    ).split()
    assert status == "0,1,0,1,0,1"
    plain = bytes.fromhex(out)
    for i in range(header.chunk_count):
        span = slice(i * cs, i * cs + header.chunk_length(i))
        if i in (1, 3, 5):
            assert plain[span] == bytes(header.chunk_length(i)), i  # zeroed, nothing leaks
        else:
            assert plain[span] == data[span], i
    # Wrong key, swapped chunks, a chunk of another dataset: every affected chunk flagged.
    wrong = harness.one(
        _batch_cmd(
            "dec", (4, 64, 256), rng.randbytes(32), header, 0, 2, bytes(records[: 2 * stride])
        )
    )
    assert wrong.split()[1] == "1,1"
    good = _seal_records(ck, header, data, 0, header.chunk_count)
    swapped = good[stride : 2 * stride] + good[:stride]
    assert harness.one(_batch_cmd("dec", (4, 3, 7), ck, header, 0, 2, swapped)).split()[1] == "1,1"
    other = fmt.Header(chunk_size=cs, dataset_id=header.dataset_id, plaintext_length=9 * cs)
    spliced = _seal_records(ck, other, rng.randbytes(9 * cs), 2, 1)
    line = _batch_cmd("dec", (1, 32, 1), ck, header, 2, 1, spliced)
    assert harness.one(line).split()[1] == "1"
    # Last chunk dropped: chunk 4 presented as the final one (same digest, so only the final
    # flag in its AAD differs) is flagged; in its place it verifies.
    chunk4 = good[4 * stride : 5 * stride]
    as_final = _batch_cmd("dec", (4, 64, 256), ck, header, 4, 1, chunk4, total=5, last_len=cs)
    assert harness.one(as_final).split() == ["0" * 2 * cs, "1"]
    in_place = _batch_cmd("dec", (4, 64, 256), ck, header, 4, 1, chunk4)
    assert harness.one(in_place).split() == [data[4 * cs : 5 * cs].hex(), "0"]


# --- the CUDA kernels themselves -----------------------------------------------------------------


def test_kernels_compile_for_sm90_without_spills(tmp_path: Path) -> None:
    funcs = ptxas_functions(KERNELS / "aesgcm.cu", tmp_path / "aesgcm.cubin")
    assert set(funcs) == set(gpu.KERNEL_NAMES)
    for name, props in funcs.items():
        assert props["spill_stores"] == 0 and props["spill_loads"] == 0, (name, props)
        assert props["stack"] == 0, (name, props)
    # __launch_bounds__(256, 4): 4 CTAs of 256 threads per SM need <= 64 registers.
    assert funcs["gcm_chunks"]["registers"] <= 64
    assert funcs["gcm_msgs"]["registers"] <= 64


def test_the_source_cupy_compiles_is_the_same_kernel(tmp_path: Path) -> None:
    """gpu.py inlines the header for NVRTC; that single source must build too."""
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    source = tmp_path / "inlined.cu"
    source.write_text(gpu._kernel_source())
    assert '#include "aesgcm_math.cuh"' not in source.read_text()
    result = subprocess.run(
        [
            NVCC,
            "-arch=sm_90",
            "-ptx",
            "-std=c++17",
            f"-DGCMK_K={gpu._K}",
            "-o",
            str(tmp_path / "k.ptx"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    ptx = (tmp_path / "k.ptx").read_text()
    for name in gpu.KERNEL_NAMES:
        assert f".entry {name}(" in ptx
