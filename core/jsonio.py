"""The one reader for untrusted JSON and YAML documents: strict UTF-8, bounded size, depth
and numbers, no duplicate keys.

:func:`loads_untrusted` (JSON) and :func:`load_yaml_untrusted` (YAML) turn every way a
document can fail into one error of the caller's malformed-input family, never a
``RecursionError`` or ``ValueError`` escaping as a bug:

* larger than the caller's cap, not UTF-8, not JSON (or not YAML);
* a key given twice in one object or mapping (a reviewer reads the first, a parser that
  keeps the last would use the second);
* ``NaN``/``Infinity`` (``.nan``/``.inf``), a number that overflows to it, or a number
  literal longer than :data:`MAX_NUMBER_DIGITS` characters (Python refuses integers of
  thousands of digits with a bare ``ValueError``);
* nesting deeper than the caller's limit (checked without recursion of our own);
* a byte-order mark at the start (JSON forbids it; YAML would skip it silently);
* a key or string that is not Unicode text: an escaped lone surrogate (``"\\ud800"``) parses
  in JSON and YAML but cannot be encoded, and would fail wherever the text is used;
* YAML only: a character YAML does not allow (NUL and the other C0 controls but tab, line
  feed and carriage return; DEL and the C1 controls but next-line; U+FFFE, U+FFFF), which
  PyYAML refuses while building its reader, inside the same mapping of errors;
* YAML only: tags (``!!python/object``, ``!!binary``, ``!custom``), anchors and aliases
  (the "billion laughs"), merge keys, and more than one document. What remains is plain
  data: mappings with string keys, lists, strings, numbers, booleans and null.

:func:`require_int` is the integer rule for fields of these documents: a boolean
(``True == 1`` in Python) or a float (``1.0``) is not an integer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from .errors import GpuccError

__all__ = [
    "MAX_DEPTH",
    "MAX_NUMBER_DIGITS",
    "load_yaml_untrusted",
    "loads_untrusted",
    "require_int",
]

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


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"the key {json.dumps(key)[:80]} appears twice in one object")
        out[key] = value
    return out


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _tree_fault(doc: Any, limit: int) -> str | None:
    """What is wrong with the parsed ``doc`` (iterative: no recursion of our own): nesting
    deeper than ``limit``, or a key or string that cannot be encoded (a lone surrogate,
    ``"\\ud800"``, is valid JSON and YAML escape syntax but no Unicode text); None when fine."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if not _encodable(value):
                return "holds a string that is not Unicode text (a lone surrogate)"
            continue
        if isinstance(value, dict):
            children: list[Any] = [*value.keys(), *value.values()]
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            return f"nests deeper than {limit} levels"
        stack.extend((child, depth + 1) for child in children)
    return None


def _text(
    data: bytes | str, what: str, error: Callable[[str], GpuccError], max_bytes: int | None
) -> str:
    if max_bytes is not None and len(data) > max_bytes:
        raise error(f"the {what} is larger than {max_bytes} bytes")
    try:
        text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
    except UnicodeDecodeError as exc:
        raise error(f"the {what} is not UTF-8 (byte {exc.start})") from None
    if text.startswith("\ufeff"):
        raise error(f"the {what} starts with a byte-order mark; save it as UTF-8 without one")
    return text


