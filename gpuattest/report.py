"""Strict parser for NVIDIA GPU attestation reports (SPDM 1.1 + NVIDIA opaque data).

Layout: a 37-byte GET_MEASUREMENTS request, then the
MEASUREMENTS response: header, measurement record of DMTF blocks, a
32-byte responder nonce, NVIDIA's opaque data, and a 96-byte raw ECDSA
P-384 signature over everything before it. Every length is bounds-checked and
the report must end exactly after the signature: trailing or missing bytes
are malformed input (NVIDIA's parsers accept trailing garbage; we do not).

The opaque data comes in two layouts, told apart by its first six bytes:

* **versioned** (drivers released with CUDA 13.5 and later): a 12-byte header, ASCII
  ``NVDAOD``, a u16 profile that must be 0, then major, minor, patch and a padding byte;
  entries of u16 type, u16 value type, u16 size and the value;
* **legacy**: entries of u16 type, u16 size and the value.

Entries are keyed on their type, never their position; types gpucc does not know are
kept. A versioned header whose major version is newer than :data:`OPAQUE_MAJOR_VERSION`
is :class:`~gpucc.core.errors.UnsupportedFormatError`, not a malformed report.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpucc.core.errors import MalformedReportError, UnsupportedFormatError

__all__ = [
    "MAX_REPORT_BYTES",
    "OPAQUE_INDEX_BASE",
    "OPAQUE_MAJOR_VERSION",
    "SVN_VALUE_TYPE",
    "REQUEST_LENGTH",
    "SIGNATURE_LENGTH",
    "Architecture",
    "EnvelopeReport",
    "AttestationReport",
    "MeasurementBlock",
    "OpaqueData",
    "OpaqueType",
    "SpdmEnvelope",
    "decode_vbios_version",
]

REQUEST_LENGTH = 37
SIGNATURE_LENGTH = 96
NONCE_LENGTH = 32
# NVML's report buffer is 0x2000 bytes; anything larger is not a GPU report.
MAX_REPORT_BYTES = 0x2000

_SPDM_VERSION_11 = 0x11
_GET_MEASUREMENTS = 0xE0
_MEASUREMENTS = 0x60
_DMTF_SPEC = 0x01


class Architecture(enum.StrEnum):
    """GPU architectures gpucc knows the rules for."""

    HOPPER = "HOPPER"
    BLACKWELL = "BLACKWELL"
    RUBIN = "RUBIN"

    @classmethod
    def parse(cls, value: str) -> Architecture:
        """Case-insensitive lookup of an NVAT ``arch`` string.

        Raises:
            MalformedReportError: unknown architecture.
        """
        try:
            return cls(value.strip().upper())
        except ValueError:
            raise MalformedReportError(f"unsupported GPU architecture {value!r}") from None


class OpaqueType(enum.IntEnum):
    """NVIDIA opaque-data TLV types, as NVIDIA's verifiers decode them."""

    CERT_ISSUER_NAME = 1
    CERT_AUTHORITY_KEY_IDENTIFIER = 2
    DRIVER_VERSION = 3
    GPU_INFO = 4
    SKU = 5
    VBIOS_VERSION = 6
    MANUFACTURER_ID = 7
    TAMPER_DETECTION = 8
    SMC = 9
    VPR = 10
    NVDEC0_STATUS = 11
    MSRSCNT = 12
    CPRINFO = 13
    BOARD_ID = 14
    CHIP_SKU = 15
    CHIP_SKU_MOD = 16
    PROJECT = 17
    PROJECT_SKU = 18
    PROJECT_SKU_MOD = 19
    FWID = 20
    PROTECTED_PCIE_STATUS = 21
    SWITCH_PDI = 22
    FLOORSWEPT_PORTS = 23
    POSITION_ID = 24
    LOCK_SWITCH_STATUS = 25
    GPU_LINK_CONN = 32
    SYS_ENABLE_STATUS = 33
    OPAQUE_DATA_VERSION = 34
    CHIP_INFO = 35
    FEATURE_FLAG = 36
    SVN = 37


# Types that must be present to derive RIM IDs.
_REQUIRED_TYPES = (
    OpaqueType.DRIVER_VERSION,
    OpaqueType.VBIOS_VERSION,
    OpaqueType.CHIP_SKU,
    OpaqueType.PROJECT,
    OpaqueType.PROJECT_SKU,
)
# Type 255 is NVIDIA's "invalid" marker; 0 is unassigned. Anything in 1..254 that we
# do not know is kept as raw bytes (new firmware must not break parsing).
_MAX_VALID_TYPE = 254

