"""Renderers for attestation results (a Rich table per GPU, or one JSON document) and
the exit status each verdict maps to."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpucc.gpuattest.result import AttestationResult, Verdict

from .exitcodes import verdict_outcome

_STATUS_STYLE = {
    "pass": "green",
    "fail": "bold red",
    "not-checked": "yellow",
    "not-present": "cyan",
}
_VERDICT_LINE = {
    "trusted": ("TRUSTED", "bold green"),
    "not-trusted": ("NOT TRUSTED", "bold red"),
    "undecided": ("UNDECIDED (collateral missing)", "bold yellow"),
}


def verdict_exit_code(verdict: Verdict) -> int:
    """The exit status ``gpucc attest`` ends with for a verdict."""
    return verdict_outcome(verdict).code


def attest_document(result: AttestationResult) -> dict[str, Any]:
    """The ``gpucc.attest/v1`` document: the result's JSON with the exit status after
    ``trusted``."""
    doc: dict[str, Any] = {}
    for key, value in result.to_dict().items():
        doc[key] = value
        if key == "trusted":
            doc["exit_code"] = verdict_exit_code(result.verdict)
    return doc


def render_json(result: AttestationResult) -> str:
    """The ``gpucc.attest/v1`` document, indented."""
    return json.dumps(attest_document(result), indent=2, sort_keys=False)


def render_text(result: AttestationResult, console: Console, *, verbose: bool = False) -> None:
    """A table per GPU with every check and its reason, then one verdict line."""
    for gpu in result.gpus:
        title = f"GPU {gpu.index}" + (f" {gpu.uuid}" if gpu.uuid else "") + f" ({gpu.arch})"
        table = Table(title=title, title_justify="left", expand=False)
        table.add_column("check")
        table.add_column("result")
        table.add_column("detail", overflow="fold")
        for check in gpu.checks:
            status = str(check.status)
            cell = Text(status, style=_STATUS_STYLE.get(status, ""))
            if check.decision != "accept" and status != "fail":
                cell.append(f" ({check.decision})")
            detail = check.reason
            if check.note:
                detail = f"{detail} (policy: {check.note})" if detail else f"policy: {check.note}"
            table.add_row(Text(check.title), cell, Text(detail))
        console.print(table)
        claims = gpu.claims
        console.print(
            f"  driver {claims.get('x-nvidia-gpu-driver-version')}  "
            f"VBIOS {claims.get('x-nvidia-gpu-vbios-version')}  "
            f"hwmodel {claims.get('hwmodel')}  measres {claims.get('measres')}",
            highlight=False,
        )
        if gpu.measurements and gpu.measurements.mismatches:
            for m in gpu.measurements.mismatches:
                console.print(
                    f"  mismatch index {m.index} ({m.source}): runtime {m.runtime_value} "
                    f"golden {' | '.join(m.golden_values)}",
                    highlight=False,
                )
        if verbose:
            console.print(f"  evidence sha256 {gpu.report_digest.hex()}", highlight=False)
            console.print(f"  RIM IDs {gpu.driver_rim_id}, {gpu.vbios_rim_id}", highlight=False)
    label, style = _VERDICT_LINE[str(result.verdict)]
    at = result.verified_at.isoformat().replace("+00:00", "Z")
    line = Text(f"{label}", style=style)
    line.append(f": {len(result.gpus)} GPU(s) verified as of {at}", style="")
    if result.reasons:
        line.append(f"; {result.reasons[0]}", style="")
        if len(result.reasons) > 1:
            line.append(f" (+{len(result.reasons) - 1} more)", style="")
    console.print(line, highlight=False)
