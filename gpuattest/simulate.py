"""A software GPU: evidence and RIMs under a private test PKI shaped like NVIDIA's.

Used by ``gpucc demo`` and by tests that need evidence no real GPU can give
here (a chosen nonce, several GPUs, a session-bound nonce). Nothing it makes
verifies under NVIDIA's pinned roots: callers must pass :attr:`SimulatedGpu.roots`
explicitly, through the same ``roots`` argument production uses.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from .evidence import EvidenceSet, GpuEvidence
from .report import OpaqueType
from .trust import TrustRoots

if TYPE_CHECKING:
    from lxml import etree

__all__ = [
    "DRIVER_ACTIVE",
    "VBIOS_ACTIVE",
    "GpuAuthority",
    "Pki",
    "SimulatedGpu",
    "build_report",
    "sign_rim",
]

# The index split NVIDIA's Hopper RIMs use.
VBIOS_ACTIVE = frozenset([*range(0, 7), *range(8, 13)])
DRIVER_ACTIVE = frozenset([7, *range(21, 41)])
_FWID_OID = x509.ObjectIdentifier("2.23.133.5.4.1")
_SHA384_OID_DER = bytes.fromhex("0609608648016503040202")
_NOT_AFTER_FOREVER = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC)


def _der(tag: int, content: bytes) -> bytes:
    n = len(content)
    if n < 0x80:
        return bytes([tag, n]) + content
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + content


def _fwid_extension(key: ec.EllipticCurvePublicKey, fwid: bytes) -> bytes:
    spki = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    digest = _der(0x30, _SHA384_OID_DER + _der(0x04, fwid))
    return _der(0x30, _der(0x02, b"\x01") + spki + digest)


def _name(cn: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpucc simulation"),
        ]
    )


@dataclass(frozen=True)
class Pki:
    """A leaf-first certificate chain with every private key (test use only)."""

    certs: tuple[x509.Certificate, ...]
    keys: tuple[ec.EllipticCurvePrivateKey, ...] = field(repr=False)

    @property
    def root(self) -> x509.Certificate:
        """The self-signed anchor (last certificate)."""
        return self.certs[-1]

    def pem(self) -> bytes:
        """The whole chain as a PEM bundle, leaf first."""
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in self.certs)

    @classmethod
    def build(
        cls,
        names: Sequence[str],
        *,
        not_before: dt.datetime,
        not_after: dt.datetime,
        leaf_extensions: Sequence[x509.ExtensionType] = (),
        leaf_not_after: dt.datetime | None = None,
        issuer: Pki | None = None,
        leaf_ca: bool = False,
    ) -> Pki:
        """Build a chain; ``names`` go root first, the last name is the leaf.

        With ``issuer`` (a chain whose leaf is a CA) the first name is issued by the
        issuer's leaf and the result continues the issuer's chain. With ``leaf_ca`` the leaf
        is a CA too (to issue further chains from).
        """
        keys = [ec.generate_private_key(ec.SECP384R1()) for _ in names]
        certs: list[x509.Certificate] = []
        for depth, cn in enumerate(names):
            is_leaf = depth == len(names) - 1 and not leaf_ca
            if depth:
                issuer_name, issuer_key = _name(names[depth - 1]), keys[depth - 1]
            elif issuer is not None:
                issuer_name, issuer_key = issuer.certs[0].subject, issuer.keys[0]
            else:
                issuer_name, issuer_key = _name(cn), keys[0]
            builder = (
                x509.CertificateBuilder()
                .subject_name(_name(cn))
                .issuer_name(issuer_name)
                .public_key(keys[depth].public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(not_before)
                .not_valid_after(leaf_not_after if is_leaf and leaf_not_after else not_after)
            )
            if is_leaf:
                builder = builder.add_extension(
                    x509.BasicConstraints(ca=False, path_length=None), critical=True
                ).add_extension(
                    x509.KeyUsage(True, False, False, False, False, False, False, False, False),
                    critical=True,
                )
                for ext in leaf_extensions:
                    builder = builder.add_extension(ext, critical=False)
            else:
                builder = builder.add_extension(
                    x509.BasicConstraints(ca=True, path_length=None), critical=True
                ).add_extension(
                    x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                    critical=True,
                )
            certs.append(builder.sign(issuer_key, hashes.SHA384()))
        above = (issuer.certs, issuer.keys) if issuer is not None else ((), ())
        return cls(certs=tuple(reversed(certs)) + above[0], keys=tuple(reversed(keys)) + above[1])


def build_report(
    *,
    nonce: bytes,
    measurements: Mapping[int, bytes],
    opaque: Sequence[tuple[int, bytes]],
    key: ec.EllipticCurvePrivateKey,
    n_blocks: int = 64,
    responder_nonce: bytes | None = None,
) -> bytes:
    """Assemble and sign an SPDM 1.1 report exactly as an H100 lays it out.

    ``measurements`` maps block Index (1-based) to a 48-byte value; missing
    indices are all-zero. ``opaque`` is the TLV list in order.
    """
    request = bytes([0x11, 0xE0, 0x01, 0xFF]) + nonce + b"\x00"
    record = b"".join(
        struct.pack("<BBH", i, 0x01, 51)
        + struct.pack("<BH", 0x01, 48)
        + measurements.get(i, bytes(48))
        for i in range(1, n_blocks + 1)
    )
    tlvs = b"".join(struct.pack("<HH", t, len(v)) + v for t, v in opaque)
    response = (
        bytes([0x11, 0x60, 0x00, 0x00, n_blocks])
        + len(record).to_bytes(3, "little")
        + record
        + (responder_nonce if responder_nonce is not None else os.urandom(32))
        + struct.pack("<H", len(tlvs))
        + tlvs
    )
    signed = request + response
    r, s = decode_dss_signature(key.sign(signed, ec.ECDSA(hashes.SHA384())))
    return signed + r.to_bytes(48, "big") + s.to_bytes(48, "big")


def _template_rim(name: str) -> bytes:
    return resources.files("gpucc.gpuattest._samples").joinpath(name).read_bytes()


def sign_rim(
    *,
    template: bytes,
    colloquial_version: str,
    golden: Mapping[int, bytes],
    active: frozenset[int],
    pki: Pki,
    min_svns: Mapping[int, tuple[str, int]] | None = None,
) -> bytes:
    """Rewrite a real RIM's values and sign it with ``pki`` (leaf = L4 signer).

    The structure stays that of NVIDIA's RIMs, so it validates against the SWID
    schema; indices in ``active`` get their ``golden`` value, others are inactive.
    ``min_svns`` adds active opaque-data entries: opaque type to (name, minimum SVN).
    """
    from lxml import etree

    swid = "http://standards.iso.org/iso/19770/-2/2015/schema.xsd"
    hash_ns = "http://www.w3.org/2001/04/xmlenc#sha384"
    parser = etree.XMLParser(resolve_entities=False, no_network=True)
    root = etree.fromstring(template, parser)
    for sig in root.findall("{http://www.w3.org/2000/09/xmldsig#}Signature"):
        root.remove(sig)
    meta = root.find(f"{{{swid}}}Meta")
    payload = root.find(f"{{{swid}}}Payload")
    if meta is None or payload is None:
        raise ValueError("the RIM template lacks Meta or Payload")
    meta.set("colloquialVersion", colloquial_version)
    for res in payload.findall(f"{{{swid}}}Resource"):
        index = int(res.get("index", "-1"))
        for attr in [str(a) for a in res.attrib if str(a).startswith(f"{{{hash_ns}}}")]:
            del res.attrib[attr]
        res.set("alternatives", "1")
        res.set("active", "True" if index in active else "False")
        res.set(f"{{{hash_ns}}}Hash0", golden.get(index, bytes(48)).hex())
    for opaque_type, (name, floor) in (min_svns or {}).items():
        res = etree.SubElement(payload, f"{{{swid}}}Resource")
        res.set("type", "Measurement")
        res.set("index", str(0x1000 + opaque_type))
        res.set("active", "True")
        res.set("name", name)
        res.set("minSvn", str(floor))
        res.set("includeInResult", "True")
    _sign_enveloped(root, pki)
    return bytes(etree.tostring(root, xml_declaration=False, encoding="utf-8"))


def _sign_enveloped(root: etree._Element, pki: Pki) -> None:
    """Append an enveloped XML-DSig signature in the one profile NVIDIA's RIMs use.

    Enveloped-signature then C14N 1.1 over the whole document, SHA-384 digest, ECDSA
    P-384/SHA-384 over the canonical ``SignedInfo``, the chain leaf first in ``X509Data``.
    Inclusive C14N 1.0 and 1.1 give the same bytes here: no ``xml:*`` attributes are
    inherited into ``SignedInfo``.
    """
    from lxml import etree

    ds = "http://www.w3.org/2000/09/xmldsig#"
    c14n11 = "http://www.w3.org/2006/12/xml-c14n11"

    def sub(parent: etree._Element, tag: str, **attrib: str) -> etree._Element:
        return etree.SubElement(parent, f"{{{ds}}}{tag}", attrib)

    digest = hashlib.sha384(etree.tostring(root, method="c14n", exclusive=False)).digest()
    sig = sub(root, "Signature")
    signed_info = sub(sig, "SignedInfo")
    sub(signed_info, "CanonicalizationMethod", Algorithm=c14n11)
    sub(
        signed_info,
        "SignatureMethod",
        Algorithm="http://www.w3.org/2001/04/xmldsig-more#ecdsa-sha384",
    )
    reference = sub(signed_info, "Reference", URI="")
    transforms = sub(reference, "Transforms")
    sub(transforms, "Transform", Algorithm=f"{ds}enveloped-signature")
    sub(transforms, "Transform", Algorithm=c14n11)
    sub(reference, "DigestMethod", Algorithm="http://www.w3.org/2001/04/xmldsig-more#sha384")
    sub(reference, "DigestValue").text = base64.b64encode(digest).decode()
    signed = etree.tostring(signed_info, method="c14n", exclusive=False)
    der = pki.keys[0].sign(signed, ec.ECDSA(hashes.SHA384()))
    r, s = decode_dss_signature(der)
    value = r.to_bytes(48, "big") + s.to_bytes(48, "big")
    sub(sig, "SignatureValue").text = base64.b64encode(value).decode()
    x509_data = sub(sub(sig, "KeyInfo"), "X509Data")
    for cert in pki.certs:
        der_cert = cert.public_bytes(serialization.Encoding.DER)
        sub(x509_data, "X509Certificate").text = base64.b64encode(der_cert).decode()


@dataclass(frozen=True)
class GpuAuthority:
    """What the simulated GPUs of one simulation share: the device identity CAs (down to the
    provisioner's intermediate, which issues each GPU's own certificates), the RIM PKI and
    the golden measurements the RIMs state. Its GPUs verify under one set of roots."""

    device_ca: Pki
    rim_pki: Pki
    golden: Mapping[int, bytes] = field(repr=False)

    @classmethod
    def create(cls, *, now: dt.datetime) -> GpuAuthority:
        """Fresh CAs whose certificates are valid a year either side of ``now``."""
        before, after = now - dt.timedelta(days=365), now + dt.timedelta(days=365)
        device_ca = Pki.build(
            [
                "Simulated Device Identity CA",
                "Simulated GH100 Identity",
                "Simulated GH100 Provisioner ICA 1",
            ],
            not_before=before,
            not_after=after,
            leaf_ca=True,
        )
        rim = Pki.build(
            [
                "Simulated CoRIM signing Root CA",
                "Simulated Reference Value GH100 CA",
                "Simulated Reference Value L3 GH100 001",
                "Simulated HCC RIM L4 Signer",
            ],
            not_before=before,
            not_after=after,
        )
        golden = {i: os.urandom(48) for i in VBIOS_ACTIVE | DRIVER_ACTIVE}
        return cls(device_ca=device_ca, rim_pki=rim, golden=golden)

    def valid_at(self, when: dt.datetime) -> bool:
        """True when every CA certificate is valid at ``when``."""
        certs = (*self.device_ca.certs, *self.rim_pki.certs)
        return all(c.not_valid_before_utc <= when <= c.not_valid_after_utc for c in certs)


@dataclass(frozen=True)
class SimulatedGpu:
    """A simulated H100 with its own device PKI, RIM PKI and golden measurements."""

    device_pki: Pki
    rim_pki: Pki
    golden: Mapping[int, bytes] = field(repr=False)
    fwid: bytes
    driver_version: str = "550.90.07"
    vbios_raw: bytes = bytes.fromhex("009f009601000000")
    project: str = "1010"
    project_sku: str = "0200"
    chip_sku: str = "882"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"

    @classmethod
    def create(
        cls,
        *,
        now: dt.datetime,
        uuid: str | None = None,
        authority: GpuAuthority | None = None,
    ) -> SimulatedGpu:
        """A fresh simulated GPU whose certificates are valid around ``now``: its own device
        keys, issued by ``authority`` (GPUs of one authority share roots, RIMs and golden
        measurements) or by a fresh one."""
        authority = authority or GpuAuthority.create(now=now)
        fwid = os.urandom(48)
        leaf_key_holder = ec.generate_private_key(ec.SECP384R1())
        device = Pki.build(
            ["GH100 A01 GSP BROM", "GH100 A01 GSP FMC LF"],
            not_before=now - dt.timedelta(days=365),
            not_after=now + dt.timedelta(days=365),
            leaf_not_after=_NOT_AFTER_FOREVER,
            leaf_extensions=[
                x509.UnrecognizedExtension(
                    _FWID_OID, _fwid_extension(leaf_key_holder.public_key(), fwid)
                )
            ],
            issuer=authority.device_ca,
        )
        return cls(
            device_pki=device,
            rim_pki=authority.rim_pki,
            golden=authority.golden,
            fwid=fwid,
            uuid=uuid or f"GPU-{os.urandom(4).hex()}-sim",
        )

    @property
    def roots(self) -> TrustRoots:
        """The simulation's anchors, to pass explicitly as ``roots``."""
        return TrustRoots(device_root=self.device_pki.root, rim_root=self.rim_pki.root)

    @property
    def vbios_version(self) -> str:
        """Dotted VBIOS version, as NVML prints it."""
        r = self.vbios_raw
        return ".".join(f"{r[i]:02X}" for i in (3, 2, 1, 0, 4))

    def opaque_fields(self) -> list[tuple[int, bytes]]:
        """The opaque TLVs an H100 with this identity reports."""
        return [
            (OpaqueType.DRIVER_VERSION, self.driver_version.encode() + b"\x00"),
            (OpaqueType.GPU_INFO, bytes.fromhex("8001000000000000")),
            (OpaqueType.VBIOS_VERSION, self.vbios_raw),
            (OpaqueType.NVDEC0_STATUS, b"\xaa"),
            (OpaqueType.BOARD_ID, struct.pack("<I", 0x3B1)),
            (OpaqueType.CHIP_SKU, self.chip_sku.encode().ljust(9, b"\x00")),
            (OpaqueType.PROJECT, self.project.encode().ljust(5, b"\x00")),
            (OpaqueType.PROJECT_SKU, self.project_sku.encode().ljust(5, b"\x00")),
            (OpaqueType.FWID, self.fwid),
            (OpaqueType.PROTECTED_PCIE_STATUS, b"\x55"),
        ]

    def report(
        self,
        nonce: bytes,
        *,
        measurements: Mapping[int, bytes] | None = None,
        opaque: Sequence[tuple[int, bytes]] | None = None,
    ) -> bytes:
        """A signed report for ``nonce``; RIM index i is reported in block i+1."""
        runtime = {i + 1: v for i, v in self.golden.items()}
        if measurements is not None:
            runtime.update(measurements)
        return build_report(
            nonce=nonce,
            measurements=runtime,
            opaque=self.opaque_fields() if opaque is None else opaque,
            key=self.device_pki.keys[0],
        )

    def gpu_evidence(self, nonce: bytes, **kwargs: object) -> GpuEvidence:
        """One GPU's evidence for ``nonce`` (report + device chain PEM)."""
        report = self.report(nonce, **kwargs)  # type: ignore[arg-type]
        return GpuEvidence(
            report=report,
            cert_chain_pem=self.device_pki.pem(),
            arch="HOPPER",
            nonce=nonce,
            uuid=self.uuid,
            driver_version=self.driver_version,
            vbios_version=self.vbios_version,
        )

    def evidence(self, nonce: bytes) -> EvidenceSet:
        """Evidence for this single GPU, as read from a file."""
        return EvidenceSet(gpus=(self.gpu_evidence(nonce),), source="file")

    def driver_rim_id(self) -> str:
        """RIM ID of this GPU's driver RIM."""
        return f"NV_GPU_DRIVER_GH100_{self.driver_version}"

    def vbios_rim_id(self) -> str:
        """RIM ID of this GPU's VBIOS RIM."""
        v = self.vbios_version.replace(".", "")
        return f"NV_GPU_VBIOS_{self.project}_{self.project_sku}_{self.chip_sku}_{v}"

    @property
    def rims(self) -> dict[str, bytes]:
        """Both RIMs, signed by the simulated RIM PKI, by RIM ID."""
        driver = sign_rim(
            template=_template_rim("driver-rim-545.00.swidtag"),
            colloquial_version=self.driver_version,
            golden=self.golden,
            active=DRIVER_ACTIVE,
            pki=self.rim_pki,
        )
        vbios = sign_rim(
            template=_template_rim("vbios-rim-1010_0200_882_96005E0001-test.swidtag"),
            colloquial_version=self.vbios_version,
            golden=self.golden,
            active=VBIOS_ACTIVE,
            pki=self.rim_pki,
        )
        return {self.driver_rim_id(): driver, self.vbios_rim_id(): vbios}
