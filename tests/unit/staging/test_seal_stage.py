"""Sealing and CPU staging: round trips, the tamper matrix, and the scrubbing guarantees.

The tamper cases stage into a caller-provided buffer pre-filled with a sentinel, so each
test can check exactly what is left: verified plaintext before the failing chunk, zeros
from it on, and never a byte of an unverified chunk.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpucc import staging
from gpucc.cli.exitcodes import exit_code_for
from gpucc.core.errors import (
    FileAccessError,
    GpuccError,
    IntegrityError,
    UsageError,
)
from gpucc.staging import format as fmt
from gpucc.staging._pipeline import ChunkFailure, run_chunks
from gpucc.staging.chunks import ChunkCipher
from gpucc.staging.cpu import Buffer, stage_bytes, stage_cpu, stage_plaintext_cpu
from gpucc.staging.dataset import SealedDataset, open_sealed
from gpucc.staging.errors import (
    ChunkAuthenticationError,
    DatasetKeyMismatchError,
    GpuStagingUnavailableError,
    HeaderAuthenticationError,
    KeyUnwrapError,
    MalformedDatasetError,
    StageKeyArgumentsError,
    StagingIOError,
)
from gpucc.staging.seal import WrapSpec, rewrap, seal_bytes, seal_file

CS = 4096  # the smallest chunk size: boundaries are cheap to exercise
SENTINEL = 0xA5


def _data(length: int, seed: int = 1) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, length, dtype=np.uint8).tobytes()


def _sentinel(length: int) -> Buffer:
    return np.full(length, SENTINEL, dtype=np.uint8)


def _stage_with_kek(path: Path, kek: bytes, out: Buffer, threads: int = 2) -> Buffer:
    dataset = open_sealed(path)
    return stage_cpu(dataset, dataset.unwrap(kek), threads=threads, out=out)


SIZES = [0, 1, 15, 16, 17, CS - 1, CS, CS + 1, 5 * CS + 7, 8 * CS]


# --- round trips ---------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("threads", [1, 3])
def test_seal_file_and_stage_round_trip(tmp_path: Path, size: int, threads: int) -> None:
    data = _data(size)
    (tmp_path / "p.bin").write_bytes(data)
    kek = fmt.new_dataset_key()
    result = seal_file(
        tmp_path / "p.bin", tmp_path / "p.gcc", kek=kek, chunk_size=CS, threads=threads
    )
    assert result.header.plaintext_length == size
    assert os.path.getsize(tmp_path / "p.gcc") == result.header.file_size
    dataset = open_sealed(tmp_path / "p.gcc")
    assert dataset.header == result.header and dataset.wrap == result.wrap
    buf = stage_cpu(dataset, dataset.unwrap(kek), threads=threads)
    assert buf.dtype == np.uint8 and buf.shape == (size,)
    assert buf.tobytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.bin", "p.gcc"]


@pytest.mark.parametrize("size", SIZES)
def test_seal_bytes_matches_seal_file_layout(tmp_path: Path, size: int) -> None:
    data = _data(size, seed=2)
    dk = fmt.new_dataset_key()
    blob = seal_bytes(data, dataset_key=dk, chunk_size=CS, threads=2)
    (tmp_path / "b.gcc").write_bytes(blob)
    dataset = open_sealed(tmp_path / "b.gcc")
    assert dataset.wrap is None and dataset.header.wrap_length == 0
    assert stage_cpu(dataset, dk, threads=2).tobytes() == data
    # Deterministic given the dataset id and key: one thread and many agree.
    again = seal_bytes(
        data, dataset_key=dk, chunk_size=CS, threads=1, dataset_id=dataset.header.dataset_id
    )
    assert again == blob


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("threads", [1, 3])
def test_stage_bytes_round_trip_and_tamper(size: int, threads: int) -> None:
    data = _data(size, seed=4)
    dk = fmt.new_dataset_key()
    blob = seal_bytes(data, dataset_key=dk, chunk_size=CS, threads=threads)
    assert stage_bytes(blob, dk, threads=threads).tobytes() == data
    header = fmt.Header.parse(bytes(blob[:64]))
    last = header.chunk_count - 1
    _, end = _chunk_span(bytes(blob), last)
    blob[end - 1] ^= 1  # the last tag
    out = _sentinel(size)
    with pytest.raises(ChunkAuthenticationError) as info:
        stage_bytes(blob, dk, threads=threads, out=out)
    assert info.value.chunk_index == last
    assert out[: last * CS].tobytes() == data[: last * CS] and not out[last * CS :].any()
    with pytest.raises(MalformedDatasetError):
        stage_bytes(blob[:-1], dk)
    with pytest.raises(HeaderAuthenticationError):
        stage_bytes(blob, fmt.new_dataset_key())


@pytest.mark.parametrize("size", [0, 1, CS - 1, CS, CS + 1, 7 * CS + 3])
@pytest.mark.parametrize("threads", [1, 2])
def test_plaintext_path_round_trip(tmp_path: Path, size: int, threads: int) -> None:
    data = _data(size, seed=3)
    (tmp_path / "p.bin").write_bytes(data)
    buf = stage_plaintext_cpu(tmp_path / "p.bin", chunk_size=CS, threads=threads)
    assert buf.tobytes() == data


def test_plaintext_staging_keeps_nothing_when_the_final_check_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The final look at the plaintext file (has it changed size?) failing in any way leaves
    the caller's buffer zeroed: an unreadable file is a typed error, not a bare OSError."""
    data = _data(3 * CS + 1, seed=5)
    (tmp_path / "p.bin").write_bytes(data)
    out = np.empty(len(data), dtype=np.uint8)

    real, calls = os.fstat, []  # (one os module: patched for the call's duration)

    def broken(fd: int) -> os.stat_result:  # the open's look succeeds, the final one fails
        if sys._getframe(1).f_code.co_name == "check_plaintext_unchanged":
            calls.append(fd)
            raise OSError(5, "Input/output error")
        return real(fd)

    monkeypatch.setattr(os, "fstat", broken)
    with pytest.raises(StagingIOError, match="cannot examine .*Input/output error"):
        stage_plaintext_cpu(tmp_path / "p.bin", chunk_size=CS, out=out)
    assert len(calls) == 1 and not out.any()


