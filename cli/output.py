"""Results on stdout, people's text on stderr: the one path each takes.

A command's result is one document: with ``--format json`` it goes to stdout as JSON
(:func:`emit`, written by the command boundary once the command's exit status is known);
text results go to stdout through :func:`out`; everything meant for people (success
lines, notices, progress) goes to stderr (:func:`note`), so ``gpucc ... -f json | jq``
always reads exactly one document.

Every byte for stdout passes through :func:`write_stdout`: written in full with
``os.write``, so a reader that goes away is a :class:`BrokenPipeError` (exit 141) however
large the write, never a silent loss. Text for people is escaped (``terminal.safe_text``)
on its way out; :func:`console` is the one rich console commands draw with.

Whether ``-q`` silences a line and whether a result is held come from the command's
:class:`~gpucc.cli.invocation.Invocation` (:func:`~gpucc.cli.invocation.current`).
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .invocation import current
from .terminal import control_free, is_terminal, json_for_terminal, pipe_width, safe_text

if TYPE_CHECKING:
    from rich.console import Console
    from rich.segment import Segment

__all__ = [
    "console",
    "emit",
    "format_bytes",
    "format_rate",
    "note",
    "out",
    "warn",
    "write_document",
    "write_stdout",
]


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
    if current().quiet:
        return
    sys.stderr.write(f"gpucc: {safe_text(message)}\n")
    sys.stderr.flush()


def detail(message: str) -> None:
    """One line for ``-v`` (and ``-vv``) on stderr, prefixed ``gpucc:``, escaped."""
    if current().verbosity < 1:
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
    result = current().result
    if result.hold:
        result.document = document
        return
    write_document(document)


def write_document(document: dict[str, Any]) -> None:
    """Write a JSON document to stdout now."""
    import json

    write_stdout(json_for_terminal(json.dumps(document, indent=2)) + "\n")
    current().result.written = True


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


# --- the rich console -------------------------------------------------------------------


class _Stdout:
    """A text stream on stdout that writes through :func:`write_stdout` (every byte, or a
    broken pipe), for rich."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        write_stdout(text)
        return len(text)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return sys.stdout.isatty()

    def fileno(self) -> int:
        return sys.stdout.fileno()


def _console_class() -> type[Console]:
    """The console class, defined on first use: rich is imported only by commands that
    draw with it (a report to a pipe does not)."""
    from rich.console import Console as RichConsole
    from rich.segment import Segment as RichSegment

    class SafeConsole(RichConsole):
        """A rich console that escapes control characters in everything it renders
        (rich adds its own styling afterwards) and reports a closed output as
        :class:`BrokenPipeError` instead of exiting 1."""

        def _render_buffer(self, buffer: Iterable[Segment]) -> str:
            escaped = (
                seg
                if seg.control or seg.text == "\n"
                else RichSegment("\n".join(map(control_free, seg.text.split("\n"))), seg.style)
                for seg in buffer
            )
            return super()._render_buffer(escaped)

        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")

    return SafeConsole


def console(*, stderr: bool = False, **options: Any) -> Console:
    """The rich console every command draws with: on stderr (silent with ``-q``), or on
    stdout through the one write path (a closed pipe is exit 141); untrusted text is escaped
    as it is rendered."""
    if stderr:
        options.setdefault("quiet", current().quiet)  # -q: only errors on stderr
        return _console_class()(stderr=True, **options)
    if "width" not in options and not is_terminal(sys.stdout):
        options["width"] = pipe_width()  # a pipe's rows stay whole unless COLUMNS is set
    return _console_class()(file=_Stdout(), **options)  # type: ignore[arg-type]
