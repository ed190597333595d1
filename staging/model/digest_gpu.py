"""Hashing model resources on the GPU with gpucc's CUDA kernels (CuPy, NVRTC).

* :func:`hash_items` reads model files (checked against the walk like the CPU path) and
  digests them on the GPU: sharded SHA-256 with one thread per shard, BLAKE3 with one thread
  per 1024-byte chunk and one launch per tree level.
* :func:`digest_device_buffers` and :func:`verify_device_buffers` digest bytes that are already
  resident on the GPU: CuPy arrays, or anything that speaks DLPack (a PyTorch tensor, the arrays
  ``gpucc stage`` returns), so the weights that run are the bytes that were verified.

The kernels (``staging/kernels/sha256.cu``, ``blake3.cu`` and their arithmetic in
``hash_math.cuh``) are built once per device and must pass a known-answer self-test before
anything is hashed. Every failure to get a usable GPU is :class:`GpuStagingUnavailableError`.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from gpucc.core.errors import UsageError
from gpucc.staging.errors import GpuKernelError, GpuStagingUnavailableError

from .digest_cpu import _check_same, open_checked
from .errors import ModelChangedError, ModelTreeError
from .manifest import Manifest, Resource, VerificationResult

__all__ = [
    "available",
    "digest_device_buffers",
    "hash_items",
    "kernel_source",
    "verify_device_buffers",
]

_THREADS = 128
_BATCH = 1 << 30  # bytes of file data per upload
_CHUNK = 1024
_INCLUDE = '#include "hash_math.cuh"'
# Known answers: SHA-256("abc") and BLAKE3("abc") (FIPS 180-4 and the BLAKE3 test vectors).
_SHA256_ABC = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
_BLAKE3_ABC = "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"


def kernel_source() -> str:
    """sha256.cu and blake3.cu with hash_math.cuh inlined: one source for NVRTC."""
    pkg = resources.files("gpucc.staging.kernels")
    header = pkg.joinpath("hash_math.cuh").read_text(encoding="utf-8")
    parts = []
    for name in ("sha256.cu", "blake3.cu"):
        text = pkg.joinpath(name).read_text(encoding="utf-8")
        if text.count(_INCLUDE) != 1:
            raise GpuStagingUnavailableError(f"{name} is damaged (include line not found)")
        parts.append(text.replace(_INCLUDE, header))
    return "\n".join(parts)


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise GpuStagingUnavailableError(f"CuPy is not installed ({exc})") from None
    return cupy


@dataclass(frozen=True)
class _Kernels:
    cupy: Any
    sha256: Any
    chunks: Any
    parents: Any
    device: int


_lock = threading.Lock()
_built: dict[int, _Kernels] = {}


def _kernels() -> _Kernels:
    cupy = _cupy()
    try:
        device = int(cupy.cuda.runtime.getDevice())
        if int(cupy.cuda.runtime.getDeviceCount()) < 1:
            raise GpuStagingUnavailableError("no CUDA device")
    except GpuStagingUnavailableError:
        raise
    except Exception as exc:  # noqa: BLE001 - driver and runtime errors alike
        raise GpuStagingUnavailableError(f"no usable CUDA device: {exc}") from None
    with _lock:
        found = _built.get(device)
        if found is not None:
            return found
        try:
            module = cupy.RawModule(code=kernel_source(), options=("-std=c++17",))
            kernels = _Kernels(
                cupy,
                module.get_function("sha256_shards"),
                module.get_function("blake3_chunks"),
                module.get_function("blake3_parents"),
                device,
            )
        except GpuStagingUnavailableError:
            raise
        except Exception as exc:  # noqa: BLE001 - CompileException, CUDADriverError, ...
            # A device is there but the kernels do not build: an error, not "no GPU".
            lines = tuple(line for line in str(exc).splitlines() if line.strip())
            raise GpuKernelError(
                "the hash kernels did not build", device_id=device, stage="build", log=lines
            ) from None
        try:
            ok = _self_test(kernels)
        except Exception as exc:  # noqa: BLE001 - a launch or copy of the self-test failed
            raise GpuKernelError(
                f"the hash kernels' self-test could not run on CUDA device {device}: "
                f"{' '.join(str(exc).split())[:300]}",
                device_id=device,
                stage="known-answer",
            ) from None
        if not ok:
            raise GpuKernelError(
                "the hash kernels failed their known-answer self-test; refusing to use them",
                device_id=device,
                stage="known-answer",
            )
        _built[device] = kernels
        return kernels


def _self_test(k: _Kernels) -> bool:
    """Known answers through both load paths: 16-byte aligned full blocks and unaligned tails."""
    body = bytes(range(256)) * 20
    data = k.cupy.asarray(np.frombuffer(body + b"abc", dtype=np.uint8))
    sha = _launch(k, "sha256", data, [0, len(body)], [len(body), 3])
    b3 = _launch(k, "blake3", data, [len(body), 0], [3, len(body)])
    if sha != [hashlib.sha256(body).digest(), bytes.fromhex(_SHA256_ABC)]:
        return False
    if b3[0] != bytes.fromhex(_BLAKE3_ABC):
        return False
    try:
        import blake3
    except ImportError:
        return True
    return bool(b3[1] == blake3.blake3(body).digest())


def available() -> bool:
    """True when CuPy, a CUDA device and working kernels are all there."""
    try:
        _kernels()
    except GpuStagingUnavailableError:
        return False
    return True


def _grid(n: int) -> tuple[int]:
    return ((n + _THREADS - 1) // _THREADS,)


def _u64(k: _Kernels, values: Sequence[int] | np.ndarray[Any, Any]) -> Any:
    return k.cupy.asarray(np.asarray(values, dtype=np.uint64))


def _words_to_bytes(words: np.ndarray[Any, Any], big_endian: bool) -> list[bytes]:
    dtype = ">u4" if big_endian else "<u4"
    rows = words.reshape(-1, 8).astype(dtype)
    return [row.tobytes() for row in rows]


def _sha256(k: _Kernels, base: Any, offsets: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
    n = len(offsets)
    if n == 0:
        return []
    out = k.cupy.empty(8 * n, dtype=k.cupy.uint32)
    k.sha256(
        _grid(n),
        (_THREADS,),
        (base, _u64(k, offsets), _u64(k, lengths), np.uint32(n), out),
    )
    return _words_to_bytes(out.get(), big_endian=True)


def _blake3(k: _Kernels, base: Any, offsets: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
    n = len(offsets)
    if n == 0:
        return []
    lens = np.asarray(lengths, dtype=np.uint64)
    counts = np.maximum((lens + _CHUNK - 1) // _CHUNK, 1).astype(np.uint64)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.uint64)
    total = int(counts.sum())
    cvs = k.cupy.empty(8 * total, dtype=k.cupy.uint32)
    k.chunks(
        _grid(total),
        (_THREADS,),
        (base, _u64(k, offsets), _u64(k, lens), _u64(k, starts), np.uint32(n),
         np.uint64(total), cvs),
    )  # fmt: skip
    # Each input's values: (level buffer, first index, count). Reduce until one value remains.
    where: list[tuple[Any, int, int]] = [
        (cvs, int(s), int(c)) for s, c in zip(starts, counts, strict=True)
    ]
    while True:
        live = [f for f, (_, _, c) in enumerate(where) if c > 1]
        if not live:
            break
        # One launch per level over every input still reducing; all of them read `src`, the
        # level buffer they currently live in (inputs join a level buffer together).
        groups: dict[int, list[int]] = {}
        for f in live:
            groups.setdefault(id(where[f][0]), []).append(f)
        for members in groups.values():
            src = where[members[0]][0]
            in_start = [where[f][1] for f in members]
            in_count = [where[f][2] for f in members]
            out_count = [(c + 1) // 2 for c in in_count]
            out_start = np.concatenate(([0], np.cumsum(out_count)[:-1])).astype(np.uint64)
            out_total = int(sum(out_count))
            dst = k.cupy.empty(8 * out_total, dtype=k.cupy.uint32)
            args = (src, dst, _u64(k, in_start), _u64(k, in_count), _u64(k, out_start),
                    np.uint32(len(members)), np.uint64(out_total))  # fmt: skip
            k.parents(_grid(out_total), (_THREADS,), args)
            for f, s, c in zip(members, out_start, out_count, strict=True):
                where[f] = (dst, int(s), c)
    hosts: dict[int, np.ndarray[Any, Any]] = {}
    out = []
    for buf, index, _ in where:
        host = hosts.get(id(buf))
        if host is None:
            host = hosts[id(buf)] = buf.get()
        out.append(_words_to_bytes(host[8 * index : 8 * index + 8], big_endian=False)[0])
    return out


def _launch(
    k: _Kernels, hash_type: str, base: Any, offsets: Sequence[int], lengths: Sequence[int]
) -> list[bytes]:
    """The digests of the given ranges of ``base``.

    Raises:
        UsageError: no kernel for ``hash_type``.
        GpuKernelError: a launch, or the copy of its results, failed (``stage="launch"``).
    """
    if hash_type not in ("sha256", "blake3"):
        raise UsageError(f"no GPU kernel for {hash_type}")
    try:
        if hash_type == "sha256":
            return _sha256(k, base, offsets, lengths)
        return _blake3(k, base, offsets, lengths)
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError (an illegal address), ...
        raise GpuKernelError(
            f"a {hash_type} kernel failed on CUDA device {k.device}: "
            f"{' '.join(str(exc).split())[:300] or exc.__class__.__name__}",
            device_id=k.device,
            stage="launch",
        ) from None


# --- model files ---------------------------------------------------------------------------------


def _read_batch(items: Sequence[Any]) -> tuple[np.ndarray[Any, Any], list[int]]:
    """Read the items' bytes into one host array (16-byte aligned offsets)."""
    offsets, pos = [], 0
    for item in items:
        offsets.append(pos)
        pos += (item.length + 15) // 16 * 16
    raw = bytearray(max(pos, 16))
    view = memoryview(raw)
    for item, at in zip(items, offsets, strict=True):
        fd = open_checked(item.entry)
        try:
            done = 0
            while done < item.length:
                try:
                    n = os.preadv(fd, [view[at + done : at + item.length]], item.start + done)
                except OSError as exc:
                    raise ModelTreeError(f"cannot read {item.entry.name}: {exc.strerror}") from None
                if n == 0:
                    raise ModelChangedError(f"{item.entry.name} became shorter while it was hashed")
                done += n
            _check_same(item.entry, os.fstat(fd), "while")
        finally:
            os.close(fd)
    return np.frombuffer(raw, dtype=np.uint8), offsets


