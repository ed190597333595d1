"""Typed errors of the model-integrity library, in the families of :mod:`gpuattest.errors`.

* :class:`MalformedManifestError` (exit 4): a manifest or signature bundle cannot be parsed,
  is larger than allowed, or is internally inconsistent (its subject digest does not match its
  resources).
* :class:`ModelTreeError` (exit 4): the model on disk cannot be serialized safely (a symlink
  that leaves the model directory, a special file, an unreadable path).
* :class:`SignatureError` (exit 6): a signature bundle did not verify with the key given.
* :class:`ModelChangedError` (exit 6): a file changed while it was hashed; no verdict.
* :class:`~gpucc.staging.model.manifest.ModelMismatchError` (exit 6), defined beside the
  result it carries: the model does not match a trusted manifest.
* :class:`HashUnavailableError` (exit 5): the hash needs a package that is not installed.
"""

from __future__ import annotations

from gpucc.core.errors import (
    EnvironmentProblemError,
    IntegrityError,
    MalformedInputError,
)

__all__ = [
    "HashUnavailableError",
    "MalformedManifestError",
    "ModelChangedError",
    "ModelTreeError",
    "SignatureError",
]


class MalformedManifestError(MalformedInputError):
    """A model manifest (in-toto statement) or signature bundle is not valid."""


class ModelTreeError(MalformedInputError):
    """The model directory holds something gpucc refuses to hash."""


class HashUnavailableError(EnvironmentProblemError):
    """The requested hash algorithm needs an optional package."""

    hint = "pip install 'gpucc[model]' (the blake3 package)"


class SignatureError(IntegrityError):
    """A model signature bundle did not verify: nothing in it is trusted."""


class ModelChangedError(IntegrityError):
    """A file's size or modification time moved while it was being hashed."""
