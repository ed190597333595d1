"""The sealed dataset format (docs/FORMAT.md): known answers, strict parsing, key files.

Known answers are computed here independently of ``staging.format`` (struct, hashlib, hmac
and raw AES-GCM from ``cryptography``), and pinned as hex so any implementation, the GPU
kernel included, can check itself against the same numbers (also listed in FORMAT.md).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
import struct
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpucc.cli.exitcodes import exit_code_for
from gpucc.core.errors import FileAccessError
from gpucc.staging import format as fmt
from gpucc.staging.chunks import ChunkCipher
from gpucc.staging.errors import KeyFileError, KeyUnwrapError, MalformedDatasetError
from gpucc.staging.seal import SealResult, WrapSpec

DK = bytes(range(32))
DATASET_ID = bytes(range(0xA0, 0xB0))
KEK = bytes(range(0x40, 0x60))
WRAP_NONCE = bytes(range(0x70, 0x7C))
CHUNK_SIZE = 4096
PLAINTEXT_LENGTH = 10000  # three chunks: 4096, 4096, 1808

PINNED = {
    "header": "47505543435344000100010000100000a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"
    "0300000000000000102700000000000050000000000000000000000000000000",
    "header_digest": "af91117f045697057dda680907d11fe1215c79867d0e471111dfbc0dce1d2efb",
    "chunk_key": "8a27d27c44f2f778d28df12adcb6f4c97c8a8475e9f8c2b7e5071f65848fe9c0",
    "header_tag": "b41e64aa5614520e461d61ccaf5cf6d9",
    "nonce_2": "a0a1a2a30000000000000002",
    "aad_2": "af91117f045697057dda680907d11fe1215c79867d0e471111dfbc0dce1d2efb020000000000000001",
    "chunk_2_tag": "d93b9da82be42fab16eadbf0ae97936c",
    "chunk_2_ct_prefix": "78e282c037852823611518e65deb911c",
    "key_id": "f49c199b88944b6d37e6e1fc71c6c1e5",
    "wrap_record": "01001000f49c199b88944b6d37e6e1fc71c6c1e5707172737475767778797a7b"
    "d3e4b91b9a5de20da356b156b309152ed81973820410d42dee948c9e391fcbbe"
    "51257f73f1399662c26adbdff9f33ba4",
}


def _hkdf_sha384(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 written out step by step."""
    prk = hmac.new(salt, ikm, hashlib.sha384).digest()
    okm, block, counter = b"", b"", 1
    while len(okm) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha384).digest()
        okm += block
        counter += 1
    return okm[:length]


def _kat_header() -> fmt.Header:
    return fmt.Header(
        chunk_size=CHUNK_SIZE,
        dataset_id=DATASET_ID,
        plaintext_length=PLAINTEXT_LENGTH,
        wrap_length=80,
    )


def _plaintext(length: int = PLAINTEXT_LENGTH) -> bytes:
    return bytes(i % 251 for i in range(length))


# --- known answers -------------------------------------------------------------


def test_header_encoding_matches_the_table() -> None:
    expected = (
        b"GPUCCSD\x00"
        + struct.pack("<HHI", 1, 1, CHUNK_SIZE)
        + DATASET_ID
        + struct.pack("<QQI", 3, PLAINTEXT_LENGTH, 80)
        + bytes(12)
    )
    header = _kat_header()
    assert header.to_bytes() == expected
    assert expected.hex() == PINNED["header"]
    assert header.digest == hashlib.sha256(expected).digest()
    assert header.digest.hex() == PINNED["header_digest"]
    assert fmt.Header.parse(expected) == header


def test_chunk_key_is_hkdf_sha384() -> None:
    expected = _hkdf_sha384(DK, DATASET_ID, b"gpucc/sealed-dataset/v1/chunk-key", 32)
    assert fmt.derive_chunk_key(DK, DATASET_ID) == expected
    assert expected.hex() == PINNED["chunk_key"]


def test_chunk_nonce_and_aad() -> None:
    digest = hashlib.sha256(bytes.fromhex(PINNED["header"])).digest()
    for i in range(3):
        final = i == 2
        assert fmt.chunk_nonce(DATASET_ID, i) == DATASET_ID[:4] + struct.pack(">Q", i)
        aad = digest + struct.pack("<Q", i) + bytes([final])
        assert fmt.chunk_aad(digest, i, final) == aad
        assert len(aad) == 41
    assert fmt.chunk_nonce(DATASET_ID, 2).hex() == PINNED["nonce_2"]
    assert fmt.chunk_aad(digest, 2, True).hex() == PINNED["aad_2"]
    big = 2**40 + 5
    assert fmt.chunk_nonce(DATASET_ID, big)[4:] == big.to_bytes(8, "big")
    assert fmt.chunk_aad(digest, big, False)[32:40] == big.to_bytes(8, "little")


