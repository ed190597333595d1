"""Event data decoded for a reader: EFI variables, boot applications, command lines, tags.

Descriptions are for people, never for decisions (policies match types and digests). Each
is cut to :data:`MAX_DESCRIPTION` characters and every character that is not printable
(controls, bidi and other format characters, separators) is written as an escape, a
backslash doubled, so a log cannot drive a terminal. Data that does not decode as its type
says is described by its size, never refused: the digest, not the data, is what was measured.
"""

from __future__ import annotations

import struct
import uuid

__all__ = ["EVENT_TYPES", "MAX_DESCRIPTION", "describe", "escape", "type_name", "type_value"]

MAX_DESCRIPTION = 240

#: TCG PC Client PFP event types.
EVENT_TYPES = {
    0x00: "EV_PREBOOT_CERT",
    0x01: "EV_POST_CODE",
    0x02: "EV_UNUSED",
    0x03: "EV_NO_ACTION",
    0x04: "EV_SEPARATOR",
    0x05: "EV_ACTION",
    0x06: "EV_EVENT_TAG",
    0x07: "EV_S_CRTM_CONTENTS",
    0x08: "EV_S_CRTM_VERSION",
    0x09: "EV_CPU_MICROCODE",
    0x0A: "EV_PLATFORM_CONFIG_FLAGS",
    0x0B: "EV_TABLE_OF_DEVICES",
    0x0C: "EV_COMPACT_HASH",
    0x0D: "EV_IPL",
    0x0E: "EV_IPL_PARTITION_DATA",
    0x0F: "EV_NONHOST_CODE",
    0x10: "EV_NONHOST_CONFIG",
    0x11: "EV_NONHOST_INFO",
    0x12: "EV_OMIT_BOOT_DEVICE_EVENTS",
    0x80000001: "EV_EFI_VARIABLE_DRIVER_CONFIG",
    0x80000002: "EV_EFI_VARIABLE_BOOT",
    0x80000003: "EV_EFI_BOOT_SERVICES_APPLICATION",
    0x80000004: "EV_EFI_BOOT_SERVICES_DRIVER",
    0x80000005: "EV_EFI_RUNTIME_SERVICES_DRIVER",
    0x80000006: "EV_EFI_GPT_EVENT",
    0x80000007: "EV_EFI_ACTION",
    0x80000008: "EV_EFI_PLATFORM_FIRMWARE_BLOB",
    0x80000009: "EV_EFI_HANDOFF_TABLES",
    0x8000000A: "EV_EFI_PLATFORM_FIRMWARE_BLOB2",
    0x8000000B: "EV_EFI_HANDOFF_TABLES2",
    0x8000000C: "EV_EFI_VARIABLE_BOOT2",
    0x8000000D: "EV_EFI_GPT_EVENT2",
    0x80000010: "EV_EFI_HCRTM_EVENT",
    0x800000E0: "EV_EFI_VARIABLE_AUTHORITY",
    0x800000E1: "EV_EFI_SPDM_FIRMWARE_BLOB",
    0x800000E2: "EV_EFI_SPDM_FIRMWARE_CONFIG",
}
_BY_NAME = {name: value for value, name in EVENT_TYPES.items()}
_VARIABLES = {0x80000001, 0x80000002, 0x8000000C, 0x800000E0}
_IMAGES = {0x80000003, 0x80000004, 0x80000005}
_TEXT = {0x01, 0x05, 0x08, 0x0D, 0x80000007}
_BLOBS = {0x8000000A, 0x8000000B}
# The Linux EFI stub's tagged events (EV_EVENT_TAG): initrd and load options.
_LINUX_TAGS = {0x8F3B22EC: "Linux load options", 0x8F3B22ED: "Linux initrd"}


def type_name(event_type: int) -> str:
    """The TCG name of an event type, or its hex."""
    return EVENT_TYPES.get(event_type, f"{event_type:#x}")


