"""The staging API for training code: a context manager that scrubs what it stages.

::

    from gpucc import staging

    with staging.stage("train.gcc", key_file="train.key", device="cpu") as buf:
        train(buf)          # buf: verified plaintext, a NumPy uint8 array
    # here buf has been zeroed, also when train() raised

Devices: ``"cpu"`` stages into host memory, ``"gpu"`` onto CUDA devices
(:mod:`staging.gpu`; :class:`~staging.errors.GpuStagingUnavailableError` when it cannot),
``"auto"`` onto the GPU when usable, else the CPU. The CPU is a fallback only for a machine
with no usable CUDA device (no CuPy, no driver, no device): where a device is present but the
kernels do not build or fail their known answers, ``"gpu"`` and ``"auto"`` both raise
:class:`~staging.errors.GpuKernelError`.

:func:`stage` is :func:`plan_stage` (choose the backend, open the input, resolve its key,
each once) followed by :meth:`StagePlan.run`; callers that report on what they stage (the
CLI) use the two steps.

Host memory: on the CPU the staged buffer (and the per-thread chunk buffers) are the call's
own by default; pass ``arena=`` (a :class:`~staging.arena.HostArena` the caller closes) to
have them lent by it and reused from call to call (:mod:`staging.arena`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from gpucc.core.errors import UsageError

from . import cpu, sources
from .arena import HostArena
from .dataset import SealedDataset, io_error, is_sealed, open_sealed
from .errors import GpuStagingUnavailableError, StageKeyArgumentsError
from .format import DEFAULT_CHUNK_SIZE, Header, StrPath, read_key_file
from .seal import ProgressCallback

if TYPE_CHECKING:
    from .shards import ShardSet
    from .verify import Verified

_logger = logging.getLogger("gpucc.staging")

__all__ = [
    "Backend",
    "Device",
    "KeySource",
    "StagePlan",
    "plan_part",
    "plan_stage",
    "reads_back_zero",
    "select_backend",
    "stage",
]

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
    arena: HostArena | None = None

    def stage_sealed(
        self,
        dataset: SealedDataset,
        dataset_key: bytes,
        *,
        threads: int | None,
        progress: ProgressCallback | None,
    ) -> cpu.Buffer:
        if dataset.source is not None:  # a store, a URL or a stream: read ahead
            from .sources.sealed import stage_source

            return stage_source(
                dataset, dataset_key, threads=threads, progress=progress, arena=self.arena
            )
        return cpu.stage_cpu(
            dataset, dataset_key, threads=threads, progress=progress, arena=self.arena
        )

    def stage_plaintext(
        self,
        path: Path,
        *,
        chunk_size: int,
        threads: int | None,
        progress: ProgressCallback | None,
    ) -> cpu.Buffer:
        return cpu.stage_plaintext_cpu(
            path, chunk_size=chunk_size, threads=threads, progress=progress, arena=self.arena
        )

    def scrub(self, buf: Any) -> None:
        cpu.scrub(buf)


def _cpu_backend() -> Backend:
    return _CpuBackend()


def _gpu_backend(gpus: int | None = None) -> Backend:
    """The GPU backend (staging/gpu.py).

    Raises:
        GpuStagingUnavailableError: no CuPy, no driver, or no usable device.
        GpuKernelError: a device is present but its kernels do not build or fail their
            known answers (raised as it is, not as "not available").
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

    ``auto`` falls back to the CPU only when no CUDA device is usable at all (no CuPy, no
    driver, no device); a broken kernel build on a present device is an error for it too.

    Raises:
        GpuStagingUnavailableError: ``gpu`` while GPU staging is not available.
        GpuKernelError: ``gpu`` or ``auto`` on a device whose kernels do not build or fail
            their known answers.
        UsageError: an unknown device name, or several GPUs asked for on the CPU.
    """
    if gpus is not None and gpus > 1 and device == "cpu":
        raise UsageError("staging on several GPUs needs device gpu or auto")
    if device == "cpu":
        return _cpu_backend()
    if device == "gpu":
        return _gpu_backend(gpus)
    if device == "auto":
        from . import gpu

        reason = gpu.unavailable_reason(0)  # GpuKernelError propagates: never a fallback
        if reason is None:
            _logger.info("device auto: staging on the GPU")
            return _gpu_backend(gpus)
        _logger.info("device auto: staging on the CPU (%s)", reason)
        return _cpu_backend()
    raise UsageError(f"unknown device {device!r} (expected cpu, gpu or auto)")


#: Where a plan's dataset key came from: given as bytes, unwrapped with a key-file key,
#: released by a session (``key_for``), or made for this call (plaintext input).
KeySource = Literal["key", "key-file", "session", "ephemeral"]


@dataclass(frozen=True)
class StagePlan:
    """One staging call, decided: the input opened, its key resolved, the backend chosen.

    Made by :func:`plan_stage`; :meth:`run` stages it. Nothing is opened, unwrapped or
    checked for a device again between the two.

    Attributes:
        path: the input file.
        backend: where the data goes (``backend.name`` is ``cpu`` or ``gpu``).
        sealed: a sealed dataset (``True``) or a plaintext file sealed in transit.
        header: the sealed header; for plaintext, the framing it is staged with (its
            dataset id is not the one staging uses, which is fresh per call).
        key_source: see :data:`KeySource`.
        dataset: the opened dataset (sealed input only).
        dataset_key: its key (sealed input only; never in a repr).
    """

    path: Path
    backend: Backend
    sealed: bool
    header: Header
    key_source: KeySource
    dataset: SealedDataset | None = None
    dataset_key: bytes | None = field(default=None, repr=False)

    @property
    def device(self) -> str:
        """``cpu`` or ``gpu``."""
        return self.backend.name

    def _backend(self, arena: HostArena | None) -> Backend:
        """The backend, lending host memory from ``arena`` on the CPU (a GPU stages into
        device memory: the arena is not used there)."""
        if arena is not None and isinstance(self.backend, _CpuBackend):
            return _CpuBackend(arena=arena)
        return self.backend

    @contextmanager
    def run(
        self,
        *,
        threads: int | None = None,
        progress: ProgressCallback | None = None,
        arena: HostArena | None = None,
    ) -> Iterator[Any]:
        """Stage, yield the verified buffer, and zero it on exit (also on errors).

        The backend verifies the header tag under the key before it decrypts anything.
        On the CPU the buffer is the call's own, or lent by ``arena`` (which then zeroes it
        again as it comes back and lends its pages to the next call).

        Raises:
            HeaderAuthenticationError: the key does not verify the header.
            ChunkAuthenticationError, MalformedDatasetError, StagingIOError,
                GpuStagingUnavailableError: see :func:`staging.cpu.stage_cpu` and
                :func:`staging.gpu.stage_gpu`.
        """
        backend = self._backend(arena)
        if self.dataset is not None and self.dataset_key is not None:
            buf = backend.stage_sealed(
                self.dataset, self.dataset_key, threads=threads, progress=progress
            )
        else:
            buf = backend.stage_plaintext(
                self.path, chunk_size=self.header.chunk_size, threads=threads, progress=progress
            )
        try:
            yield buf
        finally:
            backend.scrub(buf)

    def verify(
        self,
        *,
        threads: int | None = None,
        progress: ProgressCallback | None = None,
        arena: HostArena | None = None,
    ) -> Verified:
        """Authenticate every chunk and keep none of the plaintext.

        On the CPU chunk by chunk in a window of per-thread buffers
        (:func:`staging.verify.verify_cpu`: memory bounded by threads x chunk size, whatever
        the dataset's size); on a GPU by staging into device memory, then scrubbing it.
        ``arena`` lends the CPU's per-thread buffers (by default they are the call's own).

        Raises:
            The errors of :meth:`run`.
        """
        from . import verify

        if self.backend.name == "cpu":
            if self.dataset is not None and self.dataset_key is not None:
                if self.dataset.source is not None:  # a store, a URL or a stream
                    from .sources.sealed import verify_source

                    return verify_source(
                        self.dataset,
                        self.dataset_key,
                        threads=threads,
                        progress=progress,
                        arena=arena,
                    )
                return verify.verify_cpu(
                    self.dataset, self.dataset_key, threads=threads, progress=progress, arena=arena
                )
            return verify.verify_plaintext_cpu(
                self.path,
                chunk_size=self.header.chunk_size,
                threads=threads,
                progress=progress,
                arena=arena,
            )
        with self.run(threads=threads, progress=progress) as buf:
            pass
        return verify.Verified(
            plaintext_length=self.header.plaintext_length,
            chunk_count=self.header.chunk_count,
            held_bytes=self.header.plaintext_length,
            scrubbed=reads_back_zero(buf),
        )


def reads_back_zero(buf: Any) -> bool:
    """Whether a buffer :meth:`StagePlan.run` yielded is all zeros now (after its scrub):
    a host array, a device array, or a GPU backend's list of shards."""
    parts = [s.array for s in buf] if isinstance(buf, list) else [buf]
    return not any(bool(p.any()) for p in parts)


