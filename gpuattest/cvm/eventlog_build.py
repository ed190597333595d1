"""Writing CC event logs: what a simulated TD boots with, and what the tests tamper with.

:func:`build_event_log` writes the format :mod:`.eventlog` reads (a Spec ID event, then
``TCG_PCR_EVENT2`` records, then zero padding). Events name their register (``rtmr0``..
``rtmr3``), type and data; the digest defaults to the SHA-384 of the data, as firmware
measures most events, and may be given instead (a kernel's Authenticode digest, td-shim's
configuration events).

:func:`build_tpm_log` writes a TPM measured-boot log the same way: events name PCRs
(``pcr0``..``pcr23``) and carry SHA-256 digests (of the data, or given).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from .eventlog import ALG_SHA1, ALG_SHA256, ALG_SHA384, ALGORITHMS, EV_NO_ACTION

__all__ = [
    "LogEvent",
    "spec_id_record",
    "boot_events",
    "build_event_log",
    "build_tpm_log",
    "efi_variable_data",
    "image_load_data",
]

_REGISTERS = {"rtmr0": 1, "rtmr1": 2, "rtmr2": 3, "rtmr3": 4}
_EFI_GLOBAL = bytes.fromhex("61dfe48bca93d211aa0d00e098032b8c")  # 8be4df61-..., little-endian
EV_SEPARATOR = 0x04
EV_EVENT_TAG = 0x06
EV_EFI_VARIABLE_DRIVER_CONFIG = 0x80000001
EV_EFI_BOOT_SERVICES_APPLICATION = 0x80000003
EV_EFI_ACTION = 0x80000007
LINUX_LOAD_OPTIONS_TAG = 0x8F3B22EC
LINUX_INITRD_TAG = 0x8F3B22ED


@dataclass(frozen=True)
class LogEvent:
    """One event to write: register, type, data and (optionally) its SHA-384 digest."""

    register: str
    event_type: int
    data: bytes
    digest: bytes | None = None

    @property
    def sha384(self) -> bytes:
        """The digest extended into the register."""
        return self.digest if self.digest is not None else hashlib.sha384(self.data).digest()


def _spec_id(algorithms: Sequence[int], index: int = 0) -> bytes:
    body = b"Spec ID Event03\0" + struct.pack("<IBBBB", 0, 0, 2, 0, 2)
    body += struct.pack("<I", len(algorithms))
    for alg in algorithms:
        body += struct.pack("<HH", alg, ALGORITHMS[alg][1])
    body += b"\0"  # no vendor info
    return struct.pack("<II", index, EV_NO_ACTION) + bytes(20) + struct.pack("<I", len(body)) + body


def spec_id_record(algorithms: Sequence[int], index: int = 0) -> bytes:
    """The Spec ID event that starts a log declaring ``algorithms`` (ids, in order)."""
    return _spec_id(algorithms, index)


def build_event_log(
    events: Sequence[LogEvent],
    *,
    with_sha256: bool = False,
    sha384: bool = True,
    padding: int = 4096,
    ovmf: bool = False,
) -> bytes:
    """A CC event log holding ``events`` in order, followed by ``padding`` zero bytes.

    ``with_sha256`` adds a SHA-256 digest of each event's data; ``sha384=False`` writes a
    SHA-256-only log (which a TDX verifier must refuse). ``ovmf`` writes the log as OVMF does:
    the Spec ID event at index 1 and the region's ``0xFF`` fill after the last event.
    """
    algorithms = ([ALG_SHA384] if sha384 else []) + (
        [ALG_SHA256] if with_sha256 or not sha384 else []
    )
    out = bytearray(_spec_id(algorithms, 1 if ovmf else 0))
    for event in events:
        index = _REGISTERS[event.register]
        out += struct.pack("<III", index, event.event_type, len(algorithms))
        for alg in algorithms:
            digest = event.sha384 if alg == ALG_SHA384 else hashlib.sha256(event.data).digest()
            out += struct.pack("<H", alg) + digest
        out += struct.pack("<I", len(event.data)) + event.data
    return bytes(out) + (b"\xff" if ovmf else b"\0") * padding


def build_tpm_log(events: Sequence[LogEvent], *, with_sha1: bool = False) -> bytes:
    """A TPM measured-boot log holding ``events`` (registers ``pcr0``..``pcr23``) in order,
    with a SHA-256 digest per event (``event.digest`` when given, else SHA-256 of the data)
    and, with ``with_sha1``, a SHA-1 digest of the data before it. No padding: the kernel's
    ``binary_bios_measurements`` ends at the last event."""
    algorithms = ([ALG_SHA1] if with_sha1 else []) + [ALG_SHA256]
    out = bytearray(_spec_id(algorithms))
    for event in events:
        index = int(event.register.removeprefix("pcr"))
        sha256 = event.digest if event.digest is not None else hashlib.sha256(event.data).digest()
        out += struct.pack("<III", index, event.event_type, len(algorithms))
        for alg in algorithms:
            digest = sha256 if alg == ALG_SHA256 else hashlib.sha1(event.data).digest()  # noqa: S324
            out += struct.pack("<H", alg) + digest
        out += struct.pack("<I", len(event.data)) + event.data
    return bytes(out)


def efi_variable_data(guid_le: bytes, name: str, value: bytes) -> bytes:
    """``UEFI_VARIABLE_DATA`` for an EFI variable event (``SecureBoot``, ``db``, ...)."""
    encoded = name.encode("utf-16-le")
    return guid_le + struct.pack("<QQ", len(name), len(value)) + encoded + value


def image_load_data(path: str, length: int) -> bytes:
    """``UEFI_IMAGE_LOAD_EVENT`` for an image loaded from the file ``path``."""
    name = path.encode("utf-16-le") + b"\0\0"
    node = struct.pack("<BBH", 4, 4, 4 + len(name)) + name
    device_path = node + struct.pack("<BBH", 0x7F, 0xFF, 4)
    return struct.pack("<QQQQ", 0, length, 0, len(device_path)) + device_path


def _tagged(tag: int, data: bytes) -> bytes:
    return struct.pack("<II", tag, len(data)) + data


def boot_events(
    *, kernel_digest: bytes, initrd: bytes, cmdline: str, secure_boot: bool = True
) -> list[LogEvent]:
    """The events of a direct Linux boot as OVMF and the Linux EFI stub log them: Secure Boot
    state and a separator (RTMR0), the kernel's boot application (RTMR1, with
    ``kernel_digest``: its PE Authenticode SHA-384), then the command line and the initrd as
    the stub's tagged events (RTMR2, SHA-384 of the UTF-16 command line and of the initrd).
    """
    options = (cmdline + "\0").encode("utf-16-le")
    return [
        LogEvent(
            "rtmr0",
            EV_EFI_VARIABLE_DRIVER_CONFIG,
            efi_variable_data(_EFI_GLOBAL, "SecureBoot", b"\x01" if secure_boot else b"\x00"),
        ),
        LogEvent("rtmr0", EV_SEPARATOR, bytes(4)),
        LogEvent(
            "rtmr1",
            EV_EFI_BOOT_SERVICES_APPLICATION,
            image_load_data("\\EFI\\Linux\\vmlinuz.efi", 0),
            kernel_digest,
        ),
        LogEvent("rtmr1", EV_EFI_ACTION, b"Exit Boot Services Invocation"),
        LogEvent(
            "rtmr2",
            EV_EVENT_TAG,
            _tagged(LINUX_LOAD_OPTIONS_TAG, options),
            hashlib.sha384(options).digest(),
        ),
        LogEvent(
            "rtmr2",
            EV_EVENT_TAG,
            _tagged(LINUX_INITRD_TAG, b"Linux initrd"),
            hashlib.sha384(initrd).digest(),
        ),
    ]
