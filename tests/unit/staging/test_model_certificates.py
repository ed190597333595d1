"""The certificate method of model_signing bundles, against the real ``model_signing``.

A throw-away PKI (root, intermediate, leaf) is built per test; bundles go both ways between
gpucc and model_signing, and chains that do not lead to the trusted root, or leaves that may
not sign, are refused with exit 6.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpucc.staging.model import digest_model, make_serialization, verify_model
from gpucc.staging.model import signing as gsign
from gpucc.staging.model.errors import SignatureError
from tests.e2e.test_model_cli import error_line, run
from tests.unit.staging.test_model_library import make_model

model_signing: Any = importlib.import_module("model_signing")
NOW = dt.datetime.now(dt.UTC)


def _usage(*, sign: bool, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=sign, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _cert(
    cn: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: str,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    may_sign: bool = True,
) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - dt.timedelta(days=1))
        .not_valid_after(NOW + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
        .add_extension(_usage(sign=may_sign and not ca, ca=ca), critical=True)
    )
    if not ca and may_sign:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    rk, ik, lk = (
        ec.generate_private_key(c) for c in (ec.SECP384R1(), ec.SECP384R1(), ec.SECP256R1())
    )
    root = _cert("model root", rk, "model root", rk, ca=True)
    inter = _cert("model intermediate", ik, "model root", rk, ca=True)
    leaf = _cert("model signer", lk, "model intermediate", ik, ca=False)
    other = ec.generate_private_key(ec.SECP384R1())
    (tmp_path / "root.pem").write_bytes(_pem(root))
    (tmp_path / "other-root.pem").write_bytes(_pem(_cert("other", other, "other", other, ca=True)))
    (tmp_path / "inter.pem").write_bytes(_pem(inter))
    (tmp_path / "leaf.pem").write_bytes(_pem(leaf))
    (tmp_path / "noisy.pem").write_bytes(_pem(_cert("no signing", lk, "model intermediate", ik, ca=False, may_sign=False)))  # fmt: skip
    key = tmp_path / "leaf.key"
    key.write_bytes(
        lk.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key.chmod(0o600)
    make_model(tmp_path / "model")
    return tmp_path


def test_gpucc_certificate_bundle_verifies_with_model_signing(pki: Path) -> None:
    result = run(
        "sign", "model", "--signer-key", "leaf.key", "--signer-cert", "leaf.pem",
        "--cert-chain", "inter.pem", "--signature", "c.sig", "--shard-size", "1000",
        cwd=pki,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    model_signing.verifying.Config().use_certificate_verifier(
        certificate_chain=[pki / "root.pem"]
    ).verify(pki / "model", pki / "c.sig")
    ok = run("verify", "model", "--signature", "c.sig", "--cert-chain", "root.pem", cwd=pki)
    assert ok.returncode == 0, ok.stderr
    wrong = run("verify", "model", "--signature", "c.sig", "--cert-chain", "other-root.pem", cwd=pki)  # fmt: skip
    error_line(wrong, 6, "does not chain to a trust anchor")
    as_key = run("verify", "model", "--signature", "c.sig", "--signer-pub", "leaf.pem", cwd=pki)
    assert as_key.returncode != 0 and "Traceback" not in as_key.stderr


def test_model_signing_certificate_bundle_verifies_with_gpucc(pki: Path) -> None:
    sig = pki / "ms.sig"
    model_signing.signing.Config().use_certificate_signer(
        private_key=pki / "leaf.key",
        signing_certificate=pki / "leaf.pem",
        certificate_chain=[pki / "inter.pem"],
    ).sign(pki / "model", sig)
    anchors = gsign.load_certificates([pki / "root.pem"])
    trusted = gsign.verify_bundle(sig.read_bytes(), anchors=anchors)
    assert verify_model(pki / "model", trusted).ok
    with pytest.raises(SignatureError, match="trust anchor"):
        gsign.verify_bundle(sig.read_bytes(), anchors=gsign.load_certificates([pki / "other-root.pem"]))  # fmt: skip


def test_a_certificate_that_may_not_sign_is_refused(pki: Path) -> None:
    key = gsign.load_private_key(pki / "leaf.key")
    manifest = digest_model(pki / "model", make_serialization(pki / "model"))
    noisy = gsign.load_certificates([pki / "noisy.pem"])[0]
    chain = gsign.load_certificates([pki / "inter.pem"])
    bundle = gsign.sign_manifest(manifest, key, certificate=noisy, chain=chain)
    anchors = gsign.load_certificates([pki / "root.pem"])
    with pytest.raises(SignatureError, match="not for signing"):
        gsign.verify_bundle(bundle, anchors=anchors)


def test_key_bundles_and_certificate_bundles_do_not_mix(pki: Path) -> None:
    key = gsign.load_private_key(pki / "leaf.key")
    manifest = digest_model(pki / "model", make_serialization(pki / "model"))
    key_signed = gsign.sign_manifest(manifest, key)
    with pytest.raises(SignatureError, match="no certificate chain"):
        gsign.verify_bundle(key_signed, anchors=gsign.load_certificates([pki / "root.pem"]))
    leaf = gsign.load_certificates([pki / "leaf.pem"])[0]
    cert_signed = gsign.sign_manifest(manifest, key, certificate=leaf)
    with pytest.raises(SignatureError, match="bare public key"):
        gsign.verify_bundle(cert_signed, key.public_key())
    # a chain with the intermediate missing does not reach the root
    with pytest.raises(SignatureError, match="trust anchor"):
        gsign.verify_bundle(cert_signed, anchors=gsign.load_certificates([pki / "root.pem"]))
    # an edited payload in a certificate bundle fails the signature
    bundle = json.loads(gsign.sign_manifest(manifest, key, certificate=leaf,
                                            chain=gsign.load_certificates([pki / "inter.pem"])))  # fmt: skip
    bundle["dsseEnvelope"]["payload"] = bundle["dsseEnvelope"]["payload"][:-8] + "AAAAAAA="
    with pytest.raises(SignatureError, match="does not verify"):
        gsign.verify_bundle(json.dumps(bundle).encode(), anchors=gsign.load_certificates([pki / "root.pem"]))  # fmt: skip