def _dataset_key(
    dataset: SealedDataset,
    *,
    key: bytes | None,
    kek: bytes | None,
    key_file: StrPath | None,
    key_for: Callable[[bytes], bytes] | None,
    file_kek: bytes | None = None,
) -> tuple[bytes, KeySource]:
    """The dataset key from exactly one source; the header tag is left to the backend.

    ``file_kek`` is the key of ``key_file`` when the caller has already read it.
    """
    if sum(x is not None for x in (key, kek, key_file, key_for)) != 1:
        raise StageKeyArgumentsError(
            f"the sealed dataset {dataset.path} needs exactly one of key, kek, key_file or key_for",
            path=dataset.path,
            sealed=True,
        )
    if key is not None:
        return key, "key"
    if key_for is not None:
        return key_for(dataset.header_digest), "session"
    if key_file is not None:
        kek = file_kek if file_kek is not None else read_key_file(key_file)
    if kek is None:  # pragma: no cover - excluded by the count above
        raise UsageError("no key given")
    return dataset.unwrap(kek, verify_header=False), "key-file"


def plan_part(
    shard_set: ShardSet, index: int, *, device: Device = "cpu", gpus: int | None = None
) -> StagePlan:
    """The plan that stages part ``index`` of a verified shard set (its key, its opened
    dataset: a remote part is read from the object pinned when the set was opened).

    Raises:
        UsageError: a remote part on a GPU (datasets from a store stage on the CPU).
        The errors of :func:`plan_stage` for a local part.
    """
    part = shard_set.parts[index]
    if part.source is None:
        return plan_stage(
            part.path, key=shard_set.dataset_key, device=device, gpus=gpus, in_set=shard_set
        )
    backend = select_backend(device, gpus=gpus)
    if backend.name != "cpu":
        raise UsageError(f"{part.name}: datasets from a store or a stream stage on the CPU")
    return StagePlan(
        path=part.path,
        backend=backend,
        sealed=True,
        header=part.header,
        key_source="key",
        dataset=part,
        dataset_key=shard_set.dataset_key,
    )


