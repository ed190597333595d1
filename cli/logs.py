"""Logging for the command line: one ``gpucc`` logger tree, configured only here.

The libraries log under ``gpucc.*`` and never configure logging themselves. Every command
takes ``-v/--verbose`` (repeatable) and ``-q/--quiet``; without them ``GPUCC_LOG_LEVEL`` (or
``NVAT_LOG_LEVEL``) sets the level. ``-v`` shows progress information and, for an internal
error, its traceback; ``-vv`` shows debug records and the traceback of every error.

:func:`configure` returns the verbosity it chose; the command boundary keeps it in the
command's invocation (``cli.invocation``), where the output helpers read it. This module
keeps no state of its own and imports only the escaping of ``cli.terminal``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from .terminal import safe_text

LOGGER_NAME = "gpucc"
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
_LEVELS |= {"warn": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL}
_LEVELS |= {"trace": logging.DEBUG, "off": logging.CRITICAL + 10, "none": logging.CRITICAL + 10}


def level_from_env(environ: dict[str, str] | None = None) -> int | None:
    """The level named by ``GPUCC_LOG_LEVEL`` or ``NVAT_LOG_LEVEL``; None when unset or unknown."""
    env = os.environ if environ is None else environ
    for name in ("GPUCC_LOG_LEVEL", "NVAT_LOG_LEVEL"):
        value = env.get(name, "").strip().lower()
        if value in _LEVELS:
            return _LEVELS[value]
    return None


class _SafeFormatter(logging.Formatter):
    """Log records on a terminal: every field escaped (names and messages can come from
    untrusted input); the traceback of ``-vv`` stays as Python wrote it."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return safe_text(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's name
        return "\n".join(safe_text(line) for line in super().formatException(ei).splitlines())


def configure(verbose: int, quiet: bool) -> int:
    """Set the ``gpucc`` logger's level and its one stderr handler; return the verbosity
    (-1 quiet, 0 default, 1 ``-v``, 2 ``-vv`` or a debug level from the environment)."""
    if quiet:
        verbosity, level = -1, logging.ERROR
    elif verbose:
        verbosity, level = verbose, logging.INFO if verbose == 1 else logging.DEBUG
    else:
        env_level = level_from_env()
        level = logging.WARNING if env_level is None else env_level
        verbosity = 2 if env_level is not None and env_level <= logging.DEBUG else 0
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(level)
    logger.propagate = False
    if not any(isinstance(h.formatter, _SafeFormatter) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_SafeFormatter("gpucc: %(levelname)s: %(message)s"))
        logger.addHandler(handler)
    return verbosity
