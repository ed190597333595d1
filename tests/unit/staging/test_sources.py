"""staging.sources: the prefetch window and the source-reading paths, on local sources and
sources that fail on purpose (the real stores are in tests/e2e/test_cli_remote_stage.py)."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import numpy as np
import pytest

from gpucc.staging import format as fmt
from gpucc.staging.dataset import open_sealed
from gpucc.staging.errors import ChunkAuthenticationError, ExtendedDatasetError
from gpucc.staging.seal import seal_file
from gpucc.staging.sources import SourceSettings, StoreUnavailableError, is_remote
from gpucc.staging.sources.base import Span
from gpucc.staging.sources.prefetch import Prefetcher, window_chunks
from gpucc.staging.sources.sealed import open_sealed_source, stage_source, verify_source
from gpucc.staging.sources.stream import LocalSource, StdinSource

CS = 4096
SLOT = CS + fmt.TAG_SIZE


def _sealed(tmp_path: Path, size: int = 37 * CS + 5) -> tuple[Path, bytes, bytes]:
    data = np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8).tobytes()
    (tmp_path / "p.bin").write_bytes(data)
    kek = fmt.new_dataset_key()
    seal_file(tmp_path / "p.bin", tmp_path / "p.gcc", kek=kek, chunk_size=CS)
    return tmp_path / "p.gcc", data, open_sealed(tmp_path / "p.gcc").unwrap(kek)


def test_names_that_are_remote() -> None:
    assert is_remote("-") and is_remote("s3://b/k") and is_remote("https://h/x.gcc")
    assert not is_remote("data/x.gcc") and not is_remote(Path("-")) and not is_remote("./-")


@pytest.mark.parametrize(
    ("parallelism", "part", "window", "threads"),
    [(1, SLOT, 1, 1), (1, 100 * SLOT, None, 3), (4, SLOT, None, 2), (3, 2 * SLOT, 2, 4),
     (2, 5 * SLOT, 3, 1), (8, SLOT, 64, 8)],
)  # fmt: skip
def test_every_window_and_parallelism_stages_the_same_bytes(
    tmp_path: Path, parallelism: int, part: int, window: int | None, threads: int
) -> None:
    path, data, key = _sealed(tmp_path)
    settings = SourceSettings(parallelism=parallelism, part_size=part, window=window)
    dataset = open_sealed_source(LocalSource(str(path)))
    out = stage_source(dataset, key, threads=threads, settings=settings)
    assert out.tobytes() == data
    verified = verify_source(dataset, key, threads=threads, settings=settings)
    per_part, chunks = window_chunks(dataset.header, settings)
    assert verified.chunk_count == 38 and verified.scrubbed
    assert verified.window_bytes == chunks * SLOT  # the ring is the whole prefetch memory
    assert chunks == min(38, window or per_part * parallelism)


class _Counting(LocalSource):
    """Records, for every chunk read, how far ahead of the lowest unreleased chunk it was."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.lock = threading.Lock()
        self.spans = 0
        self.open = 0
        self.most_open = 0

    def open_span(self, offset: int, length: int) -> Span:
        with self.lock:
            self.spans += 1
            self.open += 1
            self.most_open = max(self.most_open, self.open)
        span = super().open_span(offset, length)
        close = span.close

        def closed() -> None:
            with self.lock:
                self.open -= 1
            close()

        span.close = closed  # type: ignore[method-assign]
        return span


def test_requests_are_parts_and_at_most_parallelism_are_open(tmp_path: Path) -> None:
    path, _, key = _sealed(tmp_path)
    # One request in flight: every part goes on in the request that read the header.
    source = _Counting(str(path))
    verify_source(open_sealed_source(source), key, threads=2,
                  settings=SourceSettings(parallelism=1, part_size=4 * SLOT))  # fmt: skip
    assert source.spans == 1 and source._parked is None
    # Three: 38 chunks in parts of 4, a part that does not start where the header's request
    # is opens its own; never more than three parts and the parked request at once.
    source = _Counting(str(path))
    verify_source(open_sealed_source(source), key, threads=2,
                  settings=SourceSettings(parallelism=3, part_size=4 * SLOT))  # fmt: skip
    assert source.spans <= 1 + 9 and source.most_open <= 3 + 1
    assert source._parked is None  # closed at the end


class _Failing(LocalSource):
    """A store that stops delivering at ``fail_at``."""

    def __init__(self, path: str, fail_at: int) -> None:
        super().__init__(path)
        self.fail_at = fail_at

    def open_span(self, offset: int, length: int) -> Span:
        if offset >= self.fail_at:
            raise StoreUnavailableError(f"{self.name}: gone at {offset}")
        return super().open_span(offset, length)


