"""OCSP (RFC 6960) for NVIDIA's device and RIM chains, verified completely.

:class:`OcspClient` implements :class:`~gpuattest.collateral.OcspChecker`: it asks
an OCSP responder about one certificate and evaluates the answer with
:func:`evaluate_response`, the pure core that the cache and the offline bundle
use too (a stored response is re-verified on every use exactly like a fresh one).

Request
    One unsigned ``OCSPRequest`` per certificate, POSTed as DER with
    ``Content-Type: application/ocsp-request``. The ``CertID`` uses **SHA-1**
    (as NVAT does; NVIDIA's Python verifier uses SHA-384 and the responder is
    believed to accept both). SHA-1 here is an identifier
    hash, not a signature: it is the form every OCSP responder supports. A
    32-byte random nonce goes in a **non-critical** ``id-pkix-ocsp-nonce``
    extension (RFC 8954's recommendation) unless ``use_nonce=False``.

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
       validates to ``anchor`` at ``now`` with :func:`gpuattest.chain.validate_chain`.
       When the issuer is not the anchor, the certificates above it come from the
       ``issuer_chain`` argument or, failing that, from the response's certificates.
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
    * certificateHold → revoked / True / False with reason ``certificate_hold``; the
      reason text says whether ``kind`` is in ``allow_hold_for`` (the policy decides).
    * unknown → unknown / True / False.
    * nonce missing or different → the answered status, ``nonce_match=False``.
    * stale (past nextUpdate + skew, or past the maximum age without nextUpdate)
      or not yet valid (thisUpdate beyond the skew) → not-checked / True / True,
      reason "stale: response expired 3 days ago ..." or "not yet valid: ...".
    * bad signature, unauthorised responder, invalid responder chain, no or
      ambiguous matching CertID, unsupported algorithm, malformed inner data →
      unknown / False / False, reason "invalid OCSP response: ...".
    * network failure, offline, HTTP error, a body that is not an OCSP response,
      a non-successful responseStatus, a responder chain that cannot be built →
      not-checked / None / True.

    An invalid response is reported as ``unknown`` with ``response_valid=False``:
    the certificate's status is unknown because the only answer could not be
    trusted, and every policy fails it. Anything that says nothing about the
    certificate (no usable answer at all) is "collateral missing", never a verdict.
    :meth:`OcspClient.check` never raises for network or response problems.

Cache (``cache=``)
    A response is cached only when it verified completely and its nonce did not
    mismatch (a replayed answer must not be laundered into the cache). It is
    served until ``min(nextUpdate, thisUpdate + max_age_without_next_update when
    there is no nextUpdate, now + max_cache_ttl)`` and never after, and re-verified
    on every use. A cached answer was obtained with another request's nonce, so
    it is reported with ``nonce_match=None`` ("no nonce for this use") and a reason
    that says it came from the cache: replay is then bounded by ``nextUpdate``.

Deliberate differences from NVIDIA's verifiers (docs/NETWORK.md): the hold allowance is
per chain kind (bug 1), thisUpdate/nextUpdate are enforced, the CertID is matched
and the responder's delegation is checked (bug 6), and a revoked response without
a reason is a clean ``revoked``/``unspecified`` (bug 7).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa
from cryptography.x509 import ocsp
from cryptography.x509.oid import ExtendedKeyUsageOID, SignatureAlgorithmOID

from ._internal.transport import Fetcher, HttpStatusError, plain_http_to_remote, safe_url
from ._internal.x509names import common_name
from .cache import CollateralCache
from .chain import MAX_CHAIN_CERTS, validate_chain
from .collateral import ChainKind, OcspOutcome, OcspStatus
from .errors import CollateralUnavailableError, UsageError

__all__ = [
    "DEFAULT_CLOCK_SKEW",
    "DEFAULT_MAX_AGE_WITHOUT_NEXT_UPDATE",
    "DEFAULT_MAX_CACHE_TTL",
    "DEFAULT_OCSP_URL",
    "MAX_OCSP_RESPONSE_BYTES",
    "NONCE_BYTES",
    "CertId",
    "ChainAwareOcspChecker",
    "OcspClient",
    "OcspFetch",
    "OcspRules",
    "OcspTarget",
    "build_request",
    "usable",
    "describe_age",
    "evaluate_response",
    "ocsp_targets",
]

DEFAULT_OCSP_URL = "https://ocsp.ndis.nvidia.com"
# Real responses are one or two KiB (a signature and at most a couple of certificates).
MAX_OCSP_RESPONSE_BYTES = 64 * 1024
# RFC 8954 allows 1..32 bytes and recommends 32.
NONCE_BYTES = 32
DEFAULT_CLOCK_SKEW = dt.timedelta(minutes=5)
# dstack's OCSP proxy caps freshness at 24 h without nextUpdate.
DEFAULT_MAX_AGE_WITHOUT_NEXT_UPDATE = dt.timedelta(hours=24)
DEFAULT_MAX_CACHE_TTL = dt.timedelta(hours=24)

_HASHES: dict[str, type[hashes.HashAlgorithm]] = {
    "sha1": hashes.SHA1,
    "sha256": hashes.SHA256,
    "sha384": hashes.SHA384,
    "sha512": hashes.SHA512,
}
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
        allow_hold_for: chain kinds on which ``certificateHold`` is reported as allowed.
        clock_skew: tolerance on thisUpdate/nextUpdate.
        max_age_without_next_update: the longest a response without nextUpdate is fresh.
    """

    allow_hold_for: frozenset[ChainKind] = frozenset()
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