def test_header_tag_and_chunk_ciphertext() -> None:
    header = _kat_header()
    ck = _hkdf_sha384(DK, DATASET_ID, b"gpucc/sealed-dataset/v1/chunk-key", 32)
    tag = AESGCM(ck).encrypt(
        DATASET_ID[:4] + b"\xff" * 8, b"", b"gpucc/sealed-dataset/v1/header" + header.to_bytes()
    )
    assert tag.hex() == PINNED["header_tag"]
    cipher = ChunkCipher(DK, header)
    assert cipher.header_tag() == tag
    cipher.verify_header(tag)

    pt = _plaintext()[2 * CHUNK_SIZE :]
    raw = AESGCM(ck).encrypt(
        DATASET_ID[:4] + struct.pack(">Q", 2),
        pt,
        header.digest + struct.pack("<Q", 2) + b"\x01",
    )
    out = bytearray(len(pt) + 16)
    cipher.encrypt_into(2, pt, out)
    assert bytes(out) == raw
    assert raw[-16:].hex() == PINNED["chunk_2_tag"]
    assert raw[:16].hex() == PINNED["chunk_2_ct_prefix"] and len(raw) == 1808 + 16


def test_key_id_and_wrap_record() -> None:
    kid = hashlib.sha256(b"gpucc/key-id/v1" + KEK).digest()[:16]
    assert fmt.key_id(KEK) == kid
    assert kid.hex() == PINNED["key_id"]
    digest = _kat_header().digest
    wrapped = AESGCM(KEK).encrypt(WRAP_NONCE, DK, b"gpucc/wrap/v1" + digest + b"\x01" + kid)
    expected = struct.pack("<BBH", 1, 0, 16) + kid + WRAP_NONCE + wrapped
    record = fmt.wrap_key(KEK, DK, digest, fmt.WrapKind.KEY_FILE, kid, wrap_nonce=WRAP_NONCE)
    assert record.to_bytes() == expected
    assert expected.hex() == PINNED["wrap_record"]
    assert len(expected) == 80 == WrapSpec.key_file(KEK).record_length
    assert fmt.WrapRecord.parse(expected) == record
    assert fmt.unwrap_key(KEK, record, digest) == DK


# --- header parsing --------------------------------------------------------------


def _edit(data: bytes, offset: int, value: bytes) -> bytes:
    return data[:offset] + value + data[offset + len(value) :]


@pytest.mark.parametrize(
    ("offset", "value", "message"),
    [
        (0, b"GPUCCSE\x00", "magic"),
        (8, struct.pack("<H", 2), "version 2"),
        (10, struct.pack("<H", 2), "algorithm 2"),
        (12, struct.pack("<I", 4095), "chunk size"),
        (12, struct.pack("<I", 4104), "chunk size"),
        (12, struct.pack("<I", 256 * 1024 * 1024 + 16), "chunk size"),
        (12, struct.pack("<I", 0), "chunk size"),
        (32, struct.pack("<Q", 4), "chunk count"),
        (32, struct.pack("<Q", 0), "chunk count"),
        (40, struct.pack("<Q", 12289), "chunk count"),
        (48, struct.pack("<I", 65537), "wrap section"),
        (63, b"\x01", "reserved"),
        (52, b"\x01", "reserved"),
    ],
)
def test_header_rejects_each_bad_field(offset: int, value: bytes, message: str) -> None:
    data = _edit(_kat_header().to_bytes(), offset, value)
    with pytest.raises(MalformedDatasetError, match=message):
        fmt.Header.parse(data)


@pytest.mark.parametrize("length", [0, 63, 65])
def test_header_rejects_wrong_size(length: int) -> None:
    with pytest.raises(MalformedDatasetError):
        fmt.Header.parse(bytes(length))


def test_chunk_count_formula_and_geometry() -> None:
    assert fmt.chunk_count_for(0, 4096) == 1
    assert fmt.chunk_count_for(1, 4096) == 1
    assert fmt.chunk_count_for(4096, 4096) == 1
    assert fmt.chunk_count_for(4097, 4096) == 2
    header = _kat_header()
    assert header.chunk_count == 3
    assert [header.chunk_length(i) for i in range(3)] == [4096, 4096, 1808]
    assert header.chunk_offset(0) == 80 + 80
    assert header.chunk_offset(2) == 160 + 2 * 4112
    assert header.file_size == 160 + PLAINTEXT_LENGTH + 3 * 16
    empty = fmt.Header(chunk_size=4096, dataset_id=DATASET_ID, plaintext_length=0)
    assert empty.chunk_count == 1 and empty.chunk_length(0) == 0
    assert empty.file_size == 80 + 16
    with pytest.raises(IndexError):
        header.chunk_length(3)


def test_derivations_refuse_bad_inputs() -> None:
    with pytest.raises(ValueError):
        fmt.chunk_nonce(DATASET_ID, 2**64 - 1)  # the header tag's index
    with pytest.raises(ValueError):
        fmt.chunk_nonce(DATASET_ID, -1)
    with pytest.raises(ValueError):
        fmt.chunk_aad(bytes(31), 0, False)
    with pytest.raises(ValueError):
        fmt.derive_chunk_key(bytes(16), DATASET_ID)


# --- wrap records -----------------------------------------------------------------


