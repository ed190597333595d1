"""NVIDIA's CMW evidence files (the verifier-input profile of a Conceptual Message Wrapper
collection, RFC 9781's JSON form).

A CMW evidence file is a JSON object whose ``"__cmwc_t"`` names NVIDIA's verifier-input
profile (``tag:nvidia.com,2026:verifier-input/...``). Its other keys are items: an
optional top-level ``nonce``, and one evidence item per device (``gpu_0``,
``switch_0``...), itself a collection (``"__cmwc_t": "tag:nvidia.com,2026:evidence-item/v1"``)
of ``[media type, base64url value]`` records:

* ``evidence``: ``application/vnd.nvidia.spdm-measurement-transcript`` (the report);
* ``certificate``: ``application/vnd.nvidia.pem-cert-chain``;
* ``nonce``: ``application/octet-stream``, 32 bytes;
* ``hints``: ``application/json``, unsigned hints (``{"fwversion": ...}``).

Hints are not signed: gpucc keeps them only to choose which reference values to look up,
never to decide anything, and the result says so. This module reads and writes the
container (:class:`CmwItem` values); :func:`gpuattest.evidence.load_cmw` turns the items
into evidence, reading each device's architecture from its leaf certificate as for a raw
report.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpucc.core.errors import MalformedEvidenceError, UnsupportedFormatError
from gpucc.core.jsonio import loads_untrusted

__all__ = [
    "CMW_PROFILE",
    "CmwItem",
    "is_cmw",
    "read_cmw",
    "write_cmw",
]

MAX_ITEMS = 64


@dataclass(frozen=True)
class CmwItem:
    """One device's evidence item: its key in the collection (``gpu_0``), the report, the
    PEM chain, the nonce (the item's, else the collection's) and the unsigned hints."""

    name: str
    report: bytes = field(repr=False)
    chain: bytes = field(repr=False)
    nonce: bytes | None = None
    hints: Mapping[str, str] | None = None


#: The collection type of NVIDIA's verifier input, and of one device's evidence item.
CMW_PROFILE = "tag:nvidia.com,2026:verifier-input/profiles/base/pre-1.0.0"
_PROFILE_PREFIX = "tag:nvidia.com,2026:verifier-input/"
ITEM_TYPE = "tag:nvidia.com,2026:evidence-item/v1"
REPORT_MEDIA = "application/vnd.nvidia.spdm-measurement-transcript"
CHAIN_MEDIA = "application/vnd.nvidia.pem-cert-chain"
NONCE_MEDIA = "application/octet-stream"
HINTS_MEDIA = "application/json"
_MAX_HINTS = 4096
_RECORDS = {
    "evidence": REPORT_MEDIA,
    "certificate": CHAIN_MEDIA,
    "nonce": NONCE_MEDIA,
    "hints": HINTS_MEDIA,
}


def is_cmw(doc: Any) -> bool:
    """True for a JSON value that is a CMW collection (has ``"__cmwc_t"``)."""
    return isinstance(doc, dict) and "__cmwc_t" in doc


def _b64url(text: Any, what: str) -> bytes:
    if not isinstance(text, str) or not text.isascii():
        raise MalformedEvidenceError(f"CMW {what}: the value is not base64url text")
    stripped = text.rstrip("=")
    if any(c in "+/" for c in stripped):
        raise MalformedEvidenceError(f"CMW {what}: the value is base64, not base64url")
    try:
        return base64.urlsafe_b64decode(stripped + "=" * (-len(stripped) % 4))
    except (binascii.Error, ValueError):
        raise MalformedEvidenceError(f"CMW {what}: the value is not valid base64url") from None


def _record(item: Mapping[str, Any], key: str, where: str) -> bytes | None:
    value = item.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], str):
        raise MalformedEvidenceError(f"CMW {where}.{key} is not a [media type, value] record")
    media = value[0].split(";", 1)[0].strip().lower()
    if media != _RECORDS[key]:
        raise UnsupportedFormatError(
            f"CMW {where}.{key} has media type {value[0]!r}; gpucc reads {_RECORDS[key]!r}"
        )
    return _b64url(value[1], f"{where}.{key}")


def _nonce(raw: bytes | None, where: str) -> bytes | None:
    if raw is not None and len(raw) != 32:
        raise MalformedEvidenceError(f"CMW {where}.nonce is {len(raw)} bytes, not 32")
    return raw


def _hints(raw: bytes | None, where: str) -> Mapping[str, str] | None:
    if raw is None:
        return None
    if len(raw) > _MAX_HINTS:
        raise MalformedEvidenceError(f"CMW {where}.hints is larger than {_MAX_HINTS} bytes")
    doc = loads_untrusted(raw, what=f"CMW {where}.hints", error=MalformedEvidenceError)
    if not isinstance(doc, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in doc.items()
    ):
        raise MalformedEvidenceError(f"CMW {where}.hints is not an object of strings")
    return MappingProxyType(dict(doc))


def read_cmw(doc: Any) -> tuple[CmwItem, ...]:
    """The device items of a parsed CMW collection, in document order.

    Raises:
        UnsupportedFormatError: a collection type or media type gpucc does not read.
        MalformedEvidenceError: a record that breaks the shape, bad base64url, a nonce
            that is not 32 bytes, no device item, or an item without a report or chain.
    """
    if not is_cmw(doc):
        raise MalformedEvidenceError("not a CMW collection (no __cmwc_t)")
    kind = doc["__cmwc_t"]
    if not isinstance(kind, str) or not kind.startswith(_PROFILE_PREFIX):
        raise UnsupportedFormatError(
            f"CMW collection type {kind!r} is not NVIDIA's verifier input ({CMW_PROFILE})"
        )
    top_nonce = _nonce(_record(doc, "nonce", "collection"), "collection")
    items: list[CmwItem] = []
    for key, item in doc.items():
        if key in ("__cmwc_t", "nonce"):
            continue
        if not isinstance(item, dict) or item.get("__cmwc_t") != ITEM_TYPE:
            raise UnsupportedFormatError(
                f"CMW item {key!r} is not an evidence item of type {ITEM_TYPE}"
            )
        if len(items) >= MAX_ITEMS:
            raise MalformedEvidenceError(f"CMW evidence holds more than {MAX_ITEMS} items")
        unknown = sorted(set(item) - set(_RECORDS) - {"__cmwc_t"})
        if unknown:
            raise UnsupportedFormatError(
                f"CMW item {key!r} has records gpucc does not read: {', '.join(unknown)}"
            )
        report = _record(item, "evidence", key)
        chain = _record(item, "certificate", key)
        if report is None or chain is None:
            raise MalformedEvidenceError(f"CMW item {key!r} lacks its evidence or certificate")
        nonce = _nonce(_record(item, "nonce", key), key) or top_nonce
        if top_nonce is not None and nonce != top_nonce:
            raise MalformedEvidenceError(
                f"CMW item {key!r} carries a nonce other than the collection's"
            )
        hints = _hints(_record(item, "hints", key), key)
        items.append(CmwItem(name=key, report=report, chain=chain, nonce=nonce, hints=hints))
    if not items:
        raise MalformedEvidenceError("CMW evidence holds no device item")
    return tuple(items)


def read_cmw_bytes(data: bytes) -> tuple[CmwItem, ...]:
    """:func:`read_cmw` of JSON text.

    Raises:
        MalformedEvidenceError: not JSON; as :func:`read_cmw`.
    """
    return read_cmw(loads_untrusted(data, what="CMW evidence", error=MalformedEvidenceError))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def write_cmw(items: Sequence[CmwItem]) -> bytes:
    """NVIDIA's CMW verifier input for ``items`` (each with its report, chain and nonce;
    the collection's nonce too when every item has the same one). Hints are not written:
    gpucc's own evidence has none."""
    doc: dict[str, Any] = {"__cmwc_t": CMW_PROFILE}
    for item in items:
        entry: dict[str, Any] = {
            "__cmwc_t": ITEM_TYPE,
            "evidence": [REPORT_MEDIA, _b64(item.report)],
            "certificate": [CHAIN_MEDIA, _b64(item.chain)],
        }
        if item.nonce is not None:
            entry["nonce"] = [NONCE_MEDIA, _b64(item.nonce)]
        doc[item.name] = entry
    nonces = {item.nonce for item in items}
    if len(nonces) == 1:
        (nonce,) = nonces
        if nonce is not None:
            doc["nonce"] = [NONCE_MEDIA, _b64(nonce)]
    return (json.dumps(doc, indent=2) + "\n").encode()
