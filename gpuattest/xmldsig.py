"""The one XML-DSig profile NVIDIA's RIMs are signed with, and nothing else.

XML-DSig is flexible enough to sign one part of a document while a verifier
reads another ("signature wrapping"). Every known NVIDIA RIM uses the same
profile: a single enveloped signature as the root's last child, one
``Reference`` with ``URI=""`` (the whole document), transforms
enveloped-signature then C14N 1.1, ECDSA P-384 with SHA-384, and the signer's
certificate chain in ``KeyInfo/X509Data``. Anything else is refused, so the bytes
that were digested are exactly the bytes the caller reads.

Canonicalisation is done with lxml's inclusive C14N 1.0. For a whole document
with one subtree removed, and for ``SignedInfo`` when no ancestor carries an
``xml:*`` attribute, C14N 1.0 and C14N 1.1 produce identical bytes (they differ
only in how ``xml:*`` attributes of omitted ancestors are inherited), so such
attributes are refused where they could matter.
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import hmac
from collections.abc import Sequence

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from lxml import etree

from ._internal.xmltree import (
    DSIG_NS,
    XML_NS,
    element_children,
    local_name,
    one_line,
    qname,
)

__all__ = [
    "ALLOWED_C14N",
    "ALLOWED_DIGEST",
    "ALLOWED_SIGNATURE",
    "ALLOWED_TRANSFORMS",
    "signature_refusal",
]

# The only signature profile accepted (the one every published NVIDIA RIM uses).
ALLOWED_C14N = "http://www.w3.org/2006/12/xml-c14n11"
ALLOWED_SIGNATURE = "http://www.w3.org/2001/04/xmldsig-more#ecdsa-sha384"
ALLOWED_DIGEST = "http://www.w3.org/2001/04/xmldsig-more#sha384"
ALLOWED_TRANSFORMS = (
    "http://www.w3.org/2000/09/xmldsig#enveloped-signature",
    ALLOWED_C14N,
)

_SHA384_LEN = 48
_P384_COORD_LEN = 48
_SIGNATURE_TAG = qname(DSIG_NS, "Signature")


class _Refused(Exception):
    """Internal: the signature is refused for the reason given."""


def _only_whitespace(text: str | None) -> bool:
    return text is None or text.strip() == ""


def _check_node(el: etree._Element, *, text_allowed: bool = False) -> None:
    """No comments/PIs inside the signature and no stray text."""
    if len(el) != len(element_children(el)):
        raise _Refused(f"{local_name(el)} contains a comment or processing instruction")
    for child in el:
        if not _only_whitespace(child.tail):
            raise _Refused(f"{local_name(el)} contains stray text")
    if not text_allowed and not _only_whitespace(el.text):
        raise _Refused(f"{local_name(el)} contains stray text")


def _children(el: etree._Element, expected: tuple[str, ...]) -> list[etree._Element]:
    """Require exactly these ds: element children, in this order."""
    _check_node(el)
    kids = element_children(el)
    found = tuple(
        local_name(k) if etree.QName(k).namespace == DSIG_NS else str(k.tag) for k in kids
    )
    if found != expected:
        raise _Refused(
            f"{local_name(el)} has children {', '.join(found) or 'none'}; "
            f"expected {', '.join(expected)}"
        )
    return kids


def _algorithm(el: etree._Element, allowed: str) -> None:
    _check_node(el)
    if len(el) != 0:
        raise _Refused(f"{local_name(el)} must have no parameters")
    value = el.get("Algorithm")
    if value != allowed:
        raise _Refused(f"{local_name(el)} {value!r} is not allowed (only {allowed})")


def _value(el: etree._Element, length: int) -> bytes:
    _check_node(el, text_allowed=True)
    if len(el) != 0:
        raise _Refused(f"{local_name(el)} must contain only base64 text")
    compact = "".join((el.text or "").split())
    try:
        data = base64.b64decode(compact.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise _Refused(f"{local_name(el)} is not valid base64") from None
    if len(data) != length:
        raise _Refused(f"{local_name(el)} is {len(data)} bytes, expected {length}")
    return data


def _xml_attrs(el: etree._Element) -> bool:
    return any(etree.QName(k).namespace == XML_NS for k in el.attrib)


def _signed_parts(root: etree._Element) -> tuple[etree._Element, etree._Element, bytes, bytes]:
    """Check the signature's shape; return (Signature, SignedInfo, digest, signature value)."""
    signatures = list(root.iter(_SIGNATURE_TAG))
    if len(signatures) != 1:
        raise _Refused(f"expected exactly one Signature element, found {len(signatures)}")
    sig = signatures[0]
    if sig.getparent() is not root or sig.getnext() is not None:
        raise _Refused("the Signature is not the last child of the root element")
    if not _only_whitespace(sig.tail):
        raise _Refused("text follows the Signature element")
    if _xml_attrs(root) or _xml_attrs(sig):
        raise _Refused("xml:* attributes on the root or Signature are not supported")
    signed_info, sig_value_el, key_info = _children(
        sig, ("SignedInfo", "SignatureValue", "KeyInfo")
    )
    c14n, method, reference = _children(
        signed_info, ("CanonicalizationMethod", "SignatureMethod", "Reference")
    )
    _algorithm(c14n, ALLOWED_C14N)
    _algorithm(method, ALLOWED_SIGNATURE)
    if {str(k): str(v) for k, v in reference.attrib.items()} != {"URI": ""}:
        raise _Refused('the Reference must have exactly the attribute URI=""')
    transforms, digest_method, digest_value = _children(
        reference, ("Transforms", "DigestMethod", "DigestValue")
    )
    transform_els = element_children(transforms)
    _check_node(transforms)
    if len(transform_els) != len(ALLOWED_TRANSFORMS) or any(
        t.tag != qname(DSIG_NS, "Transform") for t in transform_els
    ):
        raise _Refused("Transforms must be exactly enveloped-signature then C14N 1.1")
    for t, allowed in zip(transform_els, ALLOWED_TRANSFORMS, strict=True):
        _algorithm(t, allowed)
    _algorithm(digest_method, ALLOWED_DIGEST)
    digest = _value(digest_value, _SHA384_LEN)
    signature = _value(sig_value_el, 2 * _P384_COORD_LEN)
    (x509_data,) = _children(key_info, ("X509Data",))
    certs = element_children(x509_data)
    _check_node(x509_data)
    if not certs or any(c.tag != qname(DSIG_NS, "X509Certificate") for c in certs):
        raise _Refused("X509Data must contain only X509Certificate elements")
    return sig, signed_info, digest, signature


