"""The staging API for training code: a context manager that scrubs what it stages.

::

    from gpucc import staging

    with staging.stage("train.gcc", key_file="train.key", device="cpu") as buf:
        train(buf)          # buf: verified plaintext, a NumPy uint8 array
    # here buf has been zeroed, also when train() raised

Devices: ``"cpu"`` stages into host memory. ``"gpu"`` and ``"auto"`` raise
:class:`~staging.errors.GpuStagingUnavailableError` until the GPU path lands; it hooks in
through :func:`_gpu_backend` and nothing else here has to change.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from gpucc.gpuattest.errors import UsageError

from . import cpu
from .dataset import SealedDataset, is_sealed, open_sealed
from .errors import GpuStagingUnavailableError
from .format import DEFAULT_CHUNK_SIZE, StrPath, read_key_file
from .seal import ProgressCallback

_logger = logging.getLogger("gpucc.staging")

__all__ = ["Backend", "Device", "stage"]

Device = Literal["cpu", "gpu", "auto"]


class Backend(Protocol):
    """Where staged data lives. Each method returns the staged buffer: a NumPy ``uint8``
    array on the CPU; on the GPU whatever the GPU backend documents (a CuPy array)."""

    @property
    def name(self) -> str:
        """``cpu`` or ``gpu``."""
        ...

    def stage_sealed(
        self,
        dataset: SealedDataset,
        dataset_key: bytes,
        *,
        threads: int | None,
        progress: ProgressCallback | None,
    ) -> Any:
        """Decrypt and verify a sealed dataset onto the device."""
        ...

    def stage_plaintext(
        self,
        path: Path,
        *,
        chunk_size: int,
        threads: int | None,
        progress: ProgressCallback | None,
    ) -> Any:
        """Move a plaintext file onto the device, sealed in transit under a fresh key."""
        ...

    def scrub(self, buf: Any) -> None:
        """Zero a buffer this backend staged."""
        ...


@dataclass(frozen=True)
class _CpuBackend:
    name: str = "cpu"

    def stage_sealed(
        self,
        dataset: SealedDataset,
        dataset_key: bytes,
        *,
        threads: int | None,
        progress: ProgressCallback | None,
    ) -> cpu.Buffer:
        return cpu.stage_cpu(dataset, dataset_key, threads=threads, progress=progress)

    def stage_plaintext(
        self,
        path: Path,
        *,
        chunk_size: int,
        threads: int | None,
        progress: ProgressCallback | None,
    ) -> cpu.Buffer:
        return cpu.stage_plaintext_cpu(
            path, chunk_size=chunk_size, threads=threads, progress=progress
        )

    def scrub(self, buf: Any) -> None:
        cpu.scrub(buf)


def _cpu_backend() -> Backend:
    return _CpuBackend()


def _gpu_backend(gpus: int | None = None) -> Backend:
    """The GPU backend (staging/gpu.py).

    Raises:
        GpuStagingUnavailableError: no CuPy, no usable device, or the kernels do not build.
    """
    from . import gpu

    try:
        return gpu.backend(gpus)
    except GpuStagingUnavailableError as exc:
        if str(exc).startswith("GPU staging not available"):
            raise
        raise GpuStagingUnavailableError(f"GPU staging not available: {exc}") from None


def select_backend(device: str, *, gpus: int | None = None) -> Backend:
    """The backend for ``device``; ``auto`` takes the GPU when usable, else the CPU (logged).

    Raises:
        GpuStagingUnavailableError: ``gpu`` while GPU staging is not available.
        UsageError: an unknown device name, or several GPUs asked for on the CPU.
    """
    if gpus is not None and gpus > 1 and device == "cpu":
        raise UsageError("--gpus needs --device gpu or auto")
    if device == "cpu":
        return _cpu_backend()
    if device == "gpu":
        return _gpu_backend(gpus)
    if device == "auto":
        from . import gpu

        reason = gpu.unavailable_reason(0)
        if reason is None:
            _logger.info("device auto: staging on the GPU")
            return _gpu_backend(gpus)
        _logger.info("device auto: staging on the CPU (%s)", reason)
        return _cpu_backend()
    raise UsageError(f"unknown device {device!r} (expected cpu, gpu or auto)")


def resolve_dataset_key(
    dataset: SealedDataset,
    *,
    key: bytes | None,
    kek: bytes | None,
    key_file: StrPath | None,
) -> bytes:
    """The dataset key from exactly one of ``key``, ``kek`` or ``key_file``.

    Raises:
        UsageError: none or several given.
        KeyFileError: the key file is unreadable, exposed or malformed.
        KeyUnwrapError: the key-file key does not open the dataset.
        HeaderAuthenticationError: the key does not verify the header.
    """
    given = [x is not None for x in (key, kek, key_file)]
    if sum(given) != 1:
        raise UsageError("a sealed dataset needs exactly one of key, kek or key_file")
    if key is not None:
        dataset.check_key(key)
        return key
    if key_file is not None:
        kek = read_key_file(key_file)
    if kek is None:  # pragma: no cover - excluded by the count above
        raise UsageError("no key given")
    return dataset.unwrap(kek)


@contextmanager
def stage(
    path: StrPath,
    *,
    key: bytes | None = None,
    kek: bytes | None = None,
    key_file: StrPath | None = None,
    device: Device = "cpu",
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    plaintext: bool | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    gpus: int | None = None,
) -> Iterator[Any]:
    """Stage a dataset, yield the verified buffer, and zero it on exit (also on errors).

    The buffer is a one-dimensional NumPy ``uint8`` array on the CPU (``cpu.Buffer``), and
    what the GPU backend returns on the GPU.

    Args:
        path: a sealed dataset, or a plaintext file.
        key: the dataset key (e.g. unwrapped from an attested session), or
        kek: the key-file key the dataset was sealed for, or
        key_file: the key file itself (mode 0600).
        device: ``"cpu"``, ``"gpu"`` (CuPy array), or ``"auto"`` (GPU when usable).
        threads: worker threads (default ``os.cpu_count()``).
        progress: ``progress(done_bytes, total_bytes)``.
        plaintext: force the plaintext path (``True``) or the sealed path (``False``);
            detected from the file's magic by default. A plaintext input is sealed in
            transit under a fresh key; no key argument is allowed then.
        chunk_size: chunk size for the plaintext path.
        gpus: with ``device="gpu"``, split the dataset over this many local GPUs.

    Raises:
        GpuStagingUnavailableError: ``device`` is ``gpu`` and GPU staging is not usable.
        UsageError: key arguments that do not fit the input.
        MalformedDatasetError, KeyFileError, IntegrityError: see :func:`staging.cpu.stage_cpu`.
    """
    backend = select_backend(device, gpus=gpus)
    sealed = is_sealed(path) if plaintext is None else not plaintext
    if sealed:
        dataset = open_sealed(path)
        dataset_key = resolve_dataset_key(dataset, key=key, kek=kek, key_file=key_file)
        buf = backend.stage_sealed(dataset, dataset_key, threads=threads, progress=progress)
    else:
        if key is not None or kek is not None or key_file is not None:
            raise UsageError(f"{path} is not a sealed dataset, so it takes no key")
        buf = backend.stage_plaintext(
            Path(path), chunk_size=chunk_size, threads=threads, progress=progress
        )
    try:
        yield buf
    finally:
        backend.scrub(buf)
