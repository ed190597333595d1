"""Text from untrusted input, made safe to print on a terminal.

Bundle strings, RIM ids, certificate names and file contents can carry control
characters: a screen clear, a title change, a cursor move, a carriage return that
overwrites a line, a newline that forges one. :func:`safe_text` shows every such
character visibly (``\\x1b``, ``\\n``, ``\\u202e``) instead of sending it to the terminal.
Only text output uses it; JSON output carries the exact strings.
"""

from __future__ import annotations

import unicodedata

__all__ = ["safe_text"]

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
