"""Where sealed datasets are read from: local files, ``s3://``, ``https://`` and ``-``.

:func:`open_source` turns a name into an :class:`~.base.ObjectSource`; :func:`is_remote`
tells the names that are not local paths. See docs/REMOTE-DATA.md.
"""

from __future__ import annotations

import re

from gpucc.core.errors import UsageError

from .base import ObjectSource, SourceSettings
from .errors import (
    ObjectChangedError,
    ObjectNotFoundError,
    StoreAccessDeniedError,
    StoreDeadlineError,
    StoreProtocolError,
    StoreUnavailableError,
)

__all__ = [
    "ObjectChangedError",
    "ObjectNotFoundError",
    "ObjectSource",
    "SourceSettings",
    "StoreAccessDeniedError",
    "StoreDeadlineError",
    "StoreProtocolError",
    "StoreUnavailableError",
    "is_remote",
    "open_source",
]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_remote(name: object) -> bool:
    """Whether ``name`` is a URL or ``-`` (standard input) rather than a local path."""
    return isinstance(name, str) and (name == "-" or bool(_URL.match(name)))


def open_source(name: str, settings: SourceSettings | None = None) -> ObjectSource:
    """Open ``-``, ``s3://bucket/key`` or ``https://...``, learning its length and pin.

    Raises:
        UsageError: a scheme that is not read (``http://``, ``gs://``, ``az://``, others).
        The errors of :mod:`.errors`.
    """
    settings = settings or SourceSettings()
    if name == "-":
        from .stream import StdinSource

        return StdinSource()
    scheme = name.split("://", 1)[0].lower()
    if scheme == "s3":
        from .s3 import S3Source

        return S3Source(name, settings)
    if scheme == "https":
        from .http import HttpsSource

        return HttpsSource(name, settings)
    if scheme == "http":
        raise UsageError("plain http:// is not read: use https://")
    raise UsageError(f"{scheme}:// is not supported (s3://, https:// and - are)")
