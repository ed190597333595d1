"""The measurement blocks of an SPDM GET_MEASUREMENTS transcript, for CoRIM tests.

Just enough of the layout to hand blocks to the CoRIM appraisal: the 37-byte request,
the response header, the block count and the 3-byte record length, then DMTF blocks
(index, specification, size; value type, value size, value).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REQUEST_BYTES = 37


@dataclass(frozen=True)
class Block:
    """One DMTF measurement block."""

    index: int
    value_type: int
    value: bytes


def read_blocks(report: bytes) -> dict[int, Block]:
    """The blocks of ``report`` (request followed by the response) by index."""
    pos = REQUEST_BYTES + 4
    count = report[pos]
    length = int.from_bytes(report[pos + 1 : pos + 4], "little")
    pos += 4
    end = pos + length
    blocks: dict[int, Block] = {}
    for _ in range(count):
        index, size = report[pos], int.from_bytes(report[pos + 2 : pos + 4], "little")
        body = report[pos + 4 : pos + 4 + size]
        value_size = int.from_bytes(body[1:3], "little")
        blocks[index] = Block(index, body[0], body[3 : 3 + value_size])
        pos += 4 + size
    assert pos == end, "measurement record length disagrees with its blocks"
    return blocks


def read_report_hex(path: Path) -> bytes:
    """The report bytes of a ``*.hex`` file."""
    return bytes.fromhex("".join(path.read_text().split()))
