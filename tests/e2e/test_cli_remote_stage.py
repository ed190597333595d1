"""``gpucc stage`` from real servers on 127.0.0.1: moto's S3 server, nginx over HTTPS, a
hostile origin misbehaving in each way the store can, and standard input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import ENV, run_cli
from tests.support.stores import (
    NGINX,
    Tls,
    bucket,
    hostile_origin,
    make_tls,
    moto_server,
    nginx_https,
)

CS = 4096
REMOTE = ("--part-size", "8KiB", "--parallelism", "2")


def _one_error_line(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpucc: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert result.stdout == ""
    return lines[0]


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """d.gcc (40 chunks of 4 KiB and a partial one), its key k.key, and shards/ (3 shards)."""
    work = tmp_path_factory.mktemp("remote")
    (work / "d.bin").write_bytes(os.urandom(40 * CS + 123))
    for args in (
        ("seal", "d.bin", "-o", "d.gcc", "--data-key", "k.key", "--chunk-size", "4KiB"),
        ("seal", "d.bin", "--shards", "3", "-o", "shards", "--data-key", "k.key",
         "--chunk-size", "4KiB"),
    ):  # fmt: skip
        result = run_cli(*args, cwd=work)
        assert result.returncode == 0, result.stderr
    return work


@pytest.fixture(scope="module")
def tls(sealed: Path) -> Tls:
    return make_tls(sealed / "tls")


@pytest.fixture(scope="module")
def s3(sealed: Path) -> Iterator[dict[str, str]]:
    with moto_server(sealed) as env:
        client = bucket(env, "data")
        client.put_object(Bucket="data", Key="train/d.gcc", Body=(sealed / "d.gcc").read_bytes())
        client.put_object(Bucket="data", Key="k.key", Body=(sealed / "k.key").read_bytes())
        shard = sorted((sealed / "shards").glob("*.gcc"))[0]
        client.put_object(Bucket="data", Key=f"shards/{shard.name}", Body=shard.read_bytes())
        yield env


def test_stage_from_s3_text_and_json(sealed: Path, s3: dict[str, str]) -> None:
    result = run_cli(
        "stage", "s3://data/train/d.gcc", "--data-key", "k.key", *REMOTE, "-f", "json",
        cwd=sealed, env=s3,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["dataset"] == "s3://data/train/d.gcc"
    assert doc["bytes"] == 40 * CS + 123 and doc["chunks"] == 41 and doc["verified"]
    assert doc["scrubbed"] is True
    source = doc["source"]
    assert source["name"] == "s3://data/train/d.gcc"
    assert source["pin"].startswith('etag "') and source["parallelism"] == 2
    assert source["window_bytes"] == 2 * 1 * (CS + 16)  # 2 parts of 1 chunk (8 KiB parts)
    assert "staged" in result.stderr and "s3://data/train/d.gcc" in result.stderr
    assert "testing" not in result.stderr + result.stdout  # no credential is ever shown


def test_s3_missing_object_and_bucket_exit_8(sealed: Path, s3: dict[str, str]) -> None:
    for url in ("s3://data/none.gcc", "s3://nobucket/d.gcc"):
        result = run_cli("stage", url, "--data-key", "k.key", cwd=sealed, env=s3)
        assert result.returncode == 8
        _one_error_line(result, url, "does not exist")


def test_s3_without_credentials_exit_8(sealed: Path, s3: dict[str, str]) -> None:
    env = {k: v for k, v in s3.items() if not k.startswith("AWS_ACCESS")}
    env["AWS_SECRET_ACCESS_KEY"] = ""
    result = run_cli(
        "stage", "s3://data/train/d.gcc", "--data-key", "k.key", cwd=sealed,
        env={**env, "AWS_ACCESS_KEY_ID": ""},
    )  # fmt: skip
    assert result.returncode == 8
    _one_error_line(result, "no AWS credentials found")


def test_s3_lone_shard_is_refused(sealed: Path, s3: dict[str, str]) -> None:
    shard = sorted((sealed / "shards").glob("*.gcc"))[0].name
    result = run_cli(
        "stage", f"s3://data/shards/{shard}", "--data-key", "k.key", cwd=sealed, env=s3
    )
    assert result.returncode == 6
    _one_error_line(result, "lone shard")


def test_s3_object_replaced_between_open_and_read_is_an_error(
    sealed: Path, s3: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    from gpucc.staging.api import plan_stage
    from gpucc.staging.sources import ObjectChangedError, SourceSettings

    for name, value in s3.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3")
    client.put_object(Bucket="data", Key="swap.gcc", Body=(sealed / "d.gcc").read_bytes())
    plan = plan_stage(
        "s3://data/swap.gcc",
        key_file=sealed / "k.key",
        source_settings=SourceSettings(part_size=8192, parallelism=2),
    )
    client.put_object(Bucket="data", Key="swap.gcc", Body=(sealed / "d.gcc").read_bytes() + b"x")
    with pytest.raises(ObjectChangedError, match="s3://data/swap.gcc changed while it was read"):
        plan.verify()


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx-light)")
def test_stage_from_nginx_over_https(sealed: Path, tls: Tls) -> None:
    with nginx_https(sealed, tls, sealed / "nginx") as base:
        url = f"{base}/d.gcc"
        ok = run_cli(
            "stage", url, "--data-key", "k.key", *REMOTE, "--ca-file", str(tls.ca), "-f", "json",
            cwd=sealed,
        )  # fmt: skip
        assert ok.returncode == 0, ok.stderr
        doc = json.loads(ok.stdout)
        assert doc["source"]["pin"].startswith('etag "') and doc["chunks"] == 41
        # The standard variable works as well as the option; without the CA, TLS fails (3).
        by_env = run_cli(
            "stage", url, "--data-key", "k.key", cwd=sealed, env={"REQUESTS_CA_BUNDLE": str(tls.ca)}
        )
        assert by_env.returncode == 0, by_env.stderr
        untrusted = run_cli("stage", url, "--data-key", "k.key", cwd=sealed)
        assert untrusted.returncode == 3
        _one_error_line(untrusted, "TLS failed")
        missing = run_cli(
            "stage", f"{base}/none.gcc", "--data-key", "k.key", "--ca-file", str(tls.ca),
            cwd=sealed,
        )  # fmt: skip
        assert missing.returncode == 8
        _one_error_line(missing, f"{base}/none.gcc does not exist")


@pytest.fixture(scope="module")
def hostile(sealed: Path, tls: Tls) -> Iterator[str]:
    with hostile_origin(sealed, tls) as base:
        yield base


@pytest.mark.parametrize(
    ("mode", "code", "fragments"),
    [
        ("ignore-range", 4, ("answered 200 with the whole object", "ignores Range")),
        ("endless", 4, ("answered 200 with the whole object",)),
        ("short", 3, ("the body ended after", "after 1 retries")),
        ("wrong-range", 4, ("Content-Range 'bytes",)),
        ("other-bytes", 6, (" failed authentication: https://", "served bytes that are not")),
        ("changed", 6, ("changed while it was read",)),
        ("changed-etag", 6, ('ETag "v2" instead of "v1"',)),
        ("truncated", 6, ("chunk 40 is cut off", "short of the length")),
        ("redirect", 4, ("redirects to another origin (https://localhost:", "refused")),
        ("drip", 3, ("no complete answer within the 1.5 s deadline",)),
    ],
)
def test_hostile_origin_fails_closed(
    sealed: Path, tls: Tls, hostile: str, mode: str, code: int, fragments: tuple[str, ...]
) -> None:
    url = f"{hostile}/{mode}/d.gcc"
    result = run_cli(
        "stage", url, "--data-key", "k.key", *REMOTE, "--ca-file", str(tls.ca),
        "--deadline", "1.5", "--retries", "1", "-f", "json", cwd=sealed,
    )  # fmt: skip
    assert result.returncode == code, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == "gpucc.error/v1" and doc["error"]["code"] == code
    assert len(result.stderr.strip().splitlines()) == 1  # one line, no traceback
    for fragment in (url if mode != "other-bytes" else f"{hostile}/{mode}/d.gcc", *fragments):
        assert fragment in doc["error"]["message"], doc["error"]["message"]


def test_flaky_origin_is_retried_to_success(sealed: Path, tls: Tls, hostile: str) -> None:
    result = run_cli(
        "stage", f"{hostile}/flaky/d.gcc", "--data-key", "k.key", *REMOTE,
        "--ca-file", str(tls.ca), cwd=sealed,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def _stdin(sealed: Path, data: bytes) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "gpucc", "stage", "-", "--data-key", "k.key", "-f", "json"],
        cwd=sealed,
        input=data,
        capture_output=True,
        env={**ENV, "COLUMNS": "200"},
        check=False,
        timeout=120,
    )
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode()
    )


def test_stage_from_standard_input(sealed: Path) -> None:
    data = (sealed / "d.gcc").read_bytes()
    ok = _stdin(sealed, data)
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert (
        doc["dataset"] == "-" and doc["chunks"] == 41 and doc["source"]["pin"].startswith("stream")
    )
    cut = _stdin(sealed, data[:-5000])
    assert cut.returncode == 6
    assert (
        "chunk 38 failed authentication: - ended inside it, and chunks 39 to 40 are missing"
        in json.loads(cut.stdout)["error"]["message"]
    )
    extended = _stdin(sealed, data + b"more")
    assert extended.returncode == 6
    assert "after the final chunk" in json.loads(extended.stdout)["error"]["message"]
    flipped = bytearray(data)
    flipped[-3000] ^= 1
    bad = _stdin(sealed, bytes(flipped))
    assert bad.returncode == 6
    assert "chunk 39 failed authentication" in json.loads(bad.stdout)["error"]["message"]


def test_api_stages_an_s3_object_into_memory_and_scrubs_it(
    sealed: Path, s3: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpucc import staging
    from gpucc.staging.sources import SourceSettings

    for name, value in s3.items():
        monkeypatch.setenv(name, value)
    plan = staging.plan_stage(
        "s3://data/train/d.gcc",
        key_file=sealed / "k.key",
        source_settings=SourceSettings(part_size=3 * CS, parallelism=3),
    )
    with plan.run(threads=2) as buf:
        assert buf.tobytes() == (sealed / "d.bin").read_bytes()
    assert not buf.any()


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx-light)")
def test_a_shard_set_from_nginx_named_url_by_url(sealed: Path, tls: Tls) -> None:
    names = sorted(p.name for p in (sealed / "shards").glob("*.gcc"))
    with nginx_https(sealed, tls, sealed / "nginx-set") as base:
        urls = [f"{base}/shards/{name}" for name in names]
        ca = ("--ca-file", str(tls.ca))
        ok = run_cli("stage", *urls, "--data-key", "k.key", *ca, "-f", "json", cwd=sealed)
        assert ok.returncode == 0, ok.stderr
        doc = json.loads(ok.stdout)
        assert doc["shards"] == 3 and doc["bytes"] == 40 * CS + 123 and doc["verified"]
        assert doc["dataset"] == urls[0]
        lone = run_cli("stage", *urls[:2], "--data-key", "k.key", *ca, cwd=sealed)
        assert lone.returncode == 6
        _one_error_line(lone, "one of 3 shards, but 2 were given")
        listing = run_cli("stage", f"{base}/shards/", "--data-key", "k.key", *ca, cwd=sealed)
        assert listing.returncode == 2
        _one_error_line(listing, "only s3:// prefixes are listed")
