"""A minimal, bounds-checked DER reader for the two FWID extension shapes.

cryptography hands unknown extensions over as raw DER bytes; the FWID sits in
a small fixed structure, so a few lines of strict TLV reading are clearer than
pulling in an ASN.1 library.
"""

from __future__ import annotations

from dataclasses import dataclass


class DerError(ValueError):
    """The bytes are not the DER structure expected."""


@dataclass(frozen=True)
class Tlv:
    """One DER element: tag byte, content bytes."""

    tag: int
    content: bytes


def read_all(data: bytes) -> list[Tlv]:
    """Split ``data`` into consecutive DER elements; it must be consumed exactly."""
    out: list[Tlv] = []
    pos = 0
    while pos < len(data):
        if pos + 2 > len(data):
            raise DerError("truncated DER header")
        tag = data[pos]
        if tag & 0x1F == 0x1F:
            raise DerError("multi-byte DER tags are not expected here")
        first = data[pos + 1]
        pos += 2
        if first < 0x80:
            length = first
        else:
            n = first & 0x7F
            if n == 0 or n > 4 or pos + n > len(data):
                raise DerError("bad DER length")
            length = int.from_bytes(data[pos : pos + n], "big")
            pos += n
        if pos + length > len(data):
            raise DerError("DER element runs past its container")
        out.append(Tlv(tag, data[pos : pos + length]))
        pos += length
    return out


def read_one(data: bytes, tag: int) -> bytes:
    """The content of the single element in ``data``, which must carry ``tag``."""
    items = read_all(data)
    if len(items) != 1 or items[0].tag != tag:
        raise DerError(f"expected one element with tag 0x{tag:02x}")
    return items[0].content


SEQUENCE = 0x30
OCTET_STRING = 0x04
OID = 0x06


def hopper_fwid(ext_value: bytes) -> bytes:
    """FWID from NVIDIA's Hopper structure under OID 2.23.133.5.4.1.

    ``SEQUENCE { INTEGER, SubjectPublicKeyInfo, SEQUENCE { OID, OCTET STRING } }``;
    the FWID is that final OCTET STRING.
    """
    outer = read_all(read_one(ext_value, SEQUENCE))
    if not outer or outer[-1].tag != SEQUENCE:
        raise DerError("FWID structure does not end in a digest SEQUENCE")
    digest = read_all(outer[-1].content)
    if len(digest) != 2 or digest[0].tag != OID or digest[1].tag != OCTET_STRING:
        raise DerError("FWID digest is not { OID, OCTET STRING }")
    return digest[1].content


def dice_tcbinfo_fwid(ext_value: bytes) -> bytes:
    """FWID from a TCG DICE TcbInfo (OID 2.23.133.5.4.1.1): ``fwids[0].digest``.

    ``fwids`` is the context-specific constructed field [6].
    """
    for item in read_all(read_one(ext_value, SEQUENCE)):
        if item.tag == 0xA6:
            fwids = read_all(item.content)
            if not fwids or fwids[0].tag != SEQUENCE:
                raise DerError("TcbInfo fwids is empty")
            pair = read_all(fwids[0].content)
            if len(pair) != 2 or pair[1].tag != OCTET_STRING:
                raise DerError("TcbInfo fwid is not { OID, OCTET STRING }")
            return pair[1].content
    raise DerError("TcbInfo has no fwids")
