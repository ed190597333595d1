"""Azure's HCL report: the hardware report a paravisor keeps in its vTPM, with its runtime claims.

On Azure's confidential VMs the guest runs above a paravisor (the "HCL"), which asks the
hardware for a report and stores it in the vTPM's NV index 0x01400001. The report data it
asked for is SHA-256 of a JSON document, the *runtime claims*, which names the vTPM's
attestation key (AK). Layout, little-endian, 2600 bytes::

    0x000 'HCLA'  u32 header version (1 or 2)  u32 report_size  u32 request_type (2)
          u32 status (0)  12 reserved bytes (zero)
    0x020 hardware report: an SEV-SNP report (1184 bytes) or a TDREPORT (1024 bytes, then
          160 zero bytes)
    0x4C0 IGVM request data: u32 data_size (20 + variable_data_size), u32 version (1),
          u32 report_type (2 SEV-SNP, 4 TDX), u32 report_data_hash_type (1 SHA-256),
          u32 variable_data_size
    0x4D4 the runtime claims (variable_data_size bytes of JSON); report_size ends here, and
          every byte after it is zero.

Every rule above is checked; a blob that breaks one is :class:`MalformedHclReportError`
(exit 4). The runtime claims must be a JSON object with ``keys`` (JWKs; ``HCLAkPub`` an RSA
key of 2048 to 4096 bits), ``vm-configuration`` (an object) and, when present, ``user-data``
(128 hex digits).
"""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric import rsa

from gpucc.core.errors import MalformedInputError
from gpucc.core.jsonio import loads_untrusted

__all__ = [
    "HCL_REPORT_SIZE",
    "AzureTee",
    "HclReport",
    "MalformedHclReportError",
    "RuntimeClaims",
    "parse_hcl_report",
    "parse_runtime_claims",
]

HCL_REPORT_SIZE = 2600
HW_OFFSET = 0x20
IGVM_OFFSET = 0x4C0
CLAIMS_OFFSET = 0x4D4
HW_SIZE = IGVM_OFFSET - HW_OFFSET  # 1184
TDREPORT_SIZE = 1024
_MAGIC = b"HCLA"
_HEADER = struct.Struct("<4sIIII12s")
_IGVM = struct.Struct("<IIIII")
_TEE = {2: "snp", 4: "tdx"}
AzureTee = str  # "snp" or "tdx"


class MalformedHclReportError(MalformedInputError):
    """The bytes are not an HCL report (or its runtime claims) of the shape gpucc reads."""


@dataclass(frozen=True)
class HclReport:
    """One parsed HCL report.

    Attributes:
        tee: ``"snp"`` or ``"tdx"`` (the IGVM report type).
        header_version: 1 or 2.
        hardware_report: the SEV-SNP report (1184 bytes) or the TDREPORT (1024 bytes).
        runtime_claims: the exact bytes whose SHA-256 the hardware report's data commits to.
    """

    tee: AzureTee
    header_version: int
    hardware_report: bytes = field(repr=False)
    runtime_claims: bytes = field(repr=False)

    @property
    def claims_sha256(self) -> bytes:
        """SHA-256 of the runtime claims."""
        return hashlib.sha256(self.runtime_claims).digest()


def parse_hcl_report(data: bytes) -> HclReport:
    """Parse an HCL report strictly (see the module docstring).

    Raises:
        MalformedHclReportError: any rule broken.
    """
    if len(data) != HCL_REPORT_SIZE:
        raise MalformedHclReportError(
            f"an HCL report has {HCL_REPORT_SIZE} bytes, this has {len(data)}"
        )
    data = bytes(data)
    magic, version, report_size, request_type, status, reserved = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise MalformedHclReportError("the HCL report does not start with 'HCLA'")
    if version not in (1, 2):
        raise MalformedHclReportError(f"HCL report header version {version} is not 1 or 2")
    if request_type != 2 or status != 0 or any(reserved):
        raise MalformedHclReportError(
            f"the HCL report header has request type {request_type}, status {status} or "
            "non-zero reserved bytes (expected 2, 0, zero)"
        )
    data_size, igvm_version, report_type, hash_type, var_size = _IGVM.unpack_from(data, IGVM_OFFSET)
    if igvm_version != 1 or report_type not in _TEE or hash_type != 1:
        raise MalformedHclReportError(
            f"the HCL report's IGVM request data (version {igvm_version}, report type "
            f"{report_type}, hash type {hash_type}) is not version 1, SEV-SNP or TDX, SHA-256"
        )
    end = CLAIMS_OFFSET + var_size
    if data_size != _IGVM.size + var_size or report_size != end or end > len(data):
        raise MalformedHclReportError(
            "the HCL report's sizes do not add up (report size, IGVM data size, runtime claims)"
        )
    if any(data[end:]):
        raise MalformedHclReportError("the HCL report has non-zero bytes after its runtime claims")
    tee = _TEE[report_type]
    hardware = data[HW_OFFSET:IGVM_OFFSET]
    if tee == "tdx":
        if any(hardware[TDREPORT_SIZE:]):
            raise MalformedHclReportError("the HCL report has non-zero bytes after its TDREPORT")
        hardware = hardware[:TDREPORT_SIZE]
        if hardware[0] != 0x81:
            raise MalformedHclReportError("the HCL report's TDREPORT is not of type 0x81 (TDX)")
    return HclReport(tee, version, hardware, data[CLAIMS_OFFSET:end])


