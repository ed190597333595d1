"""Building the nvcc host harnesses once per session (cached by their sources' digest)."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

NVCC = shutil.which("nvcc")


def build_harness(
    tmp_path_factory: pytest.TempPathFactory, source: Path, header: Path, name: str
) -> Path:
    """Compile ``source`` (which includes ``header``) for the host; skip cleanly without nvcc."""
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    digest = hashlib.sha256(source.read_bytes() + header.read_bytes()).hexdigest()[:16]
    exe = tmp_path_factory.mktemp(name) / f"{name}-{digest}"
    result = subprocess.run(
        [NVCC, "-x", "cu", "-std=c++17", "-O2", "-o", str(exe), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return exe


class Harness:
    """Sends command lines to a harness binary (one process per batch of commands)."""

    def __init__(self, exe: Path) -> None:
        self.exe = exe

    def run(self, commands: Sequence[str]) -> list[str]:
        result = subprocess.run(
            [str(self.exe)],
            input="\n".join(commands) + "\n",
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        lines = result.stdout.splitlines()
        assert len(lines) == len(commands), result.stderr
        for cmd, line in zip(commands, lines, strict=True):
            assert not line.startswith("error"), f"{cmd[:80]} -> {line}"
        return lines

    def one(self, command: str) -> str:
        return self.run([command])[0]


def ptxas_functions(source: Path, out: Path) -> dict[str, dict[str, int]]:
    """Build ``source`` for sm_90 with ``ptxas -v`` (cwd: its folder, for its includes) and
    return, per kernel: ``registers``, ``stack``, ``spill_stores``, ``spill_loads``."""
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    result = subprocess.run(
        [NVCC, "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-std=c++17", "-o", str(out), str(source)],
        cwd=source.parent,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = result.stdout + result.stderr
    print(report)
    funcs: dict[str, dict[str, int]] = {}
    current = ""
    for line in report.splitlines():
        if m := re.search(r"Function properties for (\w+)", line):
            current = m.group(1)
            funcs[current] = {}
        elif m := re.search(
            r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line
        ):
            funcs[current].update(stack=int(m[1]), spill_stores=int(m[2]), spill_loads=int(m[3]))
        elif m := re.search(r"Used (\d+) registers", line):
            funcs[current]["registers"] = int(m[1])
    return funcs
