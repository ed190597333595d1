"""A throw-away RIM signing PKI for tests, shaped like NVIDIA's.

NVIDIA signs RIMs with ``HCC RIM L4 Signer`` -> ``Reference Value L3`` ->
``Reference Value CA`` -> ``CoRIM signing Root CA``, all P-384 / ECDSA-SHA384.
:func:`make_rim_pki` builds the same four-level shape with fresh keys, and
:func:`sign_rim` strips any signature from a RIM and signs it again with signxml (an independent XML-DSig implementation), embedding the four
certificates leaf first, as NVIDIA does.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from lxml import etree
from signxml.algorithms import CanonicalizationMethod, DigestAlgorithm, SignatureMethod
from signxml.signer import XMLSigner

DSIG_NS = "http://www.w3.org/2000/09/xmldsig#"

NVIDIA_SIGNATURE = SignatureMethod.ECDSA_SHA384
NVIDIA_DIGEST = DigestAlgorithm.SHA384
NVIDIA_C14N = CanonicalizationMethod.CANONICAL_XML_1_1

_DEFAULT_NOT_BEFORE = dt.datetime(2023, 1, 1, tzinfo=dt.UTC)
_DEFAULT_NOT_AFTER = dt.datetime(2033, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class RimPki:
    """Keys and certificates of a four-level RIM signing PKI."""

    root_key: ec.EllipticCurvePrivateKey
    root: x509.Certificate
    ca_key: ec.EllipticCurvePrivateKey
    ca: x509.Certificate
    l3_key: ec.EllipticCurvePrivateKey
    l3: x509.Certificate
    l4_key: ec.EllipticCurvePrivateKey
    l4: x509.Certificate

    @property
    def chain(self) -> list[x509.Certificate]:
        """Leaf first, root last: what goes into X509Data."""
        return [self.l4, self.l3, self.ca, self.root]


def _name(cn: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpucc test PKI"),
        ]
    )


def _key_usage(*, sign: bool, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _cert(
    *,
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    ca: bool,
    path_length: int | None,
    not_before: dt.datetime,
    not_after: dt.datetime,
) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer.subject if issuer is not None else _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=path_length), critical=True)
        .add_extension(_key_usage(sign=not ca, ca=ca), critical=True)
    )
    return builder.sign(issuer_key, hashes.SHA384())


def make_rim_pki(
    *,
    not_before: dt.datetime = _DEFAULT_NOT_BEFORE,
    not_after: dt.datetime = _DEFAULT_NOT_AFTER,
    l4_not_after: dt.datetime | None = None,
) -> RimPki:
    """A fresh root -> CA -> L3 -> L4 P-384 PKI with NVIDIA-like extensions."""
    keys = [ec.generate_private_key(ec.SECP384R1()) for _ in range(4)]
    root_key, ca_key, l3_key, l4_key = keys
    root = _cert(
        subject="gpucc test CoRIM Root",
        key=root_key,
        issuer=None,
        issuer_key=root_key,
        ca=True,
        path_length=None,
        not_after=not_after,
        not_before=not_before,
    )
    ca = _cert(
        subject="gpucc test Reference Value CA",
        key=ca_key,
        issuer=root,
        issuer_key=root_key,
        ca=True,
        path_length=None,
        not_after=not_after,
        not_before=not_before,
    )
    l3 = _cert(
        subject="gpucc test Reference Value L3",
        key=l3_key,
        issuer=ca,
        issuer_key=ca_key,
        ca=True,
        path_length=0,
        not_after=not_after,
        not_before=not_before,
    )
    l4 = _cert(
        subject="gpucc test RIM L4 Signer",
        key=l4_key,
        issuer=l3,
        issuer_key=l3_key,
        ca=False,
        path_length=None,
        not_after=l4_not_after or not_after,
        not_before=not_before,
    )
    return RimPki(root_key, root, ca_key, ca, l3_key, l3, l4_key, l4)


def strip_signatures(xml: bytes) -> etree._Element:
    """Parse a RIM and remove every ds:Signature element (keeping surrounding text)."""
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
    root = etree.fromstring(xml, parser)
    for sig in list(root.iter(f"{{{DSIG_NS}}}Signature")):
        parent = sig.getparent()
        assert parent is not None, "a Signature cannot be the root"
        if sig.tail:
            prev = sig.getprevious()
            if prev is not None:
                prev.tail = (prev.tail or "") + sig.tail
            else:
                parent.text = (parent.text or "") + sig.tail
        parent.remove(sig)
    return root


def sign_rim(
    xml: bytes,
    *,
    pki: RimPki,
    certificates: list[x509.Certificate] | None = None,
    signature_algorithm: SignatureMethod = NVIDIA_SIGNATURE,
    digest_algorithm: DigestAlgorithm = NVIDIA_DIGEST,
    c14n_algorithm: CanonicalizationMethod = NVIDIA_C14N,
) -> bytes:
    """Strip any existing signature from ``xml`` and sign it with ``pki``'s L4 key.

    By default the signature has NVIDIA's exact profile (enveloped, ECDSA-SHA384,
    SHA-384 digest, C14N 1.1) and embeds ``pki.chain``; the keyword arguments
    produce deliberately different, but still correctly signed, documents.
    """
    root = strip_signatures(xml)
    signer = XMLSigner(
        signature_algorithm=signature_algorithm,
        digest_algorithm=digest_algorithm,
        c14n_algorithm=c14n_algorithm,
    )
    signed = signer.sign(
        root,
        key=pki.l4_key,
        cert=certificates if certificates is not None else pki.chain,
    )
    return etree.tostring(signed)
