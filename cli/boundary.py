"""The one place where commands meet the process: options every command takes, signals,
broken pipes, file checks, errors turned into one line (and a JSON document), and exit
statuses.

Every command is wrapped by :func:`common_options`: it gains ``-v/--verbose`` and
``-q/--quiet``, records whether its output is JSON, checks the files its options name
(a missing input, a directory where a file belongs: exit 8, like every other file
problem, instead of the framework's usage error), holds its JSON result until its exit
status is known (a failure never prints a document that reads as success), and turns a
closed stdout, Ctrl-C, SIGTERM and SIGHUP into exceptions the framework does not swallow
(it would report a closed pipe as exit 1 and Ctrl-C silently). ``finally`` blocks, which
remove temporary files, run in every case.
"""

from __future__ import annotations

import errno
import functools
import inspect
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, get_args, get_origin

import typer

from gpucc.gpuattest.errors import FileAccessError, GpuccError

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
from .logs import STATE, configure
from .options import OutputFormat

ERROR_SCHEMA = "gpucc.error/v1"


class BrokenPipe(Exception):  # noqa: N818 - a condition, not a bug
    """stdout was closed by its reader."""


class Interrupted(Exception):  # noqa: N818 - a condition, not a bug
    """A signal asked the command to stop."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


VerboseOption = Annotated[
    int,
    typer.Option(
        "--verbose",
        "-v",
        count=True,
        metavar="",
        help="More detail on stderr; -vv adds debug records and tracebacks.",
        rich_help_panel="Output",
        show_default=False,
    ),
]
QuietOption = Annotated[
    bool,
    typer.Option("--quiet", "-q", help="Only errors on stderr.", rich_help_panel="Output"),
]


def json_from_environment() -> bool:
    """``GPUCC_FORMAT=json`` or ``NVAT_FORMAT=json``."""
    return any(
        os.environ.get(n, "").strip().lower() == "json" for n in ("GPUCC_FORMAT", "NVAT_FORMAT")
    )


# --- the files a command's options name --------------------------------------------------


@dataclass(frozen=True)
class PathRule:
    """What an option's path must be, checked here rather than by the framework (whose
    usage error would make a missing file exit 2)."""

    label: str
    exists: bool
    file_okay: bool
    dir_okay: bool

    def check(self, value: object) -> None:
        """Raise :class:`FileAccessError` (exit 8) for a path that breaks the rule."""
        from gpucc.gpuattest.files import SpecialFileError

        path = Path(str(value))
        shown = f"{self.label} {path}"
        try:
            st = os.stat(path)
        except FileNotFoundError:
            if os.path.lexists(path):
                raise FileAccessError(f"{shown} is a broken symbolic link") from None
            if self.exists:
                raise FileAccessError(f"{shown} does not exist") from None
            return
        except OSError as exc:
            raise FileAccessError(f"cannot access {shown}: {exc.strerror or exc}") from None
        import stat

        if not self.dir_okay and stat.S_ISDIR(st.st_mode):
            raise SpecialFileError(f"{shown} is a directory; a file is needed here")
        if not self.file_okay and not stat.S_ISDIR(st.st_mode):
            raise SpecialFileError(f"{shown} is not a directory")


def _option_label(info: Any, name: str) -> str:
    decls = [d for d in (info.default, *(info.param_decls or ())) if isinstance(d, str)]
    longs = [d for d in decls if d.startswith("--")]
    if longs:
        return longs[0]
    if decls and decls[0].startswith("-"):
        return decls[0]
    return str(info.metavar or name.upper())


def path_rules(sig: inspect.Signature) -> dict[str, PathRule]:
    """The path rules of a command's parameters, taken over from their Typer declarations
    (which are switched off, so the framework never refuses a path itself)."""
    from typer.models import ArgumentInfo, OptionInfo

    rules: dict[str, PathRule] = {}
    for name, param in sig.parameters.items():
        if get_origin(param.annotation) is not Annotated:
            continue
        base, *meta = get_args(param.annotation)
        if "Path" not in str(base):
            continue
        for info in meta:
            if not isinstance(info, (OptionInfo, ArgumentInfo)):
                continue
            rule = getattr(info, "_gpucc_rule", None)
            if rule is None:
                label = _option_label(info, name) if isinstance(info, OptionInfo) else ""
                if isinstance(info, ArgumentInfo):
                    label = str(info.metavar or name.upper())
                rule = PathRule(label, bool(info.exists), info.file_okay, info.dir_okay)
                setattr(info, "_gpucc_rule", rule)  # noqa: B010 - a mark on the framework object
                info.exists, info.file_okay, info.dir_okay, info.readable = False, True, True, False
            if rule.exists or not rule.file_okay or not rule.dir_okay:
                rules[name] = rule
    return rules


def check_paths(rules: dict[str, PathRule], kwargs: dict[str, Any]) -> None:
    """Apply ``rules`` to the values a command was called with."""
    for name, rule in rules.items():
        value = kwargs.get(name)
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is not None:
                rule.check(item)


# --- results held until the exit status is known -----------------------------------------

#: Top-level fields that state a verdict: false in any document of a failed command.
VERDICT_FIELDS = ("verified", "trusted", "complete")


def publish(code: int) -> bool:
    """Write the held result document for a command ending with ``code``; whether one was.

    On success it is written as it is. On failure, a document that states a verdict is
    written with every verdict field false and the exit status (``exit_code``) and its kind
    (``exit_kind``); any other is dropped, for the error document.
    """
    from .output import write_document

    doc, STATE.pending = STATE.pending, None
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


def _exit_types() -> tuple[type[Exception], ...]:
    """``typer.Exit``, and Click's ``Exit`` where Typer uses an installed Click (Typer 0.28
    carries its own copy of Click and installs none, so ``click`` is imported only if
    something already did)."""
    click_exceptions = sys.modules.get("click.exceptions")
    exit_type = getattr(click_exceptions, "Exit", None)
    if isinstance(exit_type, type) and issubclass(exit_type, Exception):
        return (typer.Exit, exit_type)
    return (typer.Exit,)


def common_options(fn: Callable[..., Any], path: str = "") -> Callable[..., Any]:
    """Wrap a command: ``-v``/``-q``, JSON detection, pipes and signals; ``path`` (e.g.
    ``session offer``) is recorded for hints that name the command's options.

    A command that itself takes ``verbose: bool`` (detailed rendering) receives whether
    ``-v`` was given at least once.
    """
    sig = inspect.signature(fn, eval_str=True)
    rules = path_rules(sig)
    wants_verbose = "verbose" in sig.parameters
    params = [p for n, p in sig.parameters.items() if n not in ("verbose", "quiet")]
    kw = inspect.Parameter.KEYWORD_ONLY
    params += [
        inspect.Parameter("verbose", kw, default=0, annotation=VerboseOption),
        inspect.Parameter("quiet", kw, default=False, annotation=QuietOption),
    ]

    @functools.wraps(fn)
    def command(*args: Any, verbose: int = 0, quiet: bool = False, **kwargs: Any) -> Any:
        configure(verbose, quiet)
        STATE.command = path
        formats = [v for v in kwargs.values() if isinstance(v, OutputFormat)]
        STATE.json = formats[0] is OutputFormat.JSON if formats else json_from_environment()
        STATE.hold_results, STATE.pending = True, None
        if wants_verbose:
            kwargs["verbose"] = verbose > 0
        try:
            try:
                check_paths(rules, kwargs)
                value = fn(*args, **kwargs)
            except _exit_types() as exc:
                code = int(getattr(exc, "exit_code", 1))
                if not publish(code) and code != 0:
                    report(outcome_for_code(code), f"failed (exit {code})")
                raise
            except GpuccError as exc:
                publish(outcome_for(exc).code)
                raise
            publish(0)
            return value
        except BrokenPipeError:
            raise BrokenPipe() from None
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise BrokenPipe() from None
            raise
        except KeyboardInterrupt:
            raise Interrupted(signal.SIGINT) from None

    command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    command._gpucc_wrapped = True  # type: ignore[attr-defined]
    return command


def wrap_commands(app: typer.Typer, prefix: str = "") -> None:
    """Apply :func:`common_options` to every command of ``app`` and its sub-apps."""
    for info in app.registered_commands:
        if info.callback is not None and not getattr(info.callback, "_gpucc_wrapped", False):
            name = info.name or info.callback.__name__.replace("_", "-")
            info.callback = common_options(info.callback, f"{prefix}{name}")
    for group in app.registered_groups:
        if group.typer_instance is not None:
            wrap_commands(group.typer_instance, f"{prefix}{group.name} " if group.name else prefix)


def _raise_interrupted(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(signum)


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP unwind the command like Ctrl-C, so temporary files are removed."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_interrupted)


def _print_traceback(exc: BaseException) -> None:
    """The traceback of ``-v``/``-vv`` on stderr, each line escaped (messages can quote
    untrusted input)."""
    from .terminal import safe_text

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


def _stdout_gone() -> None:
    """Point stdout at /dev/null so that the final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _emit_json(document: dict[str, Any]) -> None:
    from .output import write_stdout

    try:
        write_stdout(json.dumps(document, indent=2, sort_keys=True) + "\n")
    except BrokenPipeError:
        _stdout_gone()


