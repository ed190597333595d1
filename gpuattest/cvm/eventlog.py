"""Confidential-computing event logs: parsed strictly, replayed into the TDX RTMRs.

The log is the one the ACPI CCEL table points at (``/sys/firmware/acpi/tables/data/CCEL``):
a TCG crypto-agile event log (TCG PC Client Platform Firmware Profile, section 10) in which
the PCR index of each record holds the CC measurement register instead: 0 is MRTD, 1..4 are
RTMR0..3 (UEFI 2.10, ``EFI_CC_MEASUREMENT_PROTOCOL``).

* The first record is a ``TCG_PCClientPCREvent`` (SHA-1 layout, type ``EV_NO_ACTION``) whose
  data is the ``Spec ID Event03`` structure naming the digest algorithms and their sizes. Its
  index is 0 as the TCG profile writes it, or 1 as OVMF (edk2's TDX measurement driver) writes
  it on purpose: there PCR index 0 maps to CC register index 1, the Spec ID event included,
  and every OVMF-booted TD (Google Cloud's and Alibaba Cloud's among them) carries that log.
  Any other index, or a first record that is not a Spec ID event, is refused. A TPM log's
  Spec ID event is at index 0 only.
* Every later record is a ``TCG_PCR_EVENT2``: register index, event type, a digest per
  algorithm, then the event data.
* The log ends at the first record whose first 8 bytes are all ``0x00`` or all ``0xFF`` (the
  CCEL region is zero-filled after it by td-shim and some hypervisors; OVMF leaves the area's
  erased ``0xFF`` fill), or exactly at the end of the buffer. The tail must be one fill, all
  zero or all ``0xFF``.

Replay: each RTMR starts as 48 zero bytes; every event for index ``n`` (1..4), in log order,
sets ``RTMR[n-1] = SHA-384(RTMR[n-1] || digest)``. ``EV_NO_ACTION`` events are not extended.
A TDX log must carry SHA-384; one without it is refused.

The same format is a TPM's measured-boot log (``/sys/kernel/security/tpm0/
binary_bios_measurements``; Azure's vTPM CVMs): parsed with ``pcrs=True`` the index of each
record is a PCR (0..23), the log must carry SHA-256, it ends exactly at its last record (no
padding), and :mod:`.tpmlog` replays it into the SHA-256 bank.

Parsing is strict: every length is checked against the buffer, the algorithms of each
record must be those the Spec ID event declared, and anything after the end marker must be
padding. Bad input raises :class:`~gpuattest.errors.MalformedEvidenceError`, never a verdict.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpucc.core.errors import MalformedEvidenceError

from .eventlog_decode import describe, type_name
from .tpmlog import replay_pcrs, startup_locality

__all__ = [
    "ALG_SHA1",
    "ALG_SHA256",
    "ALG_SHA384",
    "MAX_EVENT_LOG_BYTES",
    "MAX_EVENTS",
    "SPEC_ID_INDICES",
    "CcEvent",
    "CcEventLog",
    "parse_event_log",
    "replay",
]

MAX_EVENT_LOG_BYTES = 8 * 1024 * 1024  # the CCEL region is 64 KiB to 1 MiB in practice
MAX_EVENTS = 65536
ALG_SHA1 = 0x0004
ALG_SHA256 = 0x000B
ALG_SHA384 = 0x000C
ALG_SHA512 = 0x000D
ALG_SM3_256 = 0x0012
#: Algorithm id -> (name, digest size) for the algorithms a log may declare.
ALGORITHMS = {
    ALG_SHA1: ("sha1", 20),
    ALG_SHA256: ("sha256", 32),
    ALG_SHA384: ("sha384", 48),
    ALG_SHA512: ("sha512", 64),
    ALG_SM3_256: ("sm3_256", 32),
}
EV_NO_ACTION = 0x03
_SPEC_ID_SIGNATURE = b"Spec ID Event03\0"
_REGISTERS = ("rtmr0", "rtmr1", "rtmr2", "rtmr3")
_PCRS = 24
_MAX_ALGORITHMS = len(ALGORITHMS)


@dataclass(frozen=True)
class CcEvent:
    """One record of the log.

    Attributes:
        seq: position among the records after the Spec ID event (0-based).
        mr_index: the CC measurement register index (1..4: RTMR0..3; EV_NO_ACTION may be 0).
        event_type: the TCG event type.
        digests: algorithm name -> digest.
        data: the event data as logged.
        offset: where the record starts in the log.
    """

    seq: int
    mr_index: int
    event_type: int
    digests: dict[str, bytes] = field(repr=False)
    data: bytes = field(repr=False)
    offset: int = 0
    #: a TPM measured-boot log's event: the index is a PCR, the digest SHA-256
    pcr_log: bool = False

    @property
    def register(self) -> str | None:
        """``rtmr0``..``rtmr3`` (``pcr0``..``pcr23`` in a TPM log), or None for an event
        that extends nothing."""
        if self.pcr_log:
            if self.event_type == EV_NO_ACTION or not 0 <= self.mr_index < _PCRS:
                return None
            return f"pcr{self.mr_index}"
        if self.event_type == EV_NO_ACTION or not 1 <= self.mr_index <= 4:
            return None
        return _REGISTERS[self.mr_index - 1]

    @property
    def digest(self) -> bytes | None:
        """The digest the register is extended with: SHA-384 (TDX) or SHA-256 (TPM)."""
        return self.digests.get("sha256" if self.pcr_log else "sha384")

    @property
    def type_name(self) -> str:
        """The TCG name of the event type (``EV_IPL``), or its hex."""
        return type_name(self.event_type)

    @property
    def sha384(self) -> bytes | None:
        """The SHA-384 digest, the one a TDX RTMR is extended with."""
        return self.digests.get("sha384")

    @property
    def description(self) -> str:
        """The event data decoded for a reader, every unprintable character escaped."""
        return describe(self.event_type, self.data)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (what policies and the ``cvm.event_log`` section show)."""
        return {
            "seq": self.seq,
            "mr_index": self.mr_index,
            "register": self.register,
            "type": f"{self.event_type:#x}",
            "type_name": self.type_name,
            "digest": self.digest.hex() if self.digest is not None else None,
            "digests": {name: value.hex() for name, value in sorted(self.digests.items())},
            "data_size": len(self.data),
            "description": self.description,
        }


