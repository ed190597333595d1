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

EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug in gpucc, reported in one line

app = typer.Typer(
    name="gpucc",
    help="Verify NVIDIA H100 confidential-computing attestation and stage sealed datasets.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command("attest")(_attest.attest)
app.add_typer(_attest.evidence_app, name="evidence")


def _register_optional() -> None:
    """Sub-commands that live in their own modules."""
    import importlib

    for module, attr, name in (
        ("gpucc.cli.collateral", "collateral_app", "collateral"),
        ("gpucc.cli.session", "session_app", "session"),
        ("gpucc.cli.model", "model_app", "model"),
    ):
        try:
            sub = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue
        app.add_typer(sub, name=name)
    for module, attr, name in (
        ("gpucc.cli.seal", "seal", "seal"),
        ("gpucc.cli.stage", "stage", "stage"),
        ("gpucc.cli.demo", "demo", "demo"),
    ):
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue
        app.command(name)(fn)


_register_optional()


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
    """Console-script entry point: the single place errors become exit codes."""
    from gpucc.gpuattest.errors import GpuccError

    verbose = "--verbose" in sys.argv or "-v" in sys.argv[1:]
    try:
        app()
    except GpuccError as exc:
        if verbose:
            import traceback

            traceback.print_exception(exc, file=sys.stderr)
        sys.stderr.write(f"gpucc: error: {exc.diagnostics()}\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("gpucc: interrupted\n")
        sys.exit(130)
    except Exception as exc:  # a bug: one line, no locals, no traceback unless asked
        if verbose:
            raise
        detail = " ".join(str(exc).split())[:300]
        sys.stderr.write(
            f"gpucc: internal error: {type(exc).__name__}: {detail} (rerun with --verbose)\n"
        )
        sys.exit(EXIT_INTERNAL)


if __name__ == "__main__":  # pragma: no cover
    run()
