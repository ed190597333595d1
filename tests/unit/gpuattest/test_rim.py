"""Tests for gpuattest.rim on NVIDIA's real RIMs, on mutants and on a test PKI."""

from __future__ import annotations

import base64
import copy
import datetime as dt
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree
from signxml.algorithms import CanonicalizationMethod, DigestAlgorithm, SignatureMethod
from signxml.verifier import SignatureConfiguration, XMLVerifier

from gpucc.core.errors import MalformedRimError, UsageError
from gpucc.gpuattest import rim as rim_module
from gpucc.gpuattest.chain import ChainStatus
from gpucc.gpuattest.collateral import MAX_RIM_BYTES
from gpucc.gpuattest.rim import (
    ReferenceManifest,
    RimSignatureResult,
    validate_schema,
    verify_signature,
)
from gpucc.gpuattest.trust import TrustRoots
from tests.support.rimpki import RimPki, make_rim_pki, sign_rim, strip_signatures
from tests.support.samples import PROD, SET_A_DRIVER_RIM, SET_A_VBIOS_RIM

DRIVER_RIM = SET_A_DRIVER_RIM
VBIOS_RIM = SET_A_VBIOS_RIM
PROD_RIMS = sorted(PROD.glob("*.swidtag"))

DS = "http://www.w3.org/2000/09/xmldsig#"
SWID = "http://standards.iso.org/iso/19770/-2/2015/schema.xsd"
HASH_NS = "http://www.w3.org/2001/04/xmlenc#sha384"

