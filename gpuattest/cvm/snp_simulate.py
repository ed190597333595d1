"""A software SEV-SNP platform: AMD-shaped ARK, ASK and VCEK made here, and reports they sign.

For tests and demonstrations that need reports no real CPU here can give (a chosen report
data, measurement, host data or policy). The shapes follow AMD's: a self-signed RSA ARK and
an RSA ASK per product line signing with RSA-PSS SHA-384 (salt 48), an ECDSA P-384 VCEK
carrying the TCB SPLs, productName and hwID extensions under AMD's OID arc, and reports
signed with ECDSA P-384 SHA-384 with R and S little-endian. Nothing made here verifies under
AMD's pinned roots: callers pass :attr:`SimulatedSnp.roots` explicitly, through the same
``roots`` argument production uses.

AMD's ARK and ASK are RSA-4096; the simulated ones are RSA-2048 by default (``rsa_bits``),
because a 4096-bit key takes 0.3 s to several seconds to generate on a small machine. Each
ARK/ASK pair is made once per process and product line and then reused. With a ``seed`` the
chip, the VCEK's key, the report ID and the report signatures (RFC 6979) are reproducible;
the RSA roots and the certificates' RSA-PSS signatures are not (PSS salts are random).
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import os
import struct
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from .snp_report import REPORT_SIZE, SIGNED_SIZE, SigningKey, SnpProduct, SnpTcb
from .snp_roots import (
    OID_BOOTLOADER,
    OID_FMC,
    OID_HWID,
    OID_MICROCODE,
    OID_PRODUCT_NAME,
    OID_SNP,
    OID_TEE,
    SnpProductRoots,
    SnpRoots,
)

__all__ = [
    "DEFAULT_MEASUREMENT",
    "DEFAULT_TCB",
    "SimulatedSnp",
    "SnpPki",
    "simulate_snp_report",
    "snp_pki",
]

DEFAULT_MEASUREMENT = hashlib.sha384(b"gpucc simulated SEV-SNP guest").digest()
DEFAULT_TCB = SnpTcb(bootloader=9, tee=0, snp=23, microcode=72)
_DEFAULT_TURIN_TCB = SnpTcb(bootloader=1, tee=1, snp=3, microcode=75, fmc=1)
_NOT_BEFORE = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
_NOT_AFTER = dt.datetime(2031, 1, 1, tzinfo=dt.UTC)
_ROOTS_NOT_AFTER = dt.datetime(2049, 1, 1, tzinfo=dt.UTC)
_CPUID = {
    SnpProduct.MILAN: (0x19, 0x01, 0x01),
    SnpProduct.GENOA: (0x19, 0x11, 0x01),
    SnpProduct.TURIN: (0x1A, 0x02, 0x00),
}
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48)
_P384_ORDER = int(
    "ffffffffffffffffffffffffffffffffffffffffffffffffc7634d81f4372ddf581a0db248b0a77aecec196accc52973",
    16,
)


def _name(cn: str, label: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "Engineering"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, label),
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
        ]
    )


def _key_usage(*, cert_sign: bool, crl_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=False,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=crl_sign,
        encipher_only=False,
        decipher_only=False,
    )


@dataclass(frozen=True)
class SnpPki:
    """A simulated product line's ARK and ASK with their private keys (test use only)."""

    product: SnpProduct
    ark: x509.Certificate
    ask: x509.Certificate
    ark_key: rsa.RSAPrivateKey = field(repr=False)
    ask_key: rsa.RSAPrivateKey = field(repr=False)

    @property
    def roots(self) -> SnpRoots:
        """These anchors as :class:`SnpRoots` (this product line only)."""
        return SnpRoots((SnpProductRoots(self.product, self.ark, self.ask),))


