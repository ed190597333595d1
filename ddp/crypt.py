"""Sealing and opening the pieces of a bucket: on the host, or on the GPU where they live.

Both work on batches of :class:`Piece` over two flat ``uint8`` tensors: a piece's text is
``msg.length`` bytes at ``src`` in the input, its output goes to ``dst``; a sealed frame is
``ciphertext | tag`` with the tag right after the text.

* :class:`HostCrypt` (CPU tensors) seals and opens with ``cryptography`` at once; a piece that
  does not open is zeroed and reported by :meth:`HostCrypt.open`.
* :class:`DeviceCrypt` (CUDA tensors) seals and opens each batch in one launch pair of the
  message kernels (:class:`gpucc.staging.gpu_messages.DeviceKeyring`) on the bucket's current
  stream, so plaintext never leaves the GPU. A piece that does not open is zeroed on the
  device; the verdict words stay there until :meth:`DeviceCrypt.collect` reads them, once per
  step, before the optimizer can run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpucc.core.errors import UsageError

from .errors import GradientAuthenticationError
from .keys import GroupKeys
from .messages import TAG_SIZE, MessageId

if TYPE_CHECKING:
    import torch

    from gpucc.staging.gpu_messages import DeviceKeyring

__all__ = ["DeviceCrypt", "HostCrypt", "Piece"]


@dataclass(frozen=True)
class Piece:
    """One message of a batch: its schedule position and its byte offsets."""

    msg: MessageId
    src: int
    dst: int


def _np(t: torch.Tensor) -> np.ndarray:
    """A writable uint8 NumPy view of a contiguous CPU tensor (no copy)."""
    import torch

    return t.view(torch.uint8).numpy()


class HostCrypt:
    """Pieces of CPU tensors, sealed and opened by ``cryptography`` right away."""

    def __init__(self, keys: GroupKeys) -> None:
        self.keys = keys
        self.seconds = 0.0

    def seal(self, pieces: Sequence[Piece], src: torch.Tensor, dst: torch.Tensor) -> None:
        t0 = time.perf_counter()
        s, d = _np(src), _np(dst)
        for p in pieces:
            n = p.msg.length
            self.keys.seal_into(p.msg, s[p.src : p.src + n], d[p.dst : p.dst + n + TAG_SIZE])
        self.seconds += time.perf_counter() - t0

    def open(
        self,
        pieces: Sequence[Piece],
        src: torch.Tensor,
        dst: torch.Tensor,
        failures: list[GradientAuthenticationError],
    ) -> list[bool]:
        """Open every piece; a failed one is zeroed, its error appended to ``failures``."""
        t0 = time.perf_counter()
        s, d = _np(src), _np(dst)
        ok = []
        for p in pieces:
            n = p.msg.length
            try:
                self.keys.open_into(p.msg, s[p.src : p.src + n + TAG_SIZE], d[p.dst : p.dst + n])
                ok.append(True)
            except GradientAuthenticationError as exc:
                failures.append(exc)
                ok.append(False)
        self.seconds += time.perf_counter() - t0
        return ok

    def collect(self) -> list[GradientAuthenticationError]:
        """Nothing is deferred on the host."""
        return []

    def discard(self) -> None:
        """Nothing is deferred on the host."""

    def close(self) -> None:
        """Nothing to release."""


class DeviceCrypt:
    """Pieces of device tensors, sealed and opened by the GPU message kernels.

    The keyring holds this rank's directed keys of the current epoch on the bucket's device;
    it is rebuilt (and the old one zeroed) when the epoch or the device changes. Launches go
    on the bucket's current stream (PyTorch's, for CUDA tensors), so they are ordered with
    the copies and collectives PyTorch queues there.
    """

    def __init__(self, keys: GroupKeys) -> None:
        self.keys = keys
        self.seconds = 0.0
        self._ring: DeviceKeyring | None = None
        self._ring_at: tuple[int, int] = (-1, -1)  # (epoch, device)
        self._index: dict[tuple[int, int], int] = {}
        self._pending: list[tuple[Any, list[MessageId], Any]] = []  # status, messages, opened text

    def _cupy(self) -> Any:
        from gpucc.staging import gpu_messages

        return gpu_messages.import_cupy()

    def _keyring(self, t: torch.Tensor) -> DeviceKeyring:
        from gpucc.staging.gpu_messages import DeviceKeyring

        cupy = self._cupy()
        device = t.device.index if t.is_cuda and t.device.index is not None else 0
        with cupy.cuda.Device(device):
            if t.is_cuda:
                import torch

                stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(t.device).cuda_stream)
            else:  # a host tensor some CuPy can address (a stand-in in tests)
                stream = cupy.cuda.get_current_stream()
        at = (self.keys.epoch, device)
        if self._ring is None or self._ring_at != at:
            self.close()
            edges = sorted(self.keys.edge_keys().items())
            self._index = {pair: i for i, (pair, _) in enumerate(edges)}
            self._ring = DeviceKeyring([key for _, key in edges], device_id=device, stream=stream)
            self._ring_at = at
        else:
            self._ring.use_stream(stream)
        return self._ring

    def _view(self, t: torch.Tensor) -> Any:
        if t.dtype.itemsize != 1 or t.dim() != 1 or not t.is_contiguous():
            raise UsageError("device pieces live in contiguous 1-D byte tensors")
        return self._cupy().from_dlpack(t.detach())

    def _messages(self, pieces: Sequence[Piece], *, seal: bool) -> list[Any]:
        from gpucc.staging.gpu_messages import DeviceMessage

        out = []
        for p in pieces:
            m = p.msg
            self.keys.reserve(m, sending=seal)
            n = m.length
            out.append(
                DeviceMessage(
                    key=self._index[(m.sender, m.receiver)],
                    nonce=m.nonce,
                    aad=m.aad,
                    src=p.src,
                    dst=p.dst,
                    tag=(p.dst if seal else p.src) + n,
                    length=n,
                )
            )
        return out

    def _fence(self, ring: DeviceKeyring, t: torch.Tensor) -> None:
        """Host tensors are read by PyTorch at once, outside any stream: wait for the GPU."""
        if not t.is_cuda:
            ring.stream.synchronize()

    def seal(self, pieces: Sequence[Piece], src: torch.Tensor, dst: torch.Tensor) -> None:
        t0 = time.perf_counter()
        ring = self._keyring(src)
        ring.seal(self._messages(pieces, seal=True), self._view(src), self._view(dst))
        self._fence(ring, src)
        self.seconds += time.perf_counter() - t0

    def open(
        self,
        pieces: Sequence[Piece],
        src: torch.Tensor,
        dst: torch.Tensor,
        failures: list[GradientAuthenticationError],
    ) -> list[bool]:
        """Queue the opening; failed pieces are zeroed on the device and reported by
        :meth:`collect`. Returns True for every piece (adding a zeroed piece is harmless)."""
        t0 = time.perf_counter()
        ring = self._keyring(src)
        opened = self._view(dst)
        status = ring.open(self._messages(pieces, seal=False), self._view(src), opened)
        self._pending.append((status, [p.msg for p in pieces], opened))
        self._fence(ring, src)
        self.seconds += time.perf_counter() - t0
        return [True] * len(pieces)

    def collect(self) -> list[GradientAuthenticationError]:
        """Read every verdict queued since the last call (one wait for the GPU)."""
        pending, self._pending = self._pending, []
        if not pending or self._ring is None:
            return []
        ring = self._ring
        out: list[GradientAuthenticationError] = []
        for status, msgs, opened in pending:
            # a kernel fault is GpuKernelError (stage launch), the opened text zeroed
            words = ring.verdicts(status, opened)
            out.extend(self.keys.failure(m) for m, w in zip(msgs, words, strict=True) if w)
        return out

    def discard(self) -> None:
        """Forget the verdicts of an abandoned step."""
        self._pending = []

    def close(self) -> None:
        """Zero the device key contexts."""
        self._pending = []
        if self._ring is not None:
            self._ring.close()
            self._ring = None
            self._ring_at = (-1, -1)