# Inside every set-A and PROD RIM chain's validity.
IN_VALIDITY = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
# After the L4 signers (2025) expired; the L3 "GH100 001" expired on 2026-11-11.
LATER = dt.datetime(2026, 11, 22, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def anchor() -> x509.Certificate:
    return TrustRoots.nvidia().rim_root


@pytest.fixture(scope="module")
def driver_raw() -> bytes:
    return DRIVER_RIM.read_bytes()


@pytest.fixture(scope="module")
def vbios_raw() -> bytes:
    return VBIOS_RIM.read_bytes()


@pytest.fixture(scope="module")
def pki() -> RimPki:
    return make_rim_pki()


def _verify(
    raw: bytes, anchor: x509.Certificate, now: dt.datetime = IN_VALIDITY
) -> RimSignatureResult:
    return ReferenceManifest.parse(raw).verify_signature(anchor=anchor, now=now)


def _mutate_tree(raw: bytes, change: Callable[[etree._Element], None]) -> bytes:
    """Apply ``change`` to a parsed copy of ``raw`` and serialise it again."""
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
    root = etree.fromstring(raw, parser)
    change(root)
    return etree.tostring(root)


def _signature(root: etree._Element) -> etree._Element:
    sig = root.find(f"{{{DS}}}Signature")
    assert sig is not None
    return sig


def _ds(el: etree._Element, path: str) -> etree._Element:
    found = el.find(path.replace("ds:", f"{{{DS}}}"))
    assert found is not None, path
    return found


# --- the real set-A RIMs ------------------------------------------------------


def test_driver_rim_fields(driver_raw: bytes) -> None:
    m = ReferenceManifest.parse(driver_raw)
    assert m.colloquial_version == "545.00"
    assert m.name == "GH100"
    assert m.product == "GH100"
    assert m.platform_manufacturer_id == "5703"
    assert len(m.tag_id) == 96
    assert [e.index for e in m.measurements] == list(range(64))
    assert m.active_indices == frozenset({7, *range(21, 41)})
    assert {e.index for e in m.measurements if e.alternatives == 2} == {23, 24, 35}
    for e in m.measurements:
        assert e.size == 48
        assert len(e.values) == e.alternatives
        assert all(len(v) == 48 for v in e.values)
    # Active does not mean non-zero.
    entry28 = m.entry(28)
    assert entry28 is not None and entry28.active and entry28.values[0] == bytes(48)
    entry7 = m.entry(7)
    assert entry7 is not None
    assert entry7.values[0].hex().startswith("0e0ee161b59bf124")
    assert len(m.certificates) == 4
    cn = m.certificates[0].subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value
    assert cn == "HCC RIM L4 Signer"
    assert m.sha256 == "1b939fae0138ceda87c434820e1e118739861b070c0043677a68807049eae668"


def test_vbios_rim_fields(vbios_raw: bytes) -> None:
    m = ReferenceManifest.parse(vbios_raw)
    assert m.colloquial_version == "96.00.5E.00.01"
    assert m.active_indices == frozenset({*range(0, 7), *range(8, 13)})
    entry12 = m.entry(12)
    assert entry12 is not None and entry12.alternatives == 4
    assert {e.index for e in m.active if e.values[0] == bytes(48)} == {0, 8, 10, 12}
    assert m.sha256 == "3f9877de674d57ead7095bf3d32f8aa3fb1881d524bf4c7e5cf504fcac47c6bf"


@pytest.mark.parametrize("path", [DRIVER_RIM, VBIOS_RIM], ids=["driver", "vbios"])
def test_set_a_schema_and_signature(path: Path, anchor: x509.Certificate) -> None:
    m = ReferenceManifest.parse(path.read_bytes())
    schema = validate_schema(m)
    assert schema.valid and schema.reason == ""
    result = verify_signature(m, anchor=anchor, now=IN_VALIDITY)
    assert result.signature_valid, result.signature_reason
    assert result.chain.status is ChainStatus.VALID, result.chain.reason
    assert result.ok
    assert result.signer is not None and result.signer == m.certificates[0]
    assert result.chain.certificates == m.certificates
    assert result.to_dict()["chain_status"] == "valid"


@pytest.mark.parametrize("path", [DRIVER_RIM, VBIOS_RIM], ids=["driver", "vbios"])
def test_set_a_chains_expired_later(path: Path, anchor: x509.Certificate) -> None:
    for now in (LATER, dt.datetime.now(dt.UTC)):
        result = _verify(path.read_bytes(), anchor, now)
        # The signature itself stays valid; the chain's time check fails first at L4.
        assert result.signature_valid
        assert result.chain.status is ChainStatus.EXPIRED
        assert "HCC RIM L4 Signer" in result.chain.reason
        assert "expired" in result.chain.reason
        assert not result.ok


def test_before_validity_is_expired_too(driver_raw: bytes, anchor: x509.Certificate) -> None:
    result = _verify(driver_raw, anchor, dt.datetime(2023, 1, 1, tzinfo=dt.UTC))
    assert result.chain.status is ChainStatus.EXPIRED
    assert "not valid before" in result.chain.reason


def test_naive_time_is_a_usage_error(driver_raw: bytes, anchor: x509.Certificate) -> None:
    m = ReferenceManifest.parse(driver_raw)
    with pytest.raises(UsageError):
        m.verify_signature(anchor=anchor, now=dt.datetime(2024, 1, 1))


def test_signxml_agrees_on_a_real_rim(driver_raw: bytes) -> None:
    """An independent XML-DSig implementation accepts what we accept."""
    leaf = ReferenceManifest.parse(driver_raw).certificates[0]
    XMLVerifier().verify(
        driver_raw,
        x509_cert=leaf.public_bytes(serialization.Encoding.PEM).decode(),
        expect_config=SignatureConfiguration(verification_time=IN_VALIDITY),
    )


@pytest.mark.parametrize("path", PROD_RIMS, ids=[p.name[:30] for p in PROD_RIMS])
def test_prod_vbios_rims(path: Path, anchor: x509.Certificate) -> None:
    m = ReferenceManifest.parse(path.read_bytes())
    assert m.validate_schema().valid
    result = m.verify_signature(anchor=anchor, now=IN_VALIDITY)
    assert result.signature_valid, result.signature_reason
    assert result.chain.ok, result.chain.reason
    # The file name carries the VBIOS version without dots.
    assert m.colloquial_version.replace(".", "") == path.name.split("_")[3]
    assert m.active_indices == frozenset({*range(0, 7), *range(8, 13)})


def test_prod_rim_count() -> None:
    assert len(PROD_RIMS) == 24


# --- mutations of signed content ------------------------------------------------


def _replace_once(raw: bytes, old: bytes, new: bytes) -> bytes:
    assert raw.count(old) >= 1, old
    return raw.replace(old, new, 1)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # One golden value of index 7.
        (b'ns2:Hash0="0e0ee161b59bf124', b'ns2:Hash0="1e0ee161b59bf124'),
        (b'colloquialVersion="545.00"', b'colloquialVersion="545.01"'),
        (b'index="7" active="True"', b'index="7" active="False"'),
        (b'index="0" active="False"', b'index="0" active="True"'),
        (b'name="Measurement_7"', b'name="Measurement_8"'),
        (b'tagId="f0d3a263', b'tagId="a0d3a263'),
    ],
    ids=["hash", "colloquialVersion", "deactivate", "activate", "name", "tagId"],
)
def test_changed_content_breaks_signature(
    driver_raw: bytes, anchor: x509.Certificate, old: bytes, new: bytes
) -> None:
    mutated = _replace_once(driver_raw, old, new)
    m = ReferenceManifest.parse(mutated)
    result = m.verify_signature(anchor=anchor, now=IN_VALIDITY)
    assert not result.signature_valid
    assert "digest" in result.signature_reason
    # The chain is untouched and still reported on its own.
    assert result.chain.ok
    assert not result.ok


