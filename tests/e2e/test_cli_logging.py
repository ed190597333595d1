"""``-v``/``-q`` on every command, ``GPUCC_LOG_LEVEL``, and no argv scanning, as real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

GPUCC = [sys.executable, "-m", "gpucc"]

COMMANDS = [
    ("attest",),
    ("evidence", "collect"),
    ("collateral", "fetch"),
    ("collateral", "show"),
    ("session", "challenge"),
    ("session", "offer"),
    ("session", "answer"),
    ("session", "accept"),
    ("session", "local"),
    ("seal",),
    ("stage",),
    ("demo",),
    ("inspect",),
    ("token", "verify"),
    ("model", "digest"),
    ("model", "verify"),
    ("model", "sign"),
    ("holder", "serve"),
    ("holder", "keygen"),
    ("travel", "run"),
    ("travel", "verify-log"),
]


def run(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCC_", "NVAT_"))}
    base["COLUMNS"] = "200"
    return subprocess.run(
        [*GPUCC, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=base | (env or {}),
        check=False,
    )


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_takes_verbose_and_quiet(tmp_path: Path, command: tuple[str, ...]) -> None:
    result = run(*command, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "--verbose" in result.stdout and "--quiet" in result.stdout


@pytest.fixture
def sealed(tmp_path: Path) -> Path:
    (tmp_path / "d.bin").write_bytes(os.urandom(10_000))
    sealed = run("seal", "d.bin", "-o", "d.gcc", "--data-key", "k.key", cwd=tmp_path)
    assert sealed.returncode == 0, sealed.stderr
    return tmp_path


def test_a_file_named_dash_v_does_not_turn_on_tracebacks(sealed: Path) -> None:
    (sealed / "-v").write_bytes(b"not a sealed dataset at all")
    result = run("stage", "--data-key", "k.key", "--", "-v", cwd=sealed)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_vv_shows_the_traceback_of_an_error(sealed: Path) -> None:
    (sealed / "junk.gcc").write_bytes(b"GPUCCSD1" + bytes(100))
    quiet = run("stage", "junk.gcc", "--data-key", "k.key", cwd=sealed)
    loud = run("stage", "junk.gcc", "--data-key", "k.key", "-vv", cwd=sealed)
    assert quiet.returncode == loud.returncode != 0
    assert "Traceback" not in quiet.stderr
    assert "Traceback" in loud.stderr
    assert loud.stderr.strip().splitlines()[-1] == quiet.stderr.strip()


def test_verbose_quiet_and_the_environment_set_the_level(sealed: Path) -> None:
    args = ("stage", "d.gcc", "--data-key", "k.key", "--backend", "auto")
    note = "staging on the CPU"
    assert note not in run(*args, cwd=sealed).stderr
    assert note in run(*args, "-v", cwd=sealed).stderr
    assert note in run(*args, cwd=sealed, env={"GPUCC_LOG_LEVEL": "info"}).stderr
    assert note in run(*args, cwd=sealed, env={"NVAT_LOG_LEVEL": "INFO"}).stderr
    assert note not in run(*args, "-v", "-q", cwd=sealed).stderr


def test_python_dash_m_gpucc_is_the_console_script(tmp_path: Path) -> None:
    result = run("--version", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.startswith("gpucc ")
