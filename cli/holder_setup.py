"""``gpucc holder keygen`` and ``gpucc holder datasets``: what a data holder prepares for a
plan before serving -- its P-384 signing key (and the pin the plan names it by), and each
sealed dataset's plan entry. :mod:`gpucc.cli.holder` registers both commands on its group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpucc.core.errors import UsageError

from .options import FormatOption, OutputFormat
from .output import emit, note, out

__all__ = ["datasets_cmd", "keygen", "write_key_pair"]


def keygen(
    key: Annotated[
        Path,
        typer.Option(
            "--holder-key", dir_okay=False, help="The holder's private key to create (0600)."
        ),
    ],
    pub: Annotated[
        Path, typer.Option("--holder-pub", dir_okay=False, help="Its public key PEM to write.")
    ],
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Make the holder's P-384 signing key (never replaces a file); print its pin for the plan."""
    write_key_pair(key, pub, fmt)


def write_key_pair(key: Path, pub: Path, fmt: OutputFormat) -> None:
    """Make a P-384 signing key at ``key`` (0600) and its public key at ``pub``; print its pin."""
    from gpucc.travel.signing import write_key_pair as write

    written = write(key, pub)
    pin = written.pin
    if fmt is OutputFormat.JSON:
        emit(written.to_dict())
    else:
        out(pin)
    note(f"wrote {key} (mode 0600) and {pub}; its pin for plan.yaml is {pin}")


def datasets_cmd(
    datasets: Annotated[
        Path,
        typer.Option(
            "--datasets", exists=True, file_okay=False, help="Directory of sealed datasets (*.gcc)."
        ),
    ],
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Print each sealed dataset's plan entry (name, path, header digest) as YAML."""
    from gpucc.travel.plan import PlanDatasets

    found = sorted(datasets.glob("*.gcc"))
    if not found:
        raise UsageError(f"{datasets} holds no sealed dataset (*.gcc)")
    planned = PlanDatasets.of(found)
    if fmt is OutputFormat.JSON:
        emit(planned.to_dict())
        return
    entries = planned.to_dict()["datasets"]
    lines: list[str] = []
    for e in entries:
        lines += [f"- name: {e['name']}", f"  path: {e['path']}"]
        lines.append(f"  header_digest: {e['header_digest']}")
    out(*lines)
