"""A stand-in for the part of CuPy that ``staging.model.digest_gpu`` uses, without a GPU.

"Device" arrays are NumPy arrays; ``RawModule`` checks that the requested kernels exist in the
source it is given and runs each launch through the host build of the kernels' own job
functions (``hash_harness.cu`` built as a shared library), looping over the grid. So the
orchestration (offsets, chunk ranges, one launch per BLAKE3 tree level, reading results back)
runs against the real arithmetic. Fresh allocations are filled with garbage.
"""

from __future__ import annotations

import ctypes
import re
from types import SimpleNamespace
from typing import Any

import numpy as np

uint8 = np.uint8
uint32 = np.uint32
uint64 = np.uint64

LIBRARY: ctypes.CDLL | None = None
launches: list[tuple[str, int]] = []


class ndarray:  # noqa: N801 - the CuPy name
    def __init__(self, a: np.ndarray[Any, Any]) -> None:
        self.a = a

    @property
    def size(self) -> int:
        return int(self.a.size)

    @property
    def flags(self) -> Any:
        return SimpleNamespace(c_contiguous=bool(self.a.flags.c_contiguous))

    def reshape(self, *shape: int) -> ndarray:
        return ndarray(self.a.reshape(*shape))

    def view(self, dtype: Any) -> ndarray:
        return ndarray(self.a.view(dtype))

    def get(self) -> np.ndarray[Any, Any]:
        return self.a.copy()

    def __getitem__(self, idx: Any) -> ndarray:
        return ndarray(self.a[idx])


def asarray(a: Any) -> ndarray:
    return ndarray(np.array(a, copy=True))


def empty(n: int, dtype: Any) -> ndarray:
    return ndarray(np.frombuffer(np.random.bytes(n * np.dtype(dtype).itemsize), dtype=dtype).copy())


def from_dlpack(obj: Any) -> ndarray:
    return ndarray(np.from_dlpack(obj))


def _ptr(value: Any) -> Any:
    if isinstance(value, ndarray):
        return ctypes.c_void_p(value.a.ctypes.data)
    if isinstance(value, np.uint32):
        return ctypes.c_uint32(int(value))
    if isinstance(value, np.uint64):
        return ctypes.c_uint64(int(value))
    raise TypeError(f"kernel argument of type {type(value).__name__}")


class _Function:
    def __init__(self, name: str, params: int) -> None:
        self.name = name
        self.params = params

    def __call__(self, grid: tuple[int], block: tuple[int], args: tuple[Any, ...]) -> None:
        assert LIBRARY is not None
        assert len(args) == self.params, (self.name, len(args))
        launches.append((self.name, grid[0] * block[0]))
        getattr(LIBRARY, "hh_" + self.name)(*map(_ptr, args))


class RawModule:
    def __init__(self, code: str, options: tuple[str, ...] = ()) -> None:
        self.kernels = {
            m.group(1): len(m.group(2).split(","))
            for m in re.finditer(
                r'extern "C" __global__ void __launch_bounds__\(\d+\)\s+(\w+)\(([^)]*)\)', code
            )
        }

    def get_function(self, name: str) -> _Function:
        return _Function(name, self.kernels[name])


cuda = SimpleNamespace(
    runtime=SimpleNamespace(getDevice=lambda: 0, getDeviceCount=lambda: 1),
)
