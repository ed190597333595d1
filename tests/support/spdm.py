"""The measurement blocks of an SPDM 1.1 report, read straight from its bytes (DMTF DSP0274).

Written apart from gpucc's report parser so that tests can compare what gpucc reports
against the bytes themselves. A report is the GET_MEASUREMENTS request (4-byte header,
32-byte nonce, 1-byte slot: 37 bytes) followed by the MEASUREMENTS response: a 4-byte
header, the number of blocks (1 byte), the record length (3 bytes, little-endian), then
each block: index (1), specification (1), size (2, LE), and the DMTF measurement in it:
value type (1), value size (2, LE), value.
"""

from __future__ import annotations

REQUEST_LENGTH = 37


def spdm_measurement_blocks(report: bytes) -> dict[int, bytes]:
    """Block index -> measurement value, for every block of ``report``."""
    pos = REQUEST_LENGTH + 4
    count = report[pos]
    record_end = pos + 4 + int.from_bytes(report[pos + 1 : pos + 4], "little")
    pos += 4
    blocks: dict[int, bytes] = {}
    for _ in range(count):
        index, size = report[pos], int.from_bytes(report[pos + 2 : pos + 4], "little")
        value_size = int.from_bytes(report[pos + 5 : pos + 7], "little")
        assert value_size == size - 3, (index, size, value_size)
        blocks[index] = report[pos + 7 : pos + 7 + value_size]
        pos += 4 + size
    assert pos == record_end, (pos, record_end)
    return blocks
