"""The gpucc application and its one error boundary.

Every command raises typed errors from the libraries; :func:`run` turns them
into one line on stderr and the documented exit code. Tracebacks never carry
local variables (``pretty_exceptions_show_locals=False``): they could hold keys.

A process builds only the sub-command it runs (:func:`build`): importing every command
module and its dependencies on each start-up cost more than verifying an attestation.
``--help``, an unknown or missing command, and shell completion get the whole
application, as does the module attribute ``app``.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Annotated

import typer

from .boundary import run_app
from .command import App

#: (module, attribute, name, is a group), in the order ``--help`` lists them. Every
#: module is imported when its command is built: a failed import is an error, not a gap.
COMMANDS: tuple[tuple[str, str, str, bool], ...] = (
    ("gpucc.cli.attest", "attest", "attest", False),
    ("gpucc.cli.attest", "evidence_app", "evidence", True),
    ("gpucc.cli.collateral", "collateral_app", "collateral", True),
    ("gpucc.cli.session", "session_app", "session", True),
    ("gpucc.cli.token", "token_app", "token", True),
    ("gpucc.cli.model", "model_app", "model", True),
    ("gpucc.cli.holder", "holder_app", "holder", True),
    ("gpucc.cli.cvm", "cvm_app", "cvm", True),
    ("gpucc.cli.travel", "travel_app", "travel", True),
    ("gpucc.cli.seal", "seal", "seal", False),
    ("gpucc.cli.stage", "stage", "stage", False),
    ("gpucc.cli.demo", "demo", "demo", False),
    ("gpucc.cli.inspect", "inspect", "inspect", False),
)
NAMES = frozenset(name for _, _, name, _ in COMMANDS)
GROUPS = frozenset(name for _, _, name, group in COMMANDS if group)


def _version(value: bool) -> None:
    if value:
        from gpucc import __version__

        typer.echo(f"gpucc {__version__}")
        raise typer.Exit(0)


def main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """gpucc: attestation and confidential data staging for NVIDIA H100 GPUs."""


def build(only: str | None = None) -> typer.Typer:
    """The application with every command, or with only the command (or group) ``only``."""
    application = App(
        name="gpucc",
        help="Verify NVIDIA H100 confidential-computing attestation and stage sealed datasets.",
        no_args_is_help=True,
        pretty_exceptions_show_locals=False,
        pretty_exceptions_enable=False,
        add_completion=True,
    )
    application.callback()(main)
    for module, attr, name, group in COMMANDS:
        if only is not None and name != only:
            continue
        __import__(module)  # not importlib.import_module: -X importtime lists this one
        target = getattr(sys.modules[module], attr)
        if group:
            application.add_typer(target, name=name)
        else:
            application.command(name)(target)
    return application


def command_of(argv: list[str]) -> str | None:
    """The command a command line runs, when only that one needs building.

    ``None`` (build everything) for shell completion, ``--help`` and the other options
    before a command, and a first word that is no command (so that the error can list
    them); ``""`` (no command) for ``--version``, which answers before any command runs.
    """
    if any(key.startswith("_") and key.endswith("_COMPLETE") for key in os.environ):
        return None
    if not argv:
        return None
    first = argv[0]
    if first == "--version":
        return ""
    return first if first in NAMES else None


def __getattr__(name: str) -> typer.Typer:
    """``app``: the whole application, built on first use (tests, documentation tools)."""
    if name == "app":
        application = build()
        globals()["app"] = application
        return application
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The shells ``--show-completion SHELL`` writes a script for.
SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")


def completion_script(argv: list[str]) -> str | None:
    """The script ``gpucc --show-completion SHELL`` asks for; None for any other command line.

    Typer's own option detects the running shell and takes no value, so ``zsh`` after it
    would be ignored and the current shell's script printed instead.
    """
    if len(argv) != 2 or argv[0] != "--show-completion" or argv[1] not in SHELLS:
        return None
    # typer.completion (a public module) imports the function without listing it in __all__
    from typer.completion import get_completion_script  # type: ignore[attr-defined]

    return get_completion_script(prog_name="gpucc", complete_var="_GPUCC_COMPLETE", shell=argv[1])


def run() -> None:
    """Console-script entry point: the single place errors become exit statuses."""
    argv = sys.argv[1:]
    script = completion_script(argv)
    if script is not None:
        sys.stdout.write(script + "\n")
        sys.exit(0)
    if not argv or (len(argv) == 1 and argv[0] in GROUPS):
        argv = [*argv, "--help"]  # `gpucc` or a group alone: its help on stdout, exit 0
    code = run_app(build(command_of(argv)), argv)
    # The process ends next. Interpreter shutdown would otherwise search every object
    # the run created (some 150,000) for garbage cycles, which took about an eighth of
    # a `gpucc attest`. Frozen objects are skipped by that search; shutdown still runs
    # the atexit handlers, flushes and closes the streams and joins threads.
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
