"""``gpucc attest --cvm-sample tdx|snp``: the bundled CVM samples verify offline with their
collateral at their time, alone or beside NVIDIA's GPU sample (one composite verdict); the
verdict line reads naturally and ``-v`` shows every measurement in full. Real processes."""

from __future__ import annotations

import json
import subprocess

import pytest
from jsonschema import Draft202012Validator

from gpucc.cli.schemas import load_schema
from tests.support.cli import run_cli
from tests.support.paths import DATA

AT = "2025-06-19T11:16:03Z"
MRTD = (
    "91eb2b44d141d4ece09f0c75c2c53d247a3c68edd7fafe8a3520c942a604a407"
    "de03ae6dc5f87f27428b2538873118b7"
)
MRSEAM = (
    "5b38e33a6487958b72c3c12a938eaa5e3fd4510c51aeeab58c7d5ecee41d7c43"
    "6489d6c8e4f92f160b7cad34207b00c1"
)


def attest(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("attest", "--offline", *args)


def document(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    doc = json.loads(proc.stdout)
    assert isinstance(doc, dict)
    Draft202012Validator(load_schema(str(doc["schema"]))).validate(doc)
    return doc


@pytest.mark.parametrize(("kind", "measurement"), [("tdx", "mrtd"), ("snp", "measurement")])
def test_a_bundled_cvm_sample_is_trusted_alone_at_its_time(kind: str, measurement: str) -> None:
    proc = attest("--cvm-sample", kind, "-f", "json")
    assert proc.returncode == 0, proc.stderr
    doc = document(proc)
    assert doc["trusted"] is True and doc["gpus"] == []
    cvm = doc["cvm"]
    assert isinstance(cvm, dict) and cvm["kind"] == kind and cvm["verdict"] == "trusted"
    assert len(cvm["claims"][measurement]) == 96  # in full, always, in JSON
    checks = {c["id"]: c["status"] for c in cvm["checks"]}
    assert checks["cvm-report-data"] == "pass", checks
    text = attest("--cvm-sample", kind)
    assert text.returncode == 0, text.stderr
    assert f"TRUSTED: the CVM ({kind}) verified as of {AT}" in text.stdout
    assert f"the bundled CVM sample's time ({kind})" in text.stderr


def test_the_cvm_sample_and_the_gpu_sample_give_one_composite_verdict() -> None:
    proc = attest("--sample", "--cvm-sample", "tdx")
    assert proc.returncode == 0, proc.stderr
    verdicts = [line for line in proc.stdout.splitlines() if line.startswith("TRUSTED")]
    assert verdicts == [f"TRUSTED: the CVM (tdx) and 1 GPU verified as of {AT}"], proc.stdout
    assert "not bound to the GPU's nonce" in proc.stderr
    doc = document(attest("--sample", "--cvm-sample", "snp", "-f", "json"))
    assert doc["trusted"] is True and len(doc["gpus"]) == 1  # type: ignore[arg-type]
    assert doc["cvm"]["kind"] == "snp"  # type: ignore[index]


def test_a_gpu_alone_reads_one_gpu() -> None:
    proc = attest("--sample", "--at", "2024-01-01T00:00:00Z")  # piped: the plain writer
    assert proc.returncode == 0, proc.stderr
    assert "TRUSTED: 1 GPU verified as of 2024-01-01T00:00:00Z" in proc.stdout


def test_verbose_text_shows_every_measurement_in_full() -> None:
    short = attest("--cvm-sample", "tdx")
    assert MRTD not in short.stdout and "91eb2b44" in short.stdout
    assert "mrseam" not in short.stdout
    full = run_cli("attest", "--offline", "--cvm-sample", "tdx", "-v")
    assert full.returncode == 0, full.stderr
    lines = full.stdout.splitlines()
    assert any(line.split() == ["mrtd", MRTD] for line in lines), full.stdout
    assert any(line.split() == ["mrseam", MRSEAM] for line in lines), full.stdout
    for claim in ("mrconfigid", "mrowner", "mrownerconfig", "rtmr3", "xfam"):
        assert any(line.split()[:1] == [claim] for line in lines), claim


def test_a_time_when_the_collateral_is_stale_cannot_decide() -> None:
    proc = attest("--cvm-sample", "tdx", "--at", "2031-01-01T00:00:00Z")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "UNDECIDED: " in proc.stdout and "TRUSTED" not in proc.stdout


@pytest.mark.parametrize(
    "extra",
    [
        ("--cvm-evidence", str(DATA / "cpu-tee" / "tdx" / "quote.bin")),
        ("--cvm-report-data", "00" * 64),
        ("--cvm-pccs-url", "http://127.0.0.1:9"),
    ],
)
def test_the_sample_brings_its_own_cvm_inputs(extra: tuple[str, str]) -> None:
    proc = run_cli("attest", "--cvm-sample", "snp", *extra)
    assert proc.returncode == 2, proc.stderr
    assert f"drop {extra[0]}" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_an_unknown_cvm_sample_is_a_usage_error() -> None:
    proc = attest("--cvm-sample", "sgx")
    assert proc.returncode == 2, proc.stderr