@dataclass(frozen=True)
class CcEventLog:
    """A parsed log: its declared algorithms, its events, and where it ended."""

    algorithms: dict[str, int]
    events: tuple[CcEvent, ...]
    end: int
    sha256: bytes
    #: a TPM measured-boot log (PCRs, SHA-256) rather than a CC event log
    pcr_log: bool = False

    def replay(self) -> dict[str, bytes]:
        """The RTMR values this log produces (see the module docstring); for a TPM log, the
        value of every PCR it extends (:func:`.tpmlog.replay_pcrs`)."""
        if self.pcr_log:
            return replay_pcrs(self.events)
        return replay(self.events)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the log's digest, its replayed RTMRs and every event."""
        return {
            "sha256": self.sha256.hex(),
            "algorithms": dict(sorted(self.algorithms.items())),
            "size": self.end,
            "replay": {name: value.hex() for name, value in self.replay().items()},
            "events": [e.to_dict() for e in self.events],
        }


def replay(events: Sequence[CcEvent]) -> dict[str, bytes]:
    """RTMR0..3 after extending each event's SHA-384 digest in order.

    Raises:
        MalformedEvidenceError: an extending event has no SHA-384 digest.
    """
    registers = {name: bytes(48) for name in _REGISTERS}
    for event in events:
        name = event.register
        if name is None:
            continue
        digest = event.sha384
        if digest is None:
            raise MalformedEvidenceError(f"event {event.seq} has no SHA-384 digest to replay")
        registers[name] = hashlib.sha384(registers[name] + digest).digest()
    return registers


