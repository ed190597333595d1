"""The DDP comm hook: every gradient bucket is all-reduced with sealed messages.

Usage, on every rank after ``init_process_group`` (give it a ``timeout``)::

    keys = GroupKeys.establish(platform=assemble(settings))
    state = EncryptedAllReduce(keys)
    model.register_comm_hook(state, encrypted_allreduce_hook)

Failure handling: a rank that cannot open a message zeroes that piece and finishes the
bucket, so its peers are not left waiting. After the last bucket of a step, the ranks
exchange one flag each (a small ``all_to_all``); if any rank saw a failure, every rank
raises from ``loss.backward()``: the detecting rank a :class:`GradientAuthenticationError`
naming sender, step, bucket and phase, the others a :class:`PeerAuthenticationError`.
The flags are sealed per receiver like gradients (phase ``verdict``), so a flag that is
suppressed or forged on the wire fails authentication too.
``optimizer.step()`` is never reached, so no unverified gradient is applied. A peer that
stops answering makes the collectives fail after the process group's timeout.

Buckets on a CUDA device are sealed and opened there by the GPU message kernels
(:class:`gpucc.ddp.crypt.DeviceCrypt`): plaintext gradients never leave the GPU; with NCCL the
sealed frames go over the wire from device memory, with gloo they are copied to the host
first. The device's verdict words are read once per step, at the last bucket.

Gloo's point-to-point operations return no futures, so the hook works synchronously and
returns a completed future (communication does not overlap the backward pass).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch._C._distributed_c10d import GradBucket

from gpucc.core.errors import UsageError

from .algorithms import (
    Exchange,
    Tamper,
    all_to_all_reduce,
    exchange_verdicts,
    piece_elements,
    ring_reduce,
)
from .crypt import DeviceCrypt, HostCrypt
from .errors import GradientAuthenticationError, PeerAuthenticationError
from .keys import GroupKeys

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "A2A_MAX_BYTES",
    "Algorithm",
    "EncryptedAllReduce",
    "HookStats",
    "choose_algorithm",
    "encrypted_allreduce_hook",
]

Algorithm = Literal["auto", "ring", "a2a"]

#: ``auto`` uses all-to-all for buckets up to this size (bytes) and the ring above it.
#: Measured with benchmarks/bench_ddp.py on gloo (docs/DDP.md): all-to-all wins for 1 MB
#: buckets (2 rounds instead of 2 (N-1)); with 25 MB buckets the ring wins at 2 and 3
#: ranks (point-to-point sends of 1/N each, no padded all-to-all buffers).
A2A_MAX_BYTES = 4 * 1024 * 1024


def choose_algorithm(nbytes: int, world_size: int) -> Literal["ring", "a2a"]:
    """The algorithm ``auto`` picks for a bucket of ``nbytes`` in a group of ``world_size``."""
    if world_size < 2:
        raise UsageError("an all-reduce needs at least two ranks")
    return "a2a" if nbytes <= A2A_MAX_BYTES else "ring"


@dataclass
class HookStats:
    """What the hook did on this rank since it was created (or :meth:`reset`).

    Attributes:
        steps: completed steps.
        buckets: buckets all-reduced.
        sealed_bytes: plaintext bytes this rank sealed.
        crypto_seconds: time sealing and opening.
        hook_seconds: time in the hook in total (crypto, copies, communication).
    """

    steps: int = 0
    buckets: int = 0
    sealed_bytes: int = 0
    crypto_seconds: float = 0.0
    hook_seconds: float = 0.0

    def reset(self) -> None:
        self.steps = self.buckets = self.sealed_bytes = 0
        self.crypto_seconds = self.hook_seconds = 0.0


class EncryptedAllReduce:
    """State of :func:`encrypted_allreduce_hook` for one DDP model.

    Args:
        keys: the group keys (:meth:`GroupKeys.establish`); several models may share them,
            as long as every rank runs their steps in the same order.
        algorithm: ``auto`` (:func:`choose_algorithm`), ``ring`` or ``a2a``.
        process_group: the group the keys were established for (None: default).
        device_crypto: None (default): buckets on a CUDA device are sealed on that device,
            CPU buckets on the host. True: always the GPU kernels (a CPU bucket then needs a
            CuPy that can address host memory, as the test stand-in does). False: never;
            a CUDA bucket is then refused rather than copied to the host in plaintext.
        tamper: test-only fault injection on received frames.
    """

    def __init__(
        self,
        keys: GroupKeys,
        *,
        algorithm: Algorithm = "auto",
        process_group: ProcessGroup | None = None,
        device_crypto: bool | None = None,
        tamper: Tamper | None = None,
    ) -> None:
        if algorithm not in ("auto", "ring", "a2a"):
            raise UsageError(f"unknown algorithm {algorithm!r}: use auto, ring or a2a")
        self.keys = keys
        self.algorithm: Algorithm = algorithm
        self.process_group = process_group
        self.tamper = tamper
        self.device_crypto = device_crypto
        self.stats = HookStats()
        self._position: tuple[int, int] | None = None
        self._failures: list[GradientAuthenticationError] = []
        self._host = HostCrypt(keys)
        self._device: DeviceCrypt | None = None

    def __repr__(self) -> str:
        return f"EncryptedAllReduce(keys={self.keys!r}, algorithm={self.algorithm!r})"

    def allreduce(self, flat: torch.Tensor, bucket: int, *, last: bool) -> torch.Tensor:
        """Average ``flat`` over the group in place, as bucket ``bucket`` of the step.

        Raises:
            GradientAuthenticationError, PeerAuthenticationError: at the step's last
                bucket, when any rank rejected a message of the step.
        """
        t0 = time.perf_counter()
        crypt = self._crypt(flat)
        if flat.dim() != 1 or not flat.is_contiguous():
            raise UsageError("a bucket must be a contiguous 1-D tensor")
        if isinstance(crypt, DeviceCrypt) and flat.data_ptr() % 16:
            raise UsageError("a bucket sealed on the GPU must start on a 16-byte boundary")
        if self._position is None:
            self._position = self.keys.claim_step()
        epoch, step = self._position
        size = self.keys.world_size
        nbytes = flat.numel() * flat.element_size()
        algo = self.algorithm if self.algorithm != "auto" else choose_algorithm(nbytes, size)
        per_piece = piece_elements(flat.numel(), flat.element_size(), size) * flat.element_size()
        if algo == "ring":
            self.keys.charge(invocations=2 * (size - 1), nbytes=2 * (size - 1) * per_piece)
        else:
            self.keys.charge(invocations=2, nbytes=2 * per_piece)
        flat.div_(size)
        wire = self._wire(flat)
        ex = Exchange(
            keys=self.keys,
            crypt=crypt,
            group=self.process_group,
            wire=wire,
            epoch=epoch,
            step=step,
            bucket=bucket,
            tamper=self.tamper,
        )
        seconds = crypt.seconds
        try:
            (ring_reduce if algo == "ring" else all_to_all_reduce)(flat, ex)
        except BaseException:
            # The step is lost (a peer vanished, a timeout): the next call claims a fresh
            # step from the keys, so no (key, nonce) pair is ever used twice.
            self._position = None
            self._failures = []
            crypt.discard()
            flat.zero_()
            raise
        self._failures.extend(ex.failures)
        self.stats.buckets += 1
        self.stats.sealed_bytes += ex.sealed_bytes
        self.stats.crypto_seconds += crypt.seconds - seconds
        if last:
            self._position = None
            failures, self._failures = self._failures, []
            if self._device is not None:
                failures.extend(self._device.collect())  # the one wait for device verdicts
            self.keys.charge(invocations=1, nbytes=1)
            verdict = Exchange(
                keys=self.keys,
                crypt=self._host,
                group=self.process_group,
                wire=wire,
                epoch=epoch,
                step=step,
                bucket=0,
                tamper=self.tamper,
            )
            bad = exchange_verdicts(bool(failures), verdict)
            failures.extend(verdict.failures)
            self.stats.hook_seconds += time.perf_counter() - t0
            if failures:
                raise failures[0]
            if bad:
                raise PeerAuthenticationError(ranks=bad, epoch=epoch, step=step)
            self.stats.steps += 1
        else:
            self.stats.hook_seconds += time.perf_counter() - t0
        return flat

    def _crypt(self, flat: torch.Tensor) -> HostCrypt | DeviceCrypt:
        if flat.device.type not in ("cpu", "cuda"):
            raise UsageError(
                f"a bucket on a {flat.device.type} device: encrypted all-reduce takes CPU "
                "and CUDA tensors"
            )
        on_device = flat.is_cuda if self.device_crypto is None else self.device_crypto
        if flat.is_cuda and not on_device:
            raise UsageError(
                "device_crypto=False with a CUDA bucket: gradients are not copied to the "
                "host in plaintext; leave device_crypto unset to seal them on the GPU"
            )
        if not on_device:
            return self._host
        if self._device is None:
            self._device = DeviceCrypt(self.keys)
        return self._device

    def _wire(self, flat: torch.Tensor) -> torch.device | None:
        """Where the backend takes tensors: the GPU for NCCL, the host otherwise."""
        import torch.distributed as dist

        backend = str(dist.get_backend(self.process_group)).lower()
        return flat.device if backend == "nccl" else torch.device("cpu")

    def close(self) -> None:
        """Zero the device copies of the keys (if any); the state can be used again."""
        if self._device is not None:
            self._device.close()
            self._device = None


def encrypted_allreduce_hook(
    state: EncryptedAllReduce, bucket: GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: sealed all-reduce of ``bucket``, averaged like DDP's default."""
    result = state.allreduce(bucket.buffer(), bucket.index(), last=bucket.is_last())
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(result)
    return fut


# DDP compares the annotations with the real classes; postponed evaluation makes them strings.
encrypted_allreduce_hook.__annotations__ = {
    "state": EncryptedAllReduce,
    "bucket": GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}
