"""OCSP (RFC 6960) responses about NVIDIA's device and RIM chains, judged without I/O.

:func:`evaluate_response` is the pure core: the network client
(:mod:`gpuattest.ocsp`), the cache and the offline bundle all hand it the DER they
hold, so a stored response is re-verified on every use exactly like a fresh one.
:class:`CertId` and :func:`build_request` are the request side.

The CertID uses **SHA-1** by default (as NVAT does; NVIDIA's Python verifier uses
SHA-384 and the responder is believed to accept both). SHA-1 here is an
identifier hash, not a signature: it is the form every OCSP responder supports.

Checks on the response, in order
    1. ``responseStatus`` is ``successful``.
    2. The signer is identified by the ResponderID among the issuer and the
       certificates in the response, and the signature over ``tbsResponseData``
       verifies with its key and the declared algorithm (ECDSA or RSA PKCS#1 v1.5
       with SHA-256/384/512, Ed25519, Ed448; SHA-1 and RSA-PSS signatures are refused).
    3. The signer is authorised (RFC 6960 §4.2.2.2): it is the issuing CA itself
       (same subject and key), or a delegated responder issued *directly* by the
       issuer with the ``id-kp-OCSPSigning`` EKU (and ``digitalSignature`` when it
       has keyUsage).
    4. The responder's chain, ``[delegated responder] + issuer + issuer_chain``,
       validates to ``anchor`` at ``now`` with :func:`gpuattest.x509chain.validate_chain`.
       When the issuer is not the anchor, the certificates above it come from the
       target's ``issuer_chain`` or, failing that, from the response's certificates.
    5. Exactly one ``SingleResponse`` matches the requested ``CertID`` (hash
       algorithm, issuer name hash, issuer key hash, serial): never "the first".
    6. The nonce, when one was sent, is echoed (``nonce_match``; the policy decides).
    7. ``thisUpdate <= now + clock_skew`` and ``now <= nextUpdate + clock_skew``;
       without ``nextUpdate``, ``now <= thisUpdate + max_age_without_next_update``.

How results map onto :class:`~gpuattest.collateral.OcspOutcome`
    (status / response_valid / collateral_missing):

    * good → good / True / False.
    * revoked → revoked / True / False; ``revocation_reason`` is the ReasonFlags
      name, ``unspecified`` when the response carries none.
    * certificateHold → revoked / True / False with reason ``certificate_hold``.
      Whether a hold is acceptable is the policy's decision alone
      (``Policy.allow_hold``, applied by :mod:`gpuattest.revocation`).
    * unknown → unknown / True / False.
    * nonce missing or different → the answered status, ``nonce_match=False``.
    * stale (past nextUpdate + skew, or past the maximum age without nextUpdate)
      or not yet valid (thisUpdate beyond the skew) → not-checked / True / True,
      reason "stale: response expired 3 days ago ..." or "not yet valid: ...".
    * bad signature, unauthorised responder, invalid responder chain, no or
      ambiguous matching CertID, unsupported algorithm, malformed inner data →
      unknown / False / False, reason "invalid OCSP response: ...".
    * a body that is not an OCSP response, a non-successful responseStatus, a
      responder chain that cannot be built → not-checked / None / True.

    An invalid response is reported as ``unknown`` with ``response_valid=False``:
    the certificate's status is unknown because the only answer could not be
    trusted, and every policy fails it. Anything that says nothing about the
    certificate (no usable answer at all) is "collateral missing", never a verdict.

Deliberate differences from NVIDIA's verifiers (docs/NETWORK.md): thisUpdate and
nextUpdate are enforced, the CertID is matched and the responder's delegation is
checked, and a revoked response without a reason is a clean
``revoked``/``unspecified``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa
from cryptography.x509 import ocsp
from cryptography.x509.oid import ExtendedKeyUsageOID, SignatureAlgorithmOID

from ._internal.x509names import common_name
from .collateral import OcspOutcome, OcspStatus, OcspTarget
from .x509chain import MAX_CHAIN_CERTS, ChainProfile, validate_chain

__all__ = [
    "DEFAULT_CLOCK_SKEW",
    "DEFAULT_MAX_AGE_WITHOUT_NEXT_UPDATE",
    "HASH_ALGORITHMS",
    "NONCE_BYTES",
    "CertId",
    "OcspRules",
    "RESPONDER_CHAIN",
    "build_request",
    "describe_age",
    "evaluate_response",
    "unavailable",
    "usable",
]

# RFC 8954 allows 1..32 bytes and recommends 32.
NONCE_BYTES = 32
#: The responder's chain ([delegated responder,] issuer, ..., anchor): any length up to the cap.
RESPONDER_CHAIN = ChainProfile("OCSP responder")
DEFAULT_CLOCK_SKEW = dt.timedelta(minutes=5)
# dstack's OCSP proxy caps freshness at 24 h without nextUpdate.
DEFAULT_MAX_AGE_WITHOUT_NEXT_UPDATE = dt.timedelta(hours=24)
_HASHES: dict[str, type[hashes.HashAlgorithm]] = {
    "sha1": hashes.SHA1,
    "sha256": hashes.SHA256,
    "sha384": hashes.SHA384,
    "sha512": hashes.SHA512,
}
# The CertID hash algorithms a request may use.
HASH_ALGORITHMS = frozenset(_HASHES)
# DER of the AlgorithmIdentifier OIDs (RFC 3279 / RFC 5758), for the CertID encoding.
_HASH_OID_DER = {
    "sha1": bytes.fromhex("06052b0e03021a"),
    "sha256": bytes.fromhex("0609608648016503040201"),
    "sha384": bytes.fromhex("0609608648016503040202"),
    "sha512": bytes.fromhex("0609608648016503040203"),
}
_SIGNATURE_ALGORITHMS: dict[
    x509.ObjectIdentifier, tuple[str, type[hashes.HashAlgorithm] | None]
] = {
    SignatureAlgorithmOID.ECDSA_WITH_SHA256: ("ec", hashes.SHA256),
    SignatureAlgorithmOID.ECDSA_WITH_SHA384: ("ec", hashes.SHA384),
    SignatureAlgorithmOID.ECDSA_WITH_SHA512: ("ec", hashes.SHA512),
    SignatureAlgorithmOID.RSA_WITH_SHA256: ("rsa", hashes.SHA256),
    SignatureAlgorithmOID.RSA_WITH_SHA384: ("rsa", hashes.SHA384),
    SignatureAlgorithmOID.RSA_WITH_SHA512: ("rsa", hashes.SHA512),
    SignatureAlgorithmOID.ED25519: ("ed25519", None),
    SignatureAlgorithmOID.ED448: ("ed448", None),
}


# --- small helpers ------------------------------------------------------------


def describe_age(delta: dt.timedelta) -> str:
    """A rough, human duration: "40 seconds", "12 minutes", "5 hours", "3 days"."""
    seconds = int(abs(delta.total_seconds()))
    if seconds < 120:
        return f"{seconds} seconds"
    if seconds < 2 * 3600:
        return f"{seconds // 60} minutes"
    if seconds < 2 * 86400:
        return f"{seconds // 3600} hours"
    return f"{seconds // 86400} days"


def _iso(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def _spki(cert: x509.Certificate) -> bytes:
    return cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _tlv(tag: int, content: bytes) -> bytes:
    n = len(content)
    if n < 0x80:
        return bytes([tag, n]) + content
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + content


# --- CertID ---------------------------------------------------------------------


@dataclass(frozen=True)
class CertId:
    """An OCSP ``CertID``: which certificate a request or answer is about.

    Attributes:
        hash_algorithm: "sha1", "sha256", "sha384" or "sha512".
        issuer_name_hash: hash of the issuer's DER subject name.
        issuer_key_hash: hash of the issuer's subjectPublicKey BIT STRING contents.
        serial_number: the certificate's serial number.
    """

    hash_algorithm: str
    issuer_name_hash: bytes
    issuer_key_hash: bytes
    serial_number: int

    @classmethod
    def for_certificate(
        cls, cert: x509.Certificate, issuer: x509.Certificate, hash_algorithm: str = "sha1"
    ) -> CertId:
        """The CertID of ``cert`` issued by ``issuer``.

        Raises:
            ValueError: unsupported hash algorithm.
        """
        algorithm = _HASHES.get(hash_algorithm)
        if algorithm is None:
            raise ValueError(f"unsupported CertID hash algorithm {hash_algorithm!r}")
        req = ocsp.OCSPRequestBuilder().add_certificate(cert, issuer, algorithm()).build()
        return cls(hash_algorithm, req.issuer_name_hash, req.issuer_key_hash, req.serial_number)

    def der(self) -> bytes:
        """The DER encoding of the CertID (RFC 6960 §4.1.1)."""
        alg = _tlv(0x30, _HASH_OID_DER[self.hash_algorithm] + b"\x05\x00")
        n = self.serial_number
        serial = n.to_bytes(max(1, (n.bit_length() + 8) // 8), "big", signed=True)
        return _tlv(
            0x30,
            alg
            + _tlv(0x04, self.issuer_name_hash)
            + _tlv(0x04, self.issuer_key_hash)
            + _tlv(0x02, serial),
        )

    @property
    def key(self) -> str:
        """SHA-256 of :meth:`der`, hex: the cache and bundle key."""
        return hashlib.sha256(self.der()).hexdigest()

    def matches(self, single: ocsp.OCSPSingleResponse) -> bool:
        """Whether a SingleResponse is about exactly this CertID."""
        try:
            algorithm = single.hash_algorithm.name
        except UnsupportedAlgorithm:
            return False
        return (
            algorithm == self.hash_algorithm
            and single.issuer_name_hash == self.issuer_name_hash
            and single.issuer_key_hash == self.issuer_key_hash
            and single.serial_number == self.serial_number
        )


def build_request(
    cert: x509.Certificate,
    issuer: x509.Certificate,
    *,
    nonce: bytes | None,
    hash_algorithm: str = "sha1",
) -> bytes:
    """The DER ``OCSPRequest`` for one certificate, with a non-critical nonce when given."""
    builder = ocsp.OCSPRequestBuilder().add_certificate(cert, issuer, _HASHES[hash_algorithm]())
    if nonce is not None:
        builder = builder.add_extension(x509.OCSPNonce(nonce), critical=False)
    return builder.build().public_bytes(serialization.Encoding.DER)


# --- evaluation (pure) ------------------------------------------------------------


@dataclass(frozen=True)
class OcspRules:
    """The judgement knobs of response evaluation.

    Attributes:
        clock_skew: tolerance on thisUpdate/nextUpdate.
        max_age_without_next_update: the longest a response without nextUpdate is fresh.
    """

    clock_skew: dt.timedelta = DEFAULT_CLOCK_SKEW
    max_age_without_next_update: dt.timedelta = DEFAULT_MAX_AGE_WITHOUT_NEXT_UPDATE


# What cryptography raises when a response's inner parts do not decode (lazily parsed).
_MALFORMED = (
    ValueError,
    TypeError,
    UnsupportedAlgorithm,
    x509.DuplicateExtension,
    x509.InvalidVersion,
    x509.UnsupportedGeneralNameType,
)


class _Invalid(Exception):
    """The response is a signed OCSP answer that fails verification."""


class _Unverifiable(Exception):
    """The response cannot be evaluated for lack of something (not its fault)."""


def unavailable(reason: str, *, response_valid: bool | None = None) -> OcspOutcome:
    """Not checked for lack of a usable answer: collateral missing, not a verdict."""
    return OcspOutcome(
        OcspStatus.NOT_CHECKED,
        response_valid=response_valid,
        reason=reason,
        collateral_missing=True,
    )


def _verify_signature(signer: x509.Certificate, resp: ocsp.OCSPResponse) -> bool:
    oid = resp.signature_algorithm_oid
    expected = _SIGNATURE_ALGORITHMS.get(oid)
    if expected is None:
        raise _Invalid(f"unsupported signature algorithm {oid.dotted_string}")
    key_kind, hash_cls = expected
    key = signer.public_key()
    data, sig = resp.tbs_response_bytes, resp.signature
    try:
        if key_kind == "ec" and isinstance(key, ec.EllipticCurvePublicKey) and hash_cls:
            key.verify(sig, data, ec.ECDSA(hash_cls()))
        elif key_kind == "rsa" and isinstance(key, rsa.RSAPublicKey) and hash_cls:
            key.verify(sig, data, padding.PKCS1v15(), hash_cls())
        elif key_kind == "ed25519" and isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(sig, data)
        elif key_kind == "ed448" and isinstance(key, ed448.Ed448PublicKey):
            key.verify(sig, data)
        else:
            return False
    except (InvalidSignature, ValueError, TypeError, UnsupportedAlgorithm):
        return False
    return True


def _is_named_responder(resp: ocsp.OCSPResponse, cert: x509.Certificate) -> bool:
    if resp.responder_name is not None:
        return cert.subject == resp.responder_name
    if resp.responder_key_hash is not None:
        key_id = x509.SubjectKeyIdentifier.from_public_key(cert.public_key()).digest
        return key_id == resp.responder_key_hash
    return False


def _find_signer(resp: ocsp.OCSPResponse, issuer: x509.Certificate) -> x509.Certificate:
    candidates: list[x509.Certificate] = []
    for cert in (issuer, *resp.certificates):
        if all(_der(cert) != _der(c) for c in candidates):
            candidates.append(cert)
    named = [c for c in candidates if _is_named_responder(resp, c)]
    if not named:
        raise _Invalid(
            "it is signed by a responder that is neither the issuer nor a certificate "
            "included in the response"
        )
    for cert in named:
        if _verify_signature(cert, resp):
            return cert
    raise _Invalid("its signature does not verify")


def _path_above(
    issuer: x509.Certificate,
    anchor: x509.Certificate,
    issuer_chain: Sequence[x509.Certificate],
    extra: Sequence[x509.Certificate],
) -> tuple[x509.Certificate, ...]:
    """The certificates from just above ``issuer`` to ``anchor`` (inclusive)."""
    if _der(issuer) == _der(anchor):
        return ()
    if issuer_chain:
        above = list(issuer_chain)
        if _der(above[-1]) != _der(anchor):
            above.append(anchor)
        return tuple(above)
    path: list[x509.Certificate] = []
    current = issuer
    for _ in range(MAX_CHAIN_CERTS):
        if current.issuer == anchor.subject:
            path.append(anchor)
            return tuple(path)
        used = {_der(c) for c in (issuer, *path)}
        nxt = next((c for c in extra if c.subject == current.issuer and _der(c) not in used), None)
        if nxt is None:
            break
        path.append(nxt)
        current = nxt
    raise _Unverifiable(
        f"cannot validate the OCSP responder for '{common_name(issuer)}': the certificates between "
        "it and the trust anchor were not supplied (issuer_chain)"
    )


def _authorise(
    signer: x509.Certificate,
    issuer: x509.Certificate,
    anchor: x509.Certificate,
    issuer_chain: Sequence[x509.Certificate],
    extra: Sequence[x509.Certificate],
    now: dt.datetime,
) -> None:
    if signer.subject == issuer.subject and _spki(signer) == _spki(issuer):
        path: list[x509.Certificate] = [issuer]
    else:
        name = common_name(signer)
        if signer.issuer != issuer.subject:
            raise _Invalid(
                f"responder '{name}' is not authorised: it is not issued by '{common_name(issuer)}'"
            )
        try:
            signer.verify_directly_issued_by(issuer)
        except (InvalidSignature, ValueError, TypeError):
            raise _Invalid(
                f"responder '{name}' is not authorised: it is not issued by '{common_name(issuer)}'"
            ) from None
        try:
            eku = signer.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        except x509.ExtensionNotFound:
            eku = x509.ExtendedKeyUsage([])
        if ExtendedKeyUsageOID.OCSP_SIGNING not in eku:
            raise _Invalid(
                f"responder '{name}' is not authorised: it lacks the OCSP-signing "
                "extended key usage"
            )
        try:
            ku = signer.extensions.get_extension_for_class(x509.KeyUsage).value
        except x509.ExtensionNotFound:
            ku = None
        if ku is not None and not ku.digital_signature:
            raise _Invalid(f"responder '{name}' key usage does not allow digital signatures")
        path = [signer, issuer]
    above = _path_above(issuer, anchor, issuer_chain, extra)
    result = validate_chain([*path, *above], anchor, now, RESPONDER_CHAIN)
    if not result.ok:
        raise _Invalid(f"the responder's certificate chain is {result.status}: {result.reason}")


def _match_single(resp: ocsp.OCSPResponse, cert_id: CertId) -> ocsp.OCSPSingleResponse:
    matches = [single for single in resp.responses if cert_id.matches(single)]
    if not matches:
        raise _Invalid("it does not answer for this certificate (no SingleResponse has its CertID)")
    if len(matches) > 1:
        raise _Invalid("it has more than one answer for this certificate")
    return matches[0]


def evaluate_response(
    der: bytes,
    target: OcspTarget,
    *,
    rules: OcspRules = OcspRules(),  # noqa: B008 - frozen, immutable default
    nonce: bytes | None = None,
    hash_algorithm: str = "sha1",
) -> OcspOutcome:
    """Verify a DER OCSP response about ``target.cert`` and say what it means.

    Args:
        der: the ``OCSPResponse`` bytes as received (or as stored).
        target: the certificate asked about, its issuer (the CA that must have signed,
            or delegated, the answer), the certificates above the issuer, the anchor
            the responder's chain must end in, and the verification time.
        rules: clock skew and maximum age without nextUpdate.
        nonce: the nonce sent with the request, or None when none was sent for this use.
        hash_algorithm: the CertID hash algorithm the request used.

    Returns:
        The outcome; see the module docstring for the mapping. Never raises for a
        bad response.
    """
    if target.now.tzinfo is None:
        raise ValueError("verification time must be timezone-aware")
    try:
        resp = ocsp.load_der_ocsp_response(der)
    except ValueError:
        return unavailable("the OCSP responder's answer is not an OCSP response")
    if resp.response_status is not ocsp.OCSPResponseStatus.SUCCESSFUL:
        status = resp.response_status.name.lower()
        return unavailable(f"the OCSP responder answered '{status}' instead of a status")
    try:
        return _evaluate(resp, target, rules, nonce, hash_algorithm)
    except _Unverifiable as exc:
        return unavailable(str(exc))
    except _Invalid as exc:
        return OcspOutcome(
            OcspStatus.UNKNOWN, response_valid=False, reason=f"invalid OCSP response: {exc}"
        )
    except _MALFORMED as exc:
        return OcspOutcome(
            OcspStatus.UNKNOWN,
            response_valid=False,
            reason=f"invalid OCSP response: malformed content ({type(exc).__name__})",
        )


def _evaluate(
    resp: ocsp.OCSPResponse,
    target: OcspTarget,
    rules: OcspRules,
    nonce: bytes | None,
    hash_algorithm: str,
) -> OcspOutcome:
    issuer, now = target.issuer, target.now
    # (2) who signed it, and does the signature verify
    signer = _find_signer(resp, issuer)
    # (3, 4) is that signer allowed to speak for the issuer, with a valid chain to the anchor
    _authorise(signer, issuer, target.anchor, target.issuer_chain, resp.certificates, now)
    # (5) the answer about exactly this certificate
    single = _match_single(resp, CertId.for_certificate(target.cert, issuer, hash_algorithm))
    # (6) nonce
    nonce_match: bool | None = None
    if nonce is not None:
        try:
            echoed = resp.extensions.get_extension_for_class(x509.OCSPNonce).value.nonce
        except x509.ExtensionNotFound:
            echoed = None
        nonce_match = echoed == nonce
    # (7) freshness
    this_update, next_update = single.this_update_utc, single.next_update_utc

    def result(
        status: OcspStatus, reason: str, revocation_reason: str | None = None
    ) -> OcspOutcome:
        return OcspOutcome(
            status,
            revocation_reason=revocation_reason,
            nonce_match=nonce_match,
            response_valid=True,
            reason=reason,
            collateral_missing=status is OcspStatus.NOT_CHECKED,
            this_update=this_update,
            next_update=next_update,
        )

    if next_update is not None and next_update < this_update:
        raise _Invalid("its nextUpdate is before its thisUpdate")
    if this_update > now + rules.clock_skew:
        return result(
            OcspStatus.NOT_CHECKED,
            f"not yet valid: the response's thisUpdate ({_iso(this_update)}) is "
            f"{describe_age(this_update - now)} after the verification time",
        )
    if next_update is not None and now > next_update + rules.clock_skew:
        return result(
            OcspStatus.NOT_CHECKED,
            f"stale: response expired {describe_age(now - next_update)} ago "
            f"(nextUpdate {_iso(next_update)})",
        )
    if next_update is None and now > this_update + rules.max_age_without_next_update:
        return result(
            OcspStatus.NOT_CHECKED,
            f"stale: response is {describe_age(now - this_update)} old and has no "
            f"nextUpdate (at most {describe_age(rules.max_age_without_next_update)})",
        )
    nonce_note = "the response does not echo the request nonce" if nonce_match is False else ""

    def joined(*parts: str) -> str:
        return "; ".join(p for p in parts if p)

    # (8) the status itself
    status = single.certificate_status
    if status is ocsp.OCSPCertStatus.GOOD:
        return result(OcspStatus.GOOD, nonce_note)
    if status is ocsp.OCSPCertStatus.REVOKED:
        flag = single.revocation_reason
        reason_name = flag.name if flag is not None else x509.ReasonFlags.unspecified.name
        when = single.revocation_time_utc
        text = f"revoked ({reason_name})" + (f" on {_iso(when)}" if when else "")
        return result(OcspStatus.REVOKED, joined(text, nonce_note), reason_name)
    return result(
        OcspStatus.UNKNOWN, joined("the OCSP responder does not know this certificate", nonce_note)
    )


def usable(outcome: OcspOutcome) -> bool:
    """A verified, fresh answer (good, revoked or unknown)."""
    return outcome.response_valid is True and outcome.status is not OcspStatus.NOT_CHECKED
