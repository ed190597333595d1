"""Text from untrusted input, made safe to print on a terminal.

Bundle strings, RIM ids, certificate names, file names, manifest fields, log fields and
messages from peers and services can carry control characters: a screen clear, a title
change, a cursor move, a carriage return that overwrites a line, a newline that forges one.
:func:`safe_text` shows every such character visibly (``\\x1b``, ``\\n``, ``\\u202e``)
instead of sending it to the terminal. Only text output uses it; JSON output carries the
exact strings.

Every path by which gpucc's text reaches a terminal applies it (``cli.output``'s
:func:`~gpucc.cli.output.out` and :func:`~gpucc.cli.output.note`, the error line, the log
handler and :func:`console`, whose rendered text is escaped segment by segment), so a
command cannot forget to.
"""

from __future__ import annotations

import errno
import sys
import unicodedata
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.segment import Segment

__all__ = ["console", "json_for_terminal", "safe_text"]

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


def _control_free(text: str) -> str:
    """Control and format characters escaped; backslashes left alone (rendered text)."""
    if text.isprintable():
        return text
    return "".join(_visible(ch) if ch != "\\" and _unsafe(ch) else ch for ch in text)


class _Stdout:
    """A text stream on stdout that writes through :func:`gpucc.cli.output.write_stdout`
    (every byte, or a broken pipe), for rich."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        from .output import write_stdout

        write_stdout(text)
        return len(text)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return sys.stdout.isatty()

    def fileno(self) -> int:
        return sys.stdout.fileno()


_CONSOLE_CLASS: type[Console] | None = None


def _console_class() -> type[Console]:
    global _CONSOLE_CLASS
    if _CONSOLE_CLASS is None:
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
                    else RichSegment("\n".join(map(_control_free, seg.text.split("\n"))), seg.style)
                    for seg in buffer
                )
                return super()._render_buffer(escaped)

            def on_broken_pipe(self) -> None:
                self.quiet = True
                raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")

        _CONSOLE_CLASS = SafeConsole
    return _CONSOLE_CLASS


def console(*, stderr: bool = False, **options: Any) -> Console:
    """The rich console every command draws with: on stderr (silent with ``-q``), or on
    stdout through the one write path (a closed pipe is exit 141); untrusted text is escaped
    as it is rendered."""
    if stderr:
        from .logs import STATE

        options.setdefault("quiet", STATE.verbosity < 0)  # -q: only errors on stderr
        return _console_class()(stderr=True, **options)
    return _console_class()(file=_Stdout(), **options)  # type: ignore[arg-type]
