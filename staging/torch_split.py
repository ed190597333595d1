"""Work split and key sharing for sealed datasets under ``torchrun``.

:func:`assign_chunks` gives each (rank, DataLoader worker) its chunks of an epoch (see
:mod:`staging.torch_dataset` for the rule); :func:`host_shared_key` obtains a dataset key once
per host and shares it with that host's other ranks in memory, never on disk.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from gpucc.core.errors import EnvironmentProblemError, UsageError

from .format import KEY_SIZE

__all__ = [
    "KeySharingError",
    "assign_chunks",
    "checked_key",
    "host_shared_key",
    "order_seed",
    "rank_and_world",
]


class KeySharingError(EnvironmentProblemError):
    """The host's key holder (local rank 0) could not obtain the dataset key."""


# --- ranks and the chunk split ---------------------------------------------------------


def rank_and_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: given, else from ``torch.distributed``, else ``RANK`` /
    ``WORLD_SIZE`` in the environment, else ``(0, 1)``.

    Raises:
        UsageError: a rank outside ``0 .. world_size-1``.
    """
    if rank is None or world_size is None:
        if dist.is_available() and dist.is_initialized():
            found = dist.get_rank(), dist.get_world_size()
        else:
            found = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        rank = found[0] if rank is None else rank
        world_size = found[1] if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is not in a world of {world_size}")
    return rank, world_size


def order_seed(seed: int, epoch: int) -> int:
    """The generator seed of an epoch's chunk order: the first 63 bits (big-endian) of
    SHA-256(``"gpucc/chunk-order/v1" || int64_le(seed) || int64_le(epoch)``).

    Unlike ``seed + epoch``, seed 0 epoch 1 and seed 1 epoch 0 get different orders.
    """
    digest = hashlib.sha256(b"gpucc/chunk-order/v1" + struct.pack("<qq", seed, epoch)).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def assign_chunks(
    count: int,
    *,
    rank: int,
    world_size: int,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    pad: bool = False,
    worker: int = 0,
    num_workers: int = 1,
) -> list[int]:
    """The global chunk indices (rank, worker) reads in ``epoch``, in reading order.

    See the module documentation for the rule. Pure: every rank computes every share.
    """
    if not 0 <= rank < world_size or not 0 <= worker < num_workers:
        raise UsageError(f"rank {rank}/{world_size}, worker {worker}/{num_workers} out of range")
    if shuffle:
        generator = torch.Generator()
        generator.manual_seed(order_seed(seed, epoch))
        order: list[int] = torch.randperm(count, generator=generator).tolist()
    else:
        order = list(range(count))
    if pad and count and count % world_size:
        total = -(-count // world_size) * world_size
        order = (order * -(-total // count))[:total]
    return order[rank::world_size][worker::num_workers]


# --- keys --------------------------------------------------------------------------------


def host_shared_key(
    obtain: Callable[[], bytes],
    *,
    host: str | None = None,
) -> bytes:
    """One key per host: local rank 0 calls ``obtain()``, its local ranks receive the result.

    Call it on every rank, after ``torch.distributed.init_process_group`` (without a process
    group it just calls ``obtain()``). Ranks are grouped by ``host`` (default: the host
    name); on each host the lowest rank calls ``obtain`` (e.g. an attested session's key
    release) and sends the key to the other ranks of that host over a gloo process group of
    that host only, in memory: it is never written to a file. The key crosses the loopback
    connections between the host's processes, inside the host's trust boundary (a CPU TEE).

    Raises:
        KeySharingError: on the other ranks of a host whose ``obtain`` failed (the host's
            first rank re-raises what ``obtain`` raised).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return checked_key(obtain())
    name = host or socket.gethostname()
    rank = dist.get_rank()
    names: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(names, name)
    mine: Any = None
    for host_name in dict.fromkeys(names):  # every rank creates every group, in one order
        ranks = [r for r, n in enumerate(names) if n == host_name]
        group = dist.new_group(ranks, backend="gloo")
        if host_name == name:
            mine = (ranks[0], group)
    leader, group = mine
    failure: BaseException | None = None
    payload: list[Any] = [None]
    if rank == leader:
        try:
            payload = [("ok", checked_key(obtain()))]
        except Exception as exc:
            failure = exc
            payload = [("error", f"{type(exc).__name__}: {exc}")]
    dist.broadcast_object_list(payload, src=leader, group=group)
    if failure is not None:
        raise failure
    status, value = payload[0]
    if status != "ok":
        raise KeySharingError(f"rank {leader} could not obtain the dataset key: {value}")
    return checked_key(value)


def checked_key(key: Any) -> bytes:
    if not isinstance(key, bytes) or len(key) != KEY_SIZE:
        raise UsageError(f"a dataset key is {KEY_SIZE} bytes")
    return key