def test_lxml_round_trip_keeps_signature(driver_raw: bytes, anchor: x509.Certificate) -> None:
    """Baseline for the tree mutations below: re-serialising alone changes nothing."""
    assert _verify(_mutate_tree(driver_raw, lambda root: None), anchor).ok


def test_comment_in_payload_is_not_signed_content(
    driver_raw: bytes, anchor: x509.Certificate
) -> None:
    """C14N without comments drops comments, and the parser ignores them too."""

    def add_comment(root: etree._Element) -> None:
        payload = root.find(f"{{{SWID}}}Payload")
        assert payload is not None
        payload.insert(0, etree.Comment(" harmless "))

    mutated = _mutate_tree(driver_raw, add_comment)
    m = ReferenceManifest.parse(mutated)
    assert len(m.measurements) == 64
    assert m.verify_signature(anchor=anchor, now=IN_VALIDITY).signature_valid


def _second_reference(root: etree._Element) -> None:
    ref = _ds(_signature(root), "ds:SignedInfo/ds:Reference")
    extra = copy.deepcopy(ref)
    extra.set("URI", "#payload")
    ref.addnext(extra)


def _reference_uri(root: etree._Element) -> None:
    _ds(_signature(root), "ds:SignedInfo/ds:Reference").set("URI", "#x")


def _reference_id(root: etree._Element) -> None:
    _ds(_signature(root), "ds:SignedInfo/ds:Reference").set("Id", "r1")


def _algorithm(path: str, value: str) -> Callable[[etree._Element], None]:
    def change(root: etree._Element) -> None:
        _ds(_signature(root), path).set("Algorithm", value)

    return change


def _drop_c14n_transform(root: etree._Element) -> None:
    transforms = _ds(_signature(root), "ds:SignedInfo/ds:Reference/ds:Transforms")
    transforms.remove(transforms[1])


def _xpath_transform(root: etree._Element) -> None:
    transform = _ds(_signature(root), "ds:SignedInfo/ds:Reference/ds:Transforms/ds:Transform")
    xpath = etree.SubElement(transform, f"{{{DS}}}XPath")
    xpath.text = "not(ancestor-or-self::*)"


def _move_signature_first(root: etree._Element) -> None:
    sig = _signature(root)
    root.remove(sig)
    root.insert(0, sig)


def _move_signature_into_entity(root: etree._Element) -> None:
    sig = _signature(root)
    entity = root.find(f"{{{SWID}}}Entity")
    assert entity is not None
    root.remove(sig)
    entity.append(sig)


def _duplicate_signature(root: etree._Element) -> None:
    root.append(copy.deepcopy(_signature(root)))


def _signature_copy_in_entity(root: etree._Element) -> None:
    entity = root.find(f"{{{SWID}}}Entity")
    assert entity is not None
    entity.append(copy.deepcopy(_signature(root)))


def _element_after_signature(root: etree._Element) -> None:
    etree.SubElement(root, f"{{{SWID}}}Link", href="https://example.invalid/", rel="see-also")


def _object_in_signature(root: etree._Element) -> None:
    obj = etree.SubElement(_signature(root), f"{{{DS}}}Object")
    obj.text = "x"


def _comment_in_signed_info(root: etree._Element) -> None:
    _ds(_signature(root), "ds:SignedInfo").insert(0, etree.Comment("c"))


def _xml_lang_on_root(root: etree._Element) -> None:
    root.set("{http://www.w3.org/XML/1998/namespace}lang", "en")


def _short_signature_value(root: etree._Element) -> None:
    el = _ds(_signature(root), "ds:SignatureValue")
    el.text = base64.b64encode(base64.b64decode(el.text or "")[:64]).decode()


def _flip_signature_value(root: etree._Element) -> None:
    el = _ds(_signature(root), "ds:SignatureValue")
    raw = bytearray(base64.b64decode(el.text or ""))
    raw[10] ^= 1
    el.text = base64.b64encode(bytes(raw)).decode()