#: The versioned layout's magic and the newest major version gpucc reads.
OPAQUE_MAGIC = b"NVDAOD"
OPAQUE_HEADER_LENGTH = 12
OPAQUE_MAJOR_VERSION = 2
#: The versioned layout's value type of a security version number (little-endian).
SVN_VALUE_TYPE = 0x87
#: Reference-value indices from 0x1000 name an opaque type (index - 0x1000), not a block.
OPAQUE_INDEX_BASE = 0x1000
#: DMTF measurement value types with bit 7 set hold a raw value, not a digest.
RAW_VALUE_BIT = 0x80

NVDEC0_ENABLED = 0xAA
NVDEC0_DISABLED = 0x55


@dataclass(frozen=True)
class MeasurementBlock:
    """One DMTF measurement block."""

    index: int
    value_type: int
    value: bytes

    @property
    def is_raw(self) -> bool:
        """True when the block holds a raw value (DMTF value type bit 7), not a digest."""
        return bool(self.value_type & RAW_VALUE_BIT)


@dataclass(frozen=True)
class OpaqueData:
    """NVIDIA's opaque data, either layout: entries keyed on their type.

    ``version`` is the versioned header's (major, minor, patch), None for the legacy
    layout; ``value_types`` holds each entry's value type (versioned layout only).
    """

    fields: Mapping[int, bytes]
    value_types: Mapping[int, int]
    version: tuple[int, int, int] | None
    unknown_types: tuple[int, ...]

    @property
    def layout(self) -> str:
        """``versioned`` or ``legacy``."""
        return "legacy" if self.version is None else "versioned"

    def svn(self, opaque_type: int) -> int | None:
        """The SVN an entry holds, or None when the entry is absent or not of the SVN
        value type (only the versioned layout types its values).

        Raises:
            MalformedReportError: an SVN entry of more than 8 bytes or none.
        """
        value = self.fields.get(opaque_type)
        if value is None or self.value_types.get(opaque_type) != SVN_VALUE_TYPE:
            return None
        if not 1 <= len(value) <= 8:
            raise MalformedReportError(f"SVN entry {opaque_type} is {len(value)} bytes")
        return int.from_bytes(value, "little")

    @classmethod
    def parse(cls, data: bytes) -> OpaqueData:
        """Parse opaque data, choosing the layout by its first six bytes.

        Raises:
            UnsupportedFormatError: a versioned header of a newer major version.
            MalformedReportError: a bad header, lengths past the end, invalid or repeated
                types.
        """
        return _parse_opaque(bytes(data), 0, len(data))


NVDEC0_ENABLED = 0xAA


def decode_vbios_version(raw: bytes) -> str:
    """Decode the 8-byte opaque VBIOS version: hex of bytes 3.2.1.0.4, upper case.

    Raises:
        MalformedReportError: not 8 bytes.
    """
    if len(raw) != 8:
        raise MalformedReportError(f"VBIOS version field is {len(raw)} bytes, expected 8")
    return ".".join(f"{raw[i]:02X}" for i in (3, 2, 1, 0, 4))


def _ascii_field(raw: bytes, name: str) -> str:
    text = raw.split(b"\x00", 1)[0]
    try:
        value = text.decode("ascii").strip()
    except UnicodeDecodeError:
        raise MalformedReportError(f"opaque field {name} is not ASCII") from None
    if not value or not value.isprintable():
        raise MalformedReportError(f"opaque field {name} is empty or not printable")
    return value


