"""Results on stdout, people's text on stderr.

A command's result is one document: with ``--format json`` it is written to stdout as JSON
(:func:`emit`); everything meant for people (success lines, notices, progress) goes to
stderr (:func:`note`), so ``gpucc ... -f json | jq`` always reads exactly one document.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from .logs import STATE

__all__ = ["emit", "format_bytes", "format_rate", "note"]


def note(message: str) -> None:
    """One line for people on stderr, prefixed ``gpucc:``."""
    sys.stderr.write(f"gpucc: {message}\n")
    sys.stderr.flush()


def emit(document: dict[str, Any]) -> None:
    """The command's result as one JSON document on stdout.

    A command that then fails (a verification that did not pass) raises as usual: the
    error adds its line on stderr but no second, error document.
    """
    sys.stdout.write(json.dumps(document, indent=2) + "\n")
    sys.stdout.flush()
    STATE.result_emitted = True


def format_bytes(nbytes: float) -> str:
    """A size in decimal units (kB, MB, GB, TB = 10^3, 10^6, 10^9, 10^12 bytes)."""
    if nbytes < 1000:
        return f"{nbytes:.0f} bytes" if nbytes != 1 else "1 byte"
    value = float(nbytes)
    for unit in ("kB", "MB", "GB", "TB"):
        value /= 1000
        if value < 1000 or unit == "TB":
            return f"{value:.1f} {unit}"
    return f"{value:.1f} TB"  # pragma: no cover - the loop always returns


def format_rate(nbytes: float, seconds: float) -> str:
    """A throughput in decimal units (MB/s = 10^6 bytes per second, GB/s = 10^9)."""
    rate = nbytes / seconds if seconds > 0 else 0.0
    if rate >= 1e9:
        return f"{rate / 1e9:.2f} GB/s"
    if rate >= 1e6:
        return f"{rate / 1e6:.1f} MB/s"
    if rate >= 1e3:
        return f"{rate / 1e3:.1f} kB/s"
    return f"{rate:.0f} B/s"