def _flip_digest_value(root: etree._Element) -> None:
    el = _ds(_signature(root), "ds:SignedInfo/ds:Reference/ds:DigestValue")
    raw = bytearray(base64.b64decode(el.text or ""))
    raw[0] ^= 1
    el.text = base64.b64encode(bytes(raw)).decode()


def _key_value_instead_of_certs(root: etree._Element) -> None:
    key_info = _ds(_signature(root), "ds:KeyInfo")
    etree.SubElement(key_info, f"{{{DS}}}KeyName").text = "k"


SHA256_ECDSA = "http://www.w3.org/2001/04/xmldsig-more#ecdsa-sha256"
EXC_C14N = "http://www.w3.org/2001/10/xml-exc-c14n#"
C14N10 = "http://www.w3.org/TR/2001/REC-xml-c14n-20010315"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_second_reference, "SignedInfo has children"),
        (_reference_uri, "URI"),
        (_reference_id, "URI"),
        (_algorithm("ds:SignedInfo/ds:SignatureMethod", SHA256_ECDSA), "SignatureMethod"),
        (_algorithm("ds:SignedInfo/ds:CanonicalizationMethod", EXC_C14N), "Canonicalization"),
        (_algorithm("ds:SignedInfo/ds:CanonicalizationMethod", C14N10), "Canonicalization"),
        (
            _algorithm(
                "ds:SignedInfo/ds:Reference/ds:DigestMethod",
                "http://www.w3.org/2001/04/xmlenc#sha256",
            ),
            "DigestMethod",
        ),
        (
            _algorithm("ds:SignedInfo/ds:Reference/ds:Transforms/ds:Transform", EXC_C14N),
            "Transform",
        ),
        (_drop_c14n_transform, "Transforms"),
        (_xpath_transform, "parameters"),
        (_move_signature_first, "last child"),
        (_move_signature_into_entity, "last child"),
        (_duplicate_signature, "exactly one Signature"),
        (_signature_copy_in_entity, "exactly one Signature"),
        (_element_after_signature, "last child"),
        (_object_in_signature, "Signature has children"),
        (_comment_in_signed_info, "comment"),
        (_xml_lang_on_root, "xml:"),
        (_short_signature_value, "SignatureValue"),
        (_flip_signature_value, "ECDSA"),
        (_flip_digest_value, "digest"),
        (_key_value_instead_of_certs, "KeyInfo"),
    ],
    ids=[
        "second-reference",
        "reference-uri",
        "reference-id",
        "ecdsa-sha256",
        "exclusive-c14n",
        "c14n-1.0",
        "sha256-digest",
        "exclusive-c14n-transform",
        "no-c14n-transform",
        "xpath-transform",
        "signature-first",
        "signature-in-entity",
        "duplicate-signature",
        "signature-copy-in-entity",
        "element-after-signature",
        "object-in-signature",
        "comment-in-signedinfo",
        "xml-lang-on-root",
        "short-signature-value",
        "flipped-signature-value",
        "flipped-digest-value",
        "keyname-in-keyinfo",
    ],
)
def test_signature_profile_is_enforced(
    driver_raw: bytes,
    anchor: x509.Certificate,
    change: Callable[[etree._Element], None],
    reason: str,
) -> None:
    mutated = _mutate_tree(driver_raw, change)
    try:
        m = ReferenceManifest.parse(mutated)
    except MalformedRimError:
        pytest.fail("structural signature problems are results, not parse errors")
    result = m.verify_signature(anchor=anchor, now=IN_VALIDITY)
    assert not result.signature_valid
    assert reason in result.signature_reason
    assert "\n" not in result.signature_reason
    assert not result.ok


def test_unsigned_rim(driver_raw: bytes, anchor: x509.Certificate) -> None:
    unsigned = etree.tostring(strip_signatures(driver_raw))
    m = ReferenceManifest.parse(unsigned)
    assert m.certificates == ()
    result = m.verify_signature(anchor=anchor, now=IN_VALIDITY)
    assert not result.signature_valid
    assert "found 0" in result.signature_reason
    assert result.chain.status is ChainStatus.INVALID
    assert result.signer is None
    assert result.to_dict()["signer"] is None


# --- embedded certificates --------------------------------------------------------