def _missing(reason: str, *, response_valid: bool | None = None) -> OcspOutcome:
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
    result = validate_chain([*path, *above], anchor, now)
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
    *,
    cert: x509.Certificate,
    issuer: x509.Certificate,
    anchor: x509.Certificate,
    now: dt.datetime,
    kind: ChainKind,
    rules: OcspRules = OcspRules(),  # noqa: B008 - frozen, immutable default
    nonce: bytes | None = None,
    issuer_chain: Sequence[x509.Certificate] = (),
    hash_algorithm: str = "sha1",
) -> OcspOutcome:
    """Verify a DER OCSP response about ``cert`` and say what it means.

    Args:
        der: the ``OCSPResponse`` bytes as received (or as stored).
        cert: the certificate asked about.
        issuer: its issuer (the CA that must have signed, or delegated, the answer).
        anchor: the trust anchor the responder's chain must end in.
        now: the verification time (timezone-aware).
        kind: the chain ``cert`` belongs to (for the certificateHold allowance).
        rules: hold allowance, clock skew, maximum age without nextUpdate.
        nonce: the nonce sent with the request, or None when none was sent for this use.
        issuer_chain: the certificates above ``issuer`` up to the anchor (needed when
            ``issuer`` is not the anchor and the response does not carry them).
        hash_algorithm: the CertID hash algorithm the request used.

    Returns:
        The outcome; see the module docstring for the mapping. Never raises for a
        bad response.
    """
    if now.tzinfo is None:
        raise ValueError("verification time must be timezone-aware")
    try:
        resp = ocsp.load_der_ocsp_response(der)
    except ValueError:
        return _missing("the OCSP responder's answer is not an OCSP response")
    if resp.response_status is not ocsp.OCSPResponseStatus.SUCCESSFUL:
        status = resp.response_status.name.lower()
        return _missing(f"the OCSP responder answered '{status}' instead of a status")
    try:
        return _evaluate(
            resp, cert, issuer, anchor, now, kind, rules, nonce, issuer_chain, hash_algorithm
        )
    except _Unverifiable as exc:
        return _missing(str(exc))
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
    cert: x509.Certificate,
    issuer: x509.Certificate,
    anchor: x509.Certificate,
    now: dt.datetime,
    kind: ChainKind,
    rules: OcspRules,
    nonce: bytes | None,
    issuer_chain: Sequence[x509.Certificate],
    hash_algorithm: str,
) -> OcspOutcome:
    # (2) who signed it, and does the signature verify
    signer = _find_signer(resp, issuer)
    # (3, 4) is that signer allowed to speak for the issuer, with a valid chain to the anchor
    _authorise(signer, issuer, anchor, issuer_chain, resp.certificates, now)
    # (5) the answer about exactly this certificate
    single = _match_single(resp, CertId.for_certificate(cert, issuer, hash_algorithm))
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
        if flag is x509.ReasonFlags.certificate_hold:
            allowed = kind in rules.allow_hold_for
            text += (
                f"; certificate_hold is {'allowed' if allowed else 'not allowed'} "
                f"for the {kind} chain by configuration"
            )
        return result(OcspStatus.REVOKED, joined(text, nonce_note), reason_name)
    return result(
        OcspStatus.UNKNOWN, joined("the OCSP responder does not know this certificate", nonce_note)
    )


# --- the network client ------------------------------------------------------------


