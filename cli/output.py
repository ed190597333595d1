"""Results on stdout, people's text on stderr: the one path each takes.

A command's result is one document: with ``--format json`` it goes to stdout as JSON
(:func:`emit`, written by the command boundary once the command's exit status is known);
text results go to stdout through :func:`out`; everything meant for people (success
lines, notices, progress) goes to stderr (:func:`note`), so ``gpucc ... -f json | jq``
always reads exactly one document.

Every byte for stdout passes through :func:`write_stdout`: written in full with
``os.write``, so a reader that goes away is a :class:`BrokenPipeError` (exit 141) however
large the write, never a silent loss. Text for people is escaped (``terminal.safe_text``)
on its way out.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .logs import STATE
from .terminal import json_for_terminal, safe_text

__all__ = ["emit", "format_bytes", "format_rate", "note", "out", "warn", "write_stdout"]


def write_stdout(data: str | bytes) -> None:
    """Write every byte of ``data`` to stdout, or raise :class:`BrokenPipeError`.

    Buffered text streams lose the error of a large write to a closed pipe; the bytes
    therefore go to the descriptor directly (after whatever is buffered).
    """
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    stream = sys.stdout
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # a captured stream without a descriptor
        stream.write(raw.decode("utf-8", "replace"))
        stream.flush()
        return
    stream.flush()
    view = memoryview(raw)
    while view:
        view = view[os.write(fd, view) :]


def out(*lines: str) -> None:
    """A text result on stdout, one line per argument, each escaped for the terminal (a
    line break inside an argument is shown as ``\\n``, never forges a line)."""
    write_stdout("".join(safe_text(line) + "\n" for line in lines))


def note(message: str) -> None:
    """One line for people on stderr, prefixed ``gpucc:``, escaped; nothing with ``-q``."""
    if STATE.verbosity < 0:
        return
    sys.stderr.write(f"gpucc: {safe_text(message)}\n")
    sys.stderr.flush()


def warn(message: str) -> None:
    """A warning that must not go unseen (a simulated GPU): on stderr even with ``-q``."""
    sys.stderr.write(f"gpucc: {safe_text(message)}\n")
    sys.stderr.flush()


def emit(document: dict[str, Any]) -> None:
    """The command's result as one JSON document on stdout.

    The document is held until the command ends: then it is written if the command
    succeeded; if it failed, a document that reports a verdict (``verified``, ``trusted``
    or ``complete``) is written with that verdict false and the exit status and its kind,
    and any other is replaced by the error document (``cli.boundary``). Outside the
    boundary (a sub-app run on its own) it is written at once.
    """
    if "schema" not in document:
        raise ValueError("every JSON document names its schema")
    if STATE.hold_results:
        STATE.pending = document
        return
    write_document(document)


def write_document(document: dict[str, Any]) -> None:
    """Write a JSON document to stdout now."""
    import json

    write_stdout(json_for_terminal(json.dumps(document, indent=2)) + "\n")
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