def hash_items(
    items: Sequence[Any], hash_type: str, *, progress: Callable[[int], None] | None = None
) -> list[bytes]:
    """Digest of every item (see :mod:`.serialize`), in order, computed on the current GPU.

    Raises:
        GpuStagingUnavailableError: no CuPy, no device.
        GpuKernelError: the kernels do not build (``stage="build"``), fail or cannot run their
            self-test (``"known-answer"``), or a launch fails (``"launch"``).
        ModelTreeError, ModelChangedError: as on the CPU path.
    """
    k = _kernels()
    digests: list[bytes] = []
    batch: list[Any] = []
    size = 0
    for item in [*items, None]:
        if item is not None and (not batch or size + item.length <= _BATCH):
            batch.append(item)
            size += item.length
            continue
        if batch:
            host, offsets = _read_batch(batch)
            device = k.cupy.asarray(host)
            digests += _launch(k, hash_type, device, offsets, [i.length for i in batch])
            if progress is not None:
                progress(size)
        batch, size = ([item], item.length) if item is not None else ([], 0)
    return digests


# --- buffers already on the GPU ------------------------------------------------------------------


def _device_bytes(k: _Kernels, obj: Any, name: str) -> Any:
    """A 1-D uint8 CuPy view of a contiguous device array (CuPy, or anything with DLPack)."""
    cupy = k.cupy
    try:
        arr = obj if isinstance(obj, cupy.ndarray) else cupy.from_dlpack(obj)
    except Exception as exc:  # noqa: BLE001 - TypeError, BufferError, DLPack errors
        raise UsageError(f"{name}: not a GPU array (CuPy or DLPack): {exc}") from None
    if not arr.flags.c_contiguous:
        raise UsageError(f"{name}: the array is not contiguous; pass .contiguous() data")
    return arr.reshape(-1).view(cupy.uint8)


