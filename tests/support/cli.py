"""The installed ``gpucc`` console script, run as a process with a clean environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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