@functools.cache
def snp_pki(
    product: SnpProduct = SnpProduct.MILAN,
    *,
    label: str = "gpucc simulation",
    instance: int = 0,
    rsa_bits: int = 2048,
) -> SnpPki:
    """The simulated ARK/ASK of ``product`` (made once per process and arguments).

    ``label`` goes into the names (another label: another chain with other names);
    ``instance`` makes another chain with the same names but other keys.
    """
    del instance  # part of the cache key only
    ark_key = rsa.generate_private_key(public_exponent=65537, key_size=rsa_bits)
    ask_key = rsa.generate_private_key(public_exponent=65537, key_size=rsa_bits)
    ark_name = _name(f"ARK-{product.value}", label)
    ark = (
        x509.CertificateBuilder()
        .subject_name(ark_name)
        .issuer_name(ark_name)
        .public_key(ark_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        .not_valid_after(_ROOTS_NOT_AFTER)
        .add_extension(_key_usage(cert_sign=True, crl_sign=True), critical=True)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ark_key, hashes.SHA384(), rsa_padding=_PSS)
    )
    ask = (
        x509.CertificateBuilder()
        .subject_name(_name(f"SEV-{product.value}", label))
        .issuer_name(ark_name)
        .public_key(ask_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        .not_valid_after(_ROOTS_NOT_AFTER)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True, crl_sign=False), critical=True)
        .sign(ark_key, hashes.SHA384(), rsa_padding=_PSS)
    )
    return SnpPki(product, ark, ask, ark_key, ask_key)