def _set_certs(raw: bytes, certs: list[x509.Certificate]) -> bytes:
    def change(root: etree._Element) -> None:
        x509_data = _ds(_signature(root), "ds:KeyInfo/ds:X509Data")
        for child in list(x509_data):
            x509_data.remove(child)
        for cert in certs:
            el = etree.SubElement(x509_data, f"{{{DS}}}X509Certificate")
            der = cert.public_bytes(serialization.Encoding.DER)
            el.text = base64.encodebytes(der).decode()

    return _mutate_tree(raw, change)


def test_foreign_root_as_last_certificate(
    driver_raw: bytes, anchor: x509.Certificate, pki: RimPki
) -> None:
    nvidia = list(ReferenceManifest.parse(driver_raw).certificates)
    # KeyInfo is outside SignedInfo: swapping certificates does not touch the signature...
    result = _verify(_set_certs(driver_raw, [*nvidia[:3], pki.root]), anchor)
    assert result.signature_valid
    # ...so the chain check against the pinned anchor is what refuses it.
    assert result.chain.status is ChainStatus.INVALID
    assert "not the pinned root" in result.chain.reason
    assert not result.ok


def test_chain_must_have_four_certificates(driver_raw: bytes, anchor: x509.Certificate) -> None:
    nvidia = list(ReferenceManifest.parse(driver_raw).certificates)
    result = _verify(_set_certs(driver_raw, [nvidia[0], nvidia[1], nvidia[3]]), anchor)
    assert result.signature_valid
    assert result.chain.status is ChainStatus.INVALID
    assert "expected 4" in result.chain.reason


def test_foreign_leaf_does_not_verify(
    driver_raw: bytes, anchor: x509.Certificate, pki: RimPki
) -> None:
    nvidia = list(ReferenceManifest.parse(driver_raw).certificates)
    result = _verify(_set_certs(driver_raw, [pki.l4, *nvidia[1:]]), anchor)
    assert not result.signature_valid
    assert "ECDSA" in result.signature_reason
    assert result.chain.status is ChainStatus.INVALID


def test_corrupt_embedded_certificate_is_malformed(driver_raw: bytes) -> None:
    def change(root: etree._Element) -> None:
        _ds(_signature(root), "ds:KeyInfo/ds:X509Data/ds:X509Certificate").text = "AAAA"

    with pytest.raises(MalformedRimError, match="certificate 0"):
        ReferenceManifest.parse(_mutate_tree(driver_raw, change))


def test_bad_base64_certificate_is_malformed(driver_raw: bytes) -> None:
    def change(root: etree._Element) -> None:
        _ds(_signature(root), "ds:KeyInfo/ds:X509Data/ds:X509Certificate").text = "@@@"

    with pytest.raises(MalformedRimError, match="base64"):
        ReferenceManifest.parse(_mutate_tree(driver_raw, change))


# --- a RIM signed by a test PKI ---------------------------------------------------


def test_test_pki_signature_is_real(
    driver_raw: bytes, anchor: x509.Certificate, pki: RimPki
) -> None:
    resigned = sign_rim(driver_raw, pki=pki)
    m = ReferenceManifest.parse(resigned)
    assert m.validate_schema().valid
    assert m.certificates == tuple(pki.chain)
    # Same measurements as the NVIDIA-signed original.
    assert m.measurements == ReferenceManifest.parse(driver_raw).measurements

    against_nvidia = m.verify_signature(anchor=anchor, now=IN_VALIDITY)
    assert against_nvidia.signature_valid, against_nvidia.signature_reason
    assert against_nvidia.chain.status is ChainStatus.INVALID
    assert "not the pinned root" in against_nvidia.chain.reason

    against_test_root = m.verify_signature(anchor=pki.root, now=IN_VALIDITY)
    assert against_test_root.ok, (against_test_root.signature_reason, against_test_root.chain)
    assert against_test_root.signer == pki.l4


def test_test_pki_tampered_after_signing(driver_raw: bytes, pki: RimPki) -> None:
    resigned = sign_rim(driver_raw, pki=pki)
    tampered = _replace_once(resigned, b'colloquialVersion="545.00"', b'colloquialVersion="999.99"')
    result = _verify(tampered, pki.root)
    assert not result.signature_valid
    assert result.chain.ok


def test_test_pki_unsigned_input(driver_raw: bytes, pki: RimPki) -> None:
    unsigned = etree.tostring(strip_signatures(driver_raw))
    assert _verify(sign_rim(unsigned, pki=pki), pki.root).ok


