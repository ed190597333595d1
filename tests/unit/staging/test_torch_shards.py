"""Shard sets: sealing one plaintext into bound shards, and refusing sets that are not whole."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from gpucc.core.errors import UsageError
from gpucc.staging import open_sealed, seal_file, stage, write_key_file
from gpucc.staging.errors import HeaderAuthenticationError
from gpucc.staging.format import derive_chunk_key
from gpucc.staging.shards import (
    SHARD_MARKER,
    ShardId,
    ShardSetError,
    open_shard_set,
    seal_shards,
    shard_dataset_id,
    shard_path,
)

CHUNK = 4096
KEY = bytes(range(32))


def _plaintext(length: int, seed: int = 7) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < length:
        out += hashlib.sha256(seed.to_bytes(4, "little") + counter.to_bytes(8, "little")).digest()
        counter += 1
    return bytes(out[:length])


@pytest.fixture
def source(tmp_path: Path) -> tuple[Path, bytes]:
    data = _plaintext(10 * CHUNK + 123)
    path = tmp_path / "train.bin"
    path.write_bytes(data)
    return path, data


def _read_set(paths: list[Path], key: bytes) -> bytes:
    shards = open_shard_set(paths, key=key)
    out = b""
    for part in shards.parts:
        with stage(part.path, key=key, in_set=shards) as buf:
            out += bytes(buf)
    return out


def test_shard_dataset_id_vector() -> None:
    # set id 0001..07, shard 2 of 5: set id || "GSHD" || uint16_le(2) || uint16_le(5)
    ident = shard_dataset_id(bytes(range(8)), 2, 5)
    assert ident.hex() == "0001020304050607" + SHARD_MARKER.hex() + "0200" + "0500"
    assert ident.hex() == "00010203040506074753484402000500"
    assert ShardId.parse(ident) == ShardId(set_id=bytes(range(8)), index=2, count=5)
    assert ShardId.parse(bytes(16)) is None
    # each shard gets its own chunk key although the dataset key is shared
    assert (
        derive_chunk_key(KEY, ident).hex()
        != derive_chunk_key(KEY, shard_dataset_id(bytes(range(8)), 3, 5)).hex()
    )


@pytest.mark.parametrize("n", [1, 3, 11])
def test_shards_reassemble_the_plaintext(
    tmp_path: Path, source: tuple[Path, bytes], n: int
) -> None:
    src, data = source
    out = tmp_path / "out"
    out.mkdir()
    result = seal_shards(src, out, n, dataset_key=KEY, chunk_size=CHUNK, threads=2)
    assert result.paths == tuple(shard_path(out, "train", i, n) for i in range(n))
    assert sorted(out.iterdir()) == sorted(result.paths)  # no temporary files left
    assert sum(result.chunk_counts) == 11
    assert max(result.chunk_counts) - min(result.chunk_counts) <= 1
    assert _read_set(list(result.paths), KEY) == data
    shards = open_shard_set(result.paths, key=KEY)
    assert shards.set_id == result.set_id
    assert shards.plaintext_length == len(data)
    assert shards.chunk_count == 11
    assert [shards.chunk_length(g) for g in range(11)] == [CHUNK] * 10 + [123]


def test_key_file_opens_every_shard(tmp_path: Path, source: tuple[Path, bytes]) -> None:
    src, data = source
    key_file = tmp_path / "k.key"
    kek = write_key_file(key_file)
    result = seal_shards(src, tmp_path, 2, kek=kek, chunk_size=CHUNK)
    shards = open_shard_set(result.paths, key_file=key_file)
    assert shards.dataset_key == result.dataset_key
    assert _read_set(list(result.paths), result.dataset_key) == data


def test_missing_reordered_duplicate_and_lone_shards_are_refused(
    tmp_path: Path, source: tuple[Path, bytes]
) -> None:
    src, _ = source
    paths = list(seal_shards(src, tmp_path, 3, dataset_key=KEY, chunk_size=CHUNK).paths)
    for bad in (paths[:2], paths[1:], [paths[0], paths[2]], [paths[1], paths[0], paths[2]]):
        with pytest.raises(ShardSetError):
            open_shard_set(bad, key=KEY)
    with pytest.raises(ShardSetError):
        open_shard_set([paths[0], paths[0], paths[2]], key=KEY)
    with pytest.raises(ShardSetError, match="one of 3 shards"):
        open_shard_set(paths[0], key=KEY)


def test_foreign_shards_are_refused(tmp_path: Path, source: tuple[Path, bytes]) -> None:
    src, _ = source
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "c").mkdir()
    ours = list(seal_shards(src, tmp_path / "a", 3, dataset_key=KEY, chunk_size=CHUNK).paths)
    # the same plaintext and the same key, sealed again: another set id
    again = list(seal_shards(src, tmp_path / "b", 3, dataset_key=KEY, chunk_size=CHUNK).paths)
    with pytest.raises(ShardSetError, match="another shard set") as info:
        open_shard_set([ours[0], again[1], ours[2]], key=KEY)
    assert info.value.path == again[1]
    # another key: its header does not verify under ours
    other = list(seal_shards(src, tmp_path / "c", 3, dataset_key=bytes(32), chunk_size=CHUNK).paths)
    with pytest.raises(HeaderAuthenticationError):
        open_shard_set([ours[0], other[1], ours[2]], key=KEY)
    # an unsharded dataset among shards
    plain = tmp_path / "plain.gcc"
    seal_file(src, plain, dataset_key=KEY, chunk_size=CHUNK)
    with pytest.raises(ShardSetError, match="not a shard"):
        open_shard_set([ours[0], plain, ours[2]], key=KEY)


def test_renamed_shard_keeps_its_identity(tmp_path: Path, source: tuple[Path, bytes]) -> None:
    src, _ = source
    paths = list(seal_shards(src, tmp_path, 2, dataset_key=KEY, chunk_size=CHUNK).paths)
    swapped0, swapped1 = tmp_path / "x0.gcc", tmp_path / "x1.gcc"
    shutil.copyfile(paths[1], swapped0)
    shutil.copyfile(paths[0], swapped1)
    with pytest.raises(ShardSetError, match="is shard 1, given at position 0"):
        open_shard_set([swapped0, swapped1], key=KEY)


def test_changed_index_fails_the_header_tag(tmp_path: Path, source: tuple[Path, bytes]) -> None:
    src, _ = source
    paths = list(seal_shards(src, tmp_path, 3, dataset_key=KEY, chunk_size=CHUNK).paths)
    raw = bytearray(paths[2].read_bytes())
    raw[16 + 12] = 1  # dataset_id bytes 12..13: the shard index, 2 -> 1
    paths[2].write_bytes(bytes(raw))
    assert ShardId.parse(open_sealed(paths[2]).dataset_id) is not None
    with pytest.raises(HeaderAuthenticationError):
        open_shard_set(paths, key=KEY)


def test_unsharded_dataset_is_a_set_of_one(tmp_path: Path, source: tuple[Path, bytes]) -> None:
    src, data = source
    plain = tmp_path / "plain.gcc"
    seal_file(src, plain, dataset_key=KEY, chunk_size=CHUNK)
    shards = open_shard_set(plain, key=KEY)
    assert shards.set_id == b""
    assert shards.chunk_count == 11
    assert _read_set([plain], KEY) == data


def test_shard_count_out_of_range(tmp_path: Path, source: tuple[Path, bytes]) -> None:
    src, _ = source
    for n in (0, 12):
        with pytest.raises(UsageError):
            seal_shards(src, tmp_path, n, dataset_key=KEY, chunk_size=CHUNK)
    assert list(tmp_path.iterdir()) == [src]


def _hkdf_sha384(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    import hmac

    prk = hmac.new(salt, ikm, "sha384").digest()
    okm, block, counter = b"", b"", 1
    while len(okm) < length:
        block = hmac.new(prk, block + info + bytes([counter]), "sha384").digest()
        okm += block
        counter += 1
    return okm[:length]


def test_shard_header_vectors() -> None:
    """The vectors of docs/TORCH.md: shard 1 of 3, set id a0..a7, 10000 bytes, 4 KiB chunks."""
    from gpucc.staging.format import Header, compute_header_tag

    ident = shard_dataset_id(bytes(range(0xA0, 0xA8)), 1, 3)
    assert ident.hex() == "a0a1a2a3a4a5a6a74753484401000300"
    header = Header(chunk_size=4096, dataset_id=ident, plaintext_length=10000)
    assert header.to_bytes().hex() == (
        "47505543435344000100010000100000a0a1a2a3a4a5a6a747534844010003000300000000000000"
        "102700000000000000000000000000000000000000000000"
    )
    assert hashlib.sha256(header.to_bytes()).hexdigest() == (
        "5c9a2bc79c26c58ca21f2f56a02db33d65a71891e60611695312e332d9181a43"
    )
    ck = _hkdf_sha384(bytes(range(32)), ident, b"gpucc/sealed-dataset/v1/chunk-key", 32)
    assert ck == derive_chunk_key(bytes(range(32)), ident)
    assert ck.hex() == "857d726527bca5d7416329e0277017ed459a0418630e1bd0d09edcf856127aee"
    assert compute_header_tag(ck, header).hex() == "75c19f7336e156deb0686903c0f8bc36"
