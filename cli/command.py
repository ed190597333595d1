"""The gpucc command: Typer's command class with the options every command takes and the
error boundary around the command's function.

Typer lets an application choose the class of each command (``cls=``); :class:`App` is a
``typer.Typer`` whose commands are :class:`Command` and show their examples (``cli.examples``)
in ``--help``. A :class:`Command`:

* takes ``-v/--verbose`` (repeatable) and ``-q/--quiet`` beside the options its function
  declares (declared once, below, the way Typer declares any option);
* starts the command's :class:`~gpucc.cli.invocation.Invocation` (verbosity, JSON or text,
  the command path that hints name) from the parsed command line, puts it on the Typer
  context (``ctx.obj``) and binds it for the output helpers while the function runs;
* checks the files its options name: a missing input, a directory where a file belongs,
  a broken symbolic link is exit 8 (``FileAccessError``), like every other file problem,
  never the framework's usage error (exit 2). The framework checks the rules Typer was
  given (``exists``, ``file_okay``, ``dir_okay``); a value it refuses is checked again here
  to say what is wrong, and the rules are checked once more after parsing for what the
  framework lets through (a broken symbolic link where a new file is written);
* holds the JSON result until the exit status is known (a failure never prints a document
  that reads as success) and reports a failure in one line (and the error document);
* turns a closed stdout, Ctrl-C, SIGTERM and SIGHUP into a reported exit status instead of
  leaving them to the framework (which reports a closed pipe as exit 1 and Ctrl-C silently).
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperCommand, TyperOption
from typer.exceptions import TyperException

from gpucc.core.errors import FileAccessError, GpuccError, UsageError

from .aliases import renamed_args
from .boundary import (
    Interrupted,
    Reported,
    json_from_environment,
    print_traceback,
    publish,
    report,
    report_bug,
    report_error,
    report_interrupted,
    stdout_gone,
)
from .examples import epilog_for
from .exitcodes import BROKEN_PIPE, exit_codes_line, outcome_for, outcome_for_code
from .invocation import HeldResult, Invocation, bound
from .logs import configure
from .output import warn

__all__ = ["App", "Command", "PathRule", "QuietOption", "VerboseOption"]

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
COMMON = ("verbose", "quiet")


def _common(verbose: VerboseOption = 0, quiet: QuietOption = False) -> None:
    """The options every command takes, declared as a command's function declares its own."""


def common_parameters() -> list[Any]:
    """``-v`` and ``-q`` as the framework's parameters, built by Typer from :func:`_common`."""
    declaration = typer.Typer(add_completion=False)
    declaration.command()(_common)
    return list(typer.main.get_command(declaration).params)


# --- the files a command's options name --------------------------------------------------


@dataclass(frozen=True)
class PathRule:
    """What an option's path must be (Typer's ``exists``, ``file_okay``, ``dir_okay``)."""

    label: str
    exists: bool
    file_okay: bool
    dir_okay: bool

    def check(self, value: object) -> None:
        """Raise :class:`FileAccessError` (exit 8) for a path that breaks the rule."""
        from gpucc.core.files import SpecialFileError

        path = Path(str(value))
        shown = f"{self.label} {path}"
        if self.exists and str(value) == "-" and not os.path.lexists(path):
            raise UsageError(
                f"{self.label}: standard input (-) cannot be read here; write it to a file "
                "and name the file"
            )
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
        if not self.dir_okay and stat.S_ISDIR(st.st_mode):
            raise SpecialFileError(f"{shown} is a directory; a file is needed here")
        if not self.file_okay and not stat.S_ISDIR(st.st_mode):
            raise SpecialFileError(f"{shown} is not a directory")

    def check_all(self, value: object) -> None:
        """:meth:`check` every path of ``value`` (one, or a list of them)."""
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is not None:
                self.check(item)


def _label(param: Any) -> str:
    """How an error names a parameter: its first long option, or the argument's name."""
    if param.param_type_name != "option":  # FILE..., one of them: FILE
        return str(param.human_readable_name).removesuffix("...")
    longs = [o for o in param.opts if o.startswith("--")]
    return str((longs or param.opts)[0])


def path_rule(param: Any) -> PathRule | None:
    """The rule of a parameter whose type is the framework's path type (known by its public
    attributes: Typer carries its own Click, which gpucc does not import); None for others."""
    kind: Any = getattr(param, "type", None)
    if not all(hasattr(kind, a) for a in ("exists", "file_okay", "dir_okay", "readable")):
        return None
    return PathRule(_label(param), bool(kind.exists), bool(kind.file_okay), bool(kind.dir_okay))


# --- the command ---------------------------------------------------------------------------


