"""The production known answers: gcm_setup, gcm_chunks and gcm_finalize at their launch shape.

Before a device's kernels are used at a CTA width, a fixed sealed dataset (a public key and
dataset id; more chunks than the persistent grid; a final chunk ending in a partial block) is
opened through the same :class:`~staging._gpu_runtime.GcmDevice` launches staging uses and
compared with the host's answer; then one ciphertext bit and one tag bit are flipped, and
exactly those two chunks must be flagged and zeroed. The runtime calls this module and hands
it the devices to open; this module imports nothing of the runtime.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._gpu_geometry import _K, _MAX_THREADS, _one_line
from .errors import GpuKernelError
from .format import HEADER_SIZE, TAG_SIZE, Header, derive_chunk_key

#: The fixed dataset of the production known answers: a public key and dataset id.
_PKAT_KEY = bytes(range(32))
_PKAT_ID = bytes(range(0xA0, 0xB0))


@dataclass(frozen=True)
class _KatCase:
    """A sealed dataset with known plaintext, and the two records to tamper with."""

    header: Header
    chunk_key: bytes
    records: bytes
    plaintext: bytes
    flip_ciphertext: tuple[int, int]  # (chunk, byte offset in the records)
    flip_tag: tuple[int, int]


#: Tiles per chunk of the multi-tile production case: more than gcm_finalize's 256 threads,
#: so its Horner step over G^256 runs; the chunk is 5 blocks short of whole tiles, so the
#: first tile starts with imaginary zero blocks.
_KAT_TILES = 300


def _kat_shapes(width: int, grid: int) -> list[tuple[int, int]]:
    """(chunk size, chunks) of the production known answers at ``width`` threads.

    Always chunks of one tile (16 KiB at 256; the chunk sizes that give narrower CTAs are
    one tile), ``grid + 3`` of them so CTAs loop back for more items. At 256, the width of
    every chunk of 16 KiB and up, also three chunks of :data:`_KAT_TILES` tiles.
    """
    tile = 16 * _K * width
    shapes = [(max(4096, tile), grid + 3)]
    if width == _MAX_THREADS:
        shapes.append((_KAT_TILES * tile - 5 * 16, 3))
    return shapes


@functools.lru_cache(maxsize=16)
def _kat_case(chunk_size: int, chunks: int) -> _KatCase:
    """The fixed dataset of ``chunks`` chunks, the last with a partial 16-byte block.

    Sealed by the host code (:func:`staging.seal.seal_bytes`, ``cryptography``): what the
    kernels must reproduce. Computed once per shape.
    """
    from .seal import seal_bytes

    length = (chunks - 1) * chunk_size + chunk_size // 3 + 5
    stream = bytearray()
    counter = 0
    while len(stream) < length:
        stream += hashlib.sha256(b"gpucc production kat" + counter.to_bytes(8, "little")).digest()
        counter += 1
    plaintext = bytes(stream[:length])
    blob = seal_bytes(
        plaintext, dataset_key=_PKAT_KEY, chunk_size=chunk_size, dataset_id=_PKAT_ID, threads=1
    )
    header = Header.parse(bytes(blob[:HEADER_SIZE]))
    records = bytes(blob[header.chunks_offset :])
    stride = chunk_size + TAG_SIZE
    bad_ct = chunks // 2
    bad_tag = chunks - 2 if chunks > 2 else chunks - 1
    if bad_tag == bad_ct:
        bad_tag = chunks - 1
    return _KatCase(
        header=header,
        chunk_key=derive_chunk_key(_PKAT_KEY, _PKAT_ID),
        records=records,
        plaintext=plaintext,
        flip_ciphertext=(bad_ct, bad_ct * stride + 777),
        flip_tag=(bad_tag, bad_tag * stride + header.chunk_length(bad_tag) + 9),
    )


#: Opens a GcmDevice for (header, chunk key, stream) with the kernels and grid under test.
OpenDevice = Callable[[Header, bytes, Any], Any]


def check_production(
    cupy: Any, device_id: int, width: int, grid: int, open_device: OpenDevice
) -> None:
    """Open the fixed datasets with the production kernels at ``width``, as staging does.

    Each dataset (:func:`_kat_shapes`) has more tiles than the persistent grid of ``grid``
    CTAs (so CTAs loop), and a final chunk ending in a partial block. Its plaintext must come
    back exactly with every status word zero; with one ciphertext bit flipped in one chunk and
    one tag bit in another, exactly those two chunks must be flagged and zeroed.

    Raises:
        GpuKernelError: a wrong result, or the check could not run.
    """
    for cs, chunks in _kat_shapes(width, grid):
        _check_case(cupy, device_id, width, open_device, _kat_case(cs, chunks))


def _check_case(
    cupy: Any, device_id: int, width: int, open_device: OpenDevice, case: _KatCase
) -> None:
    """One production known-answer dataset, clean and tampered (see :func:`check_production`).

    Raises:
        GpuKernelError: a wrong result, or the check could not run.
    """
    cs = case.header.chunk_size

    def fail(what: str) -> GpuKernelError:
        return GpuKernelError(
            f"the production AES-GCM kernels failed their known answers at {width} threads "
            f"({cs}-byte chunks) on CUDA device {device_id}: {what}; refusing to stage",
            device_id=device_id,
            stage="known-answer",
        )

    tampered = bytearray(case.records)
    for _, at in (case.flip_ciphertext, case.flip_tag):
        tampered[at] ^= 0x10
    try:
        stream = cupy.cuda.Stream(non_blocking=True)
        gcm = open_device(case.header, case.chunk_key, stream)
        try:
            if gcm.width != width:
                raise fail(f"they give width {gcm.width}")
            results = [_open_on(gcm, cupy, records) for records in (case.records, tampered)]
        finally:
            gcm.close()
    except GpuKernelError:
        raise
    except Exception as exc:  # noqa: BLE001 - a launch or copy failed
        raise fail(f"{_one_line(exc)}") from None
    (plain, status), (plain_t, status_t) = results
    count = case.header.chunk_count
    if status != [0] * count:
        raise fail(f"authentic chunks {[i for i, v in enumerate(status) if v]} were rejected")
    if plain != case.plaintext:
        raise fail("the plaintext differs from what cryptography computes")
    flagged = [i for i, v in enumerate(status_t) if v]
    expect = sorted({case.flip_ciphertext[0], case.flip_tag[0]})
    if flagged != expect:
        raise fail(f"tampered chunks {expect} were flagged as {flagged}")
    want = bytearray(case.plaintext)
    for index in expect:
        start = index * cs
        want[start : start + case.header.chunk_length(index)] = bytes(
            case.header.chunk_length(index)
        )
    if plain_t != bytes(want):
        raise fail("a tampered chunk was not zeroed, or an authentic one was changed")


def _open_on(gcm: Any, cupy: Any, records: bytes | bytearray) -> tuple[bytes, list[int]]:
    """(plaintext, status words) of all of ``gcm``'s chunks opened from ``records``."""
    header = gcm.header
    with cupy.cuda.Device(gcm.device_id), gcm.stream:
        src = cupy.asarray(np.frombuffer(records, dtype=np.uint8))
        out = cupy.empty(header.plaintext_length, dtype=cupy.uint8)
        status = cupy.zeros(header.chunk_count, dtype=cupy.uint32)
        gcm.launch(0, header.chunk_count, src, out, status, seal=False)
        host_status = cupy.asnumpy(status)
        host_out = cupy.asnumpy(out)
    return bytes(host_out.tobytes()), [int(v) for v in host_status]