def plan_stage(
    path: StrPath,
    *,
    key: bytes | None = None,
    kek: bytes | None = None,
    key_file: StrPath | None = None,
    key_for: Callable[[bytes], bytes] | None = None,
    device: Device = "cpu",
    gpus: int | None = None,
    plaintext: bool | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    in_set: ShardSet | None = None,
    source_settings: sources.SourceSettings | None = None,
) -> StagePlan:
    """Decide a staging call once: choose the backend, open the input, resolve its key.

    Args:
        path: a sealed dataset, or a plaintext file.
        key: the dataset key, or
        kek: the key-file key the dataset was sealed for, or
        key_file: the key file itself (mode 0600), or
        key_for: ``key_for(header_digest) -> dataset key``, e.g. an attested session's
            :meth:`keyrelease.protocol.HostSession.dataset_key`.
        device: ``"cpu"``, ``"gpu"``, or ``"auto"`` (GPU when usable).
        gpus: with ``device="gpu"``, split the dataset over this many local GPUs.
        plaintext: force the plaintext path (``True``) or the sealed path (``False``);
            by default a key argument means sealed (anything else is then malformed),
            and without one the file's magic decides. A plaintext input is sealed in
            transit under a fresh key; no key argument is allowed then.
        chunk_size: chunk size for the plaintext path.
        in_set: the verified shard set (:func:`gpucc.staging.shards.open_shard_set`) that
            ``path`` is a part of; without it a shard of a larger set is refused.
        source_settings: how a remote ``path`` (``s3://``, ``https://``, ``-``) is read.

    Raises:
        GpuStagingUnavailableError: ``device`` is ``gpu`` and GPU staging is not usable
            (checked first, before any work).
        GpuKernelError: ``device`` is ``gpu`` or ``auto`` and a device is present whose
            kernels do not build or fail their known answers.
        StageKeyArgumentsError: key arguments that do not fit the input.
        UsageError: an unknown device.
        MalformedDatasetError: a chunk size the format does not allow, or a bad dataset.
        ShardSetError: ``path`` is one shard of a larger set (stage the set with
            :func:`gpucc.staging.shards.open_shard_set`).
        KeyFileError, KeyUnwrapError: the key file does not open the dataset.
        StagingIOError: the input cannot be read.
    """
    backend = select_backend(device, gpus=gpus)
    keyed = any(x is not None for x in (key, kek, key_file, key_for))
    if sources.is_remote(path):  # s3://, https:// or - (staging.sources)
        from .sources.sealed import open_keyed_source

        if plaintext:
            raise UsageError(f"{path}: only sealed datasets are read from a store or a stream")
        if backend.name != "cpu":
            raise UsageError(f"{path}: datasets from a store or a stream stage on the CPU")
        file_kek = read_key_file(key_file) if key_file is not None else None
        remote, remote_key, key_source = open_keyed_source(
            sources.open_source(str(path), source_settings),
            lambda ds: _dataset_key(
                ds, key=key, kek=kek, key_file=key_file, key_for=key_for, file_kek=file_kek
            ),
        )
        from .shards import ShardId, lone_shard_error

        shard = ShardId.parse(remote.header.dataset_id)
        member = in_set is not None and any(
            part.header_digest == remote.header_digest for part in in_set.parts
        )
        if shard is not None and shard.count != 1 and not member:
            remote.check_key(remote_key)  # its header authenticated first
            if remote.source is not None:
                remote.source.close()
            raise lone_shard_error(remote, shard)
        return StagePlan(
            path=Path(remote.name),
            backend=backend,
            sealed=True,
            header=remote.header,
            key_source=key_source,  # type: ignore[arg-type]
            dataset=remote,
            dataset_key=remote_key,
        )
    if plaintext is None:
        # A key says the input must be sealed: anything else is malformed, not plaintext.
        sealed = keyed or is_sealed(path)
    else:
        sealed = not plaintext
    if sealed:
        # The key is read first, so that a header that does not parse can be authenticated
        # (an altered header is a data authentication failure, not malformed input).
        file_kek = None
        if key_file is not None and key is None and kek is None and key_for is None:
            file_kek = read_key_file(key_file)
        dataset = open_sealed(path, kek=kek if kek is not None else file_kek, key=key)
        dataset_key, source = _dataset_key(
            dataset, key=key, kek=kek, key_file=key_file, key_for=key_for, file_kek=file_kek
        )
        from .shards import ShardId, open_shard_set

        shard = ShardId.parse(dataset.header.dataset_id)
        member = in_set is not None and any(
            part.header_digest == dataset.header_digest for part in in_set.parts
        )
        if shard is not None and shard.count != 1 and not member:
            # One shard of a larger set holds part of the data: checked as a set (with its
            # header authenticated by the key), a lone shard is refused.
            open_shard_set([path], key=dataset_key)
        return StagePlan(
            path=Path(path),
            backend=backend,
            sealed=True,
            header=dataset.header,
            key_source=source,
            dataset=dataset,
            dataset_key=dataset_key,
        )
    if keyed:
        raise StageKeyArgumentsError(
            f"{path} is not a sealed dataset, so it takes no key", path=Path(path), sealed=False
        )
    try:
        length = Path(path).stat().st_size
    except OSError as exc:
        raise io_error("read", path, exc) from None
    return StagePlan(
        path=Path(path),
        backend=backend,
        sealed=False,
        header=Header.new(length, chunk_size=chunk_size),
        key_source="ephemeral",
    )


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
    key_for: Callable[[bytes], bytes] | None = None,
    arena: HostArena | None = None,
    in_set: ShardSet | None = None,
) -> Iterator[Any]:
    """Stage a dataset, yield the verified buffer, and zero it on exit (also on errors).

    :func:`plan_stage` then :meth:`StagePlan.run`. The buffer is a one-dimensional NumPy
    ``uint8`` array on the CPU (``cpu.Buffer``), and what the GPU backend returns on the
    GPU. See :func:`plan_stage` for the arguments; ``arena`` lends the host memory on the
    CPU (:meth:`StagePlan.run`).

    Raises:
        GpuStagingUnavailableError: ``device`` is ``gpu`` and GPU staging is not usable.
        UsageError: key arguments that do not fit the input.
        MalformedDatasetError, KeyFileError, IntegrityError: see :func:`staging.cpu.stage_cpu`.
        ShardSetError: ``path`` is one shard of a larger set and ``in_set`` is not its set.
    """
    plan = plan_stage(
        path,
        key=key,
        kek=kek,
        key_file=key_file,
        key_for=key_for,
        device=device,
        gpus=gpus,
        plaintext=plaintext,
        chunk_size=chunk_size,
        in_set=in_set,
    )
    with plan.run(threads=threads, progress=progress, arena=arena) as buf:
        yield buf