def _document_digest(tree: etree._ElementTree) -> bytes:
    """SHA-384 of the canonical document with the (single, last) Signature removed."""
    doc = copy.deepcopy(tree)
    root = doc.getroot()
    sig = root[len(root) - 1]
    # The enveloped-signature transform removes the element, not the text after it.
    tail = sig.tail
    if tail:
        prev = sig.getprevious()
        if prev is not None:
            prev.tail = (prev.tail or "") + tail
        else:
            root.text = (root.text or "") + tail
    root.remove(sig)
    return hashlib.sha384(_c14n(doc, "the document")).digest()


def _c14n(node: etree._ElementTree | etree._Element, what: str) -> bytes:
    """Inclusive C14N without comments; refuses what libxml2 cannot canonicalise.

    libxml2 refuses, for example, relative namespace URIs, which C14N forbids.
    """
    try:
        return etree.tostring(node, method="c14n", exclusive=False, with_comments=False)
    except (etree.LxmlError, ValueError) as exc:
        raise _Refused(f"{what} cannot be canonicalised: {one_line(str(exc), 80)}") from None


def _leaf_key(leaf: x509.Certificate) -> ec.EllipticCurvePublicKey:
    try:
        key = leaf.public_key()
    except ValueError:
        raise _Refused("the signer certificate's public key cannot be read") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP384R1):
        raise _Refused("the signer certificate does not hold a P-384 key")
    try:
        bc = leaf.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        bc = None
    except ValueError:
        raise _Refused("the signer certificate's extensions cannot be read") from None
    if bc is not None and bc.ca:
        raise _Refused("the signer certificate is a CA certificate")
    try:
        ku = leaf.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        ku = None
    if ku is not None and not ku.digital_signature:
        raise _Refused("the signer certificate's key usage does not allow signatures")
    return key


def _check_signature(tree: etree._ElementTree, certificates: Sequence[x509.Certificate]) -> None:
    """Raise _Refused unless the signature is well-formed and verifies with the leaf key."""
    root = tree.getroot()
    _sig, signed_info, digest, signature = _signed_parts(root)
    if not certificates:
        raise _Refused("the signature embeds no certificates")
    key = _leaf_key(certificates[0])
    if not hmac.compare_digest(_document_digest(tree), digest):
        raise _Refused("the document digest does not match DigestValue (the RIM was modified)")
    signed = _c14n(signed_info, "SignedInfo")
    r = int.from_bytes(signature[:_P384_COORD_LEN], "big")
    s = int.from_bytes(signature[_P384_COORD_LEN:], "big")
    try:
        key.verify(encode_dss_signature(r, s), signed, ec.ECDSA(hashes.SHA384()))
    except (InvalidSignature, ValueError):
        raise _Refused("the ECDSA signature does not verify with the signer certificate") from None


def signature_refusal(tree: etree._ElementTree, certificates: Sequence[x509.Certificate]) -> str:
    """Why the document's enveloped signature is refused; empty when it verifies.

    The signature must follow the profile described in the module docstring and
    verify with the key of ``certificates[0]`` (a non-CA P-384 certificate). Who
    that certificate belongs to is for the caller to establish by validating the
    chain; nothing here decides trust in a key.

    Args:
        tree: the parsed document, exactly as its other contents were read from.
        certificates: the certificates embedded in ``KeyInfo``, leaf first.
    """
    try:
        _check_signature(tree, certificates)
    except _Refused as refusal:
        return str(refusal)
    return ""