def _der_int(value: int) -> bytes:
    body = value.to_bytes(max(1, (value.bit_length() + 8) // 8), "big")
    return bytes([0x02, len(body)]) + body


def _ext(oid: x509.ObjectIdentifier, value: bytes) -> x509.UnrecognizedExtension:
    return x509.UnrecognizedExtension(oid, value)


def make_vcek(
    pki: SnpPki,
    key: ec.EllipticCurvePrivateKey,
    *,
    hwid: bytes,
    tcb: SnpTcb,
    not_before: dt.datetime = _NOT_BEFORE,
    not_after: dt.datetime = _NOT_AFTER,
    product_name: str | None = None,
) -> bytes:
    """A DER VCEK for ``key``, issued by ``pki``'s ASK, for chip ``hwid`` at ``tcb``."""
    name = product_name if product_name is not None else f"{pki.product.value}-B0"
    label = pki.ask.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name("SEV-VCEK", str(label)))
        .issuer_name(pki.ask.subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(_ext(x509.ObjectIdentifier("1.3.6.1.4.1.3704.1.1"), _der_int(0)), False)
        .add_extension(
            _ext(OID_PRODUCT_NAME, bytes([0x16, len(name)]) + name.encode("ascii")), False
        )
        .add_extension(_ext(OID_BOOTLOADER, _der_int(tcb.bootloader)), False)
        .add_extension(_ext(OID_TEE, _der_int(tcb.tee)), False)
        .add_extension(_ext(OID_SNP, _der_int(tcb.snp)), False)
        .add_extension(_ext(OID_MICROCODE, _der_int(tcb.microcode)), False)
        .add_extension(_ext(OID_HWID, hwid), False)
    )
    if tcb.fmc is not None:
        builder = builder.add_extension(_ext(OID_FMC, _der_int(tcb.fmc)), False)
    cert = builder.sign(pki.ask_key, hashes.SHA384(), rsa_padding=_PSS)
    return cert.public_bytes(serialization.Encoding.DER)


def _derive(seed: bytes | None, what: bytes, size: int) -> bytes:
    if seed is None:
        return os.urandom(size)
    return hashlib.shake_256(b"gpucc snp simulation\x00" + what + b"\x00" + seed).digest(size)


@dataclass(frozen=True)
class SimulatedSnp:
    """One simulated chip: its VCEK (DER), key and TCB, under a simulated product line.

    Make it with :meth:`create`; sign reports with :meth:`report`.
    """

    pki: SnpPki
    chip_id: bytes
    tcb: SnpTcb
    vcek: bytes
    vcek_key: ec.EllipticCurvePrivateKey = field(repr=False)
    seed: bytes | None = field(default=None, repr=False)

    @property
    def product(self) -> SnpProduct:
        """The product line."""
        return self.pki.product

    @property
    def roots(self) -> SnpRoots:
        """The anchors to verify this chip's reports with."""
        return self.pki.roots

    @classmethod
    def create(
        cls,
        *,
        product: SnpProduct = SnpProduct.MILAN,
        seed: bytes | None = None,
        tcb: SnpTcb | None = None,
        vcek_tcb: SnpTcb | None = None,
        chip_id: bytes | None = None,
        vcek_hwid: bytes | None = None,
        not_before: dt.datetime = _NOT_BEFORE,
        not_after: dt.datetime = _NOT_AFTER,
        pki: SnpPki | None = None,
    ) -> SimulatedSnp:
        """A chip; ``vcek_tcb`` and ``vcek_hwid`` make a VCEK that disagrees with it.

        Turin chip IDs are 8 bytes padded with zeros, and their VCEK's hwID is those 8 bytes.
        """
        pki = pki if pki is not None else snp_pki(product)
        product = pki.product
        default_tcb = _DEFAULT_TURIN_TCB if product is SnpProduct.TURIN else DEFAULT_TCB
        tcb = tcb if tcb is not None else default_tcb
        if chip_id is None:
            if product is SnpProduct.TURIN:
                chip_id = _derive(seed, b"chip", 8) + bytes(56)
            else:
                chip_id = _derive(seed, b"chip", 64)
        if len(chip_id) != 64:
            raise ValueError("chip_id must be 64 bytes")
        scalar = int.from_bytes(_derive(seed, b"vcek", 64), "big") % (_P384_ORDER - 1) + 1
        key = ec.derive_private_key(scalar, ec.SECP384R1())
        hwid = chip_id[:8] if product is SnpProduct.TURIN else chip_id
        vcek = make_vcek(
            pki,
            key,
            hwid=vcek_hwid if vcek_hwid is not None else hwid,
            tcb=vcek_tcb if vcek_tcb is not None else tcb,
            not_before=not_before,
            not_after=not_after,
        )
        return cls(pki, chip_id, tcb, vcek, key, seed)

    def report(
        self,
        *,
        report_data: bytes = bytes(64),
        measurement: bytes = DEFAULT_MEASUREMENT,
        host_data: bytes = bytes(32),
        policy: int = 0x30000,
        version: int = 3,
        vmpl: int = 0,
        guest_svn: int = 0,
        family_id: bytes = bytes(16),
        image_id: bytes = bytes(16),
        reported_tcb: SnpTcb | None = None,
        signing_key: SigningKey = SigningKey.VCEK,
        cpuid: tuple[int, int, int] | None = None,
    ) -> bytes:
        """A signed report with these fields (the rest as a real chip would fill them).

        ``cpuid`` (family, model, stepping) overrides the product line's in a version 3 report.
        """
        sizes = {"report_data": (report_data, 64), "measurement": (measurement, 48)}
        sizes |= {"host_data": (host_data, 32), "family_id": (family_id, 16)}
        sizes |= {"image_id": (image_id, 16)}
        for name, (value, size) in sizes.items():
            if len(value) != size:
                raise ValueError(f"{name} must be {size} bytes")
        tcb = (reported_tcb or self.tcb).encode(self.product)
        own = self.tcb.encode(self.product)
        head = struct.pack(
            "<IIQ16s16sIIQQII64s48s32s48s48s32s32sQ",
            version,
            guest_svn,
            policy,
            family_id,
            image_id,
            vmpl,
            1,
            own,
            1,
            int(signing_key) << 2,
            0,
            report_data,
            measurement,
            host_data,
            bytes(48),
            bytes(48),
            _derive(self.seed, b"report id" + report_data, 32),
            b"\xff" * 32,
            tcb,
        )
        fms = bytes(cpuid or _CPUID[self.product]) if version >= 3 else b""
        head += fms + bytes(0x1A0 - len(head) - len(fms))
        head += self.chip_id + struct.pack("<QBBBxBBBxQ", own, 7, 55, 1, 7, 55, 1, own)
        body = head + bytes(SIGNED_SIZE - len(head))
        algorithm = ec.ECDSA(hashes.SHA384(), deterministic_signing=self.seed is not None)
        r, s = decode_dss_signature(self.vcek_key.sign(body, algorithm))
        signature = r.to_bytes(72, "little") + s.to_bytes(72, "little")
        out = body + signature + bytes(REPORT_SIZE - SIGNED_SIZE - len(signature))
        assert len(out) == REPORT_SIZE  # noqa: S101 - a layout invariant of this module
        return out


def simulate_snp_report(
    *,
    report_data: bytes = bytes(64),
    measurement: bytes = DEFAULT_MEASUREMENT,
    host_data: bytes = bytes(32),
    policy: int = 0x30000,
    version: int = 3,
    product: SnpProduct = SnpProduct.MILAN,
    seed: bytes | None = None,
) -> tuple[bytes, bytes, SnpRoots]:
    """One signed report: ``(report, vcek_der, roots)`` for :func:`~.snp.verify_snp_report`."""
    chip = SimulatedSnp.create(product=product, seed=seed)
    report = chip.report(
        report_data=report_data,
        measurement=measurement,
        host_data=host_data,
        policy=policy,
        version=version,
    )
    return report, chip.vcek, chip.roots
