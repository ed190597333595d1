"""Strict parser for NVIDIA NVSwitch (LS10) attestation reports.

The SPDM layer is the GPU's (:class:`~gpuattest.report.SpdmEnvelope`: request,
MEASUREMENTS response, bounds-checked blocks and TLVs, the 96-byte signature and
nothing after it). What differs is the opaque data:

* type 6, VBIOS_VERSION, is ASCII (``96.10.55.00.01``), not the GPU's 8 packed bytes;
* types from 22 up mean switch things: 22 DEVICE_PDI (8 bytes), 23 DISABLED_PORTS,
  24 POSITION_ID, 25 LOCK_STATUS, 26 SWITCH_GPU_PDIS (n x 8 bytes);
* there is no FWID (type 20) and no driver version: a switch has one RIM, its BIOS RIM.

The BIOS RIM ID is ``NV_SWITCH_BIOS_<project>_<project SKU>_<chip SKU>_<version>``;
for LS10 NVIDIA's tools use the fixed project 5612, project SKU 0002 and chip SKU 890,
which the report does not carry.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpucc.core.errors import MalformedReportError

from .report import SIGNATURE_LENGTH, MeasurementBlock, OpaqueData, OpaqueType, SpdmEnvelope

__all__ = [
    "LS10_BIOS_IDS",
    "PDI_LENGTH",
    "SwitchOpaqueType",
    "SwitchReport",
    "split_pdis",
]

PDI_LENGTH = 8
#: (project, project SKU, chip SKU) of LS10's BIOS RIM ID, fixed by NVIDIA's tools.
LS10_BIOS_IDS = ("5612", "0002", "890")
_MAX_VERSION = 32


class SwitchOpaqueType(enum.IntEnum):
    """Opaque types whose meaning on an NVSwitch differs from a GPU's (22 and up)."""

    DEVICE_PDI = 22
    DISABLED_PORTS = 23
    POSITION_ID = 24
    LOCK_STATUS = 25
    SWITCH_GPU_PDIS = 26


def split_pdis(raw: bytes, what: str) -> tuple[bytes, ...]:
    """A list of 8-byte PDIs, in report order.

    Raises:
        MalformedReportError: the length is not a multiple of 8.
    """
    if len(raw) % PDI_LENGTH:
        raise MalformedReportError(
            f"{what} is {len(raw)} bytes, not a whole number of {PDI_LENGTH}-byte PDIs"
        )
    return tuple(raw[i : i + PDI_LENGTH] for i in range(0, len(raw), PDI_LENGTH))


def _ascii_version(raw: bytes) -> str:
    text = raw.rstrip(b"\x00")
    if not text or len(text) > _MAX_VERSION:
        raise MalformedReportError(
            f"the switch VBIOS_VERSION field is {len(raw)} bytes, expected 1..{_MAX_VERSION}"
        )
    try:
        value = text.decode("ascii")
    except UnicodeDecodeError:
        raise MalformedReportError("the switch VBIOS_VERSION field is not ASCII") from None
    if not all(c in "0123456789abcdefABCDEF." for c in value):
        raise MalformedReportError(f"the switch VBIOS_VERSION {value!r} is not a version")
    return value.upper()


@dataclass(frozen=True)
class SwitchReport:
    """A parsed, structurally valid NVSwitch report (the signature is not verified here)."""

    raw: bytes = field(repr=False)
    nonce: bytes
    blocks: Mapping[int, MeasurementBlock] = field(repr=False)
    opaque: Mapping[int, bytes] = field(repr=False)
    bios_version: str
    device_pdi: bytes
    gpu_pdis: tuple[bytes, ...]
    disabled_ports: bytes | None
    position_id: int | None
    lock_status: int | None
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
        """SHA-256 of the whole report."""
        return hashlib.sha256(self.raw).digest()

    @property
    def fwid(self) -> bytes | None:
        """Switch reports carry no FWID (opaque type 20); None unless one ever does."""
        return self.opaque.get(OpaqueType.FWID)

    @property
    def nvdec0_disabled(self) -> bool | None:
        """A switch has no NVDEC0."""
        return None

    def runtime_measurements(self) -> dict[int, bytes]:
        """Block Index (1-based) to measurement value."""
        return {i: b.value for i, b in self.blocks.items()}

    def bios_rim_id(self) -> str:
        """The BIOS RIM ID as NVIDIA's tools derive it for LS10."""
        project, sku, chip = LS10_BIOS_IDS
        version = self.bios_version.replace(".", "").upper()
        return f"NV_SWITCH_BIOS_{project}_{sku}_{chip}_{version}"

    @classmethod
    def parse(cls, data: bytes) -> SwitchReport:
        """Parse and structurally validate a switch report.

        Raises:
            MalformedReportError: any SPDM layout violation, a missing VBIOS_VERSION or
                DEVICE_PDI, or a malformed switch field.
        """
        env = SpdmEnvelope.parse(data)
        opaque = env.opaque
        if OpaqueType.VBIOS_VERSION not in opaque:
            raise MalformedReportError("opaque data lacks required field VBIOS_VERSION")
        pdi = opaque.get(SwitchOpaqueType.DEVICE_PDI)
        if pdi is None:
            raise MalformedReportError("opaque data lacks required field DEVICE_PDI")
        if len(pdi) != PDI_LENGTH:
            raise MalformedReportError(f"DEVICE_PDI is {len(pdi)} bytes, expected {PDI_LENGTH}")
        fwid = opaque.get(OpaqueType.FWID)
        if fwid is not None and len(fwid) != 48:
            raise MalformedReportError(f"FWID field is {len(fwid)} bytes, expected 48")
        gpu_pdis = split_pdis(opaque.get(SwitchOpaqueType.SWITCH_GPU_PDIS, b""), "SWITCH_GPU_PDIS")
        position = opaque.get(SwitchOpaqueType.POSITION_ID)
        lock = opaque.get(SwitchOpaqueType.LOCK_STATUS)
        return cls(
            raw=env.raw,
            nonce=env.nonce,
            blocks=env.blocks,
            opaque=opaque,
            bios_version=_ascii_version(opaque[OpaqueType.VBIOS_VERSION]),
            device_pdi=pdi,
            gpu_pdis=gpu_pdis,
            disabled_ports=opaque.get(SwitchOpaqueType.DISABLED_PORTS),
            position_id=int.from_bytes(position, "little") if position else None,
            lock_status=int.from_bytes(lock, "little") if lock else None,
            opaque_data=env.opaque_data,
        )