@dataclass(frozen=True)
class RuntimeClaims:
    """What the paravisor's runtime claims say.

    Attributes:
        ak: the vTPM attestation key (``HCLAkPub``).
        ak_sha256: SHA-256 of the AK's DER SubjectPublicKeyInfo (shown as a claim).
        vm_configuration: the ``vm-configuration`` object as given.
        user_data: the 64 bytes of ``user-data``, or None when absent.
        key_ids: every JWK's ``kid``, in order.
    """

    ak: rsa.RSAPublicKey = field(repr=False)
    ak_sha256: bytes
    vm_configuration: dict[str, Any]
    user_data: bytes | None
    key_ids: tuple[str, ...]


def _b64url_int(value: Any, what: str) -> int:
    if not isinstance(value, str) or not value or len(value) > 1024:
        raise MalformedHclReportError(f"the runtime claims' {what} is not base64url text")
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except ValueError:
        raise MalformedHclReportError(f"the runtime claims' {what} is not base64url") from None
    return int.from_bytes(raw, "big")


def _ak(keys: Any) -> tuple[rsa.RSAPublicKey, tuple[str, ...]]:
    if not isinstance(keys, list) or not all(isinstance(k, dict) for k in keys):
        raise MalformedHclReportError("the runtime claims' 'keys' is not a list of JWKs")
    kids = tuple(str(k.get("kid")) for k in keys)
    found = [k for k in keys if k.get("kid") == "HCLAkPub"]
    if len(found) != 1:
        raise MalformedHclReportError(
            f"the runtime claims name {len(found)} attestation keys 'HCLAkPub' (expected one)"
        )
    jwk = found[0]
    if jwk.get("kty") != "RSA":
        raise MalformedHclReportError("the runtime claims' attestation key is not an RSA key")
    n, e = _b64url_int(jwk.get("n"), "AK modulus"), _b64url_int(jwk.get("e"), "AK exponent")
    if not 2048 <= n.bit_length() <= 4096 or e < 3 or e % 2 == 0 or e >= 1 << 32:
        raise MalformedHclReportError(
            "the runtime claims' attestation key is not an RSA key of 2048 to 4096 bits"
        )
    try:
        return rsa.RSAPublicNumbers(e, n).public_key(), kids
    except ValueError as exc:
        raise MalformedHclReportError(f"the runtime claims' attestation key: {exc}") from None


def parse_runtime_claims(data: bytes) -> RuntimeClaims:
    """Parse the runtime claims JSON (see the module docstring).

    Raises:
        MalformedHclReportError: not JSON, or a required member missing or of the wrong shape.
    """
    from cryptography.hazmat.primitives import serialization

    doc = loads_untrusted(
        data, what="HCL runtime claims", error=MalformedHclReportError, max_bytes=HCL_REPORT_SIZE
    )
    if not isinstance(doc, dict):
        raise MalformedHclReportError("the HCL runtime claims are not a JSON object")
    ak, kids = _ak(doc.get("keys"))
    config = doc.get("vm-configuration")
    if not isinstance(config, dict):
        raise MalformedHclReportError("the runtime claims have no 'vm-configuration' object")
    user_data: bytes | None = None
    if "user-data" in doc:
        text = doc["user-data"]
        try:
            user_data = bytes.fromhex(text) if isinstance(text, str) else None
        except ValueError:
            user_data = None
        if user_data is None or len(user_data) != 64:
            raise MalformedHclReportError("the runtime claims' 'user-data' is not 64 bytes of hex")
    der = ak.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return RuntimeClaims(ak, hashlib.sha256(der).digest(), dict(config), user_data, kids)
