"""X.509 path validation for NVIDIA's short, fixed-shape chains.

NVIDIA's chains are leaf-first lists that end in a self-signed root. The chain
supplied with evidence (or embedded in a RIM) is untrusted input: its last
certificate must be byte-identical to the pinned anchor, and every link is
checked here against an explicit verification time.

What is checked for each link ``chain[i]`` issued by ``chain[i+1]``:
issuer name equals the issuer's subject, the signature verifies with the
issuer's key, the issuer is a CA (basicConstraints cA=TRUE, and keyCertSign
when keyUsage is present), path-length constraints hold, no unknown critical
extension is present, and ``not_before <= now <= not_after`` for every
certificate. Expiry is reported apart from other failures ("expired" versus
"invalid") because policies treat them differently.
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtensionOID

from ._internal.x509names import common_name
from .errors import MalformedCertificateError

__all__ = [
    "ChainResult",
    "ChainStatus",
    "load_pem_chain",
    "validate_chain",
]

# Extensions a validator may see marked critical and still understand.
_KNOWN_CRITICAL = {
    ExtensionOID.BASIC_CONSTRAINTS,
    ExtensionOID.KEY_USAGE,
    ExtensionOID.EXTENDED_KEY_USAGE,
    ExtensionOID.SUBJECT_ALTERNATIVE_NAME,
    ExtensionOID.NAME_CONSTRAINTS,
    ExtensionOID.CERTIFICATE_POLICIES,
    ExtensionOID.POLICY_CONSTRAINTS,
    ExtensionOID.INHIBIT_ANY_POLICY,
}

# A PEM bundle larger than this is not a certificate chain (NVML's buffer is 0x1400 bytes).
MAX_PEM_CHAIN_BYTES = 64 * 1024
MAX_CHAIN_CERTS = 10


class ChainStatus(enum.StrEnum):
    """Outcome of a chain validation, with NVIDIA's claim vocabulary."""

    VALID = "valid"
    EXPIRED = "expired"
    INVALID = "invalid"


@dataclass(frozen=True)
class ChainResult:
    """Result of validating one chain.

    Attributes:
        status: valid, expired (some certificate outside its validity at ``now``), or invalid.
        reason: why it is not valid; empty when valid.
        earliest_expiry: the smallest notAfter in the chain.
        certificates: the chain as given, leaf first.
    """

    status: ChainStatus
    reason: str
    earliest_expiry: dt.datetime | None
    certificates: tuple[x509.Certificate, ...]

    @property
    def ok(self) -> bool:
        """True only for a valid chain."""
        return self.status is ChainStatus.VALID


def load_pem_chain(data: bytes) -> tuple[x509.Certificate, ...]:
    """Parse a concatenated PEM bundle, leaf first.

    The certificates of the same bytes are parsed once for the process (a GPU sends the
    same chain with every piece of evidence); what is kept is the parse alone, never a
    check of trust (the chain is validated, at its time, by :func:`validate_chain`).

    Raises:
        MalformedCertificateError: empty, oversized or unparseable input (never kept).
    """
    if len(data) > MAX_PEM_CHAIN_BYTES:
        raise MalformedCertificateError(
            f"certificate bundle is {len(data)} bytes, more than {MAX_PEM_CHAIN_BYTES}"
        )
    return _parse_pem_chain(bytes(data))


@functools.lru_cache(maxsize=64)
def _parse_pem_chain(data: bytes) -> tuple[x509.Certificate, ...]:
    try:
        certs = x509.load_pem_x509_certificates(data)
    except (ValueError, x509.InvalidVersion) as exc:
        raise MalformedCertificateError(f"certificate chain cannot be parsed: {exc}") from None
    if len(certs) > MAX_CHAIN_CERTS:
        raise MalformedCertificateError(f"certificate chain has {len(certs)} certificates")
    for i, cert in enumerate(certs):
        # cryptography parses these fields lazily; force them now so a corrupt
        # certificate is malformed input here rather than an error mid-validation.
        try:
            _ = (cert.subject, cert.issuer, cert.not_valid_before_utc, cert.not_valid_after_utc)
            _ = (cert.extensions, cert.public_key(), cert.signature_hash_algorithm)
        except (
            ValueError,
            TypeError,
            UnsupportedAlgorithm,
            x509.InvalidVersion,
            x509.DuplicateExtension,
        ) as exc:
            raise MalformedCertificateError(
                f"certificate {i} in the chain is malformed: {exc}"
            ) from None
    return tuple(certs)


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def _unknown_critical(cert: x509.Certificate) -> list[str]:
    return [
        ext.oid.dotted_string
        for ext in cert.extensions
        if ext.critical and ext.oid not in _KNOWN_CRITICAL
    ]


