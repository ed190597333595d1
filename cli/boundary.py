"""Where commands meet the process: errors turned into one line (and a JSON document),
results held until the exit status is known, signals, broken pipes and exit statuses.

A command's own failures are reported by its command class (``cli.command``), which knows
the command's :class:`~gpucc.cli.invocation.Invocation`, with :func:`report` and
:func:`publish`; :func:`run_app` reports what happens outside any command (a command line
that does not parse, help written to a closed pipe, a signal before the command starts)
and turns everything into the process's exit status. ``finally`` blocks, which remove
temporary files, run in every case.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from types import FrameType
from typing import Any

import typer

from gpucc.core.errors import GpuccError
from gpucc.core.outcomes import Failure

from .exitcodes import (
    BROKEN_PIPE,
    INTERNAL,
    INTERRUPTED,
    USAGE,
    Outcome,
    describe,
    outcome_for,
    outcome_for_code,
    signal_outcome,
)
from .invocation import Invocation
from .output import write_document, write_stdout
from .terminal import safe_text

ERROR_SCHEMA = Failure.SCHEMA

#: Top-level fields that state a verdict: false in any document of a failed command.
VERDICT_FIELDS = ("verified", "trusted", "complete")


class BrokenPipe(Exception):  # noqa: N818 - a condition, not a bug
    """stdout was closed by its reader."""


class Interrupted(Exception):  # noqa: N818 - a condition, not a bug
    """A signal asked the command to stop."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Reported(Exception):  # noqa: N818 - a condition, not a bug
    """The command's outcome is reported (its line, its document): exit with ``code``.

    Not a framework exception, so that the framework neither reports it again nor turns
    it into an exit status of its own.
    """

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def json_from_environment() -> bool:
    """``GPUCC_FORMAT=json`` or ``NVAT_FORMAT=json``."""
    return any(
        os.environ.get(n, "").strip().lower() == "json" for n in ("GPUCC_FORMAT", "NVAT_FORMAT")
    )


def publish(invocation: Invocation, code: int) -> bool:
    """Write the held result document of a command ending with ``code``; whether one was.

    On success it is written as it is. On failure, a document that states a verdict is
    written with every verdict field false and the exit status (``exit_code``) and its kind
    (``exit_kind``); any other is dropped, for the error document.
    """
    doc = invocation.result.take()
    if doc is None:
        return False
    verdicts = [k for k in VERDICT_FIELDS if k in doc]
    if verdicts:
        if code != 0:
            for key in verdicts:
                doc[key] = False
        doc["exit_code"] = code
        doc["exit_kind"] = outcome_for_code(code).kind
    elif code != 0:
        return False
    write_document(doc)
    return True