def test_test_pki_expired_signer(driver_raw: bytes) -> None:
    short = make_rim_pki(l4_not_after=dt.datetime(2023, 6, 1, tzinfo=dt.UTC))
    result = _verify(sign_rim(driver_raw, pki=short), short.root, IN_VALIDITY)
    assert result.signature_valid
    assert result.chain.status is ChainStatus.EXPIRED
    assert "gpucc test RIM L4 Signer" in result.chain.reason


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"signature_algorithm": SignatureMethod.ECDSA_SHA256}, "SignatureMethod"),
        ({"digest_algorithm": DigestAlgorithm.SHA256}, "DigestMethod"),
        (
            {"c14n_algorithm": CanonicalizationMethod.EXCLUSIVE_XML_CANONICALIZATION_1_0},
            "CanonicalizationMethod",
        ),
        ({"c14n_algorithm": CanonicalizationMethod.CANONICAL_XML_1_0}, "CanonicalizationMethod"),
    ],
    ids=["ecdsa-sha256", "sha256-digest", "exc-c14n", "c14n10"],
)
def test_test_pki_other_algorithms_refused(
    driver_raw: bytes, pki: RimPki, kwargs: dict[str, object], reason: str
) -> None:
    """Correctly signed with a trusted key, but not NVIDIA's profile: refused."""
    resigned = sign_rim(driver_raw, pki=pki, **kwargs)  # type: ignore[arg-type]
    result = _verify(resigned, pki.root)
    assert result.chain.ok
    assert not result.signature_valid
    assert reason in result.signature_reason
    assert "is not allowed" in result.signature_reason


def test_ca_certificate_as_signer_refused(driver_raw: bytes, pki: RimPki) -> None:
    """A signature made with the L3 (CA) key, L3 presented as the leaf."""
    l3_as_signer = RimPki(
        pki.root_key, pki.root, pki.ca_key, pki.ca, pki.l3_key, pki.l3, pki.l3_key, pki.l3
    )
    resigned = sign_rim(
        driver_raw, pki=l3_as_signer, certificates=[pki.l3, pki.ca, pki.root, pki.root]
    )
    result = _verify(resigned, pki.root)
    assert not result.signature_valid
    assert "CA certificate" in result.signature_reason


# --- parse errors -----------------------------------------------------------------


def _drop_resources(root: etree._Element) -> None:
    payload = root.find(f"{{{SWID}}}Payload")
    assert payload is not None
    for child in list(payload):
        payload.remove(child)


def _duplicate_meta(root: etree._Element) -> None:
    meta = root.find(f"{{{SWID}}}Meta")
    assert meta is not None
    meta.addnext(copy.deepcopy(meta))


def _foreign_payload_child(root: etree._Element) -> None:
    payload = root.find(f"{{{SWID}}}Payload")
    assert payload is not None
    etree.SubElement(payload, f"{{{SWID}}}File", name="x")


def _signature_in_payload(root: etree._Element) -> None:
    payload = root.find(f"{{{SWID}}}Payload")
    sig = root.find(f"{{{DS}}}Signature")
    assert payload is not None and sig is not None
    payload.append(copy.deepcopy(sig))


def _extra_hash(root: etree._Element) -> None:
    res = root.find(f"{{{SWID}}}Payload/{{{SWID}}}Resource")
    assert res is not None
    res.set(f"{{{HASH_NS}}}Hash1", "00" * 48)


