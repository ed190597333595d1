"""Hashing model resources on the GPU (placeholder until the CUDA kernels land)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpucc.gpuattest.errors import GpuStagingUnavailableError

from .serialize import Item

__all__ = ["available", "hash_items"]


def available() -> bool:
    return False


def hash_items(
    items: Sequence[Item], hash_type: str, *, progress: Callable[[int], None] | None = None
) -> list[bytes]:
    raise GpuStagingUnavailableError("GPU model hashing is not available")
