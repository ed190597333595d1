"""Strict parser for AMD SEV-SNP attestation reports (versions 2 and 3).

The layout is AMD's ``ATTESTATION_REPORT`` structure (SEV Secure Nested Paging Firmware ABI
Specification): 1184 bytes (0x4A0), little-endian, the signed part is the first 0x2A0 bytes
and the signature follows::

    0x000 VERSION u32            0x004 GUEST_SVN u32        0x008 POLICY u64
    0x010 FAMILY_ID [16]         0x020 IMAGE_ID [16]        0x030 VMPL u32
    0x034 SIGNATURE_ALGO u32     0x038 CURRENT_TCB u64      0x040 PLATFORM_INFO u64
    0x048 key info u32 (bit 0 AUTHOR_KEY_EN, bit 1 MASK_CHIP_KEY, bits 4:2 SIGNING_KEY)
    0x04C reserved u32           0x050 REPORT_DATA [64]     0x090 MEASUREMENT [48]
    0x0C0 HOST_DATA [32]         0x0E0 ID_KEY_DIGEST [48]   0x110 AUTHOR_KEY_DIGEST [48]
    0x140 REPORT_ID [32]         0x160 REPORT_ID_MA [32]    0x180 REPORTED_TCB u64
    0x188 CPUID_FAM_ID, CPUID_MOD_ID, CPUID_STEP u8 (version 3; reserved in version 2)
    0x1A0 CHIP_ID [64]           0x1E0 COMMITTED_TCB u64
    0x1E8 CURRENT_BUILD, CURRENT_MINOR, CURRENT_MAJOR u8, reserved u8
    0x1EC COMMITTED_BUILD, COMMITTED_MINOR, COMMITTED_MAJOR u8, reserved u8
    0x1F0 LAUNCH_TCB u64         0x1F8 reserved (to 0x2A0)
    0x2A0 SIGNATURE: R [72], S [72] (little-endian), reserved [368]

Refused as malformed (:class:`MalformedSnpReportError`, exit 4): any size other than 1184
bytes, a version other than 2 or 3, a signature algorithm other than 1 (ECDSA P-384 with
SHA-384), non-zero bytes in the reserved ranges that versions 2 and 3 leave unused (0x188 or
0x18B to 0x1A0, 0x1F8 to 0x2A0, the signature's 368 trailing bytes) and in the 24 high bytes
of R and S (a P-384 scalar has 48 bytes). The reserved bits of the key-info word and the
single reserved bytes beside the firmware versions are not checked: newer firmware may use
them without changing the report version.

A TCB_VERSION is 8 bytes whose layout depends on the product line: Milan and Genoa put the
boot loader SPL in byte 0, TEE in byte 1, SNP in byte 6 and microcode in byte 7; Turin puts
FMC in byte 0, boot loader in 1, TEE in 2, SNP in 3 and microcode in 7.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from gpucc.core.errors import MalformedInputError

__all__ = [
    "REPORT_SIZE",
    "SIGNED_SIZE",
    "SUPPORTED_VERSIONS",
    "MalformedSnpReportError",
    "SigningKey",
    "SnpProduct",
    "SnpReport",
    "SnpTcb",
    "looks_like_snp_report",
    "parse_snp_report",
    "product_from_cpuid",
]

REPORT_SIZE = 0x4A0
SIGNED_SIZE = 0x2A0
SUPPORTED_VERSIONS = (2, 3)
ECDSA_P384_SHA384 = 1
POLICY_DEBUG_BIT = 19
_SCALAR = 72  # bytes per signature component in the report
_P384_BYTES = 48


class MalformedSnpReportError(MalformedInputError):
    """The bytes are not an SEV-SNP attestation report gpucc can read."""


class SnpProduct(enum.StrEnum):
    """AMD EPYC product lines with SEV-SNP (KDS spells them this way)."""

    MILAN = "Milan"
    GENOA = "Genoa"
    TURIN = "Turin"


class SigningKey(enum.IntEnum):
    """Which key signed the report (key-info bits 4:2)."""

    VCEK = 0
    VLEK = 1
    NONE = 7


def product_from_cpuid(family: int, model: int) -> SnpProduct | None:
    """The product line of a CPU family/model pair (the report's v3 CPUID fields)."""
    if family == 0x19 and model <= 0x0F:
        return SnpProduct.MILAN
    if family == 0x19 and (0x10 <= model <= 0x1F or 0xA0 <= model <= 0xAF):
        return SnpProduct.GENOA  # Genoa, Bergamo and Siena share Genoa's keys
    if family == 0x1A and model <= 0x11:
        return SnpProduct.TURIN
    return None


@dataclass(frozen=True)
class SnpTcb:
    """The security patch levels (SPLs) of one TCB_VERSION; ``fmc`` only on Turin."""

    bootloader: int
    tee: int
    snp: int
    microcode: int
    fmc: int | None = None

    @classmethod
    def decode(cls, raw: int, product: SnpProduct | None) -> SnpTcb:
        """Decode the 64-bit field; an unknown product decodes with Milan/Genoa's layout."""
        b = raw.to_bytes(8, "little")
        if product is SnpProduct.TURIN:
            return cls(bootloader=b[1], tee=b[2], snp=b[3], microcode=b[7], fmc=b[0])
        return cls(bootloader=b[0], tee=b[1], snp=b[6], microcode=b[7])

    def encode(self, product: SnpProduct) -> int:
        """The 64-bit field for ``product``'s layout."""
        if product is SnpProduct.TURIN:
            b = bytes([self.fmc or 0, self.bootloader, self.tee, self.snp, 0, 0, 0, self.microcode])
        else:
            b = bytes([self.bootloader, self.tee, 0, 0, 0, 0, self.snp, self.microcode])
        return int.from_bytes(b, "little")

    def to_dict(self) -> dict[str, int]:
        """Claim form: component name -> SPL."""
        out = {
            "bootloader": self.bootloader,
            "tee": self.tee,
            "snp": self.snp,
            "microcode": self.microcode,
        }
        if self.fmc is not None:
            out["fmc"] = self.fmc
        return out


@dataclass(frozen=True)
class SnpReport:
    """One parsed report; every field as the firmware signed it.

    TCB fields are kept raw (``*_tcb_raw``); :meth:`tcb` decodes them for a product line.
    """

    raw: bytes
    version: int
    guest_svn: int
    policy: int
    family_id: bytes
    image_id: bytes
    vmpl: int
    signature_algo: int
    current_tcb_raw: int
    platform_info: int
    author_key_en: bool
    mask_chip_key: bool
    signing_key: int
    report_data: bytes
    measurement: bytes
    host_data: bytes
    id_key_digest: bytes
    author_key_digest: bytes
    report_id: bytes
    report_id_ma: bytes
    reported_tcb_raw: int
    cpuid_family: int | None
    cpuid_model: int | None
    cpuid_stepping: int | None
    chip_id: bytes
    committed_tcb_raw: int
    current_version: tuple[int, int, int]
    committed_version: tuple[int, int, int]
    launch_tcb_raw: int
    signature_r: int
    signature_s: int

    @property
    def signed_bytes(self) -> bytes:
        """The bytes the signature covers (0x000 to 0x2A0)."""
        return self.raw[:SIGNED_SIZE]

    @property
    def debug(self) -> bool:
        """The guest policy allows debugging (policy bit 19)."""
        return bool(self.policy >> POLICY_DEBUG_BIT & 1)

    @property
    def cpuid_product(self) -> SnpProduct | None:
        """The product line the v3 CPUID fields name (None for v2 or unknown CPUs)."""
        if self.cpuid_family is None or self.cpuid_model is None:
            return None
        return product_from_cpuid(self.cpuid_family, self.cpuid_model)

    def tcb(self, which: str, product: SnpProduct | None) -> SnpTcb:
        """Decode ``current``, ``reported``, ``committed`` or ``launch`` TCB for ``product``."""
        raw = {
            "current": self.current_tcb_raw,
            "reported": self.reported_tcb_raw,
            "committed": self.committed_tcb_raw,
            "launch": self.launch_tcb_raw,
        }[which]
        return SnpTcb.decode(raw, product)


_HEAD = struct.Struct("<IIQ16s16sIIQQII64s48s32s48s48s32s32sQ")
_MID = struct.Struct("<64sQBBBxBBBxQ")


def looks_like_snp_report(data: bytes) -> bool:
    """Whether ``data`` is shaped like an SEV-SNP report (cheap; proves nothing).

    True when it is at least 0x38 bytes long, its version word is a small number (1 to 255)
    and its signature-algorithm word says ECDSA P-384; a TDX quote's first word (version 4 or
    5 with key type 2 above it) is never that small. A size other than 1184 bytes or an
    unknown version is left to :func:`parse_snp_report`, which names the problem.
    """
    if len(data) < 0x38:
        return False
    version = int.from_bytes(data[0:4], "little")
    algo = int.from_bytes(data[0x34:0x38], "little")
    return 1 <= version <= 0xFF and algo == ECDSA_P384_SHA384


def _require_zero(data: bytes, start: int, end: int, what: str) -> None:
    if any(data[start:end]):
        raise MalformedSnpReportError(
            f"SEV-SNP report has non-zero reserved bytes at 0x{start:X}..0x{end:X} ({what})"
        )


def parse_snp_report(data: bytes) -> SnpReport:
    """Parse a version 2 or 3 report strictly (see the module docstring).

    Raises:
        MalformedSnpReportError: wrong size, unknown version or signature algorithm, non-zero
            reserved bytes.
    """
    if len(data) != REPORT_SIZE:
        raise MalformedSnpReportError(
            f"an SEV-SNP report has {REPORT_SIZE} bytes, this has {len(data)}"
        )
    data = bytes(data)
    (
        version,
        guest_svn,
        policy,
        family_id,
        image_id,
        vmpl,
        signature_algo,
        current_tcb,
        platform_info,
        key_info,
        _reserved,
        report_data,
        measurement,
        host_data,
        id_key_digest,
        author_key_digest,
        report_id,
        report_id_ma,
        reported_tcb,
    ) = _HEAD.unpack_from(data, 0)
    if version not in SUPPORTED_VERSIONS:
        raise MalformedSnpReportError(
            f"SEV-SNP report version {version} is not supported (gpucc reads versions 2 and 3)"
        )
    if signature_algo != ECDSA_P384_SHA384:
        raise MalformedSnpReportError(
            f"SEV-SNP report signature algorithm {signature_algo} is not ECDSA P-384 SHA-384"
        )
    cpuid: tuple[int | None, int | None, int | None] = (None, None, None)
    if version >= 3:
        fam, mod, step = data[0x188], data[0x189], data[0x18A]
        cpuid = (fam, mod, step)
        _require_zero(data, 0x18B, 0x1A0, "after CPUID")
    else:
        _require_zero(data, 0x188, 0x1A0, "before CHIP_ID")
    (chip_id, committed_tcb, cb, cmi, cma, mb, mmi, mma, launch_tcb) = _MID.unpack_from(data, 0x1A0)
    _require_zero(data, 0x1F8, SIGNED_SIZE, "after LAUNCH_TCB")
    sig = data[SIGNED_SIZE:]
    r_raw, s_raw = sig[:_SCALAR], sig[_SCALAR : 2 * _SCALAR]
    if any(r_raw[_P384_BYTES:]) or any(s_raw[_P384_BYTES:]):
        raise MalformedSnpReportError("SEV-SNP report signature R or S exceeds 384 bits")
    _require_zero(data, SIGNED_SIZE + 2 * _SCALAR, REPORT_SIZE, "in the signature")
    return SnpReport(
        raw=data,
        version=version,
        guest_svn=guest_svn,
        policy=policy,
        family_id=family_id,
        image_id=image_id,
        vmpl=vmpl,
        signature_algo=signature_algo,
        current_tcb_raw=current_tcb,
        platform_info=platform_info,
        author_key_en=bool(key_info & 1),
        mask_chip_key=bool(key_info >> 1 & 1),
        signing_key=key_info >> 2 & 0x7,
        report_data=report_data,
        measurement=measurement,
        host_data=host_data,
        id_key_digest=id_key_digest,
        author_key_digest=author_key_digest,
        report_id=report_id,
        report_id_ma=report_id_ma,
        reported_tcb_raw=reported_tcb,
        cpuid_family=cpuid[0],
        cpuid_model=cpuid[1],
        cpuid_stepping=cpuid[2],
        chip_id=chip_id,
        committed_tcb_raw=committed_tcb,
        current_version=(cma, cmi, cb),
        committed_version=(mma, mmi, mb),
        launch_tcb_raw=launch_tcb,
        signature_r=int.from_bytes(r_raw, "little"),
        signature_s=int.from_bytes(s_raw, "little"),
    )
