"""A strict, bounded CBOR (RFC 8949) decoder for the small signed structures in device
evidence (an SPDM table of contents).

Definite and indefinite lengths, every major type; tags come back as :class:`Tag`,
floats as Python floats, simple values 20-23 as False/True/None/:data:`UNDEFINED`. Every
length is checked against the bytes left before anything is allocated, nesting is
limited, map keys must be hashable and unique, and the data must end exactly where the
item ends. Any violation raises :class:`CborError` (a ValueError, so callers map it to
their own typed error).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

__all__ = ["UNDEFINED", "CborError", "Tag", "decode"]

MAX_DEPTH = 32


class CborError(ValueError):
    """The bytes are not one well-formed CBOR item (within gpucc's bounds)."""


@dataclass(frozen=True)
class Tag:
    """A tagged item (tag number, content)."""

    number: int
    value: Any


class _Undefined:
    def __repr__(self) -> str:
        return "undefined"


UNDEFINED = _Undefined()
_BREAK = object()


class _Decoder:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or n > len(self.data) - self.pos:
            raise CborError(
                f"CBOR item needs {n} bytes at offset {self.pos}, {len(self.data) - self.pos} left"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def argument(self, info: int) -> int | None:
        """The head's argument; None for the indefinite-length marker (31)."""
        if info < 24:
            return info
        if info in (24, 25, 26, 27):
            return int.from_bytes(self.take(1 << (info - 24)), "big")
        if info == 31:
            return None
        raise CborError(f"reserved CBOR additional information {info} at offset {self.pos - 1}")

    def item(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise CborError(f"CBOR nesting deeper than {MAX_DEPTH}")
        head = self.take(1)[0]
        major, info = head >> 5, head & 0x1F
        if major == 7:
            return self._simple(info)
        arg = self.argument(info)
        if major == 0:
            return self._definite(arg, "an unsigned integer")
        if major == 1:
            return -1 - self._definite(arg, "a negative integer")
        if major in (2, 3):
            return self._string(major, arg, depth)
        if major == 4:
            return self._array(arg, depth)
        if major == 5:
            return self._map(arg, depth)
        return Tag(self._definite(arg, "a tag"), self._value(depth + 1))

    def _definite(self, arg: int | None, what: str) -> int:
        if arg is None:
            raise CborError(f"{what} cannot have an indefinite length")
        return arg

    def _value(self, depth: int) -> Any:
        value = self.item(depth)
        if value is _BREAK:
            raise CborError("unexpected CBOR break")
        return value

    def _simple(self, info: int) -> Any:
        if info == 20:
            return False
        if info == 21:
            return True
        if info == 22:
            return None
        if info == 23:
            return UNDEFINED
        if info == 25:
            return float(struct.unpack(">e", self.take(2))[0])
        if info == 26:
            return float(struct.unpack(">f", self.take(4))[0])
        if info == 27:
            return float(struct.unpack(">d", self.take(8))[0])
        if info == 31:
            return _BREAK
        raise CborError(f"unsupported CBOR simple value {info}")

    def _string(self, major: int, arg: int | None, depth: int) -> bytes | str:
        if arg is not None:
            raw = self.take(arg)
        else:
            parts: list[bytes] = []
            while True:
                head = self.take(1)[0]
                if head == 0xFF:
                    break
                if head >> 5 != major:
                    raise CborError("an indefinite string holds a chunk of another type")
                parts.append(self.take(self._definite(self.argument(head & 0x1F), "a chunk")))
            raw = b"".join(parts)
        if major == 2:
            return raw
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CborError("a CBOR text string is not UTF-8") from None

    def _array(self, arg: int | None, depth: int) -> list[Any]:
        out: list[Any] = []
        if arg is None:
            while (value := self.item(depth + 1)) is not _BREAK:
                out.append(value)
            return out
        if arg > len(self.data) - self.pos:  # every item takes at least one byte
            raise CborError(f"a CBOR array of {arg} items runs past the data")
        for _ in range(arg):
            out.append(self._value(depth + 1))
        return out

    def _map(self, arg: int | None, depth: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        if arg is not None and 2 * arg > len(self.data) - self.pos:
            raise CborError(f"a CBOR map of {arg} pairs runs past the data")
        n = 0
        while arg is None or n < arg:
            key = self.item(depth + 1) if arg is None else self._value(depth + 1)
            if key is _BREAK:
                break
            try:
                hash(key)
            except TypeError:
                raise CborError("a CBOR map key is not a scalar") from None
            if key in out:
                raise CborError(f"CBOR map key {key!r} appears twice")
            out[key] = self._value(depth + 1)
            n += 1
        return out


def decode(data: bytes) -> Any:
    """Decode exactly one CBOR item.

    Raises:
        CborError: malformed, too deep, or bytes left after the item.
    """
    dec = _Decoder(bytes(data))
    value = dec._value(0)
    if dec.pos != len(dec.data):
        raise CborError(f"{len(dec.data) - dec.pos} bytes after the CBOR item")
    return value
