"""The one JSON parser for untrusted input: strict UTF-8, bounded depth and numbers.

:func:`loads_untrusted` turns every way a document can fail (not UTF-8, not JSON,
``NaN``/``Infinity`` or a number that overflows to it, an integer of thousands of digits,
nesting deeper than :data:`MAX_DEPTH`, the interpreter's recursion limit) into one error
of the caller's malformed-input family, never a ``RecursionError`` or ``ValueError``
escaping as a bug.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from ..errors import GpuccError

__all__ = ["MAX_DEPTH", "MAX_NUMBER_DIGITS", "loads_untrusted"]

#: Deepest nesting of arrays and objects accepted (gpucc's own documents use under 10).
MAX_DEPTH = 64
#: Longest integer or number literal accepted, in characters.
MAX_NUMBER_DIGITS = 64


class _Refused(ValueError):
    pass


def _parse_int(text: str) -> int:
    if len(text) > MAX_NUMBER_DIGITS:
        raise _Refused(f"a number of {len(text)} digits")
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > MAX_NUMBER_DIGITS:
        raise _Refused(f"a number of {len(text)} characters")
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text} is out of range")
    return value


def _parse_constant(text: str) -> Any:
    raise _Refused(f"{text} is not JSON")


def _depth_exceeds(doc: Any, limit: int) -> bool:
    """Whether ``doc`` nests deeper than ``limit`` (iterative: no recursion of our own)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def loads_untrusted(
    data: bytes | str,
    *,
    what: str,
    error: Callable[[str], GpuccError],
    max_depth: int = MAX_DEPTH,
) -> Any:
    """Parse ``data`` as JSON; on any failure raise ``error(message)``.

    Args:
        data: the document (bytes must be UTF-8).
        what: names the document in the message ("session offer", "collateral bundle").
        error: the caller's malformed-input error class (or a factory for it).
        max_depth: the deepest nesting accepted.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
    except UnicodeDecodeError as exc:
        raise error(f"the {what} is not UTF-8 (byte {exc.start})") from None
    try:
        doc = json.loads(
            text,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except RecursionError:
        raise error(f"the {what} nests deeper than {max_depth} levels") from None
    except _Refused as exc:
        raise error(f"the {what} is not acceptable JSON: {exc}") from None
    except json.JSONDecodeError as exc:
        raise error(
            f"the {what} is not JSON: {exc.msg} (line {exc.lineno} column {exc.colno})"
        ) from None
    except ValueError as exc:
        raise error(f"the {what} is not JSON: {exc}") from None
    if _depth_exceeds(doc, max_depth):
        raise error(f"the {what} nests deeper than {max_depth} levels")
    return doc