def test_progress_reports_every_byte_in_order(tmp_path: Path) -> None:
    data = _data(10 * CS + 5)
    (tmp_path / "p.bin").write_bytes(data)
    kek = fmt.new_dataset_key()
    seen: list[tuple[int, int]] = []
    seal_file(
        tmp_path / "p.bin",
        tmp_path / "p.gcc",
        kek=kek,
        chunk_size=CS,
        threads=2,
        progress=lambda done, total: seen.append((done, total)),
    )
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert seen[-1] == (len(data), len(data)) and len(seen) == 11
    staged: list[int] = []
    dataset = open_sealed(tmp_path / "p.gcc")
    stage_cpu(dataset, dataset.unwrap(kek), progress=lambda d, t: staged.append(d))
    assert staged[-1] == len(data) and staged == sorted(staged)


@pytest.mark.slow
def test_256_mib_round_trip_default_chunk_size(tmp_path: Path) -> None:
    size = 256 * 1024 * 1024
    data = np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8)
    data.tofile(tmp_path / "big.bin")
    kek = fmt.new_dataset_key()
    started = time.perf_counter()
    seal_file(tmp_path / "big.bin", tmp_path / "big.gcc", kek=kek)
    (tmp_path / "big.bin").unlink()
    with staging.stage(tmp_path / "big.gcc", kek=kek) as buf:
        assert buf.shape == (size,)
        assert np.array_equal(buf, data)
    assert not buf.any()  # scrubbed on exit
    assert time.perf_counter() - started < 60


# --- the tamper matrix ---------------------------------------------------------------

N_CHUNKS = 7
LAST = 3 * CS // 4  # a short final chunk


