"""The file helpers' former home; :mod:`gpuattest.files` is the public one."""

from __future__ import annotations

from ..files import write_atomic

__all__ = ["write_atomic"]