def _ca_problem(issuer: x509.Certificate, below: int) -> str | None:
    """Why ``issuer`` may not issue a chain with ``below`` CA certificates under it."""
    try:
        bc = issuer.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return f"'{common_name(issuer)}' has no basicConstraints and cannot act as a CA"
    if not bc.ca:
        return f"'{common_name(issuer)}' is not a CA certificate"
    if bc.path_length is not None and below > bc.path_length:
        return f"'{common_name(issuer)}' path length constraint {bc.path_length} exceeded"
    try:
        ku = issuer.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return None
    if not ku.key_cert_sign:
        return f"'{common_name(issuer)}' key usage does not allow certificate signing"
    return None


def validate_chain(
    chain: Sequence[x509.Certificate],
    anchor: x509.Certificate,
    now: dt.datetime,
    *,
    expected_length: int | None = None,
) -> ChainResult:
    """Validate a leaf-first chain that must end in ``anchor``.

    The chain's last certificate must equal ``anchor`` byte for byte: a chain
    that brings its own, different root is invalid. Expiry of any certificate
    gives ``EXPIRED`` only when every other check passes.

    Args:
        chain: leaf first, root last.
        anchor: the pinned root.
        now: the verification time (timezone-aware).
        expected_length: the exact number of certificates required, if any.

    Returns:
        A :class:`ChainResult`; this function does not raise for bad chains.
    """
    if now.tzinfo is None:
        raise ValueError("verification time must be timezone-aware")
    try:
        return _validate(tuple(chain), anchor, now, expected_length)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:  # an unparseable field
        certs = tuple(chain)
        return ChainResult(
            ChainStatus.INVALID, f"a certificate cannot be parsed: {exc}", None, certs
        )


@functools.lru_cache(maxsize=256)
def _structure_problem(
    certs: tuple[x509.Certificate, ...],
    anchor: x509.Certificate,
    expected_length: int | None,
) -> str | None:
    """Why the chain's shape, names, signatures or CA constraints are invalid; None if not.

    Nothing here depends on the time, so the answer for the same certificates (equal
    and hashed by their DER bytes), the same anchor and the same length is the same
    every time: it is kept for the process (a holder sees the same RIM and device chains
    in every offer). A ``ValueError`` or ``TypeError`` is raised, never kept.
    """
    if not certs:
        return "the chain is empty"
    if expected_length is not None and len(certs) != expected_length:
        return f"expected {expected_length} certificates, found {len(certs)}"
    if _der(certs[-1]) != _der(anchor):
        return f"the chain ends in '{common_name(certs[-1])}', which is not the pinned root"
    for i, cert in enumerate(certs):
        name = common_name(cert)
        unknown = _unknown_critical(cert)
        if unknown:
            return f"'{name}' has unknown critical extensions {', '.join(unknown)}"
        issuer = certs[i + 1] if i + 1 < len(certs) else cert
        if cert.issuer != issuer.subject:
            return f"'{name}' is not issued by '{common_name(issuer)}' (wrong order or gap)"
        try:
            cert.verify_directly_issued_by(issuer)
        except InvalidSignature:
            return f"the signature on '{name}' does not verify"
        except (ValueError, TypeError) as exc:
            return f"'{name}' cannot be checked against its issuer: {exc}"
        if i + 1 < len(certs):
            # The issuer must be a CA; the CA certificates between it and the leaf
            # (indices 1..i) count against its path-length constraint.
            problem = _ca_problem(issuer, below=i)
            if problem:
                return problem
    return None


def _validate(
    certs: tuple[x509.Certificate, ...],
    anchor: x509.Certificate,
    now: dt.datetime,
    expected_length: int | None,
) -> ChainResult:
    earliest = min((c.not_valid_after_utc for c in certs), default=None)
    problem = _structure_problem(certs, anchor, expected_length)
    if problem is not None:
        return ChainResult(ChainStatus.INVALID, problem, earliest, certs)
    # the time is checked on every call: it is never part of what is kept
    for cert in certs:
        if now < cert.not_valid_before_utc:
            start = cert.not_valid_before_utc.isoformat()
            return ChainResult(
                ChainStatus.EXPIRED,
                f"'{common_name(cert)}' is not valid before {start}",
                earliest,
                certs,
            )
        if now > cert.not_valid_after_utc:
            return ChainResult(
                ChainStatus.EXPIRED,
                f"'{common_name(cert)}' expired on {cert.not_valid_after_utc.isoformat()}",
                earliest,
                certs,
            )
    return ChainResult(ChainStatus.VALID, "", earliest, certs)
