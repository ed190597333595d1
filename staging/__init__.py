"""gpucc staging: sealed datasets (``docs/FORMAT.md``) and verified staging into memory.

This package takes key bytes and never imports the attestation library (only its error
types). Submodules load on first use, so ``import gpucc.staging`` stays cheap::

    staging.seal_file(src, dst, kek=key)            # staging.seal
    staging.open_sealed(path)                       # staging.dataset
    staging.stage_cpu(dataset, dataset_key)         # staging.cpu
    with staging.stage(path, key_file=f) as buf:    # staging.api
        ...
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import stage
    from .cpu import scrub, stage_bytes, stage_cpu, stage_plaintext_cpu
    from .dataset import SealedDataset, is_sealed, open_sealed
    from .format import read_key_file, write_key_file
    from .seal import SealResult, WrapSpec, rewrap, seal_bytes, seal_file

__all__ = [
    "SealResult",
    "SealedDataset",
    "WrapSpec",
    "is_sealed",
    "open_sealed",
    "read_key_file",
    "rewrap",
    "scrub",
    "seal_bytes",
    "seal_file",
    "stage",
    "stage_bytes",
    "stage_cpu",
    "stage_plaintext_cpu",
    "write_key_file",
]

_HOME = {
    "stage": "api",
    "scrub": "cpu",
    "stage_bytes": "cpu",
    "stage_cpu": "cpu",
    "stage_plaintext_cpu": "cpu",
    "SealedDataset": "dataset",
    "is_sealed": "dataset",
    "open_sealed": "dataset",
    "read_key_file": "format",
    "write_key_file": "format",
    "SealResult": "seal",
    "WrapSpec": "seal",
    "rewrap": "seal",
    "seal_bytes": "seal",
    "seal_file": "seal",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'staging' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list[str]:
    return sorted(__all__)
