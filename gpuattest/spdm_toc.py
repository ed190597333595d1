"""The SPDM table of contents some NVIDIA reports carry in measurement block 0xFD (Rubin).

The block's value is CBOR: a tagged map (tag 570) whose key 0 lists evidence
environments (tag 571 each holding ``[environment, [measurement, ...]]`` pairs), key 1
the locators of the device's reference values (URIs, tag 32) and key 2 the evidence
profile (a tag-32 URI). An environment is named by a class ID (an OID, tag 111); each of
its measurements has an optional key (``"purpose"``, ``"BRP"``, ...) and a value map:
``{12: {0: [block index, ...]}}`` points at raw measurement blocks of the same report,
``{11: text}`` is a text value (the purpose, ``CC MPT``), ``{1: tag 552 n}`` an SVN and
``{4: tag 560 bytes}`` raw bytes.

The table is signed with the rest of the report, so what it says (the purpose, the
locators) may be relied on once the signature verifies. :func:`parse_toc` returns a
:class:`SpdmToc` value with the measurement values it points at, keyed by block index.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpucc.core.errors import MalformedReportError, UnsupportedFormatError

from ._internal.cbor import CborError, Tag, decode
from .report import MeasurementBlock

__all__ = ["TOC_BLOCK_INDEX", "SpdmToc", "TocEnvironment", "TocMeasurement", "parse_toc"]

#: The measurement block that holds the table of contents.
TOC_BLOCK_INDEX = 0xFD
_TOC_TAG = 570
_ENVIRONMENTS_TAG = 571
_OID_TAG = 111
_URI_TAG = 32
_SVN_TAG = 552
_RAW_TAG = 560
MAX_TOC_BYTES = 16 * 1024


@dataclass(frozen=True)
class TocMeasurement:
    """One measurement of an environment: where its value is, or the value itself."""

    key: str | None
    block_indices: tuple[int, ...] = ()
    text: str | None = None
    svn: int | None = None
    raw: bytes | None = None


@dataclass(frozen=True)
class TocEnvironment:
    """An evidence environment: its class ID (dotted OID) and its measurements."""

    class_id: str
    measurements: tuple[TocMeasurement, ...]


@dataclass(frozen=True)
class SpdmToc:
    """A decoded table of contents.

    Attributes:
        profile: the evidence profile URI (``tag:nvidia.com,2026:evidence/spdm/...``).
        environments: every evidence environment, in table order.
        purpose: the signed purpose (``CC MPT``, ``CC SPT``...), None when absent.
        rim_locators: where the device's reference values are published.
        values: block index to the raw measurement value for every block the table names.
    """

    profile: str | None
    environments: tuple[TocEnvironment, ...]
    purpose: str | None
    rim_locators: tuple[str, ...]
    values: Mapping[int, bytes] = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (values in hex)."""
        return {
            "profile": self.profile,
            "purpose": self.purpose,
            "rim_locators": list(self.rim_locators),
            "environments": [
                {
                    "class_id": env.class_id,
                    "measurements": [
                        {
                            "key": m.key,
                            "blocks": list(m.block_indices),
                            "text": m.text,
                            "svn": m.svn,
                            "raw": m.raw.hex() if m.raw is not None else None,
                        }
                        for m in env.measurements
                    ],
                }
                for env in self.environments
            ],
            "values": {str(i): v.hex() for i, v in sorted(self.values.items())},
        }


def _bad(what: str) -> MalformedReportError:
    return MalformedReportError(f"block 0xFD table of contents: {what}")


