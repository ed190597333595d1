"""Typed errors of dataset sources: each names the object and lands in an existing family.

* the store cannot be reached or does not answer in time (retries spent, the deadline
  passed, 5xx answers, bodies that end early): :class:`StoreUnavailableError`, a
  :class:`~gpucc.core.errors.NetworkError` (exit 3: try again later);
* the object is missing or access is refused: :class:`ObjectNotFoundError`,
  :class:`StoreAccessDeniedError`, file-access errors (exit 8, as for a local file);
* the object changed during the read (another ETag, version or length, a failed
  ``If-Match``): :class:`ObjectChangedError`, an integrity error (exit 6);
* the store answers outside the protocol (a whole object for a range, a ``Content-Range``
  for other bytes, no length, a redirect to another origin): :class:`StoreProtocolError`,
  malformed input (exit 4).

Messages name the object as the user wrote it, without a query string or user
information: a presigned URL's signature never reaches an error.
"""

from __future__ import annotations

from gpucc.core.errors import (
    FileAccessError,
    IntegrityError,
    MalformedInputError,
    NetworkError,
)

__all__ = [
    "ObjectChangedError",
    "ObjectNotFoundError",
    "StoreAccessDeniedError",
    "StoreDeadlineError",
    "StoreProtocolError",
    "StoreUnavailableError",
    "TransientStoreError",
]


class StoreUnavailableError(NetworkError):
    """The store could not be reached, or failed after every retry."""


class StoreDeadlineError(StoreUnavailableError):
    """One request (connect to last byte, retries included) took longer than the deadline."""


class TransientStoreError(StoreUnavailableError):
    """A failure worth retrying (connection reset, 5xx, a body that ended early)."""


class ObjectNotFoundError(FileAccessError):
    """The object (or its bucket) does not exist."""


class StoreAccessDeniedError(FileAccessError):
    """The store refused access (401/403), or no credentials were found."""


class ObjectChangedError(IntegrityError):
    """The object is not the one the read was pinned to (ETag, version or length)."""


class StoreProtocolError(MalformedInputError):
    """The store answered outside the HTTP range protocol gpucc accepts."""
