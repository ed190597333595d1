"""AMD's SEV-SNP trust anchors, and what a VCEK or VLEK certificate says about its chip.

Each EPYC product line has its own AMD Root Key (ARK, self-signed, RSA-4096, RSA-PSS
SHA-384) and AMD SEV Signing Key (ASK, signed by the ARK), which signs the chips' VCEKs, and
AMD SEV VLEK Signing Key (ASVK, ``SEV-VLEK-<line>``, signed by the ARK), which signs the
Versioned Loaded Endorsement Keys (VLEKs) AMD issues to cloud providers for their hosts.
AMD's are shipped as package data and checked against their SHA-256 fingerprints on every
load (:meth:`SnpRoots.amd`); tests and private deployments pass their own
(:meth:`SnpRoots.from_pem`).

A VCEK (Versioned Chip Endorsement Key) is an ECDSA P-384 certificate for one chip at one
TCB. It carries, as X.509 extensions under AMD's arc 1.3.6.1.4.1.3704.1:

* ``.2`` productName (IA5String, e.g. ``Milan-B0``);
* ``.3.1`` boot loader, ``.3.2`` TEE, ``.3.3`` SNP, ``.3.8`` microcode SPLs, and on Turin
  ``.3.9`` FMC (DER INTEGERs);
* ``.4`` hwID: the chip ID (raw bytes, or an OCTET STRING); a VLEK has none;
* ``.5`` CSP-ID (IA5String): the cloud provider a VLEK was issued to.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from gpucc.core.errors import MalformedCertificateError

from .._internal.der import DerError, read_one
from ..trust import TrustRootError
from ..x509chain import load_certificate, load_certificates
from .snp_report import SnpProduct, SnpTcb

__all__ = [
    "AMD_ASVK_SHA256",
    "AMD_ROOT_SHA256",
    "SnpProductRoots",
    "SnpRoots",
    "VcekInfo",
    "load_vcek",
    "endorser_of_issuer",
    "product_of_issuer",
    "vcek_info",
]

# SHA-256 over the DER encoding of AMD's ARK and ASK per product line.
AMD_ROOT_SHA256: Mapping[SnpProduct, tuple[str, str]] = {
    SnpProduct.MILAN: (
        "69d063b45344d26a2e94e1f4210de49ef555308287d4c174445c95639a540bcd",
        "67d303bd3905fd38db8b20e0793699870e7fa612eaad5dec358293fd8c0bac1b",
    ),
    SnpProduct.GENOA: (
        "4c6598d19c18719c5dfd4a7d335f674e5bfe1d8f800cea2cf270c10d103db2f1",
        "5464738c1546aed5f2cecf1dc98c5c960a92e8913238a61711bc90ec6e828521",
    ),
    SnpProduct.TURIN: (
        "1f084161a44bb6d93778a904877d4819cafa5d05ef4193b2ded9dd9c73dd3f6a",
        "5b77ef5fe7a7a004fd9032668fba9d0fda22f88c4442069a479636a6ae3b3185",
    ),
}

# SHA-256 over the DER encoding of AMD's ASVK (SEV-VLEK-<line>) per product line.
AMD_ASVK_SHA256: Mapping[SnpProduct, str] = {
    SnpProduct.MILAN: "c5e081f59b7efab1fe2f8b505e159704e72f29cab7ef7cf628a05a42439082f5",
    SnpProduct.GENOA: "197e610743a917d6b9bb982a5a9226ccc0a15b611be0619e626aca9151457372",
    SnpProduct.TURIN: "104e10a8bd060a3c20a434261a57d0588fd65a88915b4f65b08bdecaf8df1a3c",
}

_AMD_ARC = "1.3.6.1.4.1.3704.1"
OID_PRODUCT_NAME = x509.ObjectIdentifier(f"{_AMD_ARC}.2")
OID_BOOTLOADER = x509.ObjectIdentifier(f"{_AMD_ARC}.3.1")
OID_TEE = x509.ObjectIdentifier(f"{_AMD_ARC}.3.2")
OID_SNP = x509.ObjectIdentifier(f"{_AMD_ARC}.3.3")
OID_MICROCODE = x509.ObjectIdentifier(f"{_AMD_ARC}.3.8")
OID_FMC = x509.ObjectIdentifier(f"{_AMD_ARC}.3.9")
OID_HWID = x509.ObjectIdentifier(f"{_AMD_ARC}.4")
OID_CSP_ID = x509.ObjectIdentifier(f"{_AMD_ARC}.5")

# A VCEK is about 1.4 KiB; anything much larger is not one.
MAX_VCEK_BYTES = 16 * 1024
_IA5STRING, _INTEGER, _OCTET_STRING = 0x16, 0x02, 0x04


def _fingerprint(cert: x509.Certificate) -> str:
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


@dataclass(frozen=True)
class SnpProductRoots:
    """One product line's anchors: the ARK and the ASK (and ASVK, when known) it signed."""

    product: SnpProduct
    ark: x509.Certificate
    ask: x509.Certificate
    asvk: x509.Certificate | None = None