class ChainAwareOcspChecker(Protocol):
    """An :class:`~gpuattest.collateral.OcspChecker` that also accepts ``issuer_chain``."""

    def check(
        self,
        cert: x509.Certificate,
        issuer: x509.Certificate,
        *,
        kind: ChainKind,
        anchor: x509.Certificate,
        now: dt.datetime,
        issuer_chain: Sequence[x509.Certificate] = (),
    ) -> OcspOutcome:
        """Return the outcome; never raises for network or response problems."""
        ...


@dataclass(frozen=True)
class OcspFetch:
    """An outcome together with the response it was derived from.

    Attributes:
        outcome: what the response means.
        response: the DER response evaluated, or None when there was none.
        from_cache: the response came from the local cache.
    """

    outcome: OcspOutcome
    response: bytes | None
    from_cache: bool = False


def usable(outcome: OcspOutcome) -> bool:
    """A verified, fresh answer (good, revoked or unknown)."""
    return outcome.response_valid is True and outcome.status is not OcspStatus.NOT_CHECKED


class OcspClient:
    """Asks an OCSP responder about one certificate at a time; see the module docstring.

    Args:
        fetcher: the HTTP layer (an offline fetcher gives "not checked, offline").
        url: the responder URL (NVIDIA: ``https://ocsp.ndis.nvidia.com``).
        use_nonce: send a 32-byte nonce and report whether it is echoed.
        allow_hold_for: chain kinds on which certificateHold is reported as allowed.
        clock_skew: tolerance on thisUpdate/nextUpdate.
        max_age_without_next_update: freshness bound for responses without nextUpdate.
        service_key: optional NVIDIA service key (bearer token; https or loopback only).
        cache: where verified responses are kept and reused; None disables caching.
        max_cache_ttl: the longest a cached response is served, whatever its nextUpdate.
        hash_algorithm: the CertID hash ("sha1" by default).

    Raises:
        UsageError: a service key with a plain-http URL to a remote host.
    """

    def __init__(
        self,
        *,
        fetcher: Fetcher,
        url: str = DEFAULT_OCSP_URL,
        use_nonce: bool = True,
        allow_hold_for: frozenset[ChainKind] = frozenset(),
        clock_skew: dt.timedelta = DEFAULT_CLOCK_SKEW,
        max_age_without_next_update: dt.timedelta = DEFAULT_MAX_AGE_WITHOUT_NEXT_UPDATE,
        service_key: str | None = None,
        cache: CollateralCache | None = None,
        max_cache_ttl: dt.timedelta = DEFAULT_MAX_CACHE_TTL,
        hash_algorithm: str = "sha1",
    ) -> None:
        if hash_algorithm not in _HASHES:
            raise ValueError(f"unsupported CertID hash algorithm {hash_algorithm!r}")
        if service_key and plain_http_to_remote(url):
            raise UsageError(
                "refusing to send the service key to an OCSP responder over plain http; "
                "use an https URL"
            )
        self.fetcher = fetcher
        self.url = url
        self.use_nonce = use_nonce
        self.rules = OcspRules(frozenset(allow_hold_for), clock_skew, max_age_without_next_update)
        self._service_key = service_key or None
        self.cache = cache
        self.max_cache_ttl = max_cache_ttl
        self.hash_algorithm = hash_algorithm
        # Set after a connection-level failure: the rest of this client's checks report
        # it at once instead of paying timeouts and retries for every certificate.
        self._unreachable: str | None = None

    def __repr__(self) -> str:
        key = "set" if self._service_key else "none"
        return (
            f"OcspClient(url={safe_url(self.url)!r}, use_nonce={self.use_nonce}, "
            f"service_key={key}, cache={self.cache!r})"
        )

    def check(
        self,
        cert: x509.Certificate,
        issuer: x509.Certificate,
        *,
        kind: ChainKind,
        anchor: x509.Certificate,
        now: dt.datetime,
        issuer_chain: Sequence[x509.Certificate] = (),
    ) -> OcspOutcome:
        """The revocation status of ``cert``; never raises for network or response problems.

        Args:
            cert: the certificate to check.
            issuer: the certificate that issued it.
            kind: which chain it is in.
            anchor: the pinned root of that chain.
            now: the verification time.
            issuer_chain: the certificates above ``issuer``, up to the anchor.
        """
        return self.fetch(
            cert, issuer, kind=kind, anchor=anchor, now=now, issuer_chain=issuer_chain
        ).outcome

    def fetch(
        self,
        cert: x509.Certificate,
        issuer: x509.Certificate,
        *,
        kind: ChainKind,
        anchor: x509.Certificate,
        now: dt.datetime,
        issuer_chain: Sequence[x509.Certificate] = (),
    ) -> OcspFetch:
        """Like :meth:`check`, also returning the response bytes (for bundles)."""
        cert_id = CertId.for_certificate(cert, issuer, self.hash_algorithm)

        def evaluate(der: bytes, nonce: bytes | None) -> OcspOutcome:
            return evaluate_response(
                der,
                cert=cert,
                issuer=issuer,
                anchor=anchor,
                now=now,
                kind=kind,
                rules=self.rules,
                nonce=nonce,
                issuer_chain=issuer_chain,
                hash_algorithm=self.hash_algorithm,
            )

        if self.cache is not None:
            cached = self.cache.get_ocsp(cert_id.key, now=now)
            if cached is not None:
                outcome = evaluate(cached, None)
                if usable(outcome):
                    note = "answered from the local cache (no nonce for this use"
                    if outcome.next_update is not None:
                        note += f"; fresh until {_iso(outcome.next_update)}"
                    note += ")"
                    reason = f"{outcome.reason}; {note}" if outcome.reason else note
                    return OcspFetch(dataclasses.replace(outcome, reason=reason), cached, True)
                self.cache.discard_ocsp(cert_id.key)

        if self._unreachable is not None:
            return OcspFetch(
                _missing(f"OCSP responder unavailable (not retried this run): {self._unreachable}"),
                None,
            )
        nonce = os.urandom(NONCE_BYTES) if self.use_nonce else None
        request = build_request(cert, issuer, nonce=nonce, hash_algorithm=self.hash_algorithm)
        try:
            der = self.fetcher.post(
                self.url,
                request,
                content_type="application/ocsp-request",
                max_bytes=MAX_OCSP_RESPONSE_BYTES,
                headers={"Accept": "application/ocsp-response"},
                bearer=self._service_key,
            )
        except CollateralUnavailableError as exc:
            if not isinstance(exc, HttpStatusError):
                self._unreachable = str(exc)
            return OcspFetch(_missing(f"OCSP responder unavailable: {exc}"), None)
        outcome = evaluate(der, nonce)
        if self.cache is not None and usable(outcome) and outcome.nonce_match is not False:
            expires = self._cache_expiry(outcome, now)
            if expires is not None:
                self.cache.put_ocsp(cert_id.key, der, expires=expires)
        return OcspFetch(outcome, der)

    def _cache_expiry(self, outcome: OcspOutcome, now: dt.datetime) -> dt.datetime | None:
        if outcome.next_update is not None:
            limit = outcome.next_update
        elif outcome.this_update is not None:
            limit = outcome.this_update + self.rules.max_age_without_next_update
        else:
            return None
        expires = min(limit, now + self.max_cache_ttl)
        return expires if expires > now else None


