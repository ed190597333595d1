"""The one reader for untrusted CBOR: cbor2 underneath, gpucc's strictness on top.

CBOR reference values (CoRIMs, COSE envelopes, an SPDM table of contents) reach gpucc from
files and services it does not trust. :func:`decode_strict` reads them with ``cbor2`` (a
maintained codec) after a walk over the encoded items that enforces, without recursion:

* the input is at most ``limits.max_bytes`` long and holds exactly one item: nothing follows
  it (``cbor2`` alone stops after the first item and ignores the rest);
* no indefinite-length strings, arrays or maps; nesting at most ``limits.max_depth``;
  arrays and maps of at most ``limits.max_items`` entries, strings of at most
  ``limits.max_string`` bytes;
* map keys are integers or text strings, never given twice in one map (checked on the
  encoded key, then again by ``cbor2``'s own duplicate-key refusal);
* tags only from the caller's allowed set: ``cbor2`` would otherwise turn tags 28/29
  into shared references (cycles), 2/3 into big integers and 258 into sets; tag 1
  (epoch time) must hold an integer (a float validity is refused by name);
* no floating-point numbers and no simple values but ``false``, ``true`` and ``null``.

Every failure is one :class:`StrictCborError` (or the caller's subclass of
:class:`~gpucc.core.errors.MalformedInputError`) naming what was wrong, never a
``cbor2`` exception, ``RecursionError`` or ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import dataclass
from typing import Any

import cbor2

from gpucc.core.errors import MalformedInputError

__all__ = [
    "DEFAULT_LIMITS",
    "EPOCH_TIME_TAG",
    "CborLimits",
    "StrictCborError",
    "decode_strict",
]

#: RFC 8949 tag 1: epoch-based date/time.
EPOCH_TIME_TAG = 1


class StrictCborError(MalformedInputError):
    """CBOR data breaks the strict reader's rules (module docstring) or is not CBOR."""


@dataclass(frozen=True)
class CborLimits:
    """Bounds for one strict decode.

    Attributes:
        max_bytes: the longest input accepted.
        max_depth: the deepest nesting of arrays, maps and tags.
        max_items: the most entries of one array or map.
        max_string: the longest byte or text string.
    """

    max_bytes: int = 1 << 20
    max_depth: int = 24
    max_items: int = 4096
    max_string: int = 64 * 1024


DEFAULT_LIMITS = CborLimits()

_ErrorType = Callable[[str], MalformedInputError]


class _Walk:
    """A stack-based pass over the encoded items (no recursion, every rule checked)."""

    def __init__(
        self, data: bytes, what: str, tags: Set[int], limits: CborLimits, error: _ErrorType
    ) -> None:
        self.data, self.what, self.tags, self.limits, self.error = data, what, tags, limits, error
        self.pos = 0

    def fail(self, detail: str) -> MalformedInputError:
        return self.error(f"{self.what}: {detail} (at byte {self.pos})")

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise self.fail("truncated")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def head(self) -> tuple[int, int, int]:
        """(major type, additional information, argument) of the next item."""
        start = self._take(1)[0]
        major, info = start >> 5, start & 0x1F
        if info < 24:
            return major, info, info
        if info in (24, 25, 26, 27):
            size = 1 << (info - 24)
            return major, info, int.from_bytes(self._take(size), "big")
        if info == 31:
            raise self.fail("indefinite-length items are not accepted")
        raise self.fail(f"reserved additional information {info}")

    def run(self) -> None:
        # Each stack entry: remaining child items of an open container, its depth, and for a
        # map the set of encoded keys seen (None for arrays and tags).
        stack: list[tuple[int, int, set[bytes] | None, bool]] = []
        pending_tag_one = False
        remaining, depth = 1, 0
        keys: set[bytes] | None = None
        expect_key = False
        while True:
            while remaining == 0:
                if not stack:
                    if self.pos != len(self.data):
                        raise self.fail(
                            f"{len(self.data) - self.pos} trailing bytes after the item"
                        )
                    return
                remaining, depth, keys, expect_key = stack.pop()
            remaining -= 1
            is_key = keys is not None and expect_key
            if keys is not None:
                expect_key = not expect_key
            start = self.pos
            major, info, arg = self.head()
            if pending_tag_one:
                pending_tag_one = False
                if major not in (0, 1):
                    raise self.fail(
                        "an epoch time (tag 1) must be an integer number of seconds, not a "
                        "float or other value"
                    )
            if is_key and major not in (0, 1, 3):
                raise self.fail("map keys must be integers or text strings")
            if major in (0, 1):
                pass
            elif major in (2, 3):
                if arg > self.limits.max_string:
                    raise self.fail(
                        f"a string of {arg} bytes is longer than {self.limits.max_string}"
                    )
                self._take(arg)
            elif major in (4, 5):
                if arg > self.limits.max_items:
                    raise self.fail(
                        f"a container of {arg} entries has more than {self.limits.max_items}"
                    )
                if depth + 1 > self.limits.max_depth:
                    raise self.fail(f"nesting deeper than {self.limits.max_depth}")
                stack.append((remaining, depth, keys, expect_key))
                remaining = arg if major == 4 else 2 * arg
                depth += 1
                keys = set() if major == 5 else None
                expect_key = major == 5
                if remaining == 0:
                    continue
                continue
            elif major == 6:
                if arg not in self.tags:
                    raise self.fail(f"tag {arg} is not accepted here")
                if depth + 1 > self.limits.max_depth:
                    raise self.fail(f"nesting deeper than {self.limits.max_depth}")
                stack.append((remaining, depth, keys, expect_key))
                remaining, depth, keys, expect_key = 1, depth + 1, None, False
                pending_tag_one = arg == EPOCH_TIME_TAG
                continue
            else:
                if info in (25, 26, 27):
                    raise self.fail("floating-point numbers are not accepted")
                if arg not in (20, 21, 22):
                    raise self.fail(f"simple value {arg} is not accepted")
            if is_key and keys is not None:
                encoded = self.data[start : self.pos]
                if encoded in keys:
                    raise self.fail("a map key is given twice")
                keys.add(encoded)


def decode_strict(
    data: bytes,
    *,
    what: str,
    allowed_tags: Set[int] = frozenset(),
    limits: CborLimits = DEFAULT_LIMITS,
    error: _ErrorType = StrictCborError,
) -> Any:
    """Decode one CBOR item under the module's rules.

    Tags come back as ``cbor2.CBORTag`` (tag 1 as a timezone-aware ``datetime``), maps as
    (immutable) dicts keyed by ``int`` or ``str``, arrays as tuples.

    Args:
        data: the encoded item.
        what: names the input in messages ("CoRIM", "COSE protected header").
        allowed_tags: the tag numbers that may appear.
        limits: the bounds.
        error: the malformed-input class to raise.

    Raises:
        StrictCborError: (or ``error``) any rule broken, or data that is not CBOR.
    """
    if not isinstance(data, bytes | bytearray):
        raise error(f"{what} is not a byte string")
    if len(data) > limits.max_bytes:
        raise error(f"{what} is {len(data)} bytes, more than {limits.max_bytes}")
    if not data:
        raise error(f"{what} is empty")
    data = bytes(data)
    _Walk(data, what, allowed_tags, limits, error).run()
    try:
        value = cbor2.loads(
            data,
            max_depth=limits.max_depth + 2,
            allow_indefinite=False,
            allow_duplicate_keys=False,
            str_errors="strict",
            immutable=True,
        )
    except (cbor2.CBORError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise error(f"{what} is not valid CBOR: {' '.join(str(exc).split())[:200]}") from None
    return value
