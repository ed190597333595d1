"""The PyTorch datasets over a shard set in moto's S3 server on 127.0.0.1, in one process:
the set opened by its prefix, read byte for byte, carried to another process by pickling
(as a spawned DataLoader worker gets it), and an object replaced after the set was opened
refused rather than mixed in."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucc.staging.shards import seal_shards
from gpucc.staging.sources import ObjectChangedError
from gpucc.staging.torch_dataset import SealedChunkDataset, SealedChunkStream
from tests.support import torch_records as tr
from tests.support.stores import moto_server

KEY = bytes(range(32))
CHUNK = 4096
CHUNKS = 9


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("torch-remote")
    (work / "plain.bin").write_bytes(tr.plaintext(CHUNKS, CHUNK))
    (work / "set").mkdir()
    seal_shards(work / "plain.bin", work / "set", 3, dataset_key=KEY, chunk_size=CHUNK, stem="s")
    return work


@pytest.fixture
def s3(work: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    import boto3

    with moto_server(work) as env:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        client = boto3.client("s3")
        client.create_bucket(Bucket="data")
        for shard in sorted((work / "set").iterdir()):
            client.put_object(Bucket="data", Key=f"set/{shard.name}", Body=shard.read_bytes())
        yield client


def _bytes(stream: SealedChunkStream) -> bytes:
    chunks = list(stream)
    order = stream.chunks()
    return b"".join(bytes(c.numpy().tobytes()) for _, c in sorted(zip(order, chunks, strict=True)))


def test_stream_and_dataset_read_the_set_by_its_prefix(work: Path, s3: object) -> None:
    data = (work / "plain.bin").read_bytes()
    stream = SealedChunkStream("s3://data/set/", key=KEY, shuffle=True, seed=1)
    assert _bytes(stream) == data
    stream.close()
    dataset = SealedChunkDataset("s3://data/set/", key=KEY, record_size=tr.RECORD)
    got = b"".join(dataset[i].numpy().tobytes() for i in range(len(dataset)))
    assert got == data
    dataset.close()


def test_a_pickled_stream_opens_the_objects_again(work: Path, s3: object) -> None:
    stream = SealedChunkStream("s3://data/set/", key=KEY, shuffle=False)
    copy = pickle.loads(pickle.dumps(stream))  # what a spawned DataLoader worker receives
    assert _bytes(copy) == (work / "plain.bin").read_bytes()
    copy.close()


def test_an_object_replaced_after_the_set_was_opened_is_refused(work: Path, s3: object) -> None:
    stream = SealedChunkStream("s3://data/set/", key=KEY, shuffle=False)
    name = "s-00001-of-00003.gcc"
    body = bytearray((work / "set" / name).read_bytes())
    body[-1] ^= 1  # another object of the same length under the same name
    s3.put_object(Bucket="data", Key=f"set/{name}", Body=bytes(body))  # type: ignore[attr-defined]
    with pytest.raises(ObjectChangedError, match=f"s3://data/set/{name} changed after the shard"):
        list(stream)
    stream.close()


def test_a_set_and_a_reader_make_one_s3_client_each(
    work: Path, s3: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpucc.staging.sources import s3 as s3_module

    made: list[object] = []
    real = s3_module.s3_client

    def counting(settings: object) -> object:
        made.append(settings)
        return real(settings)  # type: ignore[arg-type]

    monkeypatch.setattr(s3_module, "s3_client", counting)
    stream = SealedChunkStream("s3://data/set/", key=KEY, shuffle=False)
    assert len(made) == 1  # three objects opened through one client (about 0.15 s each)
    assert _bytes(stream) == (work / "plain.bin").read_bytes()
    assert len(made) == 2  # the reader of the iteration: one more for its three shards
    stream.close()


@pytest.mark.slow
def test_spawned_dataloader_workers_read_the_remote_set(work: Path, s3: object) -> None:
    from torch.utils.data import DataLoader

    stream = SealedChunkStream("s3://data/set/", key=KEY, shuffle=False)
    loader = DataLoader(stream, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    chunks = [c.numpy().tobytes() for c in loader]
    data = (work / "plain.bin").read_bytes()
    assert sorted(chunks) == sorted(data[i : i + CHUNK] for i in range(0, len(data), CHUNK))