# --- which certificates of a chain are checked --------------------------------------------


@dataclass(frozen=True)
class OcspTarget:
    """One OCSP question: ``cert`` issued by ``issuer``, with the rest of the chain above it.

    Attributes:
        cert: the certificate asked about.
        issuer: the next certificate in the chain.
        issuer_chain: the certificates above ``issuer``, ending in ``anchor``.
        kind: the chain it belongs to.
        anchor: the pinned root of that chain.
    """

    cert: x509.Certificate
    issuer: x509.Certificate
    issuer_chain: tuple[x509.Certificate, ...]
    kind: ChainKind
    anchor: x509.Certificate


def ocsp_targets(
    chain: Sequence[x509.Certificate], *, kind: ChainKind, anchor: x509.Certificate
) -> tuple[OcspTarget, ...]:
    """The certificates NVIDIA checks by OCSP in a leaf-first chain.

    Device chains: indices 1 .. n-2 (not the per-boot leaf, not the root). RIM
    chains: indices 0 .. n-2. The chain's own last certificate is untrusted input
    and is replaced by ``anchor``, so the issuer of certificate n-2 is the pin.
    """
    certs = list(chain)
    if len(certs) < 2:
        return ()
    path = [*certs[:-1], anchor]
    first = 1 if kind is ChainKind.DEVICE else 0
    return tuple(
        OcspTarget(path[i], path[i + 1], tuple(path[i + 2 :]), kind, anchor)
        for i in range(first, len(path) - 1)
    )