def type_value(name: str) -> int | None:
    """An event type from its TCG name (``EV_IPL``) or number (``0xd``); None: neither."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    try:
        value = int(name, 0)
    except ValueError:
        return None
    return value if 0 <= value <= 0xFFFFFFFF else None


def escape(text: str) -> str:
    """Every unprintable character as an escape, backslashes doubled, cut to the maximum."""
    out = []
    for ch in text.replace("\\", "\\\\"):
        if ch.isprintable():
            out.append(ch)
        elif ord(ch) <= 0xFF:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
    joined = "".join(out)
    return joined if len(joined) <= MAX_DESCRIPTION else joined[: MAX_DESCRIPTION - 3] + "..."


def _text(data: bytes) -> str:
    """UTF-16LE when every other byte is zero (firmware strings), else UTF-8; NULs trimmed."""
    if len(data) >= 2 and len(data) % 2 == 0 and not any(data[1::2]):
        return data.decode("utf-16-le", "replace").rstrip("\0")
    return data.decode("utf-8", "replace").rstrip("\0")


def _variable(data: bytes) -> str:
    # UEFI_VARIABLE_DATA: GUID, u64 name length (chars), u64 data length, name, data.
    if len(data) < 32:
        return ""
    guid = uuid.UUID(bytes_le=data[:16])
    name_len, data_len = struct.unpack_from("<QQ", data, 16)
    if name_len > (len(data) - 32) // 2 or 32 + 2 * name_len + data_len != len(data):
        return ""
    name = data[32 : 32 + 2 * name_len].decode("utf-16-le", "replace")
    return f"{name} ({guid}), {data_len} bytes"


def _device_path_files(path: bytes) -> list[str]:
    # EFI device path nodes: u8 type, u8 subtype, u16 length; type 4 subtype 4 is a file path.
    files, pos = [], 0
    while pos + 4 <= len(path):
        kind, sub, size = struct.unpack_from("<BBH", path, pos)
        if size < 4 or pos + size > len(path):
            break
        if kind == 0x7F:
            break
        if kind == 4 and sub == 4:
            files.append(_text(path[pos + 4 : pos + size]))
        pos += size
    return files


def _image(data: bytes) -> str:
    # UEFI_IMAGE_LOAD_EVENT: u64 location, u64 length, u64 link-time address, u64 path length.
    if len(data) < 32:
        return ""
    _, length, _, path_len = struct.unpack_from("<QQQQ", data)
    if 32 + path_len != len(data):
        return ""
    files = _device_path_files(data[32:])
    where = " ".join(files) if files else f"device path of {path_len} bytes"
    return f"{where}, image of {length} bytes"


def _blob(data: bytes) -> str:
    # u8 description size, description, u64 base, u64 length.
    if not data or 1 + data[0] + 16 != len(data):
        return ""
    base, length = struct.unpack_from("<QQ", data, 1 + data[0])
    return f"{_text(data[1 : 1 + data[0]])} at {base:#x}, {length} bytes"


def _tag(data: bytes) -> str:
    # TCG_PCClientTaggedEvent: u32 tag id, u32 size, data.
    if len(data) < 8:
        return ""
    tag, size = struct.unpack_from("<II", data)
    if 8 + size != len(data):
        return ""
    label = _LINUX_TAGS.get(tag, f"tag {tag:#x}")
    body = data[8:]
    return f"{label}: {_text(body)}" if tag == 0x8F3B22EC else f"{label}, {size} bytes"


def _separator(data: bytes) -> str:
    if data in (b"\0" * 4, b"\xff" * 4):
        return f"separator {data.hex()}"
    return f"separator, {len(data)} bytes"


def describe(event_type: int, data: bytes) -> str:
    """The event data as a reader would want it (see the module docstring)."""
    text = ""
    if event_type in _VARIABLES:
        text = _variable(data)
    elif event_type in _IMAGES:
        text = _image(data)
    elif event_type in _TEXT:
        text = _text(data)
    elif event_type in _BLOBS:
        text = _blob(data)
    elif event_type == 0x06:
        text = _tag(data)
    elif event_type == 0x04:
        text = _separator(data)
    elif event_type == 0x03 or event_type == 0x0A:
        # Signature-led records (td-shim's, "StartupLocality"): the printable lead.
        lead = data[:64].split(b"\0", 1)[0]
        if lead and all(32 <= b < 127 for b in lead):
            text = f"{lead.decode()}, {len(data)} bytes"
    return escape(text or f"{len(data)} bytes")
