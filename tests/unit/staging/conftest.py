"""The AES-GCM host harness, built once per session for the kernel-arithmetic tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.nvcc import Harness, build_harness
from tests.support.paths import ROOT

KERNELS = ROOT / "staging" / "kernels"


@pytest.fixture(scope="session")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    exe = build_harness(
        tmp_path_factory, KERNELS / "harness.cu", KERNELS / "aesgcm_math.cuh", "harness"
    )
    yield Harness(exe)
