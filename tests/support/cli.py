"""gpucc run as a process with a clean environment: the installed console script, or
``python -m gpucc``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

StrPath = str | Path

GPUCC = shutil.which("gpucc", path=str(Path(sys.executable).parent)) or "gpucc"
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCC_", "NVAT_", "NV_"))}


def gpucc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the console script; ``env`` adds to the clean environment."""
    return subprocess.run(
        [GPUCC, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**ENV, **(env or {})},
        check=False,
    )


def run_cli(
    *args: StrPath,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    module: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run the console script (or ``python -m gpucc`` with ``module``) in ``cwd``, 200 columns
    wide; ``env`` adds to the clean environment. No traceback may reach the user."""
    command = [sys.executable, "-m", "gpucc"] if module else [GPUCC]
    result = subprocess.run(
        [*command, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**ENV, "COLUMNS": "200", **(env or {})},
        check=False,
    )
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    return result
