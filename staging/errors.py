"""Typed errors raised by staging: sealed datasets, key files, key release and GPU staging.

Each one derives from a family in :mod:`gpuattest.errors`, so its process exit code (and
what users must be able to tell apart) stays defined in one place:

* usage (exit 2): :class:`StageKeyArgumentsError`;
* malformed input (exit 4): :class:`MalformedDatasetError`, :class:`KeyFileError`,
  :class:`MalformedSessionMessageError`;
* environment (exit 5): :class:`StagingIOError`, :class:`GpuStagingUnavailableError`;
* integrity (exit 6): :class:`ChunkAuthenticationError`, :class:`HeaderAuthenticationError`,
  :class:`KeyUnwrapError`;
* not trusted (exit 1): :class:`ProtocolError`.

Messages never contain key material.
"""

from __future__ import annotations

from pathlib import Path

from gpucc.gpuattest.errors import (
    EnvironmentProblemError,
    FileAccessError,
    IntegrityError,
    MalformedInputError,
    NotTrustedError,
    UsageError,
)

__all__ = [
    "ChunkAuthenticationError",
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


# --- exit 2: usage -----------------------------------------------------------


class StageKeyArgumentsError(UsageError):
    """The key arguments of a staging call do not fit its input.

    Attributes:
        path: the input.
        sealed: whether the input is a sealed dataset (it then needs exactly one key) or a
            plaintext file (it then takes none).
    """

    def __init__(self, message: str, *, path: Path, sealed: bool) -> None:
        super().__init__(message)
        self.path = path
        self.sealed = sealed


# --- exit 4: malformed input ------------------------------------------------


class MalformedDatasetError(MalformedInputError):
    """A sealed dataset's framing (magic, version, lengths) is not valid."""


class KeyFileError(MalformedInputError):
    """A key file is malformed or has permissions that expose it."""


class MalformedSessionMessageError(MalformedInputError):
    """An offer, answer or host key file cannot be parsed."""


# --- exit 5: environment ----------------------------------------------------


class StagingIOError(FileAccessError):
    """A dataset or key file could not be read or written (missing, permissions, disk full)."""


class GpuStagingUnavailableError(EnvironmentProblemError):
    """GPU staging needs CuPy and a usable CUDA device."""

    hint = "install gpucc[gpu] on a host with a CUDA GPU, or use --device cpu"


# --- exit 6: integrity ------------------------------------------------------


class ChunkAuthenticationError(IntegrityError):
    """A sealed chunk's tag did not verify."""

    def __init__(self, chunk_index: int, detail: str = "") -> None:
        self.chunk_index = chunk_index
        text = f"chunk {chunk_index} failed authentication"
        super().__init__(f"{text}: {detail}" if detail else text)


class HeaderAuthenticationError(IntegrityError):
    """The header tag did not verify: the key is wrong or the header was changed."""


class KeyUnwrapError(IntegrityError):
    """A wrapped key did not unwrap: wrong key, wrong session or tampered."""


# --- exit 1: not trusted ----------------------------------------------------


class ProtocolError(NotTrustedError):
    """A key-release message was refused (transcript, nonce or key binding)."""
