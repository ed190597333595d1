"""``gpucc inspect FILE``: what a file is, without attesting, staging or opening anything.

A sealed dataset or shard (its header: sizes, ids, for whom its key is wrapped), a key file
(its key id, never the key), or one of the other files gpucc writes (evidence, a collateral
bundle, a model manifest or its signature bundle, a signed result as EAT or EAR, a travel
hand-over log, a command's result document). Nothing is verified: a header's tag needs the
key, and evidence needs ``gpucc attest``. Exit codes: 0 known; 4 a file gpucc does not know;
8 a file problem (a key file anyone else can read included).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import FormatOption, OutputFormat


def inspect(
    file: Annotated[
        Path,
        typer.Argument(
            metavar="FILE",
            exists=True,
            dir_okay=False,
            help="A sealed dataset or shard, a key file, evidence, a collateral bundle, a "
            "model manifest or signature, a signed result (EAT, EAR), a travel log or a "
            "gpucc JSON result.",
        ),
    ],
    output_format: FormatOption = OutputFormat.TEXT,
) -> None:
    """Say what FILE is, without secrets: a sealed dataset's header, a key file's key id."""
    from gpucc.assembly.inspect import inspect_file

    from .output import emit, out

    described = inspect_file(file)
    if output_format is OutputFormat.JSON:
        emit(described.to_dict())
        return
    out(f"{file}: {described.summary}")
    for key, value in described.details.items():
        out(f"  {key}: {value}")
