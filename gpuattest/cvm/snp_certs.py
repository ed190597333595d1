"""The SEV-SNP certificate table a host hands its guests: where a guest finds its VCEK.

An SNP host may give each guest the certificates that endorse its reports (AMD GHCB
specification, "extended guest request"); on Linux the guest reads them as the ``auxblob`` of a
configfs-tsm report (:mod:`.tsm`). The table is a run of 24-byte entries, each a 16-byte GUID
naming the certificate, a 32-bit little-endian offset and a 32-bit little-endian length into the
same buffer, ended by an all-zero entry; the certificates (DER) follow the table.

Parsing is strict: every entry's bytes lie inside the buffer and after the table, no entry is
empty, no GUID appears twice, and the table ends with its terminator inside the buffer.
Anything else is :class:`MalformedCertTableError` (exit 4). GUIDs are read in RFC 4122 byte
order, as AMD's and the public SEV tooling's writers lay them out. Bytes after the
certificates (hosts pad the buffer to whole pages) are ignored, and so are zero bytes after a
complete DER certificate inside its entry.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field

from gpucc.core.errors import MalformedInputError

__all__ = [
    "ARK_GUID",
    "ASK_GUID",
    "CERT_TABLE_MAX",
    "VCEK_GUID",
    "VLEK_GUID",
    "endorsement_from_auxblob",
    "MalformedCertTableError",
    "SnpCertTable",
    "parse_snp_cert_table",
    "vcek_from_auxblob",
]

VCEK_GUID = uuid.UUID("63da758d-e664-4564-adc5-f4b93be8accd")
VLEK_GUID = uuid.UUID("a8074bc2-a25a-483e-aae6-39c045a0b8a1")
ASK_GUID = uuid.UUID("4ab7b379-bbac-4fe4-a02f-05aef327c782")
ARK_GUID = uuid.UUID("c0b406a4-a803-4952-9743-3fb6014cd0ae")

CERT_TABLE_MAX = 64 * 1024
"""The largest table accepted (the Linux guest driver's own buffer is smaller)."""

_ENTRY = struct.Struct("<16sII")
_MAX_ENTRIES = 64
_NIL = uuid.UUID(int=0)


class MalformedCertTableError(MalformedInputError):
    """The host's certificate table breaks its layout (bounds, terminator, duplicates)."""


@dataclass(frozen=True)
class SnpCertTable:
    """The certificates of one table, in table order, keyed by GUID.

    Attributes:
        entries: ``(guid, certificate bytes)`` pairs; GUIDs gpucc does not know are kept.
    """

    entries: tuple[tuple[uuid.UUID, bytes], ...] = field(repr=False)

    def get(self, guid: uuid.UUID) -> bytes | None:
        """The certificate stored under ``guid``, or None."""
        for key, data in self.entries:
            if key == guid:
                return data
        return None

    @property
    def guids(self) -> tuple[uuid.UUID, ...]:
        """The GUIDs present, in table order."""
        return tuple(key for key, _ in self.entries)

    @property
    def vcek(self) -> bytes | None:
        """The chip's VCEK certificate (DER), when the host supplied it."""
        return self.get(VCEK_GUID)

    @property
    def vlek(self) -> bytes | None:
        """A cloud provider's VLEK certificate (DER), when the host supplied one."""
        return self.get(VLEK_GUID)

    @property
    def ask(self) -> bytes | None:
        """AMD's ASK (DER), when the host supplied it; trust comes from the pinned one."""
        return self.get(ASK_GUID)

    @property
    def ark(self) -> bytes | None:
        """AMD's ARK (DER), when the host supplied it; trust comes from the pinned one."""
        return self.get(ARK_GUID)


def _der_end(data: bytes) -> int | None:
    """Where the DER element that starts ``data`` ends, or None when it is not one."""
    if len(data) < 2 or data[0] != 0x30:
        return None
    first = data[1]
    if first < 0x80:
        return 2 + first
    count = first & 0x7F
    if count == 0 or count > 4 or len(data) < 2 + count:
        return None
    return 2 + count + int.from_bytes(data[2 : 2 + count], "big")


def _unpad(data: bytes) -> bytes:
    """``data`` without zero bytes after a complete DER element; otherwise unchanged."""
    end = _der_end(data)
    if end is not None and end < len(data) and not any(data[end:]):
        return data[:end]
    return data


def parse_snp_cert_table(data: bytes) -> SnpCertTable:
    """Parse a host's certificate table (see the module docstring for the rules).

    An empty buffer is an empty table (the host supplied no certificates).

    Raises:
        MalformedCertTableError: the table breaks its layout (exit 4).
    """
    if len(data) > CERT_TABLE_MAX:
        raise MalformedCertTableError(
            f"SEV-SNP certificate table is {len(data)} bytes, more than {CERT_TABLE_MAX}"
        )
    if not data:
        return SnpCertTable(())
    raw: list[tuple[uuid.UUID, int, int]] = []
    pos = 0
    while True:
        if pos + _ENTRY.size > len(data):
            raise MalformedCertTableError(
                f"SEV-SNP certificate table has no terminating all-zero entry within its "
                f"{len(data)} bytes"
            )
        guid_bytes, offset, length = _ENTRY.unpack_from(data, pos)
        pos += _ENTRY.size
        guid = uuid.UUID(bytes=bytes(guid_bytes))
        if guid == _NIL:
            if offset or length:
                raise MalformedCertTableError(
                    f"SEV-SNP certificate table entry {len(raw)} has a zero GUID but a "
                    f"non-zero offset or length"
                )
            break
        if len(raw) == _MAX_ENTRIES:
            raise MalformedCertTableError(
                f"SEV-SNP certificate table has more than {_MAX_ENTRIES} entries"
            )
        raw.append((guid, offset, length))
    table_end = pos
    entries: list[tuple[uuid.UUID, bytes]] = []
    seen: set[uuid.UUID] = set()
    for index, (guid, offset, length) in enumerate(raw):
        where = f"SEV-SNP certificate table entry {index} ({guid})"
        if guid in seen:
            raise MalformedCertTableError(f"{where} repeats a GUID")
        seen.add(guid)
        if length == 0:
            raise MalformedCertTableError(f"{where} is empty")
        if offset < table_end:
            raise MalformedCertTableError(
                f"{where} starts at {offset}, inside the table (which ends at {table_end})"
            )
        if offset + length > len(data):
            raise MalformedCertTableError(
                f"{where} ends at {offset + length}, past the {len(data)}-byte buffer"
            )
        entries.append((guid, _unpad(data[offset : offset + length])))
    return SnpCertTable(tuple(entries))


def vcek_from_auxblob(auxblob: bytes) -> bytes | None:
    """The VCEK certificate in an SEV-SNP configfs-tsm ``auxblob``, or None when absent.

    The bytes are returned as the host stored them (DER, less any zero padding after it);
    :func:`~.snp.verify_snp_report` parses and checks them.

    Raises:
        MalformedCertTableError: the table breaks its layout (exit 4).
    """
    return parse_snp_cert_table(auxblob).vcek


def endorsement_from_auxblob(auxblob: bytes, report: bytes) -> bytes | None:
    """The certificate that endorses ``report`` in an SEV-SNP ``auxblob``: the VLEK when the
    report's SIGNING_KEY says VLEK, the VCEK otherwise; None when the host did not supply it.

    Raises:
        MalformedCertTableError: the table breaks its layout (exit 4).
    """
    table = parse_snp_cert_table(auxblob)
    vlek = len(report) > 0x48 and (report[0x48] >> 2) & 0x7 == 1
    return table.vlek if vlek else table.vcek