# The framework's context is passed as ``Any``: its class is Click's, which Typer carries
# inside itself (``typer.Context`` is a subclass of it), so the overrides below keep the
# framework's signatures without naming it.


def command_path(ctx: Any) -> str:
    """``session offer`` for ``gpucc session offer``: the names below the application."""
    names: list[str] = []
    while ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(reversed(names))


def _wants_json(formats: list[object]) -> bool:
    if formats:
        return str(getattr(formats[0], "value", formats[0])).lower() == "json"
    return json_from_environment()


class Command(TyperCommand):
    """A gpucc command (see the module's description)."""

    #: ``session offer``: the command as users type it (set by :meth:`App.command`)
    path = ""

    def __init__(self, name: str | None, *, params: list[Any] | None = None, **kw: Any) -> None:
        own = list(params or ())
        clash = {p.name for p in own} & set(COMMON)
        if clash:
            raise TypeError(f"command {name}: {sorted(clash)} are options of every command")
        super().__init__(name, params=[*own, *common_parameters()], **kw)
        if self.help is not None and "Exit codes" not in self.help:
            self.help = f"{self.help.rstrip()}\n\n{exit_codes_line()}"
        for param in self.params:
            if type(param) is TyperOption:
                param.__class__ = _Option  # the same option, named in errors without reprs
                param.metavar = _option_metavar(param)
            elif type(param.type).__name__ == "StringParamType":  # an argument's type column
                param.type = type(param.type)()  # its own instance: the shared one stays
                param.type.name = "text"
        self.path_rules = {
            p.name: rule
            for p in own
            if (rule := path_rule(p)) is not None
            and (rule.exists or not rule.file_okay or not rule.dir_okay)
        }

    def _formats(self) -> list[Any]:
        """The ``--format`` parameter (every command has one)."""
        return [p for p in self.params if "--format" in getattr(p, "opts", ())]

    def _renamed(self, ctx: Any, args: list[str]) -> list[str]:
        """``args`` with this command's old option spellings replaced (``cli.aliases``),
        one note on stderr for each old spelling used (none while completing a word)."""
        valued = [
            o
            for p in self.params
            if p.param_type_name == "option"
            and not (getattr(p, "is_flag", False) or getattr(p, "count", False))
            for o in p.opts
        ]
        renamed, used = renamed_args(self.path or command_path(ctx), args, valued)
        for old, new in used if not ctx.resilient_parsing else ():
            warn(f"{old} is deprecated; use {new}")
        return renamed

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """Parse as the framework does; a path it refuses is reported as a file problem.

        The refused value is read again from the command line with the framework's own
        parser (the refusal does not carry it), and so is ``--format`` for the error
        document: the command has not started, so its invocation does not exist yet.
        """
        args = self._renamed(ctx, args)
        try:
            return super().parse_args(ctx, list(args))
        except typer.BadParameter as exc:
            param = exc.param
            refused = path_rule(param) if param is not None else None
            if param is None or refused is None:
                raise
            opts, _, _ = self.make_parser(ctx).parse_args(args=list(args))
            given = {p.name: p.consume_value(ctx, opts)[0] for p in self.params}
            # The first path in the command's own order, as when every path is allowed
            # through (the framework refuses in command-line order).
            checks = [*self.path_rules.items(), (str(param.name), refused)]
            found = (_path_problem(given.get(name), rule) for name, rule in checks)
            problem = next((p for p in found if p is not None), None)
            if problem is None:
                raise
        formats = [p.consume_value(ctx, opts)[0] for p in self._formats()]
        invocation = Invocation(command=command_path(ctx), json=_wants_json(formats))
        raise Reported(report_error(invocation, problem)) from None

    def invoke(self, ctx: Any) -> Any:
        """Run the command's function inside the boundary."""
        own = {k: v for k, v in ctx.params.items() if k not in COMMON}
        verbosity = configure(int(ctx.params.get("verbose") or 0), bool(ctx.params.get("quiet")))
        formats = [own[p.name] for p in self._formats() if p.name in own]
        invocation = Invocation(
            command=command_path(ctx),
            verbosity=verbosity,
            json=_wants_json(formats),
            result=HeldResult(hold=True),
        )
        ctx.obj = invocation
        with bound(invocation):
            return self._guarded(ctx, invocation, own)

    def _guarded(self, ctx: Any, invocation: Invocation, own: dict[str, Any]) -> Any:
        # the framework's own exits and usage errors, and what is reported, pass through
        passing: tuple[type[Exception], ...] = (*_exits(), Reported, typer.Abort, TyperException)
        try:
            try:
                for name, rule in self.path_rules.items():
                    rule.check_all(own.get(name))
                value = ctx.invoke(self.callback, **own) if self.callback else None
            except _exits() as exc:
                code = int(getattr(exc, "exit_code", 1))
                verdict = isinstance(exc, VerdictExit)  # its verdict line said it: no error
                if not publish(invocation, code) and code != 0 and not verdict:
                    report(invocation, outcome_for_code(code), f"failed (exit {code})")
                raise
            except GpuccError as exc:
                publish(invocation, outcome_for(exc).code)
                if invocation.verbosity >= 2:
                    print_traceback(exc)
                raise Reported(report_error(invocation, exc)) from None
            publish(invocation, 0)
            return value
        except passing:
            raise
        except OSError as exc:
            if not isinstance(exc, BrokenPipeError) and exc.errno != errno.EPIPE:
                raise Reported(report_bug(invocation, exc)) from None
            stdout_gone()
            raise Reported(BROKEN_PIPE.code) from None
        except KeyboardInterrupt:
            raise Reported(report_interrupted(invocation, Interrupted(signal.SIGINT))) from None
        except Interrupted as exc:
            raise Reported(report_interrupted(invocation, exc)) from None
        except Exception as exc:  # a bug: one line, no locals, no traceback unless asked
            raise Reported(report_bug(invocation, exc)) from None


