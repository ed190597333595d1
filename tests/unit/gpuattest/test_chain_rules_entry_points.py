"""The shared chain rules, reached through each verifier's own entry point.

Each test here is a rule a chain kind did not enforce before its chain went through
:mod:`gpuattest.x509chain`: SEV-SNP's VCEK chain (unknown critical extensions, path length,
keyCertSign), and every kind's refusal of a repeated certificate or an oversize chain.
"""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509 import ocsp
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpucc.gpuattest.chain import ChainStatus, validate_chain
from gpucc.gpuattest.collateral import ChainKind, OcspStatus
from gpucc.gpuattest.cvm.snp import verify_snp_report
from gpucc.gpuattest.cvm.snp_report import SnpProduct
from gpucc.gpuattest.cvm.snp_simulate import SimulatedSnp, SnpPki
from gpucc.gpuattest.jwks import SigningKey, check_key_chain
from gpucc.gpuattest.jws import TokenCheckError
from gpucc.gpuattest.ocsp_response import build_request, evaluate_response
from gpucc.gpuattest.result import CheckStatus
from tests.support.netfixtures import NOW, Node, OcspResponder, build_pki, make_node, ocsp_target

_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48)
_START = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
_END = dt.datetime(2049, 1, 1, tzinfo=dt.UTC)


# --- SEV-SNP: the VCEK chain ------------------------------------------------------------


def _amd_name(cn: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpucc chain rules"),
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
        ]
    )


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=False,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )


def _snp_pki(*, ark_path_length: int | None = None, ask_cert_sign: bool = True) -> SnpPki:
    """An AMD-shaped Milan ARK and ASK (RSA, RSA-PSS SHA-384) with the given constraints."""
    ark_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ask_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ark_name = _amd_name("ARK-Milan")

    def cert(subject: x509.Name, key: rsa.RSAPrivateKey) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ark_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_START)
            .not_valid_after(_END)
        )

    ark = (
        cert(ark_name, ark_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=ark_path_length), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .sign(ark_key, hashes.SHA384(), rsa_padding=_PSS)
    )
    ask = (
        cert(_amd_name("SEV-Milan"), ask_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=ask_cert_sign), critical=True)
        .sign(ark_key, hashes.SHA384(), rsa_padding=_PSS)
    )
    return SnpPki(SnpProduct.MILAN, ark, ask, ark_key, ask_key)


def _chain_check(chip: SimulatedSnp, vcek: bytes | None = None) -> tuple[CheckStatus, str]:
    findings = verify_snp_report(
        chip.report(), vcek=chip.vcek if vcek is None else vcek, now=NOW, roots=chip.roots
    )
    check = next(c for c in findings.checks if c.id == "snp-vcek-chain")
    return check.status, check.reason


def test_the_snp_control_chain_passes() -> None:
    assert _chain_check(SimulatedSnp.create(pki=_snp_pki()))[0] is CheckStatus.PASS


def test_a_vcek_with_an_unknown_critical_extension_fails_the_snp_chain() -> None:
    chip = SimulatedSnp.create(pki=_snp_pki())
    vcek = x509.load_der_x509_certificate(chip.vcek)
    builder = (
        x509.CertificateBuilder()
        .subject_name(vcek.subject)
        .issuer_name(vcek.issuer)
        .public_key(vcek.public_key())
        .serial_number(vcek.serial_number)
        .not_valid_before(vcek.not_valid_before_utc)
        .not_valid_after(vcek.not_valid_after_utc)
    )
    for ext in vcek.extensions:
        builder = builder.add_extension(ext.value, ext.critical)
    strange = x509.UnrecognizedExtension(x509.ObjectIdentifier("1.3.6.1.4.1.99999.7"), b"\x05\x00")
    hostile = builder.add_extension(strange, critical=True).sign(
        chip.pki.ask_key, hashes.SHA384(), rsa_padding=_PSS
    )
    status, reason = _chain_check(chip, hostile.public_bytes(serialization.Encoding.DER))
    assert status is CheckStatus.FAIL
    assert "unknown critical extensions 1.3.6.1.4.1.99999.7" in reason


def test_an_ark_whose_path_length_forbids_the_ask_as_a_ca_fails_the_snp_chain() -> None:
    status, reason = _chain_check(SimulatedSnp.create(pki=_snp_pki(ark_path_length=0)))
    assert status is CheckStatus.FAIL
    assert "'ARK-Milan' path length constraint 0 exceeded" in reason


def test_an_ask_that_may_not_sign_certificates_fails_the_snp_chain() -> None:
    status, reason = _chain_check(SimulatedSnp.create(pki=_snp_pki(ask_cert_sign=False)))
    assert status is CheckStatus.FAIL
    assert "'SEV-Milan' key usage does not allow certificate signing" in reason