class _Reader:
    """Bounds-checked little-endian reads over the log."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, size: int, what: str) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise MalformedEvidenceError(
                f"the event log is truncated in {what} at offset {self.pos}"
            )
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        value: int = struct.unpack("<H", self.take(2, what))[0]
        return value

    def u32(self, what: str) -> int:
        value: int = struct.unpack("<I", self.take(4, what))[0]
        return value


#: The indices a Spec ID event may carry: the TCG profile's 0 and OVMF's 1 (a CC event log).
SPEC_ID_INDICES = (0, 1)


def _spec_id(reader: _Reader, pcr_log: bool) -> dict[int, int]:
    """The first record: the Spec ID event. Returns algorithm id -> digest size."""
    mr_index = reader.u32("the Spec ID event")
    event_type = reader.u32("the Spec ID event")
    reader.take(20, "the Spec ID event's SHA-1 digest")
    size = reader.u32("the Spec ID event")
    allowed = (0,) if pcr_log else SPEC_ID_INDICES
    if event_type != EV_NO_ACTION or mr_index not in allowed:
        where = "index 0" if pcr_log else "index 0, or 1 as OVMF writes it"
        raise MalformedEvidenceError(
            f"the event log does not start with a Spec ID event (EV_NO_ACTION, {where});"
            f" its first record has type {event_type:#x}, index {mr_index}"
        )
    body = _Reader(reader.take(size, "the Spec ID event's data"))
    if body.take(16, "the Spec ID signature") != _SPEC_ID_SIGNATURE:
        raise MalformedEvidenceError("the event log's first event is not 'Spec ID Event03'")
    body.take(4 + 4, "the Spec ID event's platform class and versions")
    count = body.u32("the Spec ID event's algorithm count")
    if not 1 <= count <= _MAX_ALGORITHMS:
        raise MalformedEvidenceError(
            f"the Spec ID event declares {count} digest algorithms (1..{_MAX_ALGORITHMS})"
        )
    declared: dict[int, int] = {}
    for _ in range(count):
        alg = body.u16("the Spec ID event's algorithms")
        digest_size = body.u16("the Spec ID event's algorithms")
        if alg in declared:
            raise MalformedEvidenceError(f"the Spec ID event declares algorithm {alg:#x} twice")
        known = ALGORITHMS.get(alg)
        if known is not None and known[1] != digest_size:
            raise MalformedEvidenceError(
                f"the Spec ID event gives {known[0]} a {digest_size}-byte digest"
            )
        if known is None and not 1 <= digest_size <= 64:
            raise MalformedEvidenceError(f"unknown algorithm {alg:#x} with size {digest_size}")
        declared[alg] = digest_size
    vendor = body.u8("the Spec ID event's vendor info size")
    body.take(vendor, "the Spec ID event's vendor info")
    if body.pos != len(body.data):
        raise MalformedEvidenceError("the Spec ID event has bytes after its vendor info")
    return declared


def _at_end(data: bytes, pos: int) -> bool:
    if pos == len(data):
        return True
    # A record is at least 16 bytes: a shorter all-padding tail ends the log too.
    head = data[pos : pos + 8]
    return head == b"\0" * len(head) or head == b"\xff" * len(head)


def _event(reader: _Reader, seq: int, declared: dict[int, int], pcr_log: bool) -> CcEvent:
    start = reader.pos
    where = f"event {seq}"
    mr_index = reader.u32(where)
    event_type = reader.u32(where)
    count = reader.u32(f"{where}'s digest count")
    if not 1 <= count <= len(declared):
        raise MalformedEvidenceError(
            f"{where} carries {count} digests; the log declares {len(declared)} algorithms"
        )
    digests: dict[str, bytes] = {}
    for _ in range(count):
        alg = reader.u16(f"{where}'s digests")
        if alg not in declared:
            raise MalformedEvidenceError(f"{where} uses algorithm {alg:#x}, not declared")
        name = ALGORITHMS.get(alg, (f"alg_{alg:#06x}", 0))[0]
        if name in digests:
            raise MalformedEvidenceError(f"{where} carries algorithm {name} twice")
        digests[name] = reader.take(declared[alg], f"{where}'s {name} digest")
    size = reader.u32(f"{where}'s data size")
    data = reader.take(size, f"{where}'s data ({size} bytes)")
    if pcr_log and event_type != EV_NO_ACTION and not 0 <= mr_index < _PCRS:
        raise MalformedEvidenceError(
            f"{where} extends PCR {mr_index}; a TPM log extends PCRs 0..{_PCRS - 1}"
        )
    if not pcr_log and event_type != EV_NO_ACTION and not 1 <= mr_index <= 4:
        raise MalformedEvidenceError(
            f"{where} extends register index {mr_index}; a CC event log extends 1..4 (RTMR0..3)"
        )
    return CcEvent(seq, mr_index, event_type, digests, data, start, pcr_log)


def parse_event_log(data: bytes, *, require_sha384: bool = True, pcrs: bool = False) -> CcEventLog:
    """Parse a CC event log (the CCEL region, zero padding included), or with ``pcrs`` a
    TPM measured-boot log.

    Args:
        data: the log as read from the ACPI CCEL data table or a file.
        require_sha384: refuse a log without SHA-384 digests (TDX replays SHA-384).
        pcrs: a TPM log: indices are PCRs 0..23 and SHA-256 digests are required (instead
            of SHA-384) for every event that extends a PCR.

    Raises:
        MalformedEvidenceError: oversized, truncated, inconsistent, or without SHA-384
            (SHA-256 for a TPM log).
    """
    if len(data) > MAX_EVENT_LOG_BYTES:
        raise MalformedEvidenceError(f"the event log is larger than {MAX_EVENT_LOG_BYTES} bytes")
    if not data.strip(b"\0"):
        raise MalformedEvidenceError("the event log is empty")
    reader = _Reader(data)
    declared = _spec_id(reader, pcrs)
    if pcrs and ALG_SHA256 not in declared:
        raise MalformedEvidenceError(
            "the measured-boot log has no SHA-256 digests; the vTPM quotes the SHA-256 bank"
        )
    require_sha384 = require_sha384 and not pcrs
    if require_sha384 and ALG_SHA384 not in declared:
        raise MalformedEvidenceError(
            "the event log has no SHA-384 digests; TDX RTMRs are replayed with SHA-384"
        )
    events: list[CcEvent] = []
    # A TPM log ends exactly at its last event (the kernel's copy has no padding): a record
    # cut short there is truncated, never padding.
    while reader.pos < len(data) if pcrs else not _at_end(data, reader.pos):
        if len(events) >= MAX_EVENTS:
            raise MalformedEvidenceError(f"the event log has more than {MAX_EVENTS} events")
        event = _event(reader, len(events), declared, pcrs)
        if require_sha384 and event.register is not None and event.sha384 is None:
            raise MalformedEvidenceError(f"event {event.seq} has no SHA-384 digest")
        if pcrs and event.register is not None and event.digest is None:
            raise MalformedEvidenceError(f"event {event.seq} has no SHA-256 digest")
        events.append(event)
    end = reader.pos
    rest = data[end:]
    if rest.strip(b"\0") and rest.strip(b"\xff"):
        raise MalformedEvidenceError(f"the event log has data after its end at offset {end}")
    names = {ALGORITHMS.get(a, (f"alg_{a:#06x}", 0))[0]: s for a, s in declared.items()}
    log = CcEventLog(names, tuple(events), end, hashlib.sha256(data).digest(), pcrs)
    if pcrs:
        startup_locality(log.events)  # a malformed StartupLocality event is refused here
    return log