def _raise_interrupted(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(signum)


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP unwind the command like Ctrl-C, so temporary files are removed."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_interrupted)


def print_traceback(exc: BaseException) -> None:
    """The traceback of ``-v``/``-vv`` on stderr, each line escaped (messages can quote
    untrusted input)."""
    lines = "".join(traceback.format_exception(exc)).splitlines()
    try:
        sys.stderr.write("".join(safe_text(line) + "\n" for line in lines))
        sys.stderr.flush()
    except OSError:
        pass


def _stdout_identity() -> tuple[int, int] | None:
    try:
        st = os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return st.st_dev, st.st_ino


def _devnull_identity() -> tuple[int, int] | None:
    try:
        st = os.stat(os.devnull)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def stdout_gone() -> None:
    """Point stdout at /dev/null so that the final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _emit_json(document: dict[str, Any]) -> None:
    try:
        write_stdout(json.dumps(document, indent=2, sort_keys=True) + "\n")
    except BrokenPipeError:
        stdout_gone()


def report(
    invocation: Invocation,
    outcome: Outcome,
    message: str,
    hint: str = "",
    *,
    line: bool = True,
    reasons: list[dict[str, str]] | None = None,
) -> int:
    """One line on stderr and, when the command's output is JSON, the error document."""
    text = f"gpucc: error: {message}" + (f" ({hint})" if hint else "")
    if outcome.kind in (INTERRUPTED.kind, INTERNAL.kind):
        text = f"gpucc: {message}" + (f" ({hint})" if hint else "")
    text = safe_text(text)
    try:
        if line:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
    except OSError:
        pass
    if invocation.json and not invocation.result.written:
        _emit_json(Failure(outcome, message, hint, tuple(reasons or ())).to_dict())
    return outcome.code


def report_error(invocation: Invocation, exc: GpuccError) -> int:
    """Report a library error; return its exit status."""
    message, hint = describe(exc, invocation.command)
    listed = getattr(exc, "reasons", None)  # every failed check of a refusal, for JSON
    reasons = None
    if isinstance(listed, (list, tuple)):
        reasons = [
            {str(k): str(v) for k, v in r.items()} if isinstance(r, dict) else {"detail": str(r)}
            for r in listed
        ]
    return report(invocation, outcome_for(exc), message, hint, reasons=reasons)


def report_interrupted(invocation: Invocation, exc: Interrupted) -> int:
    """Report a signal that stopped the command; return its exit status."""
    name = "interrupted" if exc.signum == signal.SIGINT else f"terminated ({exc})"
    return report(invocation, signal_outcome(exc.signum), name)


def report_bug(invocation: Invocation, exc: Exception) -> int:
    """A bug: one line, no locals, no traceback unless asked (``-v``).

    A module of an optional extra that was not found is no bug: it is reported as the
    missing extra (:func:`gpucc.core.extras.missing_extra`), naming what installs it.
    """
    from gpucc.core.extras import missing_extra

    extra = missing_extra(exc)
    if extra is not None:
        return report_error(invocation, extra)
    if invocation.verbosity >= 1:
        print_traceback(exc)
    detail = " ".join(str(exc).split())[:300]
    return report(
        invocation, INTERNAL, f"internal error: {type(exc).__name__}: {detail}", "rerun with -v"
    )


def _usage_json_requested(argv: list[str]) -> bool:
    """Whether a command line that failed to parse asked for JSON (best effort)."""
    for i, token in enumerate(argv):
        if token in ("--format=json", "-fjson"):
            return True
        if token in ("--format", "-f") and i + 1 < len(argv) and argv[i + 1] == "json":
            return True
    return json_from_environment()


def run_app(app: typer.Typer, argv: list[str] | None = None) -> int:
    """Run ``app`` and return the process exit status; never raises."""
    from typer.exceptions import TyperException

    args = sys.argv[1:] if argv is None else argv
    stop_on_signals()
    stream_was, stdout_was = sys.stdout, _stdout_identity()
    # Outside any command: JSON when the command line or the environment asks for it.
    outside = Invocation(json=_usage_json_requested(args))
    try:
        try:
            code = app(args=args, standalone_mode=False)
        except SystemExit:
            # The framework answers a closed pipe while it writes help or usage by exiting
            # 1: Typer after replacing sys.stdout with a wrapper that ignores the failed
            # flush, rich after pointing stdout at /dev/null. The reader went away, so it is
            # a broken pipe (141).
            replaced = sys.stdout is not stream_was
            redirected = _stdout_identity() not in (stdout_was, None)
            if not replaced and not (redirected and _stdout_identity() == _devnull_identity()):
                raise
            raise BrokenPipe() from None
        code = code if isinstance(code, int) else 0
        if code == INTERRUPTED.code:  # the framework turns Ctrl-C outside a command into 130
            report(outside, INTERRUPTED, "interrupted")
    except Reported as done:  # a command reported its own outcome
        code = done.code
    except TyperException as exc:  # a command line that does not parse
        from typer.rich_utils import rich_format_error

        rich_format_error(exc)  # type: ignore[arg-type]
        message = " ".join(exc.format_message().split())
        code = report(outside, USAGE, message, line=False) if exc.exit_code == 2 else 1
    except GpuccError as exc:
        code = report_error(outside, exc)
    except (BrokenPipe, BrokenPipeError):
        stdout_gone()
        code = BROKEN_PIPE.code
    except Interrupted as exc:
        code = report_interrupted(outside, exc)
    except Exception as exc:  # a bug outside any command
        code = report_bug(outside, exc)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_gone()
        code = BROKEN_PIPE.code
    return code
