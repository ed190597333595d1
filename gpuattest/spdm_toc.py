"""The SPDM table of contents some NVIDIA reports carry in measurement block 0xFD (Rubin).

The block's value is CBOR: ``#6.570({0: [+ #6.571(concise-evidence)], ? 1: [locators],
? 2: profile})``. Each concise evidence holds evidence triples ``[environment,
[measurement, ...]]`` in the CoRIM vocabulary: an environment is named by its class (an OID,
tag 111, in NVIDIA's tables); each measurement has an optional key (``"purpose"``,
``"BRP"``, ...) and a value map: ``{12: {0: [block index, ...]}}`` points at measurement
blocks of the same report, ``{11: text}`` is a name (the purpose, ``CC MPT``), ``{1: tag
552 n}`` an SVN and ``{4: tag 560 bytes}`` raw bytes. Key 1 lists the locators of the
device's reference values (URIs, tag 32), key 2 the evidence profile (a tag-32 URI).

The bytes are read by the one strict CBOR reader (:mod:`gpuattest.cbor_strict`) and the
environments and values by the CoRIM reader's own functions (:mod:`gpuattest.corim`), so a
table and a CoRIM can never disagree on what a value means. The table is signed with the
rest of the report, so what it says (the purpose, the locators) may be relied on once the
signature verifies. :func:`parse_toc` returns a :class:`SpdmToc` value with the measurement
values it points at, keyed by block index.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from cbor2 import CBORTag

from gpucc.core.errors import MalformedInputError, MalformedReportError, UnsupportedFormatError

from .cbor_strict import CborLimits, decode_strict
from .corim import (
    CORIM_TAGS,
    TAG_CONCISE_EVIDENCE,
    TAG_CONCISE_EVIDENCE_TOC,
    TAG_URI,
    Environment,
    Measurement,
    environment_of,
    measurements_of,
)

__all__ = [
    "MAX_TOC_BYTES",
    "PURPOSE_KEY",
    "TOC_BLOCK_INDEX",
    "SpdmBlock",
    "SpdmToc",
    "TocEnvironment",
    "parse_toc",
]

#: The measurement block that holds the table of contents.
TOC_BLOCK_INDEX = 0xFD
#: The measurement key under which an environment names the evidence's purpose.
PURPOSE_KEY = "purpose"
MAX_TOC_BYTES = 16 * 1024
_LIMITS = CborLimits(max_bytes=MAX_TOC_BYTES, max_depth=16, max_items=512, max_string=4096)


class SpdmBlock(Protocol):
    """What is read of one SPDM measurement block (the report module's blocks fit)."""

    @property
    def value_type(self) -> int: ...

    @property
    def value(self) -> bytes: ...


@dataclass(frozen=True)
class TocEnvironment:
    """An evidence environment and its measurements (CoRIM values; block indirections in
    ``values.indices``)."""

    environment: Environment
    measurements: tuple[Measurement, ...]

    @property
    def class_id(self) -> str:
        """The environment's class ID without its ``oid:`` prefix ("" when it has none)."""
        return (self.environment.class_id or "").removeprefix("oid:")


@dataclass(frozen=True)
class SpdmToc:
    """A decoded table of contents.

    Attributes:
        profile: the evidence profile URI (``tag:nvidia.com,2026:evidence/spdm/...``).
        environments: every evidence environment, in table order.
        purpose: the signed purpose (``CC MPT``, ``CC SPT``...), None when absent.
        purpose_environment: the environment that names it.
        rim_locators: where the device's reference values are published.
        values: block index to the raw measurement value for every block the table names.
    """

    profile: str | None
    environments: tuple[TocEnvironment, ...]
    purpose: str | None
    rim_locators: tuple[str, ...]
    values: Mapping[int, bytes] = field(repr=False)
    purpose_environment: Environment | None = None

    @property
    def rim_ids(self) -> tuple[str, ...]:
        """The last path segment of each locator: the ID NVIDIA's RIM service serves it by."""
        return tuple(loc.rstrip("/").rsplit("/", 1)[-1] for loc in self.rim_locators)

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
                            "blocks": list(m.values.indices),
                            "text": m.values.name,
                            "svn": m.values.svn.value if m.values.svn is not None else None,
                            "raw": m.values.raw.value.hex() if m.values.raw is not None else None,
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


def _tagged(value: Any, number: int, what: str) -> Any:
    if not isinstance(value, CBORTag) or value.tag != number:
        raise _bad(f"{what} is not tag {number}")
    return value.value


def _environments(body: Mapping[Any, Any]) -> list[TocEnvironment]:
    groups = body.get(0)
    if not isinstance(groups, tuple) or not groups:
        raise _bad("no list of evidence environments")
    out: list[TocEnvironment] = []
    for n, group in enumerate(groups):
        evidence = _tagged(group, TAG_CONCISE_EVIDENCE, f"concise evidence {n}")
        triples_map = evidence.get(0) if isinstance(evidence, Mapping) else None
        triples = triples_map.get(0) if isinstance(triples_map, Mapping) else None
        if not isinstance(triples, tuple):
            raise _bad(f"concise evidence {n} holds no list of environments")
        for i, triple in enumerate(triples):
            if not isinstance(triple, tuple) or len(triple) != 2:
                raise _bad(f"environment {i} is not an [environment, measurements] pair")
            out.append(
                TocEnvironment(
                    environment_of(triple[0], f"environment {i}"),
                    measurements_of(triple[1], f"environment {i} measurement", reference=False),
                )
            )
    return out


def parse_toc(raw: bytes, blocks: Mapping[int, SpdmBlock]) -> SpdmToc:
    """Decode block 0xFD's value and collect the raw values of the blocks it names.

    Raises:
        UnsupportedFormatError: the block holds CBOR that is not a table of contents of
            the kind gpucc reads (another tag).
        MalformedReportError: not CBOR under the strict reader's rules, a table that breaks
            its shape, two purposes, or a named block the report lacks.
    """
    try:
        doc = decode_strict(raw, what="CBOR", allowed_tags=CORIM_TAGS, limits=_LIMITS)
    except MalformedInputError as exc:
        raise _bad(str(exc)) from None
    if not isinstance(doc, CBORTag) or doc.tag != TAG_CONCISE_EVIDENCE_TOC:
        number = doc.tag if isinstance(doc, CBORTag) else None
        raise UnsupportedFormatError(
            f"measurement block 0xFD holds a structure gpucc does not read (CBOR tag {number}; "
            f"the table of contents gpucc reads is tag {TAG_CONCISE_EVIDENCE_TOC})"
        )
    body = doc.value
    if not isinstance(body, Mapping):
        raise _bad("the table is not a map")
    try:
        environments = _environments(body)
    except MalformedReportError:
        raise
    except MalformedInputError as exc:
        raise _bad(str(exc)) from None
    listed = body.get(1, ())
    if not isinstance(listed, tuple):
        raise _bad("the RIM locators are not a list")
    locators: list[str] = []
    for loc in listed:
        uri = loc.get(0) if isinstance(loc, Mapping) else None
        text = _tagged(uri, TAG_URI, "a RIM locator")
        if not isinstance(text, str):
            raise _bad("a RIM locator is not text")
        locators.append(text)
    profile = _tagged(body[2], TAG_URI, "the profile") if 2 in body else None
    if profile is not None and not isinstance(profile, str):
        raise _bad("the profile is not text")
    named = [
        (env.environment, m.values.name)
        for env in environments
        for m in env.measurements
        if m.key == PURPOSE_KEY and m.values.name is not None
    ]
    if len(named) > 1:
        raise _bad(f"it names more than one purpose ({', '.join(sorted(n for _, n in named))})")
    values: dict[int, bytes] = {}
    for env in environments:
        for m in env.measurements:
            if m.values.indices and not m.values.empty:
                raise _bad(f"{env.environment} holds both values and a block indirection")
            for index in m.values.indices:
                block = blocks.get(index)
                if block is None:
                    raise _bad(f"it names block {index}, which the report lacks")
                values[index] = block.value
    return SpdmToc(
        profile=profile,
        environments=tuple(environments),
        purpose=named[0][1] if named else None,
        rim_locators=tuple(locators),
        values=MappingProxyType(values),
        purpose_environment=named[0][0] if named else None,
    )
