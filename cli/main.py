"""The gpucc application and its one error boundary.

Every command raises typed errors from the libraries; :func:`run` turns them
into one line on stderr and the documented exit code. Tracebacks never carry
local variables (``pretty_exceptions_show_locals=False``): they could hold keys.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from . import attest as _attest
from .boundary import run_app, wrap_commands
from .examples import add_examples

app = typer.Typer(
    name="gpucc",
    help="Verify NVIDIA H100 confidential-computing attestation and stage sealed datasets.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    pretty_exceptions_enable=False,
    add_completion=True,
)
app.command("attest")(_attest.attest)
app.add_typer(_attest.evidence_app, name="evidence")


def _register() -> None:
    """Sub-commands that live in their own modules (a failed import is an error, not a gap)."""
    import importlib

    for module, attr, name in (
        ("gpucc.cli.collateral", "collateral_app", "collateral"),
        ("gpucc.cli.session", "session_app", "session"),
        ("gpucc.cli.token", "token_app", "token"),
        ("gpucc.cli.model", "model_app", "model"),
        ("gpucc.cli.holder", "holder_app", "holder"),
        ("gpucc.cli.travel", "travel_app", "travel"),
    ):
        app.add_typer(getattr(importlib.import_module(module), attr), name=name)
    for module, attr, name in (
        ("gpucc.cli.seal", "seal", "seal"),
        ("gpucc.cli.stage", "stage", "stage"),
        ("gpucc.cli.demo", "demo", "demo"),
    ):
        app.command(name)(getattr(importlib.import_module(module), attr))
    add_examples(app)
    wrap_commands(app)


_register()


def _version(value: bool) -> None:
    if value:
        from gpucc import __version__

        typer.echo(f"gpucc {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """gpucc: attestation and confidential data staging for NVIDIA H100 GPUs."""


def run() -> None:
    """Console-script entry point: the single place errors become exit statuses."""
    sys.exit(run_app(app))


if __name__ == "__main__":  # pragma: no cover
    run()
