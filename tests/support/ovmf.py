"""A small synthetic OVMF image with the footer table and SEV-SNP metadata that QEMU and
sev-snp-measure read: a reset block, the SEV hashes table (for direct kernel boot) and the
SEV metadata sections (pre-validated memory, secrets, CPUID, the kernel hashes page)."""

from __future__ import annotations

import struct
import uuid
from pathlib import Path

_FOOTER = "96b582de-1fb2-45f7-baea-a366c55a082d"
_HASHES = "7255371f-3a3b-4b04-927b-1da6efa8d454"
_RESET = "00f771de-1a7e-4fcb-890e-68c77e2fb44e"
_METADATA = "dc886566-984a-4798-a75e-5585a7bf67cc"
_FOUR_GB = 1 << 32


def _entry(guid: str, data: bytes) -> bytes:
    return data + struct.pack("<H", len(data) + 18) + uuid.UUID(guid).bytes_le


def synthetic_ovmf(path: Path, *, size: int = 64 * 1024, seed: bytes = b"ovmf") -> Path:
    """Write a ``size``-byte image (a multiple of 4 KiB) whose code is filled from ``seed``."""
    base = _FOUR_GB - size
    body = bytearray((seed * (size // len(seed) + 1))[:size])
    # SEV metadata ("ASEV", version 1) at 4 KiB into the image; sections below the image.
    sections = [
        (0x800000, 0x9000, 1),  # SNP_SEC_MEM
        (0x809000, 0x1000, 2),  # SNP_SECRETS
        (0x80A000, 0x1000, 3),  # CPUID
        (0x80B000, 0x1000, 0x10),  # SNP_KERNEL_HASHES
    ]
    meta = b"ASEV" + struct.pack("<III", 16 + 12 * len(sections), 1, len(sections))
    meta += b"".join(struct.pack("<III", *s) for s in sections)
    meta_at = 0x1000
    body[meta_at : meta_at + len(meta)] = meta
    table = (
        _entry(_RESET, struct.pack("<I", base + 0x2000))
        + _entry(_HASHES, struct.pack("<II", 0x80B000 + 0x400, 0x400))
        + _entry(_METADATA, struct.pack("<I", size - meta_at))
    )
    footer = table + struct.pack("<H", len(table) + 18) + uuid.UUID(_FOOTER).bytes_le
    end = size - 32
    body[end - len(footer) : end] = footer
    path.write_bytes(bytes(body))
    return path