@dataclass(frozen=True)
class SnpRoots:
    """The ARK/ASK pairs a VCEK may chain to, one per product line."""

    lines: tuple[SnpProductRoots, ...]

    def get(self, product: SnpProduct) -> SnpProductRoots | None:
        """The anchors for ``product``, or None when these roots have none for it."""
        return next((line for line in self.lines if line.product is product), None)

    @classmethod
    def amd(cls) -> SnpRoots:
        """AMD's production roots from package data, fingerprint-checked (loaded once).

        Raises:
            TrustRootError: a packaged file is missing or altered.
        """
        return _amd_roots()

    @classmethod
    def from_pem(cls, pems: Mapping[SnpProduct, tuple[bytes, ...]]) -> SnpRoots:
        """Roots a caller supplies: ``{product: (ark_pem, ask_pem[, asvk_pem])}``.

        Raises:
            MalformedCertificateError: a PEM does not hold exactly one certificate.
        """
        lines = []
        for product, pem in pems.items():
            if len(pem) not in (2, 3):
                raise MalformedCertificateError(f"{product} roots are an ARK, an ASK and an ASVK")
            asvk = _one_pem(pem[2], f"{product} ASVK") if len(pem) == 3 else None
            lines.append(
                SnpProductRoots(
                    SnpProduct(product),
                    _one_pem(pem[0], f"{product} ARK"),
                    _one_pem(pem[1], f"{product} ASK"),
                    asvk,
                )
            )
        return cls(tuple(lines))


def _one_pem(data: bytes, what: str) -> x509.Certificate:
    certs = load_certificates(data, what=what)
    if len(certs) != 1:
        raise MalformedCertificateError(f"{what} must be one certificate, not {len(certs)}")
    return certs[0]


@functools.cache
def _amd_roots() -> SnpRoots:
    lines = []
    package = resources.files("gpucc.gpuattest._roots.amd")
    for product, (ark_pin, ask_pin) in AMD_ROOT_SHA256.items():
        pair = []
        for role, pin in (("ark", ark_pin), ("ask", ask_pin), ("asvk", AMD_ASVK_SHA256[product])):
            name = f"{product.value.lower()}-{role}.pem"
            try:
                cert = x509.load_pem_x509_certificate(package.joinpath(name).read_bytes())
            except (OSError, ValueError) as exc:
                raise TrustRootError(f"embedded AMD root {name} cannot be loaded: {exc}") from None
            if _fingerprint(cert) != pin:
                raise TrustRootError(
                    f"embedded AMD root {name} does not match its pinned fingerprint"
                )
            pair.append(cert)
        lines.append(SnpProductRoots(product, pair[0], pair[1], pair[2]))
    return SnpRoots(tuple(lines))


def product_of_issuer(cert: x509.Certificate) -> SnpProduct | None:
    """The product line an ASK-issued certificate names in its issuer (``SEV-Milan`` ...)."""
    product, kind = endorser_of_issuer(cert)
    return product if kind == "vcek" else None


def endorser_of_issuer(cert: x509.Certificate) -> tuple[SnpProduct | None, str | None]:
    """The product line and kind (``vcek``: issued by ``SEV-<line>``, the ASK; ``vlek``: by
    ``SEV-VLEK-<line>``, the ASVK) an endorsement key's issuer names; (None, None) if neither."""
    names = cert.issuer.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        return None, None
    cn = str(names[0].value)
    for p in SnpProduct:
        if cn == f"SEV-{p.value}":
            return p, "vcek"
        if cn == f"SEV-VLEK-{p.value}":
            return p, "vlek"
    return None, None


