"""TPM measured-boot logs replayed into the SHA-256 PCR bank (Azure's vTPM CVMs).

The log is the TCG PC Client crypto-agile event log the firmware and boot loaders append to
(``/sys/kernel/security/tpm0/binary_bios_measurements`` on Linux), parsed by
:func:`.eventlog.parse_event_log` with ``pcrs=True``: a Spec ID event first, then
``TCG_PCR_EVENT2`` records whose index is a PCR (0..23).

Replay (TCG PC Client Platform Firmware Profile): a PCR starts at its reset value (32 zero
bytes; PCRs 17..22, the dynamic-launch PCRs, at 32 ``0xFF`` bytes) and every event for it, in
log order, sets ``PCR = SHA-256(PCR || digest)``. ``EV_NO_ACTION`` events extend nothing; one
of them, ``StartupLocality``, sets PCR0's starting value to 31 zero bytes and the locality
the platform started from. Only PCRs the log extends are replayed: a PCR extended by
software that logs elsewhere (Linux IMA's PCR10) is not this log's to judge.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol

from gpucc.core.errors import MalformedEvidenceError

__all__ = ["replay_pcrs", "startup_locality"]

EV_NO_ACTION = 0x03
_STARTUP_LOCALITY = b"StartupLocality\0"
_DYNAMIC = range(17, 23)


class _Event(Protocol):
    """What replay reads of an event (:class:`.eventlog.CcEvent` of a TPM log)."""

    @property
    def seq(self) -> int: ...
    @property
    def mr_index(self) -> int: ...
    @property
    def event_type(self) -> int: ...
    @property
    def digests(self) -> dict[str, bytes]: ...
    @property
    def data(self) -> bytes: ...
    @property
    def register(self) -> str | None: ...


def startup_locality(events: Sequence[_Event]) -> int | None:
    """The locality a ``StartupLocality`` event names, or None without one.

    Raises:
        MalformedEvidenceError: the event is malformed, repeated, names a locality other
            than 0, 3 or 4, or comes after PCR0 was extended.
    """
    found: int | None = None
    pcr0_extended = False
    for event in events:
        if event.register == "pcr0":
            pcr0_extended = True
        if event.event_type != EV_NO_ACTION or not event.data.startswith(_STARTUP_LOCALITY):
            continue
        where = f"event {event.seq} (StartupLocality)"
        if len(event.data) != len(_STARTUP_LOCALITY) + 1 or event.mr_index != 0:
            raise MalformedEvidenceError(f"{where} is not 17 bytes for PCR0")
        if found is not None:
            raise MalformedEvidenceError(f"{where} repeats the startup locality")
        if pcr0_extended:
            raise MalformedEvidenceError(f"{where} comes after PCR0 was extended")
        found = event.data[-1]
        if found not in (0, 3, 4):
            raise MalformedEvidenceError(f"{where} names locality {found} (0, 3 or 4)")
    return found


def replay_pcrs(events: Sequence[_Event]) -> dict[str, bytes]:
    """``pcrN`` -> the value the log's events give PCR N, for every PCR the log extends.

    Raises:
        MalformedEvidenceError: an extending event has no SHA-256 digest, or a malformed
            StartupLocality event.
    """
    locality = startup_locality(events)
    registers: dict[str, bytes] = {}
    for event in events:
        name = event.register
        if name is None:
            continue
        digest = event.digests.get("sha256")
        if digest is None:
            raise MalformedEvidenceError(f"event {event.seq} has no SHA-256 digest to replay")
        if name not in registers:
            registers[name] = _reset_value(event.mr_index, locality)
        registers[name] = hashlib.sha256(registers[name] + digest).digest()
    return dict(sorted(registers.items(), key=lambda item: int(item[0][3:])))


def _reset_value(index: int, locality: int | None) -> bytes:
    if index in _DYNAMIC:
        return b"\xff" * 32
    if index == 0 and locality is not None:
        return bytes(31) + bytes([locality])
    return bytes(32)
