"""Logging for the command line: one ``gpucc`` logger tree, configured only here.

The libraries log under ``gpucc.*`` and never configure logging themselves. Every command
takes ``-v/--verbose`` (repeatable) and ``-q/--quiet``; without them ``GPUCC_LOG_LEVEL`` (or
``NVAT_LOG_LEVEL``) sets the level. ``-v`` shows progress information and, for an internal
error, its traceback; ``-vv`` shows debug records and the traceback of every error.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

LOGGER_NAME = "gpucc"
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
_LEVELS |= {"warn": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL}
_LEVELS |= {"trace": logging.DEBUG, "off": logging.CRITICAL + 10, "none": logging.CRITICAL + 10}


@dataclass
class _State:
    verbosity: int = 0  # -1 quiet, 0 default, 1 -v, 2 -vv and more


STATE = _State()


def level_from_env(environ: dict[str, str] | None = None) -> int | None:
    """The level named by ``GPUCC_LOG_LEVEL`` or ``NVAT_LOG_LEVEL``; None when unset or unknown."""
    env = os.environ if environ is None else environ
    for name in ("GPUCC_LOG_LEVEL", "NVAT_LOG_LEVEL"):
        value = env.get(name, "").strip().lower()
        if value in _LEVELS:
            return _LEVELS[value]
    return None


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
        handler.setFormatter(logging.Formatter("gpucc: %(levelname)s: %(message)s"))
        handler._gpucc = True  # type: ignore[attr-defined]
        logger.addHandler(handler)


VerboseOption = Annotated[
    int,
    typer.Option(
        "--verbose",
        "-v",
        count=True,
        help="More detail on stderr; repeat (-vv) for debug records and tracebacks.",
        rich_help_panel="Output",
    ),
]
QuietOption = Annotated[
    bool,
    typer.Option("--quiet", "-q", help="Only errors on stderr.", rich_help_panel="Output"),
]


def with_log_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Give a command ``-v/--verbose`` (counted) and ``-q/--quiet``.

    A command that itself takes ``verbose: bool`` (detailed rendering) receives whether
    ``-v`` was given at least once.
    """
    sig = inspect.signature(fn, eval_str=True)
    wants_verbose = "verbose" in sig.parameters
    params = [p for n, p in sig.parameters.items() if n not in ("verbose", "quiet")]
    params += [
        inspect.Parameter("verbose", inspect.Parameter.KEYWORD_ONLY, default=0,
                          annotation=VerboseOption),
        inspect.Parameter("quiet", inspect.Parameter.KEYWORD_ONLY, default=False,
                          annotation=QuietOption),
    ]  # fmt: skip

    @functools.wraps(fn)
    def command(*args: Any, verbose: int = 0, quiet: bool = False, **kwargs: Any) -> Any:
        configure(verbose, quiet)
        if wants_verbose:
            kwargs["verbose"] = verbose > 0
        return fn(*args, **kwargs)

    command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return command


def add_log_options(app: typer.Typer) -> None:
    """Apply :func:`with_log_options` to every command of ``app`` and its sub-apps."""
    for info in app.registered_commands:
        if info.callback is not None and not getattr(info.callback, "_gpucc_logs", False):
            info.callback = with_log_options(info.callback)
            info.callback._gpucc_logs = True  # type: ignore[attr-defined]
    for group in app.registered_groups:
        if group.typer_instance is not None:
            add_log_options(group.typer_instance)