def load_vcek(data: bytes) -> x509.Certificate:
    """Parse a VCEK certificate (DER, as AMD's KDS serves it, or PEM).

    AMD's VCEKs have serial number 0, which RFC 5280 forbids and cryptography warns about;
    the warning is silenced here (the certificate is AMD's to shape).

    Raises:
        MalformedCertificateError: empty, oversized, not one certificate, or one whose
            fields do not parse (:func:`~gpuattest.x509chain.load_certificate`).
    """
    if not data or len(data) > MAX_VCEK_BYTES:
        raise MalformedCertificateError(
            f"a VCEK certificate has 1 to {MAX_VCEK_BYTES} bytes, this has {len(data)}"
        )
    return load_certificate(data, what="the VCEK certificate")


@dataclass(frozen=True)
class VcekInfo:
    """What a VCEK's AMD extensions say (None where an extension is absent or unreadable).

    Attributes:
        product_name: the productName extension (``Milan-B0``).
        bootloader, tee, snp, microcode, fmc: the TCB SPLs the VCEK was issued for.
        hwid: the chip ID it was issued for.
        problems: extensions present but unreadable.
        csp_id: a VLEK's CSP-ID (the cloud provider it was issued to).
    """

    product_name: str | None
    bootloader: int | None
    tee: int | None
    snp: int | None
    microcode: int | None
    fmc: int | None
    hwid: bytes | None
    problems: tuple[str, ...]
    csp_id: str | None = None

    def tcb(self) -> SnpTcb | None:
        """The TCB the VCEK names, or None when a Milan/Genoa component is missing."""
        parts = (self.bootloader, self.tee, self.snp, self.microcode)
        if any(p is None for p in parts):
            return None
        bl, tee, snp, ucode = (p or 0 for p in parts)
        return SnpTcb(bootloader=bl, tee=tee, snp=snp, microcode=ucode, fmc=self.fmc)


def _raw_extension(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> bytes | None:
    try:
        value = cert.extensions.get_extension_for_oid(oid).value
    except x509.ExtensionNotFound:
        return None
    if isinstance(value, x509.UnrecognizedExtension):
        return value.value
    return None


def _small_int(content: bytes) -> int:
    if not content or len(content) > 2 or content[0] & 0x80:
        raise DerError("not a small non-negative INTEGER")
    if len(content) == 2 and content[0] == 0 and not content[1] & 0x80:
        raise DerError("INTEGER not minimally encoded")
    value = int.from_bytes(content, "big")
    if value > 0xFF:
        raise DerError("SPL above 255")
    return value


def vcek_info(cert: x509.Certificate) -> VcekInfo:
    """Read a VCEK's AMD extensions (unreadable ones are listed in ``problems``)."""
    problems: list[str] = []

    def spl(oid: x509.ObjectIdentifier, name: str) -> int | None:
        raw = _raw_extension(cert, oid)
        if raw is None:
            return None
        try:
            return _small_int(read_one(raw, _INTEGER))
        except DerError as exc:
            problems.append(f"{name} SPL extension: {exc}")
            return None

    product_name: str | None = None
    raw_name = _raw_extension(cert, OID_PRODUCT_NAME)
    if raw_name is not None:
        try:
            product_name = read_one(raw_name, _IA5STRING).decode("ascii")
        except (DerError, UnicodeDecodeError):
            problems.append("productName extension is not an IA5String")
    csp_id: str | None = None
    raw_csp = _raw_extension(cert, OID_CSP_ID)
    if raw_csp is not None:
        try:
            csp_id = read_one(raw_csp, _IA5STRING).decode("ascii")
        except (DerError, UnicodeDecodeError):
            problems.append("CSP-ID extension is not an IA5String")
    hwid = _raw_extension(cert, OID_HWID)
    if hwid is not None and len(hwid) not in (8, 64):
        try:  # some encoders wrap the chip ID in an OCTET STRING
            hwid = read_one(hwid, _OCTET_STRING)
        except DerError:
            problems.append(f"hwID extension has {len(hwid)} bytes")
            hwid = None
    return VcekInfo(
        product_name=product_name,
        bootloader=spl(OID_BOOTLOADER, "boot loader"),
        tee=spl(OID_TEE, "TEE"),
        snp=spl(OID_SNP, "SNP"),
        microcode=spl(OID_MICROCODE, "microcode"),
        fmc=spl(OID_FMC, "FMC"),
        hwid=hwid,
        problems=tuple(problems),
        csp_id=csp_id,
    )
