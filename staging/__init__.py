"""gpucc staging: sealed datasets (``docs/FORMAT.md``) and verified staging.

Staging takes key bytes; it uses the attestation library only for its error families and,
in :mod:`keyrelease.protocol`, to load evidence for the attestation check the caller injects.
Submodules load on first use, so ``import gpucc.staging`` stays cheap::

    staging.seal_file(src, dst, kek=key)            # staging.seal
    staging.open_sealed(path)                       # staging.dataset
    staging.stage_cpu(dataset, dataset_key)         # staging.cpu
    with staging.stage(path, key_file=f) as buf:    # staging.api
        ...
    plan = staging.plan_stage(path, key_file=f)     # decide once (open, key, device) ...
    with plan.run() as buf:                         # ... then stage
        ...
    staging.verify_cpu(dataset, dataset_key)        # every chunk checked, none kept
    with staging.HostArena() as arena:              # staging.arena: memory lent, reused,
        staging.stage_cpu(dataset, key, arena=arena)  # zeroed on return and on close

Errors are in :mod:`staging.errors`; the key-release protocol in :mod:`keyrelease.protocol`;
GPU staging in :mod:`staging.gpu`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import StagePlan, plan_part, plan_stage, stage
    from .arena import HostArena
    from .cpu import scrub, stage_bytes, stage_cpu, stage_plaintext_cpu
    from .dataset import SealedDataset, is_sealed, open_sealed
    from .format import read_key_file, valid_chunk_size, write_key_file
    from .seal import SealResult, WrapSpec, default_threads, rewrap, seal_bytes, seal_file
    from .verify import Verified, verify_cpu, verify_plaintext_cpu

__all__ = [
    "HostArena",
    "SealResult",
    "SealedDataset",
    "StagePlan",
    "Verified",
    "WrapSpec",
    "default_threads",
    "is_sealed",
    "open_sealed",
    "plan_part",
    "plan_stage",
    "read_key_file",
    "rewrap",
    "scrub",
    "seal_bytes",
    "seal_file",
    "stage",
    "stage_bytes",
    "stage_cpu",
    "stage_plaintext_cpu",
    "valid_chunk_size",
    "verify_cpu",
    "verify_plaintext_cpu",
    "write_key_file",
]

_HOME = {
    "HostArena": "arena",
    "StagePlan": "api",
    "plan_part": "api",
    "plan_stage": "api",
    "stage": "api",
    "scrub": "cpu",
    "stage_bytes": "cpu",
    "stage_cpu": "cpu",
    "stage_plaintext_cpu": "cpu",
    "SealedDataset": "dataset",
    "is_sealed": "dataset",
    "open_sealed": "dataset",
    "read_key_file": "format",
    "valid_chunk_size": "format",
    "write_key_file": "format",
    "SealResult": "seal",
    "WrapSpec": "seal",
    "default_threads": "seal",
    "rewrap": "seal",
    "seal_bytes": "seal",
    "seal_file": "seal",
    "Verified": "verify",
    "verify_cpu": "verify",
    "verify_plaintext_cpu": "verify",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'staging' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list[str]:
    return sorted(__all__)
