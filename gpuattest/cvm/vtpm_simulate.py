"""A simulated Azure paravisor's HCL report: runtime claims naming a given AK, and a simulated
SEV-SNP report (:mod:`.snp_simulate`) or TDREPORT (:mod:`.tdx_sim`) whose report data commits
to them.

For tests and demonstrations that provision a TPM simulator as an Azure-shaped CVM (the AK
at 0x81000003, this report in NV index 0x01400001). It attests nothing real: the report
verifies only under the simulated chip's roots.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from typing import Any

from cryptography.hazmat.primitives.asymmetric import rsa

from .hcl import CLAIMS_OFFSET, HCL_REPORT_SIZE, HW_OFFSET, IGVM_OFFSET
from .snp_simulate import DEFAULT_MEASUREMENT, SimulatedSnp
from .tdx_sim import SimulatedTdx

__all__ = ["DEFAULT_VM_CONFIGURATION", "simulated_hcl_report", "simulated_tdx_hcl_report"]

DEFAULT_VM_CONFIGURATION: dict[str, Any] = {
    "console-enabled": False,
    "secure-boot": True,
    "tpm-enabled": True,
    "tpm-persisted": True,
    "vmUniqueId": "7f3c5a12-0d1e-4b6a-9c2f-5a1b3c4d5e6f",
}


def _b64url(value: int) -> str:
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _claims(ak: rsa.RSAPublicKey, vm_configuration: dict[str, Any] | None) -> bytes:
    numbers = ak.public_numbers()
    jwk = {"kid": "HCLAkPub", "key_ops": ["sign"], "kty": "RSA",
           "e": _b64url(numbers.e), "n": _b64url(numbers.n)}  # fmt: skip
    config = DEFAULT_VM_CONFIGURATION if vm_configuration is None else vm_configuration
    claims = json.dumps({"keys": [jwk], "vm-configuration": config}).encode()
    if CLAIMS_OFFSET + len(claims) > HCL_REPORT_SIZE:
        raise ValueError("the runtime claims do not fit an HCL report")
    return claims


def _hcl(hardware: bytes, report_type: int, claims: bytes) -> bytes:
    out = bytearray(HCL_REPORT_SIZE)
    struct.pack_into("<4sIIII", out, 0, b"HCLA", 2, CLAIMS_OFFSET + len(claims), 2, 0)
    out[HW_OFFSET : HW_OFFSET + len(hardware)] = hardware
    struct.pack_into("<IIIII", out, IGVM_OFFSET, 20 + len(claims), 1, report_type, 1, len(claims))
    out[CLAIMS_OFFSET : CLAIMS_OFFSET + len(claims)] = claims
    return bytes(out)


def simulated_hcl_report(
    snp: SimulatedSnp,
    ak: rsa.RSAPublicKey,
    *,
    vm_configuration: dict[str, Any] | None = None,
    measurement: bytes = DEFAULT_MEASUREMENT,
) -> bytes:
    """A 2600-byte HCL report (header version 2, SEV-SNP) whose runtime claims name ``ak``
    as ``HCLAkPub``, signed by ``snp``."""
    claims = _claims(ak, vm_configuration)
    report_data = hashlib.sha256(claims).digest() + bytes(32)
    return _hcl(snp.report(report_data=report_data, measurement=measurement), 2, claims)


def simulated_tdx_hcl_report(
    tdx: SimulatedTdx,
    ak: rsa.RSAPublicKey,
    *,
    vm_configuration: dict[str, Any] | None = None,
    rtmrs: tuple[bytes, bytes, bytes, bytes] = (bytes(48), bytes(48), bytes(48), bytes(48)),
) -> bytes:
    """A 2600-byte HCL report (header version 2, TDX) whose runtime claims name ``ak`` as
    ``HCLAkPub``: a TDREPORT of ``tdx``'s platform committing to them, the RTMRs zero as on
    Azure (the paravisor measures into the vTPM). ``tdx.quote_td_report`` quotes it, as the
    paravisor's quote endpoint does (:mod:`.azure_tdquote`)."""
    claims = _claims(ak, vm_configuration)
    report_data = hashlib.sha256(claims).digest() + bytes(32)
    return _hcl(tdx.td_report(report_data, rtmrs=rtmrs), 4, claims)
