"""File helpers shared by the libraries and the CLI.

:func:`write_atomic` writes to a temporary name beside the target, then renames it;
:func:`read_capped` reads a file without trusting its size.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from .errors import FileAccessError

__all__ = ["read_capped", "write_atomic"]


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one.

    The temporary file is created in the target's directory with ``mode`` from the
    start (never looser), flushed and fsynced, then renamed over ``path``.

    Raises:
        OSError: the directory is not writable or the disk is full; no partial
            file is left behind.
    """
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_capped(path: Path, limit: int) -> bytes:
    """Read at most ``limit + 1`` bytes of ``path``.

    Callers refuse a result longer than ``limit``: reading one byte more is how they tell a
    file of exactly ``limit`` bytes from a larger one without trusting its size.

    Raises:
        FileAccessError: the file cannot be opened or read (one line, exit 5).
    """
    try:
        with path.open("rb") as fh:
            return fh.read(limit + 1)
    except OSError as exc:
        raise FileAccessError(f"cannot read {path}: {exc.strerror or exc}") from None
