"""Fixtures of the GPU tests: fresh random inputs on every run, the seed printed."""

from __future__ import annotations

import os

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    """A generator seeded at random (``GPUCC_TEST_SEED`` replays a run)."""
    env = os.environ.get("GPUCC_TEST_SEED")
    seed = int(env) if env else int.from_bytes(os.urandom(8), "big")
    print(f"GPUCC_TEST_SEED={seed}")
    return np.random.default_rng(seed)
