"""The real ``gpucc`` console script: seal, stage and session, as users run them.

Each test runs the installed entry point in a subprocess and checks exit codes, that data
goes to stdout and people-facing lines to stderr, the JSON shape, and that no traceback
ever reaches the user.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from gpucc.staging.format import HEADER_SIZE, PREFIX_SIZE, TAG_SIZE
from tests.support.cli import run_cli

CS = 4096


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd)


def _one_error_line(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpucc: error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert result.stdout == ""


@pytest.fixture
def work(tmp_path: Path) -> Path:
    data = os.urandom(5 * CS + 123)
    (tmp_path / "d.bin").write_bytes(data)
    return tmp_path


def _seal(work: Path) -> subprocess.CompletedProcess[str]:
    return run(
        "seal", "d.bin", "-o", "d.gcc", "--data-key", "k.key", "--chunk-size", "4KiB", cwd=work
    )


# --- seal --------------------------------------------------------------------------


def test_seal_creates_a_0600_key_file_and_says_so(work: Path) -> None:
    result = _seal(work)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert "created key file k.key (mode 0600)" in result.stderr
    assert "sealed" in result.stderr
    assert stat.S_IMODE(os.stat(work / "k.key").st_mode) == 0o600
    assert sorted(p.name for p in work.iterdir()) == ["d.bin", "d.gcc", "k.key"]
    again = run("seal", "d.bin", "-o", "e.gcc", "--data-key", "k.key", cwd=work)
    assert again.returncode == 0 and "created key file" not in again.stderr


def test_seal_refuses_an_exposed_key_file(work: Path) -> None:
    _seal(work)
    (work / "k.key").chmod(0o644)
    result = run("seal", "d.bin", "-o", "x.gcc", "--data-key", "k.key", cwd=work)
    assert result.returncode == 8  # permissions: file access
    _one_error_line(result, "k.key", "0644", "chmod 600")
    assert not (work / "x.gcc").exists()


@pytest.mark.parametrize(
    "args",
    [
        ("seal", "d.bin", "-o", "x.gcc"),  # no key file
        ("seal", "d.bin", "-o", "x.gcc", "--data-key", "k.key", "--chunk-size", "1000"),
        ("seal", "d.bin", "-o", "x.gcc", "--data-key", "k.key", "--chunk-size", "lots"),
    ],
)
def test_seal_usage_errors(work: Path, args: tuple[str, ...]) -> None:
    result = run(*args, cwd=work)
    assert result.returncode == 2
    _one_error_line(result)
    assert not (work / "x.gcc").exists()


# --- stage -------------------------------------------------------------------------


def test_stage_text_and_json(work: Path) -> None:
    _seal(work)
    text = run("stage", "d.gcc", "--data-key", "k.key", "--threads", "2", cwd=work)
    assert text.returncode == 0, text.stderr
    assert text.stdout == ""  # success is for people: stderr, like seal's
    assert text.stderr.startswith("gpucc: staged ") and "6 chunks of 4 KiB" in text.stderr
    # The rate is in decimal units whatever its size (kB/s on a slow run, MB/s or GB/s else).
    assert "verified" in text.stderr and "MiB" not in text.stderr
    assert re.search(r"\(\d+(\.\d+)? [kMG]?B/s\)", text.stderr), text.stderr
    result = run("stage", "d.gcc", "--data-key", "k.key", "--format", "json", cwd=work)
    assert result.returncode == 0 and result.stderr.startswith("gpucc: staged ")
    doc = json.loads(result.stdout)
    assert doc["schema"] == "gpucc.stage/v1"
    assert doc["input"] == "sealed" and doc["key_source"] == "key-file"
    assert doc["device"] == "cpu" and doc["verified"] is True and doc["scrubbed"] is True
    assert doc["bytes"] == 5 * CS + 123 and doc["chunks"] == 6 and doc["chunk_size"] == CS
    assert len(doc["dataset_id"]) == 32
    assert isinstance(doc["seconds"], float) and isinstance(doc["bytes_per_second"], int)
    assert isinstance(doc["threads"], int)
    key_hex = (work / "k.key").read_bytes()[-32:].hex()
    assert key_hex not in result.stdout


def test_stage_plaintext_input_is_sealed_in_transit(work: Path) -> None:
    result = run("stage", "d.bin", "--format", "json", "--chunk-size", "4KiB", cwd=work)
    assert result.returncode == 0, result.stderr
    assert "not sealed" in result.stderr and "fresh one-time key" in result.stderr
    doc = json.loads(result.stdout)
    assert doc["input"] == "plaintext" and doc["key_source"] == "ephemeral"
    assert doc["chunks"] == 6 and doc["dataset_id"] is None
    refused = run("stage", "d.bin", "--data-key", "k.key", cwd=work)
    assert refused.returncode == 8  # the key file does not exist
    _seal(work)
    refused = run("stage", "d.bin", "--data-key", "k.key", cwd=work)
    assert refused.returncode == 4  # a key says it must be sealed: malformed, not usage
    _one_error_line(refused, "not a sealed dataset")


def test_stage_on_gpu_without_cupy_is_one_line_exit_5(work: Path) -> None:
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed: the GPU path is tested in test_gpu_staging.py")
    except ImportError:
        pass
    _seal(work)
    result = run("stage", "d.gcc", "--data-key", "k.key", "--backend", "gpu", cwd=work)
    assert result.returncode == 5
    _one_error_line(result, "GPU staging not available")


def test_stage_auto_without_a_gpu_says_it_uses_the_cpu(work: Path) -> None:
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed")
    except ImportError:
        pass
    _seal(work)
    result = run(
        "stage", "d.gcc", "--data-key", "k.key", "--backend", "auto", "--format", "json", cwd=work
    )
    assert result.returncode == 0, result.stderr
    assert "staging on cpu" in result.stderr
    assert json.loads(result.stdout)["device"] == "cpu"


def test_stage_tampered_chunk_exits_6_naming_it(work: Path) -> None:
    _seal(work)
    blob = bytearray((work / "d.gcc").read_bytes())
    blob[PREFIX_SIZE + 80 + 3 * (CS + TAG_SIZE) + 10] ^= 1  # wrap section is 80 bytes
    (work / "d.gcc").write_bytes(bytes(blob))
    result = run("stage", "d.gcc", "--data-key", "k.key", "--format", "json", cwd=work)
    assert result.returncode == 6
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "chunk 3 failed authentication" in lines[0]
    error = json.loads(result.stdout)
    assert error["schema"] == "gpucc.error/v1"
    assert error["error"]["code"] == 6 and error["error"]["kind"] == "authentication-failed"
    assert error["error"]["message"] == "d.gcc: chunk 3 failed authentication"  # names the file


def test_stage_integrity_and_framing_failures(work: Path) -> None:
    _seal(work)
    (work / "other.bin").write_bytes(b"x")
    run("seal", "other.bin", "-o", "o.gcc", "--data-key", "other.key", cwd=work)
    wrong = run("stage", "d.gcc", "--data-key", "other.key", cwd=work)
    assert wrong.returncode == 7  # told apart from tampering by the key id
    _one_error_line(wrong, "key id")
    blob = (work / "d.gcc").read_bytes()
    (work / "d.gcc").write_bytes(blob[:-1])
    truncated = run("stage", "d.gcc", "--data-key", "k.key", cwd=work)
    assert truncated.returncode == 6  # the authenticated header says what is missing
    _one_error_line(truncated, "chunk 5 failed authentication", "chunk 5 is cut off")
    (work / "d.gcc").write_bytes(blob[: -(123 + TAG_SIZE)])  # the last chunk dropped
    dropped = run("stage", "d.gcc", "--data-key", "k.key", cwd=work)
    assert dropped.returncode == 6
    _one_error_line(dropped, "chunk 5 is missing")
    (work / "d.gcc").write_bytes(blob[:33] + bytes([blob[33] ^ 4]) + blob[34:])  # chunk count
    flipped = run("stage", "d.gcc", "--data-key", "k.key", cwd=work)
    assert flipped.returncode == 6
    _one_error_line(flipped, "header failed authentication")
    (work / "d.gcc").write_bytes(bytes([blob[0] ^ 1]) + blob[1:HEADER_SIZE] + blob[HEADER_SIZE:])
    magic = run("stage", "d.gcc", "--data-key", "k.key", cwd=work)
    assert magic.returncode == 4  # given a key it must be sealed: a damaged magic is malformed
    _one_error_line(magic, "magic is damaged")
    missing_key = run("stage", "o.gcc", cwd=work)
    assert missing_key.returncode == 2
    _one_error_line(missing_key, "--data-key")


# --- session -----------------------------------------------------------------------


def test_session_two_party_flow_on_a_simulated_gpu(work: Path) -> None:
    _seal(work)
    challenge = run("session", "challenge", cwd=work)
    assert challenge.returncode == 0 and challenge.stderr == ""
    value = challenge.stdout.strip()
    assert len(bytes.fromhex(value)) == 32
    offer = run(
        "session", "offer", "--challenge", value, "-o", "offer.json",
        "--host-key", "host.key", "--simulate", "sim", cwd=work,
    )  # fmt: skip
    assert offer.returncode == 0, offer.stderr
    assert offer.stdout == "" and "SIMULATED GPU" in offer.stderr
    assert stat.S_IMODE(os.stat(work / "host.key").st_mode) == 0o600
    doc = json.loads((work / "offer.json").read_text())
    assert doc["schema"] == "gpucc.session-offer/v1" and doc["challenge"] == value
    host_secret = (work / "host.key").read_text().split("private-key: ")[1].strip()
    assert host_secret not in (work / "offer.json").read_text()

    answer = run(
        "session", "answer", "offer.json", "--challenge", value, "--dataset", "d.gcc",
        "--data-key", "k.key", "-o", "answer.json", "--simulate", "sim", cwd=work,
    )  # fmt: skip
    assert answer.returncode == 0, answer.stderr
    assert "attestation trusted" in answer.stderr
    assert json.loads((work / "answer.json").read_text())["schema"] == "gpucc.session-answer/v1"

    accept = run("session", "accept", "answer.json", "--host-key", "host.key", cwd=work)
    assert accept.returncode == 0 and "answer verified" in accept.stdout

    staged = run(
        "stage", "d.gcc", "--session", "answer.json", "--host-key", "host.key",
        "--format", "json", cwd=work,
    )  # fmt: skip
    assert staged.returncode == 0, staged.stderr
    assert json.loads(staged.stdout)["key_source"] == "session"

    # Another data holder's challenge: the offer is refused (exit 1, one line).
    other = run("session", "challenge", cwd=work).stdout.strip()
    replay = run(
        "session", "answer", "offer.json", "--challenge", other, "--dataset", "d.gcc",
        "--data-key", "k.key", "-o", "a2.json", "--simulate", "sim", cwd=work,
    )  # fmt: skip
    assert replay.returncode == 1
    assert replay.stderr.strip().splitlines()[-1].startswith("gpucc: error: the offer answers")
    assert not (work / "a2.json").exists()

    # A host key of another session cannot use this answer.
    again = run(
        "session", "offer", "--challenge", value, "-o", "offer2.json",
        "--host-key", "host.key", "--simulate", "sim", cwd=work,
    )  # fmt: skip
    assert again.returncode == 8  # an existing output: never reuse a host key file
    run(
        "session", "offer", "--challenge", value, "-o", "offer2.json",
        "--host-key", "host2.key", "--simulate", "sim2", cwd=work,
    )  # fmt: skip
    mismatch = run(
        "stage", "d.gcc", "--session", "answer.json", "--host-key", "host2.key", cwd=work
    )
    assert mismatch.returncode == 1
    _one_error_line(mismatch, "transcript mismatch")


def test_session_local(work: Path) -> None:
    _seal(work)
    local = run(
        "session", "local", "d.gcc", "--data-key", "k.key", "-o", "answer.json",
        "--host-key", "host.key", "--simulate", "sim", cwd=work,
    )  # fmt: skip
    assert local.returncode == 0, local.stderr
    assert local.stderr.count("SIMULATED GPU") == 1
    staged = run("stage", "d.gcc", "--session", "answer.json", "--host-key", "host.key", cwd=work)
    assert staged.returncode == 0 and staged.stderr.startswith("gpucc: staged ")
    (work / "host.key").chmod(0o640)
    exposed = run("stage", "d.gcc", "--session", "answer.json", "--host-key", "host.key", cwd=work)
    assert exposed.returncode == 8  # permissions: file access
    _one_error_line(exposed, "chmod 600")


@pytest.mark.parametrize(
    "args",
    [
        ("seal", "--help"),
        ("stage", "--help"),
        ("session", "--help"),
        ("session", "offer", "--help"),
        ("session", "answer", "--help"),
        ("session", "accept", "--help"),
        ("session", "local", "--help"),
    ],
)
def test_help(tmp_path: Path, args: tuple[str, ...]) -> None:
    result = run(*args, cwd=tmp_path)
    assert result.returncode == 0 and "Usage" in result.stdout
    if "--simulate" in result.stdout:  # shown, and labelled as what it is
        assert "SIMULATED GPU" in result.stdout
        assert "Simulation (no GPU; never for production)" in result.stdout
