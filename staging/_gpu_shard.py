"""Splitting one staging call over several GPUs: chunk ranges, one pipeline per device."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from . import _gpu_runtime as rt
from ._gpu_pipeline import (
    Failure,
    Source,
    Stopped,
    kvikio_usable,
    run_device,
    shard_bytes,
)
from ._gpu_runtime import (
    check_aligned,
)
from .errors import ChunkAuthenticationError
from .format import (
    Header,
)
from .seal import ProgressCallback

__all__ = ["GpuShard", "single_array", "stage_shards"]

# --- shards and results ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuShard:
    """The part of a dataset staged on one GPU.

    Attributes:
        device: CUDA device id.
        first_chunk: the first chunk it holds.
        chunk_count: how many chunks it holds.
        offset: its first plaintext byte within the whole dataset.
        array: verified plaintext, a 1-D ``cupy.ndarray`` of ``uint8`` on ``device``.
    """

    device: int
    first_chunk: int
    chunk_count: int
    offset: int
    array: Any = field(repr=False)


def _split(header: Header, devices: Sequence[int]) -> list[tuple[int, int, int]]:
    """(device, first chunk, chunk count) for each device: contiguous, balanced, non-empty."""
    total = header.chunk_count
    used = devices[: max(1, min(len(devices), total))]
    out = []
    start = 0
    for k, dev in enumerate(used):
        n = total // len(used) + (1 if k < total % len(used) else 0)
        out.append((dev, start, n))
        start += n
    return out


def stage_shards(
    source: Source,
    chunk_key: bytes,
    devices: Sequence[int],
    *,
    threads: int,
    progress: ProgressCallback | None,
    outs: Sequence[Any] | None,
    batch_bytes: int,
    slots: int,
    use_gds: bool | None,
) -> list[GpuShard]:
    cupy = rt.import_cupy()
    header = source.header
    plan = _split(header, devices)
    gds = kvikio_usable() if use_gds is None else use_gds
    shards: list[GpuShard] = []
    for k, (dev, first, count) in enumerate(plan):
        length = shard_bytes(header, first, count)
        if outs is not None:
            arr = outs[k]
            if (
                arr.dtype != cupy.uint8
                or arr.ndim != 1
                or arr.size != length
                or not arr.flags.c_contiguous
                or int(arr.device.id) != dev
            ):
                raise ValueError(
                    f"out must be a contiguous 1-D uint8 array of {length} bytes on device {dev}"
                )
            check_aligned("out", arr)
        else:
            with cupy.cuda.Device(dev):
                # Every byte is overwritten by the kernels (or zeroed on failure).
                arr = cupy.empty(length, dtype=cupy.uint8)
        shards.append(
            GpuShard(
                device=dev,
                first_chunk=first,
                chunk_count=count,
                offset=first * header.chunk_size,
                array=arr,
            )
        )

    failure = Failure()
    total_bytes = header.plaintext_length
    done_chunks = [0]
    progress_lock = threading.Lock()

    def on_verified(n: int) -> None:
        if progress is None:
            return
        with progress_lock:
            done_chunks[0] += n
            progress(min(total_bytes, done_chunks[0] * header.chunk_size), total_bytes)

    errors: list[tuple[int, BaseException]] = []
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gpucc-gpu-read") as pool:

        def run(shard: GpuShard) -> None:
            try:
                _run_shard(shard)
            except (ChunkAuthenticationError, Stopped):
                raise
            except BaseException:
                failure.aborted.set()
                raise

        def _run_shard(shard: GpuShard) -> None:
            run_device(
                device_id=shard.device,
                source=source,
                chunk_key=chunk_key,
                first=shard.first_chunk,
                count=shard.chunk_count,
                out=shard.array,
                pool=pool,
                batch_bytes=batch_bytes,
                slots=slots,
                use_gds=gds,
                failure=failure,
                on_verified=on_verified,
            )

        if len(shards) == 1:
            try:
                run(shards[0])
            except BaseException as exc:  # noqa: BLE001 - re-raised below after cleanup
                errors.append((0, exc))
        else:
            with ThreadPoolExecutor(len(shards), thread_name_prefix="gpucc-gpu") as lanes:
                futures = [lanes.submit(run, s) for s in shards]
                for k, fut in enumerate(futures):
                    error = fut.exception()
                    if error is not None:
                        errors.append((k, error))

    real = [(k, e) for k, e in errors if not isinstance(e, Stopped)]
    if real:
        # Staging owns these arrays: zero them all; a caller's `out` keeps its verified prefix.
        lowest = failure.lowest()
        only_auth = all(isinstance(e, ChunkAuthenticationError) for _, e in real)
        for shard in shards:
            cut = 0
            if outs is not None and lowest is not None and only_auth:
                cut = max(0, lowest - shard.first_chunk) * header.chunk_size
            if cut < shard.array.size:
                with cupy.cuda.Device(shard.device):
                    stream = cupy.cuda.get_current_stream()
                # Quietly: a device that faulted may refuse it; its error is the one raised.
                rt.zero_buffers(cupy, shard.device, stream, [shard.array[cut:]])
        if lowest is not None:
            # A chunk the kernels rejected is reported even when another device, or a later
            # launch of the same one, failed otherwise (everything is zeroed then).
            raise ChunkAuthenticationError(lowest) from None
        raise real[0][1]
    return shards


def single_array(shards: list[GpuShard]) -> Any:
    assert len(shards) == 1
    return shards[0].array