class _Reader:
    def __init__(self, data: bytes, offset: int = 0, end: int | None = None) -> None:
        self.data = data
        self.pos = offset
        self.end = len(data) if end is None else end

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise MalformedReportError(
                f"report truncated: {what} needs {n} bytes at offset {self.pos}, "
                f"{max(0, self.end - self.pos)} left"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return int(struct.unpack("<H", self.take(2, what))[0])

    def u24(self, what: str) -> int:
        return int.from_bytes(self.take(3, what), "little")


@dataclass(frozen=True)
class SpdmEnvelope:
    """The SPDM 1.1 layer every NVIDIA device report shares (GPUs and NVSwitches).

    Request, MEASUREMENTS response, measurement blocks, responder nonce, opaque TLVs and
    the 96-byte signature, each bounds-checked; the data must end exactly where the
    structure ends (``37 + 42 + L1 + L2 + 96`` bytes). What the opaque types mean is the
    device's business (:class:`AttestationReport` for GPUs, :mod:`.switch_report`).
    """

    raw: bytes = field(repr=False)
    nonce: bytes
    responder_nonce: bytes
    blocks: Mapping[int, MeasurementBlock] = field(repr=False)
    opaque: Mapping[int, bytes] = field(repr=False)
    unknown_types: tuple[int, ...]
    opaque_data: OpaqueData = field(repr=False)

    @classmethod
    def parse(cls, data: bytes) -> SpdmEnvelope:
        """Parse the SPDM layer of a report.

        Raises:
            MalformedReportError: wrong headers, lengths that run past the data, duplicate
                or malformed blocks or TLVs, or bytes after the signature (the message
                names the length the structure implies).
        """
        data = bytes(data)
        if len(data) > MAX_REPORT_BYTES:
            raise MalformedReportError(
                f"report is {len(data)} bytes, more than the {MAX_REPORT_BYTES}-byte maximum"
            )
        r = _Reader(data)
        # (1) request: version, code, param1, param2, nonce, slot
        version, code = r.u8("request version"), r.u8("request code")
        if version != _SPDM_VERSION_11 or code != _GET_MEASUREMENTS:
            raise MalformedReportError(
                f"not an SPDM 1.1 GET_MEASUREMENTS request (0x{version:02x} 0x{code:02x})"
            )
        r.take(2, "request parameters")
        nonce = r.take(NONCE_LENGTH, "request nonce")
        r.take(1, "request slot")
        # (2) response header
        version, code = r.u8("response version"), r.u8("response code")
        if version != _SPDM_VERSION_11 or code != _MEASUREMENTS:
            raise MalformedReportError(
                f"not an SPDM 1.1 MEASUREMENTS response (0x{version:02x} 0x{code:02x})"
            )
        r.take(2, "response parameters")
        n_blocks = r.u8("block count")
        record_len = r.u24("measurement record length")
        record_end = r.pos + record_len
        if record_end > len(data):
            raise MalformedReportError("measurement record runs past the end of the report")
        blocks = _parse_blocks(data, r.pos, record_end, n_blocks)
        r.pos = record_end
        responder_nonce = r.take(NONCE_LENGTH, "responder nonce")
        opaque_len = r.u16("opaque data length")
        opaque_start = r.pos
        r.take(opaque_len, "opaque data")
        opaque = _parse_opaque(data, opaque_start, opaque_start + opaque_len)
        r.take(SIGNATURE_LENGTH, "signature")
        if r.pos != len(data):
            raise MalformedReportError(
                f"{len(data) - r.pos} unexpected bytes after the signature: the report's "
                f"structure ends after {r.pos} bytes (37 + 42 + {record_len} measurement "
                f"bytes + {opaque_len} opaque bytes + 96), the data has {len(data)}"
            )
        return cls(
            raw=data,
            nonce=nonce,
            responder_nonce=responder_nonce,
            blocks=MappingProxyType(blocks),
            opaque=opaque.fields,
            unknown_types=opaque.unknown_types,
            opaque_data=opaque,
        )


@dataclass(frozen=True)
class AttestationReport:
    """A parsed, structurally valid attestation report.

    Construct only with :meth:`parse`. The signature is *not* verified here.
    """

    raw: bytes = field(repr=False)
    nonce: bytes
    responder_nonce: bytes
    blocks: Mapping[int, MeasurementBlock] = field(repr=False)
    opaque: Mapping[int, bytes] = field(repr=False)
    driver_version: str
    vbios_version: str
    project: str
    project_sku: str
    chip_sku: str
    chip_info: str | None
    fwid: bytes | None
    nvdec0_status: int | None
    feature_flag: int | None
    unknown_types: tuple[int, ...]
    opaque_data: OpaqueData = field(repr=False)

    @property
    def signed_bytes(self) -> bytes:
        """The bytes the signature covers: everything but the last 96."""
        return self.raw[:-SIGNATURE_LENGTH]

    @property
    def signature(self) -> bytes:
        """Raw r||s, 48 + 48 bytes big-endian."""
        return self.raw[-SIGNATURE_LENGTH:]

    @property
    def digest(self) -> bytes:
        """SHA-256 of the whole report (used to bind sessions and in JSON output)."""
        return hashlib.sha256(self.raw).digest()

    @property
    def nvdec0_disabled(self) -> bool | None:
        """True when NVDEC0 is disabled (0x55), False when enabled, None when absent."""
        if self.nvdec0_status is None:
            return None
        return self.nvdec0_status == NVDEC0_DISABLED

    def runtime_measurements(self) -> dict[int, bytes]:
        """Block Index (1-based) → measurement value."""
        return {i: b.value for i, b in self.blocks.items()}

    def driver_rim_id(self, arch: Architecture = Architecture.HOPPER) -> str:
        """The driver RIM ID exactly as NVIDIA's verifiers derive it."""
        if arch is Architecture.HOPPER:
            return f"NV_GPU_DRIVER_GH100_{self.driver_version}"
        chip = self.chip_info or "GB100"
        return f"NV_GPU_CC_DRIVER_{chip}_{self.driver_version}"

    def vbios_rim_id(self) -> str:
        """The VBIOS RIM ID: project, project SKU, chip SKU, VBIOS hex without dots."""
        version = self.vbios_version.replace(".", "").upper()
        return (
            f"NV_GPU_VBIOS_{self.project.upper()}_{self.project_sku.upper()}_"
            f"{self.chip_sku.upper()}_{version}"
        )

    @classmethod
    def parse(cls, data: bytes) -> AttestationReport:
        """Parse and structurally validate a report.

        Raises:
            MalformedReportError: any layout violation: wrong headers, lengths that
                run past the data, duplicate or malformed blocks or TLVs, a missing
                required TLV, or bytes after the signature.
        """
        env = SpdmEnvelope.parse(data)
        opaque = env.opaque
        for t in _REQUIRED_TYPES:
            if t not in opaque:
                raise MalformedReportError(f"opaque data lacks required field {t.name}")
        fwid = opaque.get(OpaqueType.FWID)
        if fwid is not None and len(fwid) != 48:
            raise MalformedReportError(f"FWID field is {len(fwid)} bytes, expected 48")
        nvdec = opaque.get(OpaqueType.NVDEC0_STATUS)
        if nvdec is not None and (len(nvdec) != 1 or nvdec[0] not in (0x55, 0xAA)):
            raise MalformedReportError("NVDEC0 status is neither enabled nor disabled")
        flag = opaque.get(OpaqueType.FEATURE_FLAG)
        chip_info = opaque.get(OpaqueType.CHIP_INFO)
        return cls(
            raw=env.raw,
            nonce=env.nonce,
            responder_nonce=env.responder_nonce,
            blocks=env.blocks,
            opaque=env.opaque,
            driver_version=_ascii_field(opaque[OpaqueType.DRIVER_VERSION], "DRIVER_VERSION"),
            vbios_version=decode_vbios_version(opaque[OpaqueType.VBIOS_VERSION]),
            project=_ascii_field(opaque[OpaqueType.PROJECT], "PROJECT"),
            project_sku=_ascii_field(opaque[OpaqueType.PROJECT_SKU], "PROJECT_SKU"),
            chip_sku=_ascii_field(opaque[OpaqueType.CHIP_SKU], "CHIP_SKU"),
            chip_info=_ascii_field(chip_info, "CHIP_INFO") if chip_info is not None else None,
            fwid=fwid,
            nvdec0_status=nvdec[0] if nvdec is not None else None,
            feature_flag=int.from_bytes(flag, "little") if flag else None,
            unknown_types=env.unknown_types,
            opaque_data=env.opaque_data,
        )


def _parse_blocks(data: bytes, start: int, end: int, count: int) -> dict[int, MeasurementBlock]:
    r = _Reader(data, start, end)
    blocks: dict[int, MeasurementBlock] = {}
    for n in range(count):
        index = r.u8(f"block {n + 1} index")
        spec = r.u8(f"block {n + 1} specification")
        size = r.u16(f"block {n + 1} size")
        body = _Reader(data, r.pos, r.pos + size)
        r.take(size, f"block {n + 1} body")
        if spec != _DMTF_SPEC:
            raise MalformedReportError(f"block {index} is not a DMTF measurement")
        if index == 0 or index in blocks:
            raise MalformedReportError(f"block index {index} is invalid or repeated")
        value_type = body.u8(f"block {index} value type")
        value_size = body.u16(f"block {index} value size")
        value = body.take(value_size, f"block {index} value")
        if body.pos != body.end:
            raise MalformedReportError(f"block {index} size does not match its value")
        blocks[index] = MeasurementBlock(index, value_type, value)
    if r.pos != end:
        raise MalformedReportError(f"measurement record length disagrees with its {count} blocks")
    return blocks


def _parse_opaque(data: bytes, start: int, end: int) -> OpaqueData:
    if data[start : start + len(OPAQUE_MAGIC)] == OPAQUE_MAGIC:
        return _parse_versioned(data, start, end)
    r = _Reader(data, start, end)
    fields: dict[int, bytes] = {}
    while r.pos < r.end:
        t = r.u16("opaque type")
        length = r.u16(f"opaque field {t} length")
        _add_field(fields, t, r.take(length, f"opaque field {t} value"))
    return _opaque(fields, {}, None)


def _parse_versioned(data: bytes, start: int, end: int) -> OpaqueData:
    r = _Reader(data, start, end)
    r.take(len(OPAQUE_MAGIC), "opaque data magic")
    profile = r.u16("opaque data profile")
    major, minor, patch = r.u8("opaque major"), r.u8("opaque minor"), r.u8("opaque patch")
    r.take(1, "opaque header padding")
    if major > OPAQUE_MAJOR_VERSION:
        raise UnsupportedFormatError(
            f"versioned opaque data (NVDAOD) version {major}.{minor}.{patch} is not supported: "
            f"the newest major version gpucc reads is {OPAQUE_MAJOR_VERSION}"
        )
    if profile != 0:
        raise UnsupportedFormatError(
            f"versioned opaque data (NVDAOD) profile {profile} is not supported: only profile 0"
        )
    if major < 1:
        raise MalformedReportError(f"versioned opaque data has major version {major}")
    fields: dict[int, bytes] = {}
    value_types: dict[int, int] = {}
    while r.pos < r.end:
        t = r.u16("opaque type")
        value_type = r.u16(f"opaque field {t} value type")
        length = r.u16(f"opaque field {t} length")
        value = r.take(length, f"opaque field {t} value")
        if t == OpaqueType.OPAQUE_DATA_VERSION:
            # The legacy version entry beside a header says nothing the header does not;
            # it is ignored, as NVIDIA's verifier ignores it.
            continue
        _add_field(fields, t, value)
        value_types[t] = value_type
    return _opaque(fields, value_types, (major, minor, patch))


def _add_field(fields: dict[int, bytes], t: int, value: bytes) -> None:
    if t == 0 or t > _MAX_VALID_TYPE:
        raise MalformedReportError(f"opaque field type {t} is not a valid type")
    if t in fields:
        raise MalformedReportError(f"opaque field type {t} appears twice")
    fields[t] = value


def _opaque(
    fields: dict[int, bytes], value_types: dict[int, int], version: tuple[int, int, int] | None
) -> OpaqueData:
    unknown = tuple(sorted(t for t in fields if t not in OpaqueType._value2member_map_))
    return OpaqueData(
        fields=MappingProxyType(fields),
        value_types=MappingProxyType(value_types),
        version=version,
        unknown_types=unknown,
    )


@dataclass(frozen=True)
class EnvelopeReport:
    """A device report read by its SPDM layer alone: for responders whose opaque data holds
    none of the fields a GPU's RIM IDs are derived from (Blackwell's FSP sends none at all).

    Construct only with :meth:`parse`. The signature is *not* verified here.
    """

    raw: bytes = field(repr=False)
    nonce: bytes
    responder_nonce: bytes
    blocks: Mapping[int, MeasurementBlock] = field(repr=False)
    opaque: Mapping[int, bytes] = field(repr=False)
    unknown_types: tuple[int, ...]
    opaque_data: OpaqueData = field(repr=False)

    @property
    def signed_bytes(self) -> bytes:
        """The bytes the signature covers: everything but the last 96."""
        return self.raw[:-SIGNATURE_LENGTH]

    @property
    def signature(self) -> bytes:
        """Raw r||s, 48 + 48 bytes big-endian."""
        return self.raw[-SIGNATURE_LENGTH:]

    @property
    def fwid(self) -> bytes | None:
        """The opaque FWID (type 20) when the report has one."""
        fwid = self.opaque.get(OpaqueType.FWID)
        if fwid is not None and len(fwid) != 48:
            raise MalformedReportError(f"FWID field is {len(fwid)} bytes, expected 48")
        return fwid

    @property
    def nvdec0_disabled(self) -> bool | None:
        """Such reports do not say."""
        return None

    def runtime_measurements(self) -> dict[int, bytes]:
        """Block Index (1-based) → measurement value."""
        return {i: b.value for i, b in self.blocks.items()}

    @classmethod
    def parse(cls, data: bytes) -> EnvelopeReport:
        """Parse the SPDM layer (see :class:`SpdmEnvelope`).

        Raises:
            MalformedReportError: any layout violation.
        """
        env = SpdmEnvelope.parse(data)
        report = cls(
            raw=env.raw,
            nonce=env.nonce,
            responder_nonce=env.responder_nonce,
            blocks=env.blocks,
            opaque=env.opaque,
            unknown_types=env.unknown_types,
            opaque_data=env.opaque_data,
        )
        _ = report.fwid  # its length is checked at parse time, as for every report
        return report
