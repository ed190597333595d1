"""Digesting a model into a manifest and verifying a model against a trusted one.

Both walk the model with :mod:`.serialize` and hash with :mod:`.digest_cpu` or, where
``device`` asks for it and a GPU is usable, :mod:`.digest_gpu`. Nothing here prints: results
are value objects and failures typed errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpucc.core.errors import UsageError

from .digest_cpu import default_threads, hash_items, new_hasher
from .errors import MalformedManifestError, ModelTreeError
from .manifest import (
    MAX_MANIFEST_SIZE,
    Manifest,
    ModelMismatchError,
    Resource,
    Serialization,
    VerificationResult,
)
from .serialize import model_ignores, model_name, plan_items, relative_ignores, walk_model

__all__ = [
    "DEVICES",
    "digest_model",
    "load_manifest",
    "make_serialization",
    "require_verified",
    "staged_resource",
    "verify_model",
    "verify_staged",
]

DEVICES = ("cpu", "gpu", "auto")


def make_serialization(
    root: Path,
    *,
    hash_type: str = "sha256",
    shard_size: int | None = None,
    allow_symlinks: bool = False,
    ignore: Iterable[Path] = (),
    ignore_git: bool = True,
    exclude: Iterable[Path] = (),
) -> Serialization:
    """The serialization for digesting ``root``: sharded SHA-256 when ``shard_size`` is given,
    whole files otherwise (always whole files for BLAKE3).

    ``ignore`` names paths relative to the model (as model_signing does); ``exclude`` names
    files by their own path (the manifest or signature being written), left out when they
    lie inside the model.

    Raises:
        UsageError: an impossible combination, or an ``ignore`` path outside the model.
    """
    if hash_type not in ("sha256", "blake3"):
        raise UsageError(f"--hash {hash_type!r}: choose sha256 or blake3")
    if hash_type == "blake3" and shard_size is not None:
        raise UsageError("BLAKE3 digests whole files (its tree is already parallel): no shard size")
    if shard_size is not None and shard_size <= 0:
        raise UsageError("the shard size must be positive")
    method = "shards" if shard_size is not None else "files"
    return Serialization(
        method,
        hash_type,
        shard_size,
        allow_symlinks,
        tuple(
            sorted({*relative_ignores(root, exclude, git=ignore_git), *model_ignores(root, ignore)})
        ),
    )


def _hash(
    root: Path,
    serialization: Serialization,
    device: str,
    threads: int | None,
    progress: Callable[[int], None] | None,
    *,
    allow_empty: bool = False,
) -> Manifest:
    if device not in DEVICES:
        raise UsageError(f"--device {device!r}: choose cpu, gpu or auto")
    entries = walk_model(
        root, allow_symlinks=serialization.allow_symlinks, ignore_paths=serialization.ignore_paths
    )
    if not entries and not allow_empty:
        raise ModelTreeError(
            f"the model {root} holds no file to digest (after the ignore paths): a manifest of "
            "nothing would verify anything"
        )
    items = plan_items(entries, serialization)
    digests: list[bytes] | None = None
    if device in ("gpu", "auto"):
        from . import digest_gpu

        if device == "gpu" or digest_gpu.available():
            digests = digest_gpu.hash_items(items, serialization.hash_type, progress=progress)
    if digests is None:
        digests = hash_items(items, serialization.hash_type, threads=threads, progress=progress)
    algorithm = serialization.resource_algorithm
    resources = [Resource(i.name, algorithm, d) for i, d in zip(items, digests, strict=True)]
    return Manifest.build(model_name(root), serialization, resources)


def digest_model(
    root: Path,
    serialization: Serialization,
    *,
    device: str = "cpu",
    threads: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> Manifest:
    """Hash the model at ``root`` into a manifest.

    Raises:
        ModelTreeError, ModelChangedError, HashUnavailableError, UsageError, and
        GpuStagingUnavailableError for ``device="gpu"`` without a usable GPU.
    """
    return _hash(root, serialization, device, threads, progress)


def verify_model(
    root: Path,
    trusted: Manifest,
    *,
    device: str = "cpu",
    threads: int | None = None,
    progress: Callable[[int], None] | None = None,
    ignore: Iterable[Path] = (),
) -> VerificationResult:
    """Hash ``root`` the way ``trusted`` was made and compare every resource.

    ``ignore`` adds paths to leave out besides the manifest's own ``ignore_paths`` (the
    signature or manifest file itself when it lies inside the model, as model_signing does).

    The result lists each mismatching, missing and extra resource; :func:`require_verified`
    turns a failed result into :class:`ModelMismatchError`.
    """
    if not trusted.resources:
        raise MalformedManifestError("the manifest lists no resource: it covers nothing")
    ser = trusted.serialization
    extra = relative_ignores(root, ignore, git=False)
    if extra:
        ignores = (*ser.ignore_paths, *extra)
        ser = Serialization(ser.method, ser.hash_type, ser.shard_size, ser.allow_symlinks, ignores)
    actual = _hash(root, ser, device, threads, progress, allow_empty=True)
    return trusted.compare(actual)


def load_manifest(path: Path) -> Manifest:
    """Read and parse a manifest file (at most ``MAX_MANIFEST_SIZE`` bytes).

    Raises:
        MalformedManifestError: see :meth:`Manifest.parse`.
        ModelTreeError: the file cannot be read.
    """
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_MANIFEST_SIZE + 1)
    except OSError as exc:
        raise ModelTreeError(f"cannot read {path}: {exc.strerror}") from None
    return Manifest.parse(data)


def require_verified(result: VerificationResult) -> None:
    """Raise :class:`ModelMismatchError` (exit 6) unless every resource matched."""
    if not result.ok:
        raise ModelMismatchError(result)


def staged_resource(trusted: Manifest, resource: str | None = None) -> str:
    """The file of ``trusted`` that a staged buffer holds: ``resource`` when given (it must be
    a path the manifest lists), else the manifest's only file.

    Raises:
        UsageError: ``resource`` is not in the manifest, or the manifest lists several files
            and none was chosen.
    """
    paths = sorted({r.path for r in trusted.resources})
    if resource is not None:
        if resource not in paths:
            listed = ", ".join(repr(p) for p in paths[:5]) + (" ..." if len(paths) > 5 else "")
            raise UsageError(
                f"resource {resource!r} is not in the manifest of {trusted.model_name!r} "
                f"(it lists {listed or 'nothing'})"
            )
        return resource
    if len(paths) != 1:
        raise UsageError(
            f"the manifest of {trusted.model_name!r} lists {len(paths)} files: "
            "name the one that was staged (--resource)"
        )
    return paths[0]


def _host_bytes(buffer: Any) -> memoryview:
    """A flat byte view of a contiguous host buffer (no copy)."""
    try:
        view = memoryview(buffer)
    except TypeError:
        raise UsageError("the staged buffer is not a host buffer or a GPU array") from None
    if not view.c_contiguous:
        raise UsageError("the staged buffer is not contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _host_resources(
    view: memoryview, name: str, trusted: Manifest, threads: int | None
) -> list[Resource]:
    ser = trusted.serialization
    algorithm = ser.resource_algorithm
    workers = threads or default_threads()
    if ser.shard_size is None:
        hasher = new_hasher(ser.hash_type, threads=workers)
        hasher.update(view)
        return [Resource(name, algorithm, hasher.digest())]
    size = ser.shard_size
    ranges = [(s, min(s + size, len(view))) for s in range(0, len(view), size)]

    def digest(span: tuple[int, int]) -> bytes:
        hasher = new_hasher(ser.hash_type)
        hasher.update(view[span[0] : span[1]])
        return hasher.digest()

    with ThreadPoolExecutor(max_workers=min(workers, max(len(ranges), 1))) as pool:
        found = list(pool.map(digest, ranges))
    return [
        Resource(f"{name}:{s}:{e}", algorithm, d) for (s, e), d in zip(ranges, found, strict=True)
    ]


def verify_staged(
    buffer: Any,
    trusted: Manifest,
    resource: str | None = None,
    *,
    threads: int | None = None,
) -> VerificationResult:
    """Check the bytes of a staged buffer against the manifest entry of the file it holds.

    The digests are computed over ``buffer`` itself (a host buffer such as the NumPy array
    of CPU staging, or a CuPy array on the GPU, hashed there), so the verified bytes are the
    bytes in use. ``resource`` names the file (see :func:`staged_resource`); the manifest's
    other files are not part of this check. Every shard of that file is compared in constant
    time: a shard of the manifest the buffer does not reach is ``missing``, bytes past the
    last shard are ``extra``, and a differing shard is a ``mismatch``.
    :func:`require_verified` turns a failed result into :class:`ModelMismatchError`.

    Raises:
        UsageError: see :func:`staged_resource`; a buffer that is neither contiguous host
            memory nor a GPU array.
        HashUnavailableError: BLAKE3 without the ``blake3`` package.
        GpuStagingUnavailableError: a GPU array and GPU digests are not usable.
    """
    name = staged_resource(trusted, resource)
    ser = trusted.serialization
    expected = Manifest(
        trusted.model_name, ser, tuple(r for r in trusted.resources if r.path == name)
    )
    if hasattr(buffer, "__cuda_array_interface__"):
        from . import digest_gpu

        result = digest_gpu.verify_device_buffers({name: buffer}, expected)
    else:
        resources = _host_resources(_host_bytes(buffer), name, trusted, threads)
        result = expected.compare(Manifest.build(trusted.model_name, ser, resources))
    # Report the subject of the whole manifest: the one a signature covers.
    return replace(result, subject_digest=trusted.subject_digest.hex())
