"""Fixtures shared across the suite: gpucc as a real process, and NVIDIA's bundled sample."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from gpucc.gpuattest.samples import Sample, nvidia_h100_sample
from tests.support.cli import run_cli

#: Runs ``python -m gpucc ARGS`` in ``cwd`` (a clean environment: no GPUCC_*/NVAT_* variables
#: from the caller; ``env`` adds to it) and checks that no traceback reached the user.
GpuccRunner = Callable[..., subprocess.CompletedProcess[str]]


def _run(
    *args: str | Path, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, env=env, timeout=timeout, module=True)


@pytest.fixture
def run_gpucc() -> GpuccRunner:
    """The gpucc command line, run as a separate process."""
    return _run


@pytest.fixture(scope="session")
def nvidia_sample() -> Sample:
    """NVIDIA's H100 sample (driver 545.00) as the package ships it."""
    return nvidia_h100_sample()
