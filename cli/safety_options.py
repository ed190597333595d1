"""Options and checks shared by every command that writes a file with ``-o``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from gpucc.core.errors import UsageError

__all__ = ["ForceOption", "check_output", "force_hint"]

ForceOption = Annotated[
    bool,
    typer.Option(
        "--force",
        rich_help_panel="Output",
        help="Replace the output file if it exists (never a file this command reads).",
    ),
]


def check_output(output: Path, *inputs: Path | None, also: tuple[Path, ...] = ()) -> None:
    """Refuse an output that is a file this command reads or writes under another option.

    Existing files are compared by device and inode (a hard link, a symbolic link or
    another spelling of the same name is the same file); files that do not exist yet by
    their absolute path. ``--force`` does not lift this.

    Raises:
        OutputExistsError: the output is an existing file this command reads (exit 8,
            like every existing output; never replaceable).
        UsageError: the output's name is also given to another option.
    """
    from gpucc.core.files import refuse_inputs_as_output

    refuse_inputs_as_output(output, [*inputs, *also])
    target = Path(os.path.abspath(output))
    for other in (*inputs, *also):
        if other is not None and Path(os.path.abspath(other)) == target:
            raise UsageError(
                f"the output {output} is also given as {other} to another option; choose "
                "another output"
            )


@contextmanager
def force_hint() -> Iterator[None]:
    """Name ``--force`` in the error of an output that exists (the library names no option)."""
    from gpucc.core.files import OutputExistsError

    try:
        yield
    except OutputExistsError as exc:
        if not exc.replaceable:
            raise
        raise OutputExistsError(f"{exc} (give --force to replace it)") from None
