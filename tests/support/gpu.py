"""The real CuPy with a CUDA device, or a clean skip: the one check every GPU test makes."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from gpucc.staging import gpu


def real_cupy() -> Any:
    """The cupy module when CuPy imports and sees a CUDA device; skips the test otherwise.

    The kernels are not built here: a build or known-answer failure must fail the tests that
    use them, never skip them.
    """
    try:
        cupy = importlib.import_module("cupy")
    except ImportError as exc:  # not installed, or a CuPy without its CUDA libraries
        pytest.skip(f"could not import cupy: {exc}")
    if gpu.gpu_count() == 0:
        pytest.skip("CuPy sees no CUDA device (no driver, or no GPU)")
    return cupy
