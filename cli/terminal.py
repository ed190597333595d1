"""Text from untrusted input, made safe to print on a terminal.

Bundle strings, RIM ids, certificate names, file names, manifest fields, log fields and
messages from peers and services can carry control characters: a screen clear, a title
change, a cursor move, a carriage return that overwrites a line, a newline that forges one.
:func:`safe_text` shows every such character visibly (``\\x1b``, ``\\n``, ``\\u202e``)
instead of sending it to the terminal. Only text output uses it; JSON output carries the
exact strings.

Every path by which gpucc's text reaches a terminal applies it (``cli.output``'s
:func:`~gpucc.cli.output.out`, :func:`~gpucc.cli.output.note` and
:func:`~gpucc.cli.output.console`, whose rendered text is escaped segment by segment, the
error line and the log handler), so a command cannot forget to. This module is pure text:
it imports nothing else of the command line, and everything that prints imports it.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Mapping
from typing import TextIO

__all__ = [
    "UNBOUNDED",
    "control_free",
    "is_terminal",
    "json_for_terminal",
    "pipe_width",
    "safe_text",
]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def _visible(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _unsafe(ch: str) -> bool:
    # Cc: C0/C1 controls (ESC, CSI, BEL, NEL...); Cf: format characters such as bidi
    # overrides that reorder what is shown; Zl/Zp: line and paragraph separators.
    return ch == "\\" or unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")


def safe_text(value: object) -> str:
    """``str(value)`` with every control or format character shown as an escape.

    A backslash is doubled, so an escape in the output always means a character was
    escaped, never that the input contained the escape's text.
    """
    text = str(value)
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(_visible(ch) if _unsafe(ch) else ch for ch in text)


def _json_escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_for_terminal(text: str) -> str:
    """JSON text with every control or format character other than its line breaks
    written as a ``\\uXXXX`` escape: the same JSON value, nothing a terminal acts on.

    (JSON allows such characters raw only inside strings, where the escape means the same.)
    """
    if text.isprintable() or all(ch == "\n" or not _unsafe(ch) for ch in text):
        return text
    return "".join(
        _json_escape(ch) if ch != "\n" and ch != "\\" and _unsafe(ch) else ch for ch in text
    )


def control_free(text: str) -> str:
    """Control and format characters escaped; backslashes left alone (rendered text)."""
    if text.isprintable():
        return text
    return "".join(_visible(ch) if ch != "\\" and _unsafe(ch) else ch for ch in text)


def is_terminal(stream: TextIO, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether Rich would treat ``stream`` as a terminal (``TTY_COMPATIBLE``,
    ``FORCE_COLOR``, else ``isatty``)."""
    compatible = environ.get("TTY_COMPATIBLE", "")
    if compatible in ("0", "1"):
        return compatible == "1"
    if environ.get("FORCE_COLOR") is not None:
        return environ.get("FORCE_COLOR") != ""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


#: The width of a report to a pipe or a file when ``COLUMNS`` does not set one: no table
#: cell is wrapped, so each check is one line that a pipeline can grep whole.
UNBOUNDED = 100_000


def pipe_width(environ: Mapping[str, str] = os.environ) -> int:
    """The width of the report on a stream that is not a terminal: ``COLUMNS`` when it is
    set (the reader asked for that width), else :data:`UNBOUNDED`."""
    columns = environ.get("COLUMNS")
    if columns is not None and columns.isdigit() and int(columns) > 0:
        return int(columns)
    return UNBOUNDED