def loads_untrusted(
    data: bytes | str,
    *,
    what: str,
    error: Callable[[str], GpuccError],
    max_depth: int = MAX_DEPTH,
    max_bytes: int | None = None,
) -> Any:
    """Parse ``data`` as JSON; on any failure raise ``error(message)``.

    Args:
        data: the document (bytes must be UTF-8).
        what: names the document in the message ("session offer", "collateral bundle").
        error: the caller's malformed-input error class (or a factory for it).
        max_depth: the deepest nesting accepted.
        max_bytes: the largest document accepted (``None``: the caller capped its read).
    """
    text = _text(data, what, error, max_bytes)
    try:
        doc = json.loads(
            text,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
            object_pairs_hook=_no_duplicates,
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
    fault = _tree_fault(doc, max_depth)
    if fault is not None:
        raise error(f"the {what} {fault}")
    return doc


def _strict_loader(max_depth: int) -> Any:
    """A PyYAML SafeLoader class that builds plain data only (see the module docstring)."""
    import yaml
    from yaml.constructor import ConstructorError
    from yaml.events import AliasEvent, CollectionStartEvent, ScalarEvent
    from yaml.nodes import MappingNode

    class StrictLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            event: Any = self.peek_event()  # type: ignore[no-untyped-call]
            line = event.start_mark.line + 1
            if isinstance(event, AliasEvent):
                raise _Refused(f"an alias at line {line}")
            if getattr(event, "anchor", None) is not None:
                raise _Refused(f"an anchor at line {line}")
            explicit = (
                (isinstance(event, ScalarEvent) and not any(event.implicit))
                or (isinstance(event, CollectionStartEvent) and not event.implicit)
            ) and event.tag not in (None, "!")
            if explicit:
                raise _Refused(f"a tag at line {line}")
            self.depth += 1
            if self.depth > max_depth:
                raise _Refused(f"nesting deeper than {max_depth} levels")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if not isinstance(node, MappingNode):
                raise ConstructorError(None, None, "expected a mapping", node.start_mark)
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise _Refused(f"a merge key (<<) at line {key_node.start_mark.line + 1}")
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, str):
                    raise _Refused(
                        f"a key that is not a string at line {key_node.start_mark.line + 1}"
                    )
                if key in seen:
                    raise _Refused(
                        f"the key {key[:80]!r} appears twice in one mapping "
                        f"(line {key_node.start_mark.line + 1})"
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

        def construct_yaml_int(self, node: Any) -> Any:
            text = str(node.value)
            if len(text) > MAX_NUMBER_DIGITS:
                raise _Refused(f"a number of {len(text)} digits at line {node.start_mark.line + 1}")
            return super().construct_yaml_int(node)

        def construct_yaml_float(self, node: Any) -> Any:
            text = str(node.value)
            if len(text) > MAX_NUMBER_DIGITS:
                raise _Refused(f"a number of {len(text)} characters")
            value = super().construct_yaml_float(node)
            if not math.isfinite(value):
                raise _Refused(f"the number {text} at line {node.start_mark.line + 1}")
            return value

        def construct_yaml_timestamp(self, node: Any, values: Any = None) -> Any:
            return self.construct_scalar(node)  # a date stays the text it is

    StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)
    StrictLoader.add_constructor("tag:yaml.org,2002:float", StrictLoader.construct_yaml_float)
    StrictLoader.add_constructor(
        "tag:yaml.org,2002:timestamp", StrictLoader.construct_yaml_timestamp
    )
    return StrictLoader


def _yaml_problem(exc: Exception) -> str:
    """What a YAML parser found wrong and where (``expected ..., found ... at line 2,
    column 1``), without the parser's name for its input."""
    context = getattr(exc, "context", None)
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem is None:
        return " ".join(str(exc).split())[:200] or "invalid YAML"
    words = f"{context}: {problem}" if context else str(problem)
    if mark is not None:
        words += f" at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(words.replace("'<stream end>'", "the end of the file").split())[:200]


def load_yaml_untrusted(
    data: bytes | str,
    *,
    what: str,
    error: Callable[[str], GpuccError],
    max_depth: int = MAX_DEPTH,
    max_bytes: int | None = None,
) -> Any:
    """Parse ``data`` as one YAML document of plain data; on any failure raise ``error``.

    JSON is YAML, so a plan or policy written as JSON reads the same way (with YAML's
    rules: duplicate keys refused, no tags).
    """
    import yaml

    text = _text(data, what, error, max_bytes)
    loader = None
    try:
        # PyYAML checks every character while the loader is built (a NUL or another control
        # character raises there), so building it is inside the mapping of errors too
        loader = _strict_loader(max_depth)(text)
        doc = loader.get_single_data()
    except RecursionError:
        raise error(f"the {what} nests deeper than {max_depth} levels") from None
    except _Refused as exc:
        raise error(f"the {what} is not acceptable YAML: {exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"the {what} is not YAML: {_yaml_problem(exc)}") from None
    except ValueError as exc:
        raise error(f"the {what} is not YAML: {' '.join(str(exc).split())[:200]}") from None
    finally:
        if loader is not None:
            loader.dispose()
    fault = _tree_fault(doc, max_depth)
    if fault is not None:
        raise error(f"the {what} {fault}")
    return doc


def require_int(
    value: Any, where: str, *, lo: int, hi: int, error: Callable[[str], GpuccError]
) -> int:
    """``value`` if it is an integer in ``[lo, hi]``; booleans and floats are refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{where} must be an integer")
    if not lo <= value <= hi:
        raise error(f"{where} must be between {lo} and {hi}")
    return value
