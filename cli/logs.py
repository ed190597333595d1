"""Logging for the command line: one ``gpucc`` logger tree, configured only here.

The libraries log under ``gpucc.*`` and never configure logging themselves. Every command
takes ``-v/--verbose`` (repeatable) and ``-q/--quiet``; without them ``GPUCC_LOG_LEVEL`` (or
``NVAT_LOG_LEVEL``) sets the level. ``-v`` shows progress information and, for an internal
error, its traceback; ``-vv`` shows debug records and the traceback of every error.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

LOGGER_NAME = "gpucc"
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
_LEVELS |= {"warn": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL}
_LEVELS |= {"trace": logging.DEBUG, "off": logging.CRITICAL + 10, "none": logging.CRITICAL + 10}


@dataclass
class _State:
    verbosity: int = 0  # -1 quiet, 0 default, 1 -v, 2 -vv and more
    json: bool = False  # the command's result (or error) goes to stdout as JSON
    result_emitted: bool = False  # a result document is out: an error adds only its line
    command: str = ""  # the command path, e.g. "session offer" (hints name its options)
    hold_results: bool = False  # the boundary writes the result once the exit status is known
    pending: dict[str, Any] | None = None  # the result document held until then


STATE = _State()


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
        from .terminal import safe_text

        return safe_text(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's name
        from .terminal import safe_text

        return "\n".join(safe_text(line) for line in super().formatException(ei).splitlines())


def configure(verbose: int, quiet: bool) -> None:
    """Set the ``gpucc`` logger's level and its one stderr handler."""
    if quiet:
        STATE.verbosity = -1
        level = logging.ERROR
    elif verbose:
        STATE.verbosity = verbose
        level = logging.INFO if verbose == 1 else logging.DEBUG
    else:
        STATE.verbosity = 0
        env_level = level_from_env()
        level = logging.WARNING if env_level is None else env_level
        if env_level is not None and env_level <= logging.DEBUG:
            STATE.verbosity = 2
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(level)
    logger.propagate = False
    if not any(getattr(h, "_gpucc", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_SafeFormatter("gpucc: %(levelname)s: %(message)s"))
        handler._gpucc = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
