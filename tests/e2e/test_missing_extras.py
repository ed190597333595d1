"""Every optional extra, missing: each command that needs one says which, and exits 5.

Each command runs as a real process in which the extra's top-level modules cannot be
imported (``GPUCCTEST_BLOCK``, ``tests/support/childhooks``: ``import`` raises
ModuleNotFoundError and ``importlib.util.find_spec`` answers None, as on an install without
the extra). An internal error (exit 70) fails the test by itself (``tests/conftest.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucc.core.extras import EXTRAS
from tests.support.cli import run_cli

S3 = "boto3,botocore"
HOLDER = ["holder", "serve", "--datasets", "data", "--data-key", "data.key", "--holder-key",
          "holder.key", "--listen", "127.0.0.1:0"]  # fmt: skip
SNP = ["cvm", "reference-snp", "--ovmf", "OVMF.fd", "--kernel", "vmlinuz", "--initrd",
       "initrd.img", "--append", "console=ttyS0", "--vcpus", "4", "--vcpu-type", "EPYC-v4",
       "-o", "policy.yaml"]  # fmt: skip

CASES = [
    ("s3", S3, ["stage", "s3://bucket/object.gcc", "--data-key", "data.key"]),
    ("s3", S3, ["stage", "s3://bucket/prefix/", "--data-key", "data.key"]),
    ("s3", "botocore", ["stage", "s3://bucket/object.gcc", "--data-key", "data.key"]),
    ("holder", "starlette,h11", HOLDER),
    ("metrics", "prometheus_client", [*HOLDER, "--metrics"]),
    ("state-postgres", "psycopg", [*HOLDER, "--state", "postgresql://127.0.0.1:9/none"]),
    ("gpu", "cupy", ["stage", "data.gcc", "--data-key", "data.key", "--backend", "gpu"]),
    ("nvml", "pynvml", ["attest"]),
    ("nvml", "pynvml", ["evidence", "collect", "-o", "evidence.json"]),
    ("model", "blake3", ["model", "digest", "data", "--hash", "blake3"]),
    ("cvm-reference", "sevsnpmeasure", SNP),
]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("extras")
    (work / "data").mkdir()
    (work / "data.bin").write_bytes(bytes(range(256)) * 64)
    for argv in (
        ["seal", "data.bin", "-o", "data/data.gcc", "--data-key", "data.key"],
        ["holder", "keygen", "--holder-key", "holder.key", "--holder-pub", "holder.pub.pem"],
    ):
        done = run_cli(*argv, cwd=work)
        assert done.returncode == 0, done.stderr
    (work / "data.gcc").write_bytes((work / "data" / "data.gcc").read_bytes())
    for name in ("OVMF.fd", "vmlinuz", "initrd.img"):
        (work / name).write_bytes(b"\0" * 4096)
    return work


def test_every_extra_is_covered() -> None:
    extras = {extra for extra, _, _ in CASES} | {"torch"}  # torch: a library import, below
    assert extras == {extra for extra, _ in EXTRAS.values()}


@pytest.mark.parametrize("output", ["text", "json"])
@pytest.mark.parametrize(("extra", "blocked", "argv"), CASES, ids=lambda v: str(v)[:40])
def test_a_missing_extra_is_said(
    work: Path, extra: str, blocked: str, argv: list[str], output: str
) -> None:
    if extra == "metrics":  # holder serve says a missing holder extra first
        pytest.importorskip("starlette", reason="--metrics is checked after the holder extra")
        pytest.importorskip("h11", reason="--metrics is checked after the holder extra")
    result = run_cli(*argv, "--format", output, cwd=work, env={"GPUCCTEST_BLOCK": blocked})
    assert result.returncode == 5, result.stderr
    said = f"pip install 'gpucc[{extra}]'"
    assert said in result.stderr and result.stderr.count("\n") == 1, result.stderr
    if output == "json":
        error = json.loads(result.stdout)["error"]
        assert error["kind"] == "environment" and said in error["message"] + error["hint"]


def test_the_same_commands_run_past_that_point_with_the_extra(work: Path) -> None:
    """Without the block, the s3 command gets as far as the store (none here): the block,
    not the command line, is what the tests above see."""
    pytest.importorskip("boto3", reason="the s3 extra is not installed here")
    result = run_cli(
        "stage", "s3://bucket/object.gcc", "--data-key", "data.key", cwd=work,
        env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x",
             "AWS_SECRET_ACCESS_KEY": "x", "AWS_MAX_ATTEMPTS": "1"},
    )  # fmt: skip
    assert result.returncode not in (0, 5), result.stderr
    assert "gpucc[s3]" not in result.stderr


@pytest.mark.parametrize("module", ["gpucc.ddp"])
def test_the_torch_integrations_say_the_extra(tmp_path: Path, module: str) -> None:
    probe = (
        "from gpucc.core.extras import MissingExtraError\n"
        f"try:\n    import {module}\n"
        "except MissingExtraError as exc:\n    print(exc.extra, exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "GPUCCTEST_BLOCK": "torch"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("torch ") and "pip install 'gpucc[torch]'" in done.stdout