def _record() -> bytes:
    return bytes.fromhex(PINNED["wrap_record"])


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x01\x00",
        _edit(bytes.fromhex(PINNED["wrap_record"]), 0, b"\x03"),  # unknown kind
        _edit(bytes.fromhex(PINNED["wrap_record"]), 1, b"\x01"),  # reserved
        _edit(bytes.fromhex(PINNED["wrap_record"]), 2, struct.pack("<H", 17)),  # lengths
        _edit(bytes.fromhex(PINNED["wrap_record"]), 0, b"\x02"),  # kind 2 needs 48
        bytes.fromhex(PINNED["wrap_record"]) + b"\x00",  # trailing byte
        bytes.fromhex(PINNED["wrap_record"])[:-1],
        _edit(bytes.fromhex(PINNED["wrap_record"]), 2, struct.pack("<H", 1025)),
    ],
)
def test_wrap_record_parse_is_strict(data: bytes) -> None:
    with pytest.raises(MalformedDatasetError):
        fmt.WrapRecord.parse(data)


def test_wrap_section_is_empty_or_one_record() -> None:
    assert fmt.parse_wrap_section(b"") is None
    assert fmt.parse_wrap_section(_record()) is not None
    with pytest.raises(MalformedDatasetError):
        fmt.parse_wrap_section(_record() + _record())


def test_unwrap_refuses_other_key_dataset_kind_and_context() -> None:
    digest = _kat_header().digest
    record = fmt.WrapRecord.parse(_record())
    with pytest.raises(KeyUnwrapError):
        fmt.unwrap_key(bytes(32), record, digest)
    with pytest.raises(KeyUnwrapError):
        fmt.unwrap_key(KEK, record, hashlib.sha256(b"another header").digest())
    other_context = fmt.WrapRecord(
        kind=record.kind, context=bytes(16), wrap_nonce=record.wrap_nonce, wrapped=record.wrapped
    )
    with pytest.raises(KeyUnwrapError):
        fmt.unwrap_key(KEK, other_context, digest)
    session = fmt.wrap_key(KEK, DK, digest, fmt.WrapKind.SESSION, bytes(48))
    relabelled = fmt.WrapRecord(
        kind=fmt.WrapKind.SESSION,
        context=bytes(range(48)),
        wrap_nonce=session.wrap_nonce,
        wrapped=session.wrapped,
    )
    with pytest.raises(KeyUnwrapError):
        fmt.unwrap_key(KEK, relabelled, digest)
    assert fmt.unwrap_key(KEK, session, digest) == DK


# --- key files -------------------------------------------------------------------


def test_key_file_created_0600_with_the_documented_layout(tmp_path: Path) -> None:
    old = os.umask(0)  # even a permissive umask must not widen the mode
    try:
        key = fmt.write_key_file(tmp_path / "k.key")
    finally:
        os.umask(old)
    st = os.stat(tmp_path / "k.key")
    assert stat.S_IMODE(st.st_mode) == 0o600
    data = (tmp_path / "k.key").read_bytes()
    assert data == b"gpucc-key v1\n" + key and len(data) == 45
    assert fmt.read_key_file(tmp_path / "k.key") == key
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.key"]  # no temp left


def test_key_file_is_never_replaced_silently(tmp_path: Path) -> None:
    first = fmt.write_key_file(tmp_path / "k.key")
    with pytest.raises(FileAccessError, match="already exists"):
        fmt.write_key_file(tmp_path / "k.key")
    assert fmt.read_key_file(tmp_path / "k.key") == first
    second = fmt.write_key_file(tmp_path / "k.key", overwrite=True)
    assert fmt.read_key_file(tmp_path / "k.key") == second != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.key"]


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o660])
def test_exposed_key_file_is_refused_in_one_line(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "k.key"
    fmt.write_key_file(path)
    path.chmod(mode)
    with pytest.raises(KeyFileError) as info:
        fmt.read_key_file(path)
    text = info.value.diagnostics()
    assert "\n" not in text and f"{mode:04o}" in text and "chmod 600" in text
    assert exit_code_for(info.value) == 8  # permissions: file access


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"gpucc-key v1\n" + bytes(31),
        b"gpucc-key v1\n" + bytes(33),
        b"gpucc-key v2\n" + bytes(32),
    ],
)
def test_malformed_key_file_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "k.key"
    path.write_bytes(content)
    path.chmod(0o600)
    with pytest.raises(KeyFileError, match="not a gpucc key file"):
        fmt.read_key_file(path)


def test_missing_or_directory_key_file(tmp_path: Path) -> None:
    with pytest.raises(FileAccessError, match="does not exist"):
        fmt.read_key_file(tmp_path / "absent.key")
    (tmp_path / "dir").mkdir(mode=0o700)
    with pytest.raises(FileAccessError, match="not a regular file"):
        fmt.read_key_file(tmp_path / "dir")


def test_keys_stay_out_of_reprs() -> None:
    spec = WrapSpec.key_file(KEK)
    assert KEK.hex() not in repr(spec) and repr(KEK) not in repr(spec)
    result = SealResult(
        header=_kat_header(), header_tag=bytes(16), wrap=None, dataset_key=DK, seconds=0.0
    )
    assert repr(DK) not in repr(result)
    assert "chunk_key" not in repr(ChunkCipher(DK, _kat_header()))