def _path_problem(given: object, rule: PathRule) -> FileAccessError | None:
    """What is wrong with the path(s) ``given`` that the framework refused."""
    items = given if isinstance(given, (list, tuple)) else [given]
    for item in (i for i in items if i is not None):
        try:
            rule.check(item)
        except FileAccessError as exc:
            return exc
        if not os.access(str(item), os.R_OK):
            return FileAccessError(f"cannot read {rule.label} {item}: permission denied")
    return None


class _Option(TyperOption):
    """An option as an error names it: ``'--format' / '-f' (env var GPUCC_FORMAT or
    NVAT_FORMAT)``; Typer's own writes a list of variables as a Python list."""

    def get_error_hint(self, ctx: Any) -> str:
        hint = " / ".join(f"'{name}'" for name in self.opts or [self.human_readable_name])
        names = [self.envvar] if isinstance(self.envvar, str) else list(self.envvar or ())
        if self.show_envvar and names:
            hint += f" (env var {' or '.join(names)})"
        return hint


def _option_metavar(param: TyperOption) -> str | None:
    """One style for an option's value in help and errors: ``<lowercase>`` (``<file>``,
    ``<text|json>``, ``<dir>``, ``<n>``), as Typer writes paths and choices; arguments stay
    upper case (``FILE``), as Click writes them."""
    if param.is_flag or param.count:
        return param.metavar
    if param.metavar is not None:
        text = {"DIR": "DIRECTORY"}.get(param.metavar, param.metavar)
        return text if text.startswith("<") else f"<{text.lower()}>"
    kind = type(param.type).__name__
    return {
        "StringParamType": "<text>",
        "IntParamType": "<n>",
        "IntRange": "<n>",
        "FloatParamType": "<number>",
        "FloatRange": "<number>",
    }.get(kind)


class VerdictExit(typer.Exit):
    """The exit status of a verdict the command printed (not trusted, undecided): a verdict
    is not an error, so no ``gpucc: error:`` line follows it."""


def _exits() -> tuple[type[Exception], ...]:
    """``typer.Exit``, and Click's ``Exit`` where Typer uses an installed Click (Typer 0.28
    carries its own copy of Click and installs none, so ``click`` is looked at only if
    something imported it)."""

    click_exceptions = sys.modules.get("click.exceptions")
    exit_type = getattr(click_exceptions, "Exit", None)
    if isinstance(exit_type, type) and issubclass(exit_type, Exception):
        return (typer.Exit, exit_type)
    return (typer.Exit,)


F = TypeVar("F", bound=Callable[..., Any])


class App(typer.Typer):
    """A ``typer.Typer`` whose commands are :class:`Command` with their ``--help`` examples.

    ``group`` is the group's name as users type it (``session``), which the examples of
    its commands are filed under (``session offer``); empty for the application itself.
    """

    def __init__(self, *, group: str = "", **settings: Any) -> None:
        super().__init__(**settings)
        self.group = group

    def command(
        self, name: str | None = None, *, cls: type[TyperCommand] | None = None, **settings: Any
    ) -> Callable[[F], F]:
        path = " ".join(p for p in (self.group, name or "") if p)
        settings.setdefault("epilog", epilog_for(path))
        if cls is None and name is not None:
            # the command knows its path also when its group runs alone (python -m)
            cls = type(Command.__name__, (Command,), {"path": path})
        return super().command(name, cls=cls or Command, **settings)