@pytest.mark.parametrize(
    ("old", "new", "match"),
    [
        (b'index="7" active="True"', b'index="7" active="Yes"', "active"),
        (b'index="7" active="True"', b'index="7" active=""', "active"),
        (b'index="7" active="True"', b'index="7" activ="True"', "no active"),
        (b'index="8" active="False"', b'index="7" active="False"', "duplicate"),
        (b'index="7" ', b'index="7a" ', "not a decimal"),
        (b'index="7" ', b'index=" 7" ', "not a decimal"),
        (b'index="7" ', b'index="-7" ', "not a decimal"),
        (b'index="7" ', b'index="999" ', "outside"),
        (
            b'index="7" active="True" alternatives="1"',
            b'index="7" active="True" alternatives="2"',
            "alternatives",
        ),
        (
            b'index="7" active="True" alternatives="1"',
            b'index="7" active="True" alternatives="0"',
            "outside",
        ),
        (b'ns2:Hash0="0e0ee161', b'ns2:Hash0="0e0ee16', "hex"),
        (b'ns2:Hash0="0e0ee161', b'ns2:Hash0="0g0ee161', "hex"),
        (b'ns2:Hash0="0e0ee161', b'ns2:Hash1="0e0ee161', "alternatives"),
        (b'name="Measurement_7" size="48"', b'name="Measurement_7" size="47"', "hex"),
        (b'colloquialVersion="545.00" ', b"", "colloquialVersion"),
        (b'tagId="f0d3a263', b'tagid="f0d3a263', "tagId"),
        (b'type="Measurement" index="7"', b'type="Other" index="7"', "measurement"),
        (
            b'<SoftwareIdentity xmlns="http://standards.iso.org/iso/19770/-2/2015/schema.xsd"',
            b'<SoftwareIdentity xmlns="urn:other"',
            "SoftwareIdentity",
        ),
    ],
)
def test_malformed_content(driver_raw: bytes, old: bytes, new: bytes, match: str) -> None:
    with pytest.raises(MalformedRimError, match=match) as info:
        ReferenceManifest.parse(_replace_once(driver_raw, old, new))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (_drop_resources, "no measurement"),
        (_duplicate_meta, "Meta"),
        (_foreign_payload_child, "unexpected element"),
        (_signature_in_payload, "unexpected element"),
        (_extra_hash, "alternatives"),
    ],
    ids=["no-resources", "two-meta", "file-in-payload", "signature-in-payload", "extra-hash"],
)
def test_malformed_structure(
    driver_raw: bytes, change: Callable[[etree._Element], None], match: str
) -> None:
    with pytest.raises(MalformedRimError, match=match):
        ReferenceManifest.parse(_mutate_tree(driver_raw, change))


def test_active_is_case_insensitive(driver_raw: bytes) -> None:
    raw = _replace_once(driver_raw, b'index="7" active="True"', b'index="7" active="true"')
    raw = _replace_once(raw, b'index="21" active="True"', b'index="21" active="TRUE"')
    raw = _replace_once(raw, b'index="22" active="True"', b'index="22" active="false"')
    m = ReferenceManifest.parse(raw)
    assert {7, 21} <= m.active_indices
    assert 22 not in m.active_indices


def test_upper_case_hash_is_the_same_bytes(driver_raw: bytes) -> None:
    original = ReferenceManifest.parse(driver_raw).entry(7)
    upper = b'ns2:Hash0="0E0EE161B59BF124'
    changed = ReferenceManifest.parse(
        _replace_once(driver_raw, b'ns2:Hash0="0e0ee161b59bf124', upper)
    ).entry(7)
    assert original is not None and changed is not None
    assert original.values == changed.values


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "empty"),
        (b"not xml", "well-formed"),
        (b"<a>", "well-formed"),
        (b"<SoftwareIdentity/>", "SoftwareIdentity"),
        (b'<x xmlns="http://standards.iso.org/iso/19770/-2/2015/schema.xsd"/>', "expected"),
        (
            b'<!DOCTYPE r [<!ENTITY a "aaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]><r>&b;</r>',
            "DTD",
        ),
        (b'<!DOCTYPE r SYSTEM "http://example.invalid/x.dtd"><r/>', "DTD"),
        (b'<?xml version="1.0"?><r xmlns:x="urn:x">&ext;</r>', "well-formed"),
        (b"\x00\x01\x02", "well-formed"),
    ],
    ids=[
        "empty",
        "text",
        "truncated",
        "no-namespace",
        "wrong-element",
        "entities",
        "external-dtd",
        "undeclared-entity",
        "binary",
    ],
)
def test_malformed_documents(data: bytes, match: str) -> None:
    with pytest.raises(MalformedRimError, match=match):
        ReferenceManifest.parse(data)


def test_utf16_doctype_is_refused() -> None:
    """The byte-level DTD check cannot see UTF-16; the parsed docinfo check does."""
    doc = '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE r [<!ENTITY e "x">]><r>&e;</r>'
    with pytest.raises(MalformedRimError):
        ReferenceManifest.parse(doc.encode("utf-16"))


def test_size_cap() -> None:
    with pytest.raises(MalformedRimError, match="more than"):
        ReferenceManifest.parse(b" " * (MAX_RIM_BYTES + 1))


# --- schema -----------------------------------------------------------------------


def test_schema_rejects_invalid_document(driver_raw: bytes) -> None:
    m = ReferenceManifest.parse(_replace_once(driver_raw, b'corpus="false"', b'corpus="maybe"'))
    result = m.validate_schema()
    assert not result.valid
    assert "corpus" in result.reason
    assert "\n" not in result.reason
    assert result.to_dict() == {"valid": False, "reason": result.reason}