def digest_device_buffers(
    buffers: Sequence[Any], hash_type: str = "sha256", *, shard_size: int | None = None
) -> list[list[bytes]]:
    """Digests of device-resident buffers: per buffer, its shards' SHA-256 (``shard_size``),
    or one digest of the whole buffer (SHA-256 without ``shard_size``, or BLAKE3).

    Raises:
        GpuStagingUnavailableError, UsageError: no GPU; not a contiguous GPU array.
        GpuKernelError: as for :func:`hash_items`.
    """
    k = _kernels()
    if hash_type == "blake3" and shard_size is not None:
        raise UsageError("BLAKE3 digests whole buffers: no shard size")
    out = []
    for i, obj in enumerate(buffers):
        data = _device_bytes(k, obj, f"buffer {i}")
        n = int(data.size)
        step = shard_size or max(n, 1)
        starts = list(range(0, n, step)) if shard_size else [0]
        lengths = [min(step, n - s) for s in starts]
        out.append(_launch(k, hash_type, data, starts, lengths))
    return out


def verify_device_buffers(
    buffers: Mapping[str, Any], trusted: Manifest, *, partial: bool = False
) -> VerificationResult:
    """Check device-resident file contents against a trusted manifest, on the GPU.

    ``buffers`` maps a manifest path (``"model.safetensors"``) to the bytes of that file on the
    GPU. Each resource of the manifest is recomputed from those bytes; a file of the manifest
    with no buffer is reported missing unless ``partial`` is set (then only the files given
    are proven), and a buffer the manifest does not list is reported extra.
    """
    ser = trusted.serialization
    names = sorted(buffers)
    shards = ser.shard_size if ser.method == "shards" else None
    digests = digest_device_buffers([buffers[n] for n in names], ser.hash_type, shard_size=shards)
    k = _kernels()
    resources: list[Resource] = []
    for name, obj, found in zip(names, (buffers[n] for n in names), digests, strict=True):
        size = int(_device_bytes(k, obj, name).size)
        if shards is None:
            resources.append(Resource(name, ser.resource_algorithm, found[0]))
            continue
        for start, digest in zip(range(0, size, shards), found, strict=False):
            end = min(start + shards, size)
            resources.append(Resource(f"{name}:{start}:{end}", ser.resource_algorithm, digest))
    expected = trusted
    if partial:
        kept = tuple(r for r in trusted.resources if r.path in buffers)
        expected = Manifest(trusted.model_name, ser, kept)
    return expected.compare(Manifest.build(trusted.model_name, ser, resources))