@pytest.fixture
def sealed(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    """A dataset of 7 chunks (the last partial), its plaintext and its key-file key."""
    data = _data((N_CHUNKS - 1) * CS + LAST, seed=11)
    (tmp_path / "p.bin").write_bytes(data)
    kek = fmt.new_dataset_key()
    seal_file(tmp_path / "p.bin", tmp_path / "p.gcc", kek=kek, chunk_size=CS, threads=2)
    return tmp_path / "p.gcc", data, kek


def _chunk_span(blob: bytes, index: int) -> tuple[int, int]:
    header = fmt.Header.parse(blob[:64])
    start = header.chunk_offset(index)
    return start, start + header.chunk_length(index) + fmt.TAG_SIZE


def _flip(blob: bytes, offset: int, bit: int = 0) -> bytes:
    return blob[:offset] + bytes([blob[offset] ^ (1 << bit)]) + blob[offset + 1 :]


def _assert_failed_at(path: Path, kek: bytes, data: bytes, index: int, threads: int = 2) -> None:
    out = _sentinel(len(data))
    with pytest.raises(ChunkAuthenticationError) as info:
        _stage_with_kek(path, kek, out, threads=threads)
    assert info.value.chunk_index == index
    assert exit_code_for(info.value) == 6
    cut = index * CS
    assert out[:cut].tobytes() == data[:cut]  # verified chunks, intact
    assert not out[cut:].any()  # the failed chunk and everything after it: zero


def _assert_refused_before_chunks(path: Path, kek: bytes, length: int) -> GpuccError:
    out = _sentinel(length)
    with pytest.raises((MalformedDatasetError, IntegrityError)) as info:
        _stage_with_kek(path, kek, out)
    # No chunk was decrypted: the buffer holds the sentinel or zeros, nothing else.
    assert np.isin(out, [0, SENTINEL]).all()
    assert isinstance(info.value, GpuccError)
    return info.value


@pytest.mark.parametrize("index", range(N_CHUNKS))
@pytest.mark.parametrize("where", ["first", "middle", "tag"])
def test_flipped_bit_in_any_chunk_or_tag(
    sealed: tuple[Path, bytes, bytes], index: int, where: str
) -> None:
    path, data, kek = sealed
    blob = path.read_bytes()
    start, end = _chunk_span(blob, index)
    offset = {"first": start, "middle": (start + end - 16) // 2, "tag": end - 1}[where]
    path.write_bytes(_flip(blob, offset, bit=index % 8))
    _assert_failed_at(path, kek, data, index)


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_failure_is_deterministic_with_parallel_chunks(
    sealed: tuple[Path, bytes, bytes], threads: int
) -> None:
    path, data, kek = sealed
    blob = path.read_bytes()
    for index in (5, 2):  # two bad chunks; the lower one is always the one named
        blob = _flip(blob, _chunk_span(blob, index)[0] + 3)
    path.write_bytes(blob)
    for _ in range(5):
        _assert_failed_at(path, kek, data, 2, threads=threads)


# Every field of the fixed header, and bits inside each multi-byte field.
HEADER_BITS = [
    (0, 0, "magic"),
    (7, 0, "magic"),
    (8, 0, "version"),
    (9, 7, "version"),
    (10, 1, "algorithm"),
    (12, 0, "chunk_size"),
    (13, 4, "chunk_size"),
    (14, 0, "chunk_size"),
    (15, 7, "chunk_size"),
    (16, 0, "dataset_id"),
    (19, 7, "dataset_id"),
    (20, 0, "dataset_id"),
    (31, 3, "dataset_id"),
    (32, 0, "chunk_count"),
    (39, 7, "chunk_count"),
    (40, 0, "plaintext_length"),
    (41, 4, "plaintext_length"),
    (47, 7, "plaintext_length"),
    (48, 0, "wrap_length"),
    (48, 4, "wrap_length"),
    (51, 7, "wrap_length"),
    (52, 0, "reserved"),
    (63, 7, "reserved"),
]


@pytest.mark.parametrize(("offset", "bit", "field"), HEADER_BITS)
def test_flipped_bit_in_each_header_field(
    sealed: tuple[Path, bytes, bytes], offset: int, bit: int, field: str
) -> None:
    path, data, kek = sealed
    path.write_bytes(_flip(path.read_bytes(), offset, bit))
    error = _assert_refused_before_chunks(path, kek, len(data))
    if field == "dataset_id":  # still well formed: only authentication can tell
        assert isinstance(error, KeyUnwrapError)


def test_every_header_byte_is_covered(sealed: tuple[Path, bytes, bytes]) -> None:
    path, data, kek = sealed
    blob = path.read_bytes()
    for offset in range(fmt.HEADER_SIZE):
        path.write_bytes(_flip(blob, offset, bit=offset % 8))
        _assert_refused_before_chunks(path, kek, len(data))


@pytest.mark.parametrize("offset", range(64, 80))
def test_flipped_bit_in_header_tag(sealed: tuple[Path, bytes, bytes], offset: int) -> None:
    path, data, kek = sealed
    path.write_bytes(_flip(path.read_bytes(), offset))
    error = _assert_refused_before_chunks(path, kek, len(data))
    assert isinstance(error, HeaderAuthenticationError)


@pytest.mark.parametrize("offset", [80, 81, 82, 84, 99, 100, 111, 112, 159])
def test_flipped_bit_in_wrap_record(sealed: tuple[Path, bytes, bytes], offset: int) -> None:
    path, data, kek = sealed
    path.write_bytes(_flip(path.read_bytes(), offset))
    _assert_refused_before_chunks(path, kek, len(data))


def test_header_digest_change_is_caught_by_the_header_tag_with_a_direct_key(
    sealed: tuple[Path, bytes, bytes],
) -> None:
    path, data, kek = sealed
    dk = open_sealed(path).unwrap(kek)
    path.write_bytes(_flip(path.read_bytes(), 20))  # dataset id: parses fine
    with pytest.raises(HeaderAuthenticationError):
        stage_cpu(open_sealed(path), dk, out=_sentinel(len(data)))


@pytest.mark.parametrize("first", [0, 2, N_CHUNKS - 2])
def test_two_chunks_swapped(sealed: tuple[Path, bytes, bytes], first: int) -> None:
    path, data, kek = sealed
    blob = path.read_bytes()
    a0, a1 = _chunk_span(blob, first)
    b0, b1 = _chunk_span(blob, first + 1)
    if first + 1 == N_CHUNKS - 1:  # the last chunk is shorter: swap equal-length prefixes
        b1 = b0 + (a1 - a0)
        swapped = blob[:a0] + blob[b0:b1] + blob[a1:b0] + blob[a0:a1]
        swapped = swapped[: len(blob)]
    else:
        swapped = blob[:a0] + blob[b0:b1] + blob[a1:b0] + blob[a0:a1] + blob[b1:]
    assert len(swapped) == len(blob)
    path.write_bytes(swapped)
    _assert_failed_at(path, kek, data, first)


def test_chunk_dropped_from_the_middle(sealed: tuple[Path, bytes, bytes]) -> None:
    path, data, kek = sealed
    blob = path.read_bytes()
    start, end = _chunk_span(blob, 3)
    path.write_bytes(blob[:start] + blob[end:])
    error = _assert_refused_before_chunks(path, kek, len(data))
    # The authenticated header says how long the file is: a full chunk's worth is missing
    # at the end, which cuts off the next-to-last chunk (the last one is partial).
    assert isinstance(error, ChunkAuthenticationError) and exit_code_for(error) == 6
    assert error.chunk_index == N_CHUNKS - 2
    assert f"chunk {N_CHUNKS - 1} is missing" in str(error)


def test_chunk_dropped_and_header_rewritten_to_match(sealed: tuple[Path, bytes, bytes]) -> None:
    path, data, kek = sealed
    blob = path.read_bytes()
    dk = open_sealed(path).unwrap(kek)
    start, end = _chunk_span(blob, 3)
    header = fmt.Header.parse(blob[:64])
    forged = fmt.Header(
        chunk_size=CS,
        dataset_id=header.dataset_id,
        plaintext_length=header.plaintext_length - CS,
        wrap_length=header.wrap_length,
    )
    path.write_bytes(forged.to_bytes() + blob[64:start] + blob[end:])
    error = _assert_refused_before_chunks(path, kek, len(data) - CS)
    assert isinstance(error, KeyUnwrapError)  # the wrap binds the header digest
    with pytest.raises(HeaderAuthenticationError):
        stage_cpu(open_sealed(path), dk)


def test_last_chunk_dropped(sealed: tuple[Path, bytes, bytes]) -> None:
    path, data, kek = sealed
    blob = path.read_bytes()
    dk = open_sealed(path).unwrap(kek)
    start, _ = _chunk_span(blob, N_CHUNKS - 1)
    # Truncated at a chunk boundary, header unchanged: the size gives it away.
    path.write_bytes(blob[:start])
    error = _assert_refused_before_chunks(path, kek, len(data))
    assert isinstance(error, ChunkAuthenticationError) and exit_code_for(error) == 6
    assert error.chunk_index == N_CHUNKS - 1 and "is missing" in str(error)
    # Header count and length edited to match: the header no longer authenticates.
    header = fmt.Header.parse(blob[:64])
    forged = fmt.Header(
        chunk_size=CS,
        dataset_id=header.dataset_id,
        plaintext_length=(N_CHUNKS - 1) * CS,
        wrap_length=header.wrap_length,
    )
    assert forged.chunk_count == N_CHUNKS - 1
    path.write_bytes(forged.to_bytes() + blob[64:start])
    error = _assert_refused_before_chunks(path, kek, (N_CHUNKS - 1) * CS)
    assert isinstance(error, KeyUnwrapError)
    with pytest.raises(HeaderAuthenticationError):
        stage_cpu(open_sealed(path), dk, out=_sentinel((N_CHUNKS - 1) * CS))
    # Even with the original header digest kept, chunk 5 is not marked final.
    cipher = ChunkCipher(dk, header)
    bogus = fmt.Header(
        chunk_size=CS,
        dataset_id=header.dataset_id,
        plaintext_length=(N_CHUNKS - 1) * CS,
    )
    out = bytearray(CS)
    start5, end5 = _chunk_span(blob, N_CHUNKS - 2)
    with pytest.raises(ChunkAuthenticationError):
        ChunkCipher(dk, bogus).decrypt_into(N_CHUNKS - 2, blob[start5:end5], out)
    cipher.decrypt_into(N_CHUNKS - 2, blob[start5:end5], out)  # in place it is fine


@pytest.mark.parametrize("cut", [1, 17, CS // 2])
def test_truncated_mid_chunk(sealed: tuple[Path, bytes, bytes], cut: int) -> None:
    path, data, kek = sealed
    blob = path.read_bytes()
    start, _ = _chunk_span(blob, 4)
    path.write_bytes(blob[: start + cut])
    error = _assert_refused_before_chunks(path, kek, len(data))
    assert isinstance(error, ChunkAuthenticationError) and error.chunk_index == 4
    assert "chunk 4 is cut off" in str(error) and exit_code_for(error) == 6


def test_extended_file_is_refused(sealed: tuple[Path, bytes, bytes]) -> None:
    path, data, kek = sealed
    path.write_bytes(path.read_bytes() + b"\x00")
    error = _assert_refused_before_chunks(path, kek, len(data))
    assert "follow the final chunk" in str(error) and exit_code_for(error) == 6


def test_truncated_file_without_a_key_still_opens(sealed: tuple[Path, bytes, bytes]) -> None:
    path, data, kek = sealed
    path.write_bytes(path.read_bytes()[:-1])
    opened = open_sealed(path)  # the length is judged once the header is authenticated
    with pytest.raises(ChunkAuthenticationError, match=f"chunk {N_CHUNKS - 1} is cut off"):
        opened.unwrap(kek)


@pytest.mark.parametrize("offset", range(10, fmt.PREFIX_SIZE))
def test_any_flipped_header_byte_is_an_authentication_failure(
    sealed: tuple[Path, bytes, bytes], offset: int
) -> None:
    """Past the magic and version, any changed header or header-tag bit is exit 6, whether or
    not the changed field still parses: the raw header is authenticated before it is trusted."""
    path, data, kek = sealed
    dk = open_sealed(path).unwrap(kek)
    path.write_bytes(_flip(path.read_bytes(), offset, bit=offset % 8))
    for use_kek in (True, False):
        given = {"kek": kek} if use_kek else {"key": dk}
        with pytest.raises(IntegrityError) as info:
            with staging.stage(path, kek=given.get("kek"), key=given.get("key")) as buf:
                raise AssertionError(f"staged {len(buf)} of {len(data)} bytes, header altered")
        assert exit_code_for(info.value) == 6, (sorted(given), info.value)


def test_chunk_spliced_from_another_dataset_with_the_same_kek(
    sealed: tuple[Path, bytes, bytes], tmp_path: Path
) -> None:
    path, data, kek = sealed
    other_data = _data(len(data), seed=99)
    (tmp_path / "o.bin").write_bytes(other_data)
    seal_file(tmp_path / "o.bin", tmp_path / "o.gcc", kek=kek, chunk_size=CS)
    blob, other = path.read_bytes(), (tmp_path / "o.gcc").read_bytes()
    start, end = _chunk_span(blob, 4)
    path.write_bytes(blob[:start] + other[start:end] + blob[end:])
    _assert_failed_at(path, kek, data, 4)


def test_wrap_record_spliced_from_another_dataset(
    sealed: tuple[Path, bytes, bytes], tmp_path: Path
) -> None:
    path, data, kek = sealed
    (tmp_path / "o.bin").write_bytes(data)
    seal_file(tmp_path / "o.bin", tmp_path / "o.gcc", kek=kek, chunk_size=CS)
    blob, other = path.read_bytes(), (tmp_path / "o.gcc").read_bytes()
    path.write_bytes(blob[:80] + other[80:160] + blob[160:])
    error = _assert_refused_before_chunks(path, kek, len(data))
    assert isinstance(error, KeyUnwrapError)


def test_wrong_key(sealed: tuple[Path, bytes, bytes]) -> None:
    path, data, _ = sealed
    with pytest.raises(DatasetKeyMismatchError, match="key id"):
        open_sealed(path).unwrap(fmt.new_dataset_key())
    out = _sentinel(len(data))
    with pytest.raises(HeaderAuthenticationError):
        stage_cpu(open_sealed(path), fmt.new_dataset_key(), out=out)
    assert (out == SENTINEL).all()


def test_key_wrapped_for_another_session(sealed: tuple[Path, bytes, bytes]) -> None:
    path, data, kek = sealed
    dataset = open_sealed(path)
    session_key, transcript = os.urandom(32), os.urandom(48)
    record = rewrap(dataset, kek=kek, to=WrapSpec.session(session_key, transcript))
    assert record.kind is fmt.WrapKind.SESSION and record.context == transcript
    dk = dataset.unwrap_record(record, session_key)
    assert stage_cpu(dataset, dk).tobytes() == data
    with pytest.raises(KeyUnwrapError):  # another session's key
        dataset.unwrap_record(record, os.urandom(32))
    moved = fmt.WrapRecord(
        kind=record.kind,
        context=os.urandom(48),  # relabelled for another transcript
        wrap_nonce=record.wrap_nonce,
        wrapped=record.wrapped,
    )
    with pytest.raises(KeyUnwrapError):
        dataset.unwrap_record(moved, session_key)


def test_rewrap_leaves_the_file_untouched(sealed: tuple[Path, bytes, bytes]) -> None:
    path, _, kek = sealed
    before = path.read_bytes()
    rewrap(path, kek=kek, to=WrapSpec.session(os.urandom(32), os.urandom(48)))
    assert path.read_bytes() == before
    with pytest.raises(DatasetKeyMismatchError):
        rewrap(path, kek=os.urandom(32), to=WrapSpec.key_file(os.urandom(32)))


def test_file_changed_after_open_is_refused(sealed: tuple[Path, bytes, bytes]) -> None:
    path, data, kek = sealed
    dataset = open_sealed(path)
    dk = dataset.unwrap(kek)
    blob = path.read_bytes()
    path.write_bytes(blob[:70] + bytes([blob[70] ^ 1]) + blob[71:])  # header tag changed
    out = _sentinel(len(data))
    with pytest.raises(MalformedDatasetError, match="changed"):
        stage_cpu(dataset, dk, out=out)
    assert not out.any()


def test_decrypt_into_zeroes_its_output_on_failure() -> None:
    header = fmt.Header(chunk_size=CS, dataset_id=os.urandom(16), plaintext_length=CS)
    cipher = ChunkCipher(os.urandom(32), header)
    sealed_chunk = bytearray(CS + 16)
    cipher.encrypt_into(0, _data(CS), sealed_chunk)
    sealed_chunk[100] ^= 1
    out = bytearray(b"\xa5" * CS)
    with pytest.raises(ChunkAuthenticationError):
        cipher.decrypt_into(0, bytes(sealed_chunk), out)
    assert out == bytes(CS)


# --- sealing is atomic -----------------------------------------------------------------


def test_failed_seal_leaves_no_file_and_keeps_the_old_one(tmp_path: Path) -> None:
    (tmp_path / "p.bin").write_bytes(_data(20 * CS))
    (tmp_path / "p.gcc").write_bytes(b"previous")
    calls = 0

    def boom(done: int, total: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        seal_file(
            tmp_path / "p.bin",
            tmp_path / "p.gcc",
            kek=os.urandom(32),
            chunk_size=CS,
            threads=2,
            progress=boom,
            force=True,
        )
    assert (tmp_path / "p.gcc").read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.bin", "p.gcc"]


def test_seal_refuses_bad_sources_and_options(tmp_path: Path) -> None:
    with pytest.raises(FileAccessError, match="does not exist"):
        seal_file(tmp_path / "absent", tmp_path / "x.gcc", kek=os.urandom(32))
    with pytest.raises(FileAccessError, match="directory"):
        seal_file(tmp_path, tmp_path / "x.gcc", kek=os.urandom(32))
    (tmp_path / "p.bin").write_bytes(b"abc")
    with pytest.raises(MalformedDatasetError, match="chunk size"):
        seal_file(tmp_path / "p.bin", tmp_path / "x.gcc", kek=os.urandom(32), chunk_size=1000)
    with pytest.raises(ValueError):
        seal_file(tmp_path / "p.bin", tmp_path / "x.gcc")  # nobody could open it
    with pytest.raises(FileAccessError):
        seal_file(tmp_path / "p.bin", tmp_path / "no" / "x.gcc", kek=os.urandom(32))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.bin"]


def test_open_sealed_refuses_non_datasets(tmp_path: Path) -> None:
    (tmp_path / "short").write_bytes(b"GPUCCSD\x00")
    with pytest.raises(MalformedDatasetError, match="too short"):
        open_sealed(tmp_path / "short")
    (tmp_path / "plain").write_bytes(_data(200))
    with pytest.raises(MalformedDatasetError, match="magic"):
        open_sealed(tmp_path / "plain")
    with pytest.raises(FileAccessError):
        open_sealed(tmp_path / "absent")


# --- the context-manager API ------------------------------------------------------------


def test_stage_scrubs_on_exit_and_on_error(sealed: tuple[Path, bytes, bytes]) -> None:
    path, data, kek = sealed
    with staging.stage(path, kek=kek, threads=2) as buf:
        assert buf.tobytes() == data
    assert buf.shape == (len(data),) and not buf.any()
    kept: list[Buffer] = []
    with pytest.raises(KeyError), staging.stage(path, kek=kek) as buf2:
        kept.append(buf2)
        raise KeyError("training failed")
    assert not kept[0].any()


def test_stage_key_sources(sealed: tuple[Path, bytes, bytes], tmp_path: Path) -> None:
    path, data, kek = sealed
    fmt.write_key_file(tmp_path / "k.key", kek)
    with staging.stage(path, key_file=tmp_path / "k.key") as buf:
        assert buf.tobytes() == data
    dk = open_sealed(path).unwrap(kek)
    with staging.stage(path, key=dk) as buf:
        assert buf.tobytes() == data
    with pytest.raises(UsageError), staging.stage(path):
        pass
    with pytest.raises(UsageError), staging.stage(path, key=dk, kek=kek):
        pass


def test_plan_stage_decides_once_and_runs(
    sealed: tuple[Path, bytes, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, data, kek = sealed
    dk = open_sealed(path).unwrap(kek)
    asked: list[bytes] = []

    def key_for(header_digest: bytes) -> bytes:
        asked.append(header_digest)
        return dk

    plan = staging.plan_stage(path, key_for=key_for)
    assert plan.sealed and plan.device == "cpu" and plan.key_source == "session"
    assert plan.dataset is not None and asked == [plan.dataset.header_digest]
    assert plan.header.plaintext_length == len(data) and "dataset_key" not in repr(plan)
    checks: list[bytes] = []
    real_check = SealedDataset.check_key

    def counting(self: SealedDataset, key: bytes) -> Any:
        checks.append(key)
        return real_check(self, key)

    monkeypatch.setattr(SealedDataset, "check_key", counting)
    with plan.run(threads=2) as buf:
        assert buf.tobytes() == data
    assert not buf.any() and checks == [dk]  # the header tag is checked once, by the backend
    assert staging.plan_stage(path, kek=kek).key_source == "key-file"

    with pytest.raises(StageKeyArgumentsError) as info:
        staging.plan_stage(path, key=dk, key_for=key_for)
    assert info.value.sealed and exit_code_for(info.value) == 2
    (tmp_path / "plain.bin").write_bytes(data)
    with pytest.raises(MalformedDatasetError, match="not a sealed dataset") as bad:
        staging.plan_stage(tmp_path / "plain.bin", key=dk)
    assert exit_code_for(bad.value) == 4
    with pytest.raises(StageKeyArgumentsError) as info:
        staging.plan_stage(tmp_path / "plain.bin", key=dk, plaintext=True)
    assert not info.value.sealed
    plain = staging.plan_stage(tmp_path / "plain.bin", chunk_size=CS)
    assert not plain.sealed and plain.key_source == "ephemeral" and plain.dataset_key is None
    with plain.run() as buf:
        assert buf.tobytes() == data


def test_stage_plaintext_input(tmp_path: Path) -> None:
    data = _data(3 * CS + 1)
    (tmp_path / "p.bin").write_bytes(data)
    with staging.stage(tmp_path / "p.bin", chunk_size=CS) as buf:
        assert buf.tobytes() == data
    assert not buf.any()
    # A key says the input must be sealed: a plaintext file given with one is malformed.
    with (
        pytest.raises(MalformedDatasetError, match="not a sealed dataset"),
        staging.stage(tmp_path / "p.bin", kek=os.urandom(32)),
    ):
        pass
    with (
        pytest.raises(UsageError),
        staging.stage(tmp_path / "p.bin", kek=os.urandom(32), plaintext=True),
    ):
        pass


def test_gpu_device_without_cupy_fails_with_its_reason(
    sealed: tuple[Path, bytes, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpucc.staging import gpu

    def unavailable(*_args: object, **_kwargs: object) -> None:
        raise GpuStagingUnavailableError("GPU staging not available: CuPy is not installed")

    monkeypatch.setattr(gpu, "require_gpu", unavailable)
    monkeypatch.setattr(gpu, "unavailable_reason", lambda *_a: "CuPy is not installed")
    path, _, kek = sealed
    with pytest.raises(GpuStagingUnavailableError, match="GPU staging not available") as info:
        with staging.stage(path, kek=kek, device="gpu"):
            pass
    assert exit_code_for(info.value) == 5


def test_auto_falls_back_to_the_cpu_and_cpu_refuses_several_gpus(
    sealed: tuple[Path, bytes, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpucc.staging import gpu

    monkeypatch.setattr(gpu, "unavailable_reason", lambda *_a: "CuPy is not installed")
    path, plain, kek = sealed
    with staging.stage(path, kek=kek, device="auto") as buf:
        assert isinstance(buf, np.ndarray) and bytes(buf) == plain
    with pytest.raises(UsageError), staging.stage(path, kek=kek, device="cpu", gpus=2):
        pass


def test_unknown_device(sealed: tuple[Path, bytes, bytes]) -> None:
    path, _, kek = sealed
    with pytest.raises(UsageError), staging.stage(path, kek=kek, device="tpu"):  # type: ignore[arg-type]
        pass


# --- the pipeline ----------------------------------------------------------------------


def test_pipeline_reports_the_lowest_failure_and_waits_for_workers() -> None:
    running = threading.Event()
    finished: list[int] = []

    def work(index: int, slot: int) -> None:
        if index == 6:
            raise ValueError("six")
        if index == 3:
            running.wait(1)
            raise ValueError("three")
        if index == 4:
            running.set()
        time.sleep(0.01)
        finished.append(index)

    with pytest.raises(ChunkFailure) as info:
        run_chunks(20, work, threads=4)
    assert info.value.index == 3 and str(info.value.cause) == "three"
    assert max(finished) < 3 + 2 * 4 + 1  # bounded window, nothing submitted after
    count = len(finished)
    time.sleep(0.05)
    assert len(finished) == count  # no worker still running


def test_pipeline_slots_are_exclusive() -> None:
    owners: dict[int, int] = {}
    lock = threading.Lock()
    clashes: list[int] = []

    def work(index: int, slot: int) -> None:
        with lock:
            if slot in owners:
                clashes.append(index)
            owners[slot] = index
        time.sleep(0.001)
        with lock:
            del owners[slot]

    done: list[int] = []
    run_chunks(200, work, threads=4, on_done=done.append)
    assert not clashes and done == list(range(200))
