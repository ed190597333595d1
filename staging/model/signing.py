"""model_signing signature bundles: the elliptic-key and certificate methods.

Keys are elliptic-curve keys on P-256, P-384 or P-521.

The bundle is a Sigstore bundle (media type ``application/vnd.dev.sigstore.bundle.v0.3+json``)
whose DSSE envelope carries the manifest statement as its payload::

    {"mediaType": ..., "verificationMaterial": {"publicKey": {"hint": HEX}, "tlogEntries": []},
     "dsseEnvelope": {"payload": B64, "payloadType": "application/vnd.in-toto+json",
                      "signatures": [{"sig": B64, "keyid": ""}]}}

The signature is ECDSA (SHA-256/384/512 by curve size) over the DSSE pre-authentication
encoding of the payload; ``hint`` is SHA-256 of the public key's PEM (SubjectPublicKeyInfo).
With the certificate method, ``verificationMaterial`` is instead
``{"x509CertificateChain": {"certificates": [{"rawBytes": B64_DER}, ...]}, "tlogEntries": []}``,
the signing certificate first. :func:`verify_bundle` checks the signature (and, for the
certificate method, the chain to the given trust anchors) before anything in the payload is
parsed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID

from gpucc.core.errors import ExposedKeyFileError, KeyFileError
from gpucc.core.files import read_secret
from gpucc.gpuattest import x509chain

from .errors import MalformedManifestError, SignatureError
from .manifest import MAX_MANIFEST_SIZE, Manifest, _loads, _object, _string

__all__ = [
    "BUNDLE_MEDIA_TYPE",
    "MAX_BUNDLE_SIZE",
    "PAYLOAD_TYPE",
    "key_hint",
    "load_certificates",
    "load_private_key",
    "load_public_key",
    "pae",
    "sign_manifest",
    "verify_bundle",
]

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
MAX_BUNDLE_SIZE = MAX_MANIFEST_SIZE * 4 // 3 + 64 * 1024
MAX_KEY_SIZE = 64 * 1024
_CURVES: dict[str, type[hashes.SHA256 | hashes.SHA384 | hashes.SHA512]] = {
    "secp256r1": hashes.SHA256,
    "secp384r1": hashes.SHA384,
    "secp521r1": hashes.SHA512,
}


def pae(payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding of an in-toto payload."""
    head = f"DSSEv1 {len(PAYLOAD_TYPE)} {PAYLOAD_TYPE} {len(payload)} "
    return head.encode() + payload


def _hash_for(key: ec.EllipticCurvePublicKey) -> hashes.HashAlgorithm:
    algorithm = _CURVES.get(key.curve.name)
    if algorithm is None:
        raise KeyFileError(f"unsupported curve {key.curve.name} (use P-256, P-384 or P-521)")
    return algorithm()


def key_hint(key: ec.EllipticCurvePublicKey) -> str:
    """SHA-256 of the PEM SubjectPublicKeyInfo, hex: model_signing's key identifier."""
    pem = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(pem).hexdigest()


def _read_private(path: Path) -> bytes:
    data = read_secret(path, MAX_KEY_SIZE, what="private key", exposed=ExposedKeyFileError)
    if len(data) > MAX_KEY_SIZE:
        raise KeyFileError(f"private key {path} is too large to be a key")
    return data