def report(
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
    from .terminal import safe_text

    text = safe_text(text)
    try:
        if line:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
    except OSError:
        pass
    if STATE.json and not STATE.result_emitted:
        error: dict[str, Any] = {
            "code": outcome.code,
            "kind": outcome.kind,
            "message": message,
            "hint": hint,
        }
        if reasons:
            error["reasons"] = list(reasons)
        _emit_json({"schema": ERROR_SCHEMA, "error": error})
    return outcome.code


def report_error(exc: GpuccError) -> int:
    """Report a library error; return its exit status."""
    message, hint = describe(exc, STATE.command)
    listed = getattr(exc, "reasons", None)  # every failed check of a refusal, for JSON
    reasons = None
    if isinstance(listed, (list, tuple)):
        reasons = [
            {str(k): str(v) for k, v in r.items()} if isinstance(r, dict) else {"detail": str(r)}
            for r in listed
        ]
    return report(outcome_for(exc), message, hint, reasons=reasons)


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
    stdout_was = _stdout_identity()
    try:
        try:
            code = app(args=args, standalone_mode=False)
        except SystemExit:
            # rich (help, usage boxes) answers a closed pipe by pointing stdout at /dev/null
            # and exiting 1, click by wrapping stdout and exiting 1: the reader went away,
            # so it is a broken pipe (141).
            pacified = type(sys.stdout).__name__ == "PacifyFlushWrapper"
            redirected = _stdout_identity() not in (stdout_was, None)
            if not pacified and not (redirected and _stdout_identity() == _devnull_identity()):
                raise
            raise BrokenPipe() from None
        code = code if isinstance(code, int) else 0
        if code == INTERRUPTED.code:  # the framework turns Ctrl-C outside a command into 130
            report(INTERRUPTED, "interrupted")
    except TyperException as exc:  # a command line that does not parse
        from typer.rich_utils import rich_format_error

        rich_format_error(exc)  # type: ignore[arg-type]
        STATE.json = _usage_json_requested(args)
        message = " ".join(exc.format_message().split())
        code = report(USAGE, message, line=False) if exc.exit_code == 2 else 1
    except GpuccError as exc:
        if STATE.verbosity >= 2:
            _print_traceback(exc)
        code = report_error(exc)
    except (BrokenPipe, BrokenPipeError):
        _stdout_gone()
        code = BROKEN_PIPE.code
    except Interrupted as exc:
        name = "interrupted" if exc.signum == signal.SIGINT else f"terminated ({exc})"
        code = report(signal_outcome(exc.signum), name)
    except Exception as exc:  # a bug: one line, no locals, no traceback unless asked
        if STATE.verbosity >= 1:
            _print_traceback(exc)
        detail = " ".join(str(exc).split())[:300]
        code = report(INTERNAL, f"internal error: {type(exc).__name__}: {detail}", "rerun with -v")
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_gone()
        code = BROKEN_PIPE.code
    return code
