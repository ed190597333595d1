"""Model integrity: OpenSSF model-signing v1.0 manifests, signatures, CPU and GPU digests.

See ``docs/MODEL.md``. The library raises the typed errors of :mod:`.errors` and returns
value objects (:class:`~.manifest.Manifest`, :class:`~.manifest.VerificationResult`).
"""

from .api import digest_model, load_manifest, make_serialization, require_verified, verify_model
from .manifest import (
    Manifest,
    ModelMismatchError,
    Resource,
    ResourceProblem,
    Serialization,
    VerificationResult,
)

__all__ = [
    "ModelMismatchError",
    "Manifest",
    "Resource",
    "ResourceProblem",
    "Serialization",
    "VerificationResult",
    "digest_model",
    "load_manifest",
    "make_serialization",
    "require_verified",
    "verify_model",
]
