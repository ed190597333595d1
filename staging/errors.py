"""Typed errors raised by staging: sealed datasets, key files, key release and GPU staging.

Each one derives from a family in :mod:`gpucc.core.errors`, so what callers must be
able to tell apart stays defined in one place:

* usage: :class:`StageKeyArgumentsError`, :class:`ArenaClosedError`;
* malformed input: :class:`MalformedDatasetError`, :class:`KeyFileError`,
  :class:`MalformedSessionMessageError`;
* environment: :class:`GpuStagingUnavailableError` (no usable CUDA device) and
  :class:`GpuKernelError` (a device is there, but the kernels fail to build or to reproduce
  their known answers: never a reason to fall back to the CPU quietly);
* files: :class:`StagingIOError`;
* integrity (tampering): :class:`ChunkAuthenticationError`,
  :class:`HeaderAuthenticationError`, :class:`KeyUnwrapError`;
* wrong key: :class:`DatasetKeyMismatchError`;
* not trusted: :class:`ProtocolError`.

Messages never contain key material.
"""

from __future__ import annotations

from pathlib import Path

from gpucc.core.errors import (
    EnvironmentProblemError,
    FileAccessError,
    IntegrityError,
    KeyFileError,
    MalformedInputError,
    NotTrustedError,
    UsageError,
    WrongKeyError,
)

__all__ = [
    "ArenaClosedError",
    "ChunkAuthenticationError",
    "DatasetKeyMismatchError",
    "GpuKernelError",
    "ExtendedDatasetError",
    "GpuStagingUnavailableError",
    "HeaderAuthenticationError",
    "KeyFileError",
    "KeyUnwrapError",
    "MalformedDatasetError",
    "MalformedSessionMessageError",
    "ProtocolError",
    "StageKeyArgumentsError",
    "StagingIOError",
]


# --- usage -----------------------------------------------------------


class StageKeyArgumentsError(UsageError):
    """The key arguments of a staging call do not fit its input.

    Attributes:
        path: the input.
        sealed: whether the input is a sealed dataset (it then needs exactly one key) or a
            plaintext file (it then takes none).
    """

    portable = ("path", "sealed")

    def __init__(self, message: str, *, path: Path, sealed: bool) -> None:
        super().__init__(message)
        self.path = path
        self.sealed = sealed


class ArenaClosedError(UsageError):
    """A closed :class:`~staging.arena.HostArena` was asked to lend memory."""


# --- malformed input ------------------------------------------------


class MalformedDatasetError(MalformedInputError):
    """A sealed dataset's framing (magic, version, lengths) is not valid."""


class MalformedSessionMessageError(MalformedInputError):
    """An offer, answer or host key file cannot be parsed."""


# --- environment and files ----------------------------------------------------


class StagingIOError(FileAccessError):
    """A dataset or key file could not be read or written (missing, permissions, disk full)."""


class GpuStagingUnavailableError(EnvironmentProblemError):
    """GPU staging needs CuPy and a usable CUDA device."""


class GpuKernelError(EnvironmentProblemError):
    """A CUDA device is present, but the AES-GCM kernels do not build or fail a known answer.

    Not a kind of :class:`GpuStagingUnavailableError`: ``device="auto"`` falls back to the
    CPU only when no device is usable, and raises this instead.

    Attributes:
        device_id: the CUDA device.
        stage: ``"build"`` (NVRTC or module load), ``"occupancy"`` (the driver reports no
            resident CTA), ``"known-answer"`` (the built kernels computed a wrong result, or
            their self-test faulted), or ``"launch"`` (a kernel faulted on real work after
            passing its self-test).
        log: the relevant lines of the build log (at most :data:`LOG_LINES`; no key material:
            the log is about the kernel source, and known-answer keys are public constants).
    """

    LOG_LINES = 10
    portable = ("device_id", "stage", "log")

    def __init__(
        self, message: str, *, device_id: int, stage: str, log: tuple[str, ...] = ()
    ) -> None:
        self.device_id = device_id
        self.stage = stage
        self.log = log[: self.LOG_LINES]
        text = message
        if self.log:
            text += "\n" + "\n".join(f"  {line}" for line in self.log)
        super().__init__(text)


# --- integrity and keys ------------------------------------------------------


class ChunkAuthenticationError(IntegrityError):
    """A sealed chunk's tag did not verify.

    Attributes:
        chunk_index: the chunk (of a shard set: its global index).
        path: the sealed file (the shard) holding it, where the raiser knows it.
    """

    portable = ("chunk_index", "path")

    def __init__(self, chunk_index: int, detail: str = "", *, path: Path | None = None) -> None:
        self.chunk_index = chunk_index
        self.path = path
        text = f"chunk {chunk_index} failed authentication"
        super().__init__(f"{text}: {detail}" if detail else text)


class HeaderAuthenticationError(IntegrityError):
    """The header tag did not verify: the key is wrong or the header was changed."""


class ExtendedDatasetError(IntegrityError):
    """Bytes follow the final chunk that the authenticated header describes."""


class DatasetKeyMismatchError(WrongKeyError):
    """The key offered is not the one this dataset was sealed or released for.

    Told apart from tampering by the key id in the wrap record (or by the absence of a
    wrap for this dataset in a session answer): nothing was decrypted.
    """


class KeyUnwrapError(IntegrityError):
    """A wrapped key did not unwrap: wrong key, wrong session or tampered."""


# --- not trusted ----------------------------------------------------


class ProtocolError(NotTrustedError):
    """A key-release message was refused (transcript, nonce or key binding)."""
