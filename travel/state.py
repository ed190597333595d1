"""Model digests and buffer scrubbing with read-back receipts (CPU and GPU)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ScrubError

__all__ = ["ScrubReceipt", "buffer_nbytes", "model_digest", "scrub_and_check"]


def _host_bytes(array: Any) -> memoryview:
    if hasattr(array, "get") and not isinstance(array, np.ndarray):  # a CuPy array
        array = array.get()
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def model_digest(model: Mapping[str, Any]) -> str:
    """SHA-256 over the parameters in name order: per parameter, the length-prefixed name,
    dtype and shape, then the raw bytes. Hex."""
    h = hashlib.sha256(b"gpucc/travel-model/v1\x00")
    for name in sorted(model):
        array = model[name]
        meta = f"{name}\x00{np.dtype(array.dtype).str}\x00{tuple(array.shape)}".encode()
        h.update(len(meta).to_bytes(4, "big") + meta)
        data = _host_bytes(array)
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def buffer_nbytes(buf: Any) -> int:
    """Bytes in a staged buffer (an array, or a list of GPU shards)."""
    if isinstance(buf, list):
        return sum(int(s.array.nbytes) for s in buf)
    return int(buf.nbytes)


def _arrays(buf: Any) -> list[Any]:
    return [s.array for s in buf] if isinstance(buf, list) else [buf]


def _count_nonzero(array: Any) -> int:
    if isinstance(array, np.ndarray):
        return int(np.count_nonzero(array))
    # a device array: counted on the device, only the count comes back
    return int(array.astype(bool).sum().item())


@dataclass(frozen=True)
class ScrubReceipt:
    """What was zeroed and read back for one dataset.

    Attributes:
        name: the dataset's name in the plan.
        device: ``cpu`` or ``gpu``.
        nbytes: bytes zeroed.
        nonzero: bytes that read back non-zero (0 when scrubbed).
    """

    name: str
    device: str
    nbytes: int
    nonzero: int

    def to_dict(self) -> dict[str, Any]:
        """JSON form for the log."""
        return {
            "name": self.name,
            "device": self.device,
            "bytes": self.nbytes,
            "nonzero": self.nonzero,
        }


def scrub_and_check(name: str, device: str, buf: Any, scrub: Any) -> ScrubReceipt:
    """Zero ``buf`` with the backend's ``scrub`` and count non-zero bytes on the device.

    Raises:
        ScrubError: any byte reads back non-zero.
    """
    scrub(buf)
    nonzero = sum(_count_nonzero(a) for a in _arrays(buf))
    receipt = ScrubReceipt(name=name, device=device, nbytes=buffer_nbytes(buf), nonzero=nonzero)
    if nonzero:
        raise ScrubError(f"dataset {name}: {nonzero} bytes read back non-zero after scrubbing")
    return receipt