def test_a_store_failure_is_raised_and_nothing_unverified_is_kept(tmp_path: Path) -> None:
    path, data, key = _sealed(tmp_path)
    dataset = open_sealed_source(_Failing(str(path), fail_at=20 * SLOT))
    out = np.full(dataset.header.plaintext_length, 7, dtype=np.uint8)
    with pytest.raises(StoreUnavailableError, match="gone at"):
        stage_source(dataset, key, threads=3, out=out,
                     settings=SourceSettings(parallelism=2, part_size=SLOT))  # fmt: skip
    assert out[: 20 * CS].tobytes() == data[: 20 * CS]  # verified before the failure
    assert not out[20 * CS :].any()  # chunk 20 never came: from it on, zeros


def test_a_tampered_chunk_names_the_source_and_zeroes_from_it(tmp_path: Path) -> None:
    path, data, key = _sealed(tmp_path)
    raw = bytearray(path.read_bytes())
    dataset = open_sealed(path)
    raw[dataset.header.chunk_offset(9) + 3] ^= 1
    path.write_bytes(bytes(raw))
    source = open_sealed_source(LocalSource(str(path)))
    out = np.full(source.header.plaintext_length, 7, dtype=np.uint8)
    with pytest.raises(ChunkAuthenticationError, match=f"chunk 9 failed authentication: {path}"):
        stage_source(source, key, threads=4, out=out, settings=SourceSettings(part_size=SLOT))
    assert out[: 9 * CS].tobytes() == data[: 9 * CS]  # verified chunks stay
    assert not out[9 * CS :].any()  # from the failed chunk on, nothing survives


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("run", ["stage", "verify"])
def test_the_lowest_bad_chunk_wins_and_progress_is_in_order(
    tmp_path: Path, threads: int, run: str
) -> None:
    path, data, key = _sealed(tmp_path)
    total = len(data)
    seen: list[tuple[int, int]] = []
    settings = SourceSettings(parallelism=3, part_size=SLOT)
    call = stage_source if run == "stage" else verify_source
    call(open_sealed_source(LocalSource(str(path))), key, threads=threads, settings=settings,
         progress=lambda d, t: seen.append((d, t)))  # fmt: skip
    assert seen == [(min(total, (i + 1) * CS), total) for i in range(38)]
    raw = bytearray(path.read_bytes())
    header = open_sealed(path).header
    for index in (30, 10, 9):  # 9 and 10 fail in flight together: 9 is named, always
        raw[header.chunk_offset(index) + 3] ^= 1
    path.write_bytes(bytes(raw))
    seen.clear()
    out = np.full(total, 7, dtype=np.uint8)
    dataset = open_sealed_source(LocalSource(str(path)))
    with pytest.raises(ChunkAuthenticationError, match=f"chunk 9 .*{path} served") as info:
        if run == "stage":
            stage_source(dataset, key, threads=threads, out=out, settings=settings,
                         progress=lambda d, t: seen.append((d, t)))  # fmt: skip
        else:
            verify_source(dataset, key, threads=threads, settings=settings,
                          progress=lambda d, t: seen.append((d, t)))  # fmt: skip
    assert info.value.chunk_index == 9
    assert seen == [((i + 1) * CS, total) for i in range(len(seen))] and len(seen) <= 9
    if run == "stage":  # verified chunks stay; from the lowest bad one on, nothing survives
        assert out[: 9 * CS].tobytes() == data[: 9 * CS] and not out[9 * CS :].any()


def test_a_stream_is_read_once_in_order(tmp_path: Path) -> None:
    path, data, key = _sealed(tmp_path)
    raw = path.read_bytes()
    dataset = open_sealed_source(StdinSource(io.BufferedReader(io.BytesIO(raw))))
    assert stage_source(dataset, key, threads=3).tobytes() == data
    longer = open_sealed_source(StdinSource(io.BufferedReader(io.BytesIO(raw + b"!"))))
    with pytest.raises(ExtendedDatasetError, match="after the final chunk"):
        verify_source(longer, key, threads=2)


def test_the_prefetcher_never_deadlocks_whatever_the_order_of_release(tmp_path: Path) -> None:
    path, _, _ = _sealed(tmp_path)
    dataset = open_sealed_source(LocalSource(str(path)))
    pf = Prefetcher(dataset.source, dataset.header,  # type: ignore[arg-type]
                    SourceSettings(parallelism=4, part_size=3 * SLOT, window=5))  # fmt: skip
    taken: list[int] = []
    for index in reversed(range(5)):  # the whole window taken, released backwards
        pf.take(index)
        taken.append(index)
    for index in taken:
        pf.release(index)
    for index in range(5, dataset.header.chunk_count):
        pf.take(index)
        pf.release(index)
    pf.close()
