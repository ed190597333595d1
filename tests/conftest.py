"""Fixtures shared across the suite: gpucc as a real process, and NVIDIA's bundled sample."""

from __future__ import annotations

import importlib.util
import os
import re
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


# --- PyTorch, an optional extra ---------------------------------------------------------------
#
# CI runs the whole suite with torch (the `test` extra pins its CPU build) and sets
# GPUCC_REQUIRE_TORCH, so that no torch test can go missing there. Where no CPU build of torch
# exists for the interpreter (CI's pass on the newest Python), the modules that import torch are
# not collected, and the summary says how many and why.

_TORCH_IMPORT = re.compile(
    r"^(?:import torch\b|from torch\b|from tests\.support import [^\n]*\btorch"
    r"|from gpucc\.staging import [^\n]*\btorch|from gpucc\.ddp\b|import gpucc\.ddp\b)",
    re.MULTILINE,
)
_TORCH_MISSING = importlib.util.find_spec("torch") is None
_not_collected: set[str] = set()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if not _TORCH_MISSING or collection_path.suffix != ".py":
        return None
    if os.environ.get("GPUCC_REQUIRE_TORCH"):
        return None  # collected, so that a missing torch is an error, never a silent gap
    if not collection_path.name.startswith("test_"):
        return None
    if _TORCH_IMPORT.search(collection_path.read_text(encoding="utf-8")):
        _not_collected.add(collection_path.name)
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _TORCH_MISSING or os.environ.get("GPUCC_REQUIRE_TORCH"):
        return
    skip = pytest.mark.skip(reason="needs torch, which is not installed")
    for item in items:
        if item.get_closest_marker("torch") is not None:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _not_collected:
        terminalreporter.write_line(
            f"{len(_not_collected)} test modules not collected: torch is not installed "
            f"({', '.join(sorted(_not_collected))})"
        )
