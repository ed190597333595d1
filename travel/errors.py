"""Typed errors of GPU Travelling, each in a family of :mod:`gpucc.core.errors`.

* :class:`HolderAuthenticationError` (integrity): an answer envelope whose signature or
  pinned key does not check.
* :class:`HolderRefusedError` (not trusted): the holder verified the GPU and refused it.
* :class:`HolderProtocolError` (not trusted): the holder refused the exchange itself
  (unknown, used or expired challenge, rate limit).
* :class:`HolderCannotDecideError` (collateral unavailable): the holder could not reach
  a verdict (HTTP 503: its collateral is unavailable, or it is at capacity).
* :class:`HolderUnreachableError` (network): no answer in time, a dropped connection, an
  oversized or malformed HTTP reply; :class:`HolderConnectionError`, its kind: no connection
  (refused, name unknown, TLS failed), the cause in its message.
* :class:`DatasetsWithheldError` (not trusted): the holder answered, but its release
  policies withheld a dataset the plan visits it for.
* :class:`CvmPolicyMismatchError` (not trusted): this CVM does not satisfy the image policy
  the plan names for a holder (checked before any holder is contacted).
* :class:`CvmPolicyUndecidedError` (collateral unavailable): that check could not be decided.
* :class:`DatasetDigestMismatchError` (integrity): a dataset is not the one the plan names.
* :class:`ModelDigestMismatchError` (integrity): the model changed between two holders.
* :class:`ScrubError` (integrity): a staged buffer did not read back as zero.
* :class:`LogTamperedError` (integrity) and :class:`MalformedLogError` (malformed input):
  the hand-over log.
* :class:`MalformedReceiptError` (malformed input): a holder receipt.
* :class:`PlanError` (malformed input): the travel plan.

Messages never contain key material.
"""

from __future__ import annotations

from gpucc.core.errors import (
    CollateralUnavailableError,
    ConnectionFailedError,
    IntegrityError,
    MalformedInputError,
    NetworkError,
    NotTrustedError,
)

__all__ = [
    "CvmPolicyMismatchError",
    "CvmPolicyUndecidedError",
    "DatasetDigestMismatchError",
    "DatasetsWithheldError",
    "HolderAuthenticationError",
    "HolderCannotDecideError",
    "HolderConnectionError",
    "HolderProtocolError",
    "HolderRefusedError",
    "HolderUnreachableError",
    "LogTamperedError",
    "MalformedEnvelopeError",
    "MalformedLogError",
    "MalformedReceiptError",
    "ModelDigestMismatchError",
    "PlanError",
    "ScrubError",
]


class HolderAuthenticationError(IntegrityError):
    """The answer is not signed by the holder the plan pins."""


class MalformedEnvelopeError(MalformedInputError):
    """An answer envelope cannot be parsed."""


class HolderRefusedError(NotTrustedError):
    """The holder evaluated the GPU's evidence and refused it."""


class HolderProtocolError(NotTrustedError):
    """The holder refused the exchange (challenge unknown, used or expired; rate limited)."""


class HolderCannotDecideError(CollateralUnavailableError):
    """The holder could not decide (its collateral is unavailable, or it is at capacity)."""


class HolderUnreachableError(NetworkError):
    """The holder's service did not answer properly in time."""


class HolderConnectionError(HolderUnreachableError, ConnectionFailedError):
    """No connection to the holder's service: refused, an unknown name, or TLS failed (a
    certificate not valid for the name, not signed by the CA given); the message keeps the
    cause."""


class DatasetsWithheldError(NotTrustedError):
    """The holder released the session, but its release policies withheld datasets the plan
    visits it for (each named with the rule it did not meet, where the holder said)."""


class CvmPolicyMismatchError(NotTrustedError):
    """This CVM does not satisfy the image policy the plan names for a holder."""


class CvmPolicyUndecidedError(CollateralUnavailableError):
    """Whether this CVM satisfies a holder's image policy could not be decided."""


class DatasetDigestMismatchError(IntegrityError):
    """A sealed dataset's header digest is not the one the plan expects."""


class ModelDigestMismatchError(IntegrityError):
    """The model arriving at a holder is not the model that left the previous one."""


class ScrubError(IntegrityError):
    """A staged buffer did not read back as zeros after scrubbing."""


class LogTamperedError(IntegrityError):
    """A hand-over log entry's signature or hash chain does not check."""


class MalformedLogError(MalformedInputError):
    """A hand-over log cannot be parsed."""


class MalformedReceiptError(MalformedInputError):
    """A holder receipt cannot be parsed."""


class PlanError(MalformedInputError):
    """A travel plan has missing, unknown or invalid fields."""