def test_schema_rejects_unknown_swid_element(driver_raw: bytes) -> None:
    def change(root: etree._Element) -> None:
        meta = root.find(f"{{{SWID}}}Meta")
        assert meta is not None
        meta.addnext(etree.Element(f"{{{SWID}}}Bogus"))

    assert not ReferenceManifest.parse(_mutate_tree(driver_raw, change)).validate_schema().valid


def test_schema_is_compiled_once(driver_raw: bytes) -> None:
    m = ReferenceManifest.parse(driver_raw)
    m.validate_schema()
    before = rim_module._swid_schema.cache_info()
    m.validate_schema()
    after = rim_module._swid_schema.cache_info()
    assert after.misses == before.misses
    assert after.hits == before.hits + 1


def test_schema_imports_never_leave_the_package() -> None:
    parser = etree.XMLParser(no_network=True, load_dtd=False)
    parser.resolvers.add(rim_module._PackagedSchemaResolver())
    doc = etree.fromstring(
        b'<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">'
        b'<xs:import namespace="urn:x" schemaLocation="http://example.invalid/x.xsd"/>'
        b"</xs:schema>",
        parser,
        base_url="gpuattest-schemas/test.xsd",
    )
    with pytest.raises(etree.XMLSchemaParseError):
        etree.XMLSchema(doc)


# --- speed ------------------------------------------------------------------------


# --- fuzzing ----------------------------------------------------------------------

_SEED_RIM = DRIVER_RIM.read_bytes()
_ANCHOR = TrustRoots.nvidia().rim_root
_SPECIAL = [b"<", b">", b'"', b"&", b"/", b"=", b" ", b"\x00", b"\xff", b"0", b"a", b"Z"]
_ALNUM = b"0123456789abcdefABCDEFxyzXYZ"
_SIGNATURE_AT = _SEED_RIM.index(b"<ds:Signature")
_OPS = ["flip", "special", "truncate", "insert", "delete", "alnum", "line", "signature"]


@st.composite
def _mutated_rim(draw: st.DrawFn) -> bytes:
    """Byte-level and line-level mutants of a real RIM.

    The "alnum", "line" and "signature" operations mostly keep the document
    well-formed, so a good share of mutants reaches the signature checks.
    """
    data = bytearray(_SEED_RIM)
    for _ in range(draw(st.integers(1, 3))):
        if not data:
            break
        op = draw(st.sampled_from(_OPS))
        if op == "signature" and len(data) > _SIGNATURE_AT:
            pos = draw(st.integers(_SIGNATURE_AT, len(data) - 1))
            op = draw(st.sampled_from(["alnum", "special", "delete", "insert"]))
        else:
            pos = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "special":
            data[pos : pos + 1] = draw(st.sampled_from(_SPECIAL))
        elif op == "alnum":
            if chr(data[pos]).isalnum():
                data[pos] = draw(st.sampled_from(_ALNUM))
        elif op == "truncate":
            del data[pos:]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 64))]
        else:
            lines = bytes(data).split(b"\n")
            i = draw(st.integers(0, len(lines) - 1))
            j = draw(st.integers(0, len(lines) - 1))
            action = draw(st.sampled_from(["drop", "duplicate", "swap"]))
            if action == "drop":
                del lines[i]
            elif action == "duplicate":
                lines.insert(j, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            data = bytearray(b"\n".join(lines))
    return bytes(data)


def _exercise(data: bytes) -> None:
    try:
        m = ReferenceManifest.parse(data)
    except MalformedRimError as exc:
        assert "\n" not in str(exc)
        return
    assert m.validate_schema().valid in (True, False)
    result = m.verify_signature(anchor=_ANCHOR, now=IN_VALIDITY)
    assert isinstance(result, RimSignatureResult)
    if data != _SEED_RIM and result.signature_valid:
        # Only changes outside the signed content (certificates, comments,
        # insignificant markup) can leave the signature intact.
        assert m.measurements == ReferenceManifest.parse(_SEED_RIM).measurements


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated_rim())
def test_fuzz_mutated_real_rim(data: bytes) -> None:
    _exercise(data)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=512))
def test_fuzz_random_bytes(data: bytes) -> None:
    _exercise(data)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('<>/="& abcdefxyz0123456789:!-?[]')), max_size=200))
def test_fuzz_xmlish_text(text: str) -> None:
    _exercise(text.encode())