def load_private_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """An unencrypted PEM EC private key from a file only its owner can read (mode 0600).

    Raises:
        KeyFileError: exposed, not owned by this user, encrypted, malformed or not EC.
    """
    data = _read_private(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise KeyFileError(
            f"private key {path} is encrypted; gpucc needs an unencrypted key"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise KeyFileError(f"private key {path} is not a PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise KeyFileError(f"private key {path} is not an elliptic-curve key")
    _hash_for(key.public_key())
    return key


def load_public_key(path: Path) -> ec.EllipticCurvePublicKey:
    """A PEM EC public key.

    Raises:
        KeyFileError: unreadable, malformed or not EC.
    """
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_KEY_SIZE + 1)
    except OSError as exc:
        raise KeyFileError(f"cannot read public key {path}: {exc.strerror}") from None
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise KeyFileError(f"public key {path} is not a PEM public key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise KeyFileError(f"public key {path} is not an elliptic-curve key")
    _hash_for(key)
    return key


def load_certificates(paths: Sequence[Path]) -> list[x509.Certificate]:
    """Every PEM certificate in ``paths``.

    Raises:
        KeyFileError: unreadable, or a file without a PEM certificate.
    """
    certs: list[x509.Certificate] = []
    for path in paths:
        try:
            with path.open("rb") as fh:
                data = fh.read(MAX_KEY_SIZE * 16 + 1)
        except OSError as exc:
            raise KeyFileError(f"cannot read certificates {path}: {exc.strerror}") from None
        certs += x509chain.load_certificates(data, what=str(path), error=KeyFileError, max_count=64)
    return certs


def sign_manifest(
    manifest: Manifest,
    key: ec.EllipticCurvePrivateKey,
    *,
    certificate: x509.Certificate | None = None,
    chain: Sequence[x509.Certificate] = (),
) -> bytes:
    """The signature bundle (JSON bytes) over ``manifest``'s statement: the elliptic-key
    method, or with ``certificate`` (and its ``chain`` of issuers) the certificate method.

    Raises:
        KeyFileError: ``certificate`` is not for ``key``.
    """
    payload = manifest.to_bytes()
    public = key.public_key()
    material: dict[str, Any]
    if certificate is None:
        material = {"publicKey": {"hint": key_hint(public)}, "tlogEntries": []}
    else:
        if certificate.public_key() != public:
            raise KeyFileError("the signing certificate is not for this private key")
        der = [c.public_bytes(serialization.Encoding.DER) for c in (certificate, *chain)]
        material = {
            "x509CertificateChain": {
                "certificates": [{"rawBytes": base64.b64encode(d).decode()} for d in der]
            },
            "tlogEntries": [],
        }
    sig = key.sign(pae(payload), ec.ECDSA(_hash_for(public)))
    bundle = {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": material,
        "dsseEnvelope": {
            "payload": base64.b64encode(payload).decode(),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [{"sig": base64.b64encode(sig).decode(), "keyid": ""}],
        },
    }
    return json.dumps(bundle, separators=(",", ":")).encode()


def _b64(value: object, what: str) -> bytes:
    text = _string(value, what)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedManifestError(f"{what} is not base64") from None


def _key_from_hint(material: dict[str, Any], key: ec.EllipticCurvePublicKey) -> None:
    if "publicKey" not in material:
        raise SignatureError(
            "the bundle is not signed with a bare public key (it carries certificates or is a "
            "Sigstore bundle); use --certificate-chain for certificate bundles"
        )
    hint = _object(material["publicKey"], "verificationMaterial.publicKey").get("hint")
    if hint is not None and not (
        isinstance(hint, str) and hmac.compare_digest(hint.encode(), key_hint(key).encode())
    ):
        raise SignatureError("the bundle was signed by a different key than the one given")


def _key_from_chain(
    material: dict[str, Any], anchors: Sequence[x509.Certificate]
) -> ec.EllipticCurvePublicKey:
    """The signing certificate's key, once its chain verified to one of ``anchors``.

    As model_signing does, the chain is checked as of the signing certificate's notBefore (a
    signature outlives the certificate); no revocation is checked.
    """
    if "x509CertificateChain" not in material:
        raise SignatureError(
            "the bundle carries no certificate chain (a key-signed bundle? use --public-key)"
        )
    chain = _object(material["x509CertificateChain"], "x509CertificateChain")
    entries = chain.get("certificates")
    if not isinstance(entries, list) or not entries:
        raise MalformedManifestError("the bundle's certificate chain is empty")
    certs = []
    for i, entry in enumerate(entries):
        der = _b64(_object(entry, f"certificate {i}").get("rawBytes"), f"certificate {i}")
        certs.append(
            x509chain.load_certificate(
                der, what=f"certificate {i} of the bundle", error=MalformedManifestError, pem=False
            )
        )
    leaf, intermediates = certs[0], certs[1:]
    if not anchors:
        raise SignatureError("no trust anchors given for a certificate bundle")
    try:
        verifier = (
            verification.PolicyBuilder()
            .store(verification.Store(list(anchors)))
            .time(leaf.not_valid_before_utc)
            .extension_policies(
                ca_policy=verification.ExtensionPolicy.webpki_defaults_ca(),
                ee_policy=verification.ExtensionPolicy.permit_all(),
            )
            .build_client_verifier()
        )
        verifier.verify(leaf, intermediates)
    except (verification.VerificationError, ValueError) as exc:
        raise SignatureError(
            f"the signing certificate does not chain to a trust anchor: {exc}"
        ) from None
    if not _may_sign(leaf):
        raise SignatureError("the signing certificate is not for signing (key usage)")
    key = leaf.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise SignatureError("the signing certificate's key is not an elliptic-curve key")
    return key


def _may_sign(cert: x509.Certificate) -> bool:
    try:
        if cert.extensions.get_extension_for_class(x509.KeyUsage).value.digital_signature:
            return True
    except x509.ExtensionNotFound:
        pass
    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return False
    return ExtendedKeyUsageOID.CODE_SIGNING in usage


def verify_bundle(
    data: bytes,
    key: ec.EllipticCurvePublicKey | None = None,
    *,
    anchors: Sequence[x509.Certificate] = (),
) -> Manifest:
    """Check a bundle's signature, then parse the manifest it carries.

    With ``key``, the bundle must be key-signed by it; otherwise it must carry a certificate
    chain that verifies to one of ``anchors``, and the signature is checked with the signing
    certificate's key.

    Raises:
        MalformedManifestError: the bundle (or, once its signature verified, the manifest)
            cannot be parsed.
        SignatureError: not signed by ``key`` or a certificate chained to ``anchors``, or a
            method gpucc does not verify.
    """
    if len(data) > MAX_BUNDLE_SIZE:
        raise MalformedManifestError("the signature bundle is too large")
    bundle = _object(_loads(data, "signature bundle"), "the signature bundle")
    if bundle.get("mediaType") != BUNDLE_MEDIA_TYPE:
        raise MalformedManifestError(f"the bundle's mediaType is not {BUNDLE_MEDIA_TYPE}")
    material: dict[str, Any] = _object(bundle.get("verificationMaterial"), "verificationMaterial")
    if key is not None:
        _key_from_hint(material, key)
    else:
        key = _key_from_chain(material, anchors)
        _hash_for(key)
    envelope = _object(bundle.get("dsseEnvelope"), "dsseEnvelope")
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        raise MalformedManifestError(f"the DSSE payloadType is not {PAYLOAD_TYPE}")
    payload = _b64(envelope.get("payload"), "dsseEnvelope.payload")
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or len(signatures) != 1:
        raise MalformedManifestError("the DSSE envelope must carry exactly one signature")
    sig = _b64(_object(signatures[0], "signature").get("sig"), "signature.sig")
    try:
        key.verify(sig, pae(payload), ec.ECDSA(_hash_for(key)))
    except InvalidSignature:
        raise SignatureError(
            "the model signature does not verify with this public key (wrong key, or the "
            "bundle was altered)"
        ) from None
    return Manifest.parse(payload)