# --- a repeated certificate, an oversize chain ---------------------------------------------


def _ladder(depth: int) -> list[Node]:
    """A root and ``depth`` CAs below it, each issued by the one before (root first)."""
    nodes = [make_node("Ladder Root", None, ca=True)]
    for i in range(depth):
        nodes.append(make_node(f"Ladder CA {i + 1}", nodes[-1], ca=True))
    return nodes


def test_a_gpu_chain_that_repeats_its_root_is_invalid() -> None:
    """Five certificates, as NVIDIA's device chain has, but the root is counted twice."""
    nodes = _ladder(2)
    leaf = make_node("Ladder Leaf", nodes[-1], ca=False)
    chain = [leaf.cert, nodes[2].cert, nodes[1].cert, nodes[0].cert, nodes[0].cert]
    result = validate_chain(chain, nodes[0].cert, NOW, expected_length=5)
    assert result.status is ChainStatus.INVALID
    assert "'Ladder Root' appears twice in the chain" in result.reason


def _ocsp_answer(issuer_chain: list[x509.Certificate]) -> tuple[OcspStatus, str]:
    """OCSP for the test PKI's BROM, signed by its issuer, with ``issuer_chain`` above it."""
    pki = build_pki()
    chain = pki.device_chain
    responder = OcspResponder(pki)
    request = ocsp.load_der_ocsp_request(build_request(chain[1], chain[2], nonce=None))
    der = responder.respond(pki.brom, request, responder.behaviour)
    target = ocsp_target(
        chain[1],
        chain[2],
        kind=ChainKind.DEVICE,
        anchor=pki.device_root.cert,
        now=NOW,
        issuer_chain=issuer_chain,
    )
    out = evaluate_response(der, target)
    return out.status, out.reason


def test_an_ocsp_responder_chain_that_repeats_its_root_is_invalid() -> None:
    chain = build_pki().device_chain
    assert _ocsp_answer(chain[3:])[0] is OcspStatus.GOOD  # the control
    status, reason = _ocsp_answer([chain[3], chain[4], chain[4]])
    assert status is OcspStatus.UNKNOWN
    assert "appears twice in the chain" in reason


def test_an_oversize_ocsp_responder_chain_is_invalid() -> None:
    """The responder's chain above the issuer is as long as the caller gives: now capped."""
    pki = build_pki()
    nodes = [pki.device_root]
    for i in range(9):
        nodes.append(make_node(f"Deep CA {i + 1}", nodes[-1], ca=True))
    issuer = make_node("Deep Issuer", nodes[-1], ca=True)
    subject = make_node("Deep Subject", issuer, ca=False)
    above = [n.cert for n in reversed(nodes)]  # 10 certificates, the anchor last
    request = ocsp.load_der_ocsp_request(build_request(subject.cert, issuer.cert, nonce=None))
    now = NOW
    der = (
        ocsp.OCSPResponseBuilder()
        .add_response_by_hash(
            issuer_name_hash=request.issuer_name_hash,
            issuer_key_hash=request.issuer_key_hash,
            serial_number=request.serial_number,
            algorithm=request.hash_algorithm,
            cert_status=ocsp.OCSPCertStatus.GOOD,
            this_update=now - dt.timedelta(hours=1),
            next_update=now + dt.timedelta(days=1),
            revocation_time=None,
            revocation_reason=None,
        )
        .responder_id(ocsp.OCSPResponderEncoding.HASH, issuer.cert)
        .sign(issuer.key, hashes.SHA384())
        .public_bytes(serialization.Encoding.DER)
    )
    target = ocsp_target(
        subject.cert,
        issuer.cert,
        kind=ChainKind.DEVICE,
        anchor=pki.device_root.cert,
        now=now,
        issuer_chain=above,
    )
    out = evaluate_response(der, target)
    assert out.status is OcspStatus.UNKNOWN and out.response_valid is False
    assert "11 certificates, more than 10" in out.reason


def test_a_jwks_x5c_chain_that_repeats_its_root_is_refused() -> None:
    nodes = _ladder(1)
    signer = make_node("Token Signer", nodes[-1], ca=False, eku=[ExtendedKeyUsageOID.CLIENT_AUTH])
    public = signer.key.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    good = SigningKey("k", public, (signer.cert, nodes[1].cert, nodes[0].cert))
    check_key_chain(good, [nodes[0].cert], NOW)  # the control
    repeated = SigningKey("k", public, (signer.cert, nodes[1].cert, nodes[0].cert, nodes[0].cert))
    with pytest.raises(TokenCheckError, match="appears twice"):
        check_key_chain(repeated, [nodes[0].cert], NOW)