def _oid(raw: bytes) -> str:
    """Dotted form of DER OID content octets."""
    if not raw or raw[-1] & 0x80:
        raise _bad("an environment class ID is not an OID")
    arcs: list[int] = []
    value = 0
    for i, byte in enumerate(raw):
        if value == 0 and byte == 0x80:
            raise _bad("an environment class ID is not minimally encoded")
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            if not arcs:
                first = min(value // 40, 2)
                arcs += [first, value - 40 * first]
            else:
                arcs.append(value)
            value = 0
        if i > 64:
            raise _bad("an environment class ID is too long")
    return ".".join(map(str, arcs))


def _tagged(value: Any, number: int, kind: type, what: str) -> Any:
    if not isinstance(value, Tag) or value.number != number or not isinstance(value.value, kind):
        raise _bad(f"{what} is not a tag-{number} {kind.__name__}")
    return value.value


def _measurement(item: Any) -> TocMeasurement:
    if not isinstance(item, dict) or not isinstance(item.get(1), dict):
        raise _bad("a measurement is not a map with a value map")
    key = item.get(0)
    if key is not None and not isinstance(key, str):
        raise _bad("a measurement key is not text")
    mval: dict[Any, Any] = item[1]
    blocks: tuple[int, ...] = ()
    if 12 in mval:
        where = mval[12]
        indices = where.get(0) if isinstance(where, dict) else None
        if not isinstance(indices, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= 0xFE for i in indices
        ):
            raise _bad("a measurement's block list is not a list of block indices")
        blocks = tuple(indices)
    text = mval.get(11)
    if text is not None and not isinstance(text, str):
        raise _bad("a text value is not text")
    svn = _tagged(mval[1], _SVN_TAG, int, "an SVN") if 1 in mval else None
    if isinstance(svn, bool) or (svn is not None and svn < 0):
        raise _bad("an SVN is not a non-negative integer")
    raw = _tagged(mval[4], _RAW_TAG, bytes, "a raw value") if 4 in mval else None
    return TocMeasurement(key=key, block_indices=blocks, text=text, svn=svn, raw=raw)


def _environment(pair: Any) -> TocEnvironment:
    if not isinstance(pair, list) or len(pair) != 2:
        raise _bad("an environment entry is not an [environment, measurements] pair")
    env, measurements = pair
    cls = env.get(0) if isinstance(env, dict) else None
    class_id = cls.get(0) if isinstance(cls, dict) else None
    if not isinstance(measurements, list):
        raise _bad("an environment's measurements are not a list")
    return TocEnvironment(
        class_id=_oid(_tagged(class_id, _OID_TAG, bytes, "an environment class ID")),
        measurements=tuple(_measurement(m) for m in measurements),
    )


def parse_toc(raw: bytes, blocks: Mapping[int, MeasurementBlock]) -> SpdmToc:
    """Decode block 0xFD's value and collect the raw values of the blocks it names.

    Raises:
        UnsupportedFormatError: the block holds CBOR that is not a table of contents of
            the kind gpucc reads (another tag).
        MalformedReportError: not CBOR, a table that breaks its shape, or a named block
            the report lacks.
    """
    if len(raw) > MAX_TOC_BYTES:
        raise _bad(f"{len(raw)} bytes, more than {MAX_TOC_BYTES}")
    try:
        doc = decode(raw)
    except CborError as exc:
        raise _bad(f"not CBOR: {exc}") from None
    if not isinstance(doc, Tag) or doc.number != _TOC_TAG:
        number = doc.number if isinstance(doc, Tag) else None
        raise UnsupportedFormatError(
            f"measurement block 0xFD holds a structure gpucc does not read (CBOR tag {number}; "
            f"the table of contents gpucc reads is tag {_TOC_TAG})"
        )
    body = doc.value
    if not isinstance(body, dict) or not isinstance(body.get(0), list):
        raise _bad("no list of evidence environments")
    environments: list[TocEnvironment] = []
    for group in body[0]:
        triples = _tagged(group, _ENVIRONMENTS_TAG, dict, "an environment group")
        inner = triples.get(0)
        pairs = inner.get(0) if isinstance(inner, dict) else None
        if not isinstance(pairs, list):
            raise _bad("an environment group holds no list of environments")
        environments += [_environment(p) for p in pairs]
    locators: list[str] = []
    for loc in body.get(1, []) if isinstance(body.get(1, []), list) else [None]:
        uri = loc.get(0) if isinstance(loc, dict) else None
        locators.append(_tagged(uri, _URI_TAG, str, "a RIM locator"))
    profile = _tagged(body[2], _URI_TAG, str, "the profile") if 2 in body else None
    purposes = [
        m.text
        for env in environments
        for m in env.measurements
        if m.key == "purpose" and m.text is not None
    ]
    if len(set(purposes)) > 1:
        raise _bad(f"it names more than one purpose ({', '.join(sorted(set(purposes)))})")
    values: dict[int, bytes] = {}
    for env in environments:
        for m in env.measurements:
            for index in m.block_indices:
                block = blocks.get(index)
                if block is None:
                    raise _bad(f"it names block {index}, which the report lacks")
                values[index] = block.value
    return SpdmToc(
        profile=profile,
        environments=tuple(environments),
        purpose=purposes[0] if purposes else None,
        rim_locators=tuple(locators),
        values=MappingProxyType(values),
    )
