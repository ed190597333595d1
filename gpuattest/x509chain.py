"""One rule set for X.509 certificate chains: the GPU, RIM, OCSP responder, JWKS and SEV-SNP chains.

Every chain gpucc checks is short, of a known shape, given leaf first, and ends in a pinned
anchor. The chain is validated in the order given (no path building from a pool of
certificates): a chain out of order, with a gap or with a repeated certificate is refused, not
repaired. The rules, in the order they are applied:

1. *Shape.* At least one and at most ``max_length`` certificates (:data:`MAX_CHAIN_CERTS`),
   exactly ``expected_length`` when one is given.
2. *Anchor.* The last certificate is byte-identical to the pinned ``anchor``: a chain that
   brings its own, different root is invalid.
3. *Each link,* ``chain[i]`` issued by ``chain[i+1]`` (the anchor by itself), leaf first:

   a. the certificate appears only once in the chain;
   b. it has no critical extension outside :data:`KNOWN_CRITICAL`;
   c. its issuer name equals the issuer's subject (wrong order or a gap fails here);
   d. its signature algorithm is one the chain's :class:`SignatureRule` allows, and the
      signature verifies with the issuer's key;
   e. the issuer is a CA (basicConstraints present with cA=TRUE, and keyCertSign when it has
      keyUsage), and the CA certificates below it (``1..i``) stay within its path length.

4. *Validity at* ``now``: ``not_before <= now <= not_after`` for every certificate.

The first rule broken decides the :class:`ChainFault`. Validity is judged last and apart
("expired" versus "invalid") because callers treat it differently: the GPU and RIM checks fail
(RIM policies may grant a grace to an expired signer), SEV-SNP reports it as missing
collateral. :func:`validity_fault` is that one rule on its own, for callers that report
validity as a separate check.

What legitimately differs between kinds of chain is a :class:`ChainProfile`, a named value
each caller defines beside its call, never a branch in here:

* ``expected_length``: NVIDIA's device chain has 5 certificates, a RIM's 4, SEV-SNP's
  VCEK/ASK/ARK 3; OCSP responder and JWKS chains have no fixed length.
* ``signature``: :attr:`SignatureRule.AS_DECLARED` (NVIDIA, OCSP and JWKS chains: any
  algorithm the certificate declares that cryptography verifies) or
  :attr:`SignatureRule.RSA_PSS_SHA384` (AMD's ARK, ASK and VCEK are signed with nothing else).
* ``max_length``: :data:`MAX_CHAIN_CERTS` for every chain today.

No chain needs an exception to the unknown-critical-extension rule: NVIDIA's FWID extension
(2.23.133.5.4.1) and AMD's VCEK extensions (1.3.6.1.4.1.3704.1) are not marked critical.

cryptography's ``x509.verification.PolicyBuilder`` is not used. It accepts NVIDIA's device
chain (with its Web PKI CA extension policy), but it builds a path from a pool of
intermediates, so a chain out of order or with a repeated certificate passes; it refuses the
RSA-PSS parameters AMD signs with ("forbidden signature algorithm"); and it tells an expired
certificate from a forged one only in its message text. Using it for some chains would make
two rule sets again.
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import ExtensionOID

from gpucc.core.errors import GpuccError, MalformedCertificateError

from ._internal.x509names import common_name

__all__ = [
    "ANY_CHAIN",
    "KNOWN_CRITICAL",
    "MAX_CHAIN_CERTS",
    "ChainFault",
    "ChainProfile",
    "ChainResult",
    "ChainStatus",
    "SignatureRule",
    "load_certificate",
    "load_certificates",
    "unparseable",
    "validate_chain",
    "validity_fault",
]

#: Extensions a chain may mark critical: the ones these rules (or the callers) understand.
KNOWN_CRITICAL = frozenset(
    {
        ExtensionOID.BASIC_CONSTRAINTS,
        ExtensionOID.KEY_USAGE,
        ExtensionOID.EXTENDED_KEY_USAGE,
        ExtensionOID.SUBJECT_ALTERNATIVE_NAME,
        ExtensionOID.NAME_CONSTRAINTS,
        ExtensionOID.CERTIFICATE_POLICIES,
        ExtensionOID.POLICY_CONSTRAINTS,
        ExtensionOID.INHIBIT_ANY_POLICY,
    }
)

#: The longest chain accepted (NVIDIA's longest has 5 certificates).
MAX_CHAIN_CERTS = 10


def unparseable(cert: x509.Certificate) -> str | None:
    """Why ``cert`` cannot be used, or None: every field gpucc reads, parsed now.

    cryptography parses a certificate's fields when they are first read (the subject, the
    extensions, the public key, the signature algorithm), and a field that does not parse
    raises then, with one of several classes (``ValueError``, ``InvalidVersion``,
    ``DuplicateExtension``, ``UnsupportedAlgorithm``, ``TypeError``). Reading them all here,
    once, turns every one of them into an answer before any rule looks at the certificate.
    """
    try:
        with warnings.catch_warnings():
            # AMD's VCEKs have serial number 0, which RFC 5280 forbids (a warning, not a fault)
            warnings.simplefilter("ignore", CryptographyDeprecationWarning)
            _ = (cert.version, cert.serial_number, cert.subject, cert.issuer)
            _ = (cert.not_valid_before_utc, cert.not_valid_after_utc)
            _ = [e.value for e in cert.extensions]
            _ = (cert.public_key(), cert.signature_algorithm_oid, cert.signature_hash_algorithm)
            _ = (cert.signature_algorithm_parameters, cert.signature, cert.tbs_certificate_bytes)
    except Exception as exc:  # whatever class the parser raises: the certificate is unusable
        return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    return None


def load_certificates(
    data: bytes,
    *,
    what: str,
    error: Callable[[str], GpuccError] = MalformedCertificateError,
    max_count: int = MAX_CHAIN_CERTS,
) -> tuple[x509.Certificate, ...]:
    """The certificates of a PEM bundle (at least one, at most ``max_count``), each
    :func:`unparseable`-checked: the one reader for certificates gpucc did not make.

    Args:
        data: concatenated PEM certificates.
        what: names the document in messages ("the TDX quote's PCK chain").
        error: the caller's malformed-input error class.

    Raises:
        ``error``: no certificate, too many, or one that cannot be parsed (its position named,
        1 for the first).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CryptographyDeprecationWarning)
            certs = x509.load_pem_x509_certificates(bytes(data))
    except Exception as exc:  # whatever class the parser raises
        raise error(f"{what} cannot be parsed: {_pem_fault(bytes(data), exc)}") from None
    if len(certs) > max_count:
        raise error(f"{what} has {len(certs)} certificates, more than {max_count}")
    for i, cert in enumerate(certs):
        why = unparseable(cert)
        if why is not None:
            raise error(f"{what}: certificate {i + 1} of {len(certs)} is malformed: {why}")
    return tuple(certs)


_PEM_BLOCK = re.compile(rb"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.DOTALL)


def _pem_fault(data: bytes, exc: Exception) -> str:
    """Which certificate of a PEM bundle the parser refused, and why (its own words when the
    blocks one by one do not tell)."""
    blocks = _PEM_BLOCK.findall(data[: 1024 * 1024])
    for i, block in enumerate(blocks):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CryptographyDeprecationWarning)
                x509.load_pem_x509_certificate(block)
        except Exception as one:  # whatever class the parser raises
            return f"certificate {i + 1} of {len(blocks)}: {_first_line(one)}"
    return _first_line(exc)


def load_certificate(
    data: bytes,
    *,
    what: str,
    error: Callable[[str], GpuccError] = MalformedCertificateError,
    pem: bool = True,
) -> x509.Certificate:
    """One certificate, DER (or PEM, exactly one, unless ``pem`` is False),
    :func:`unparseable`-checked.

    Raises:
        ``error``: not one certificate, or one that cannot be parsed.
    """
    if pem and bytes(data).lstrip().startswith(b"-----BEGIN"):
        certs = load_certificates(data, what=what, error=error)
        if len(certs) != 1:
            raise error(f"{what} must be one certificate, not {len(certs)}")
        return certs[0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CryptographyDeprecationWarning)
            cert = x509.load_der_x509_certificate(bytes(data))
    except Exception as exc:  # whatever class the parser raises
        raise error(f"{what} cannot be parsed as a certificate: {_first_line(exc)}") from None
    why = unparseable(cert)
    if why is not None:
        raise error(f"{what} is malformed: {why}")
    return cert


def _first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


class ChainStatus(enum.StrEnum):
    """Outcome of a chain validation, with NVIDIA's claim vocabulary."""

    VALID = "valid"
    EXPIRED = "expired"
    INVALID = "invalid"


class ChainFault(enum.StrEnum):
    """Which rule a chain broke (the first one, in the module docstring's order)."""

    MALFORMED = "malformed"
    EMPTY = "empty"
    TOO_LONG = "too-long"
    WRONG_LENGTH = "wrong-length"
    NOT_ANCHORED = "not-anchored"
    REPEATED = "repeated"
    UNKNOWN_CRITICAL = "unknown-critical-extension"
    WRONG_ISSUER = "wrong-issuer"
    SIGNATURE_ALGORITHM = "signature-algorithm"
    BAD_SIGNATURE = "bad-signature"
    NOT_CA = "not-ca"
    KEY_USAGE = "key-usage"
    PATH_LENGTH = "path-length"
    NOT_YET_VALID = "not-yet-valid"
    EXPIRED = "expired"


class SignatureRule(enum.Enum):
    """Which certificate signature algorithms a chain accepts."""

    AS_DECLARED = "as-declared"
    """Any algorithm the certificate declares that cryptography can verify."""
    RSA_PSS_SHA384 = "rsa-pss-sha384"
    """RSASSA-PSS with SHA-384 only (AMD's SEV-SNP certificates)."""

    def refusal(self, cert: x509.Certificate) -> str | None:
        """Why ``cert``'s signature algorithm is not allowed by this rule; None when it is."""
        if self is SignatureRule.AS_DECLARED:
            return None
        try:
            pss = isinstance(cert.signature_algorithm_parameters, padding.PSS)
            sha384 = isinstance(cert.signature_hash_algorithm, hashes.SHA384)
        except (ValueError, UnsupportedAlgorithm):
            pss = sha384 = False
        if pss and sha384:
            return None
        return f"'{common_name(cert)}' is not signed with RSA-PSS SHA-384"


@dataclass(frozen=True)
class ChainProfile:
    """What one kind of chain differs in; every other rule is shared (module docstring).

    Attributes:
        name: the kind of chain, for readers and tests ("GPU device", "SEV-SNP VCEK").
        expected_length: the exact number of certificates, or None for any up to ``max_length``.
        signature: the certificate signature algorithms accepted.
        max_length: the most certificates accepted.
    """

    name: str
    expected_length: int | None = None
    signature: SignatureRule = SignatureRule.AS_DECLARED
    max_length: int = MAX_CHAIN_CERTS


#: A chain of any length up to :data:`MAX_CHAIN_CERTS`, any signature algorithm.
ANY_CHAIN = ChainProfile("certificate")


@dataclass(frozen=True)
class ChainResult:
    """Result of validating one chain.

    Attributes:
        status: valid, expired (some certificate outside its validity at ``now``), or invalid.
        reason: why it is not valid; empty when valid.
        earliest_expiry: the smallest notAfter in the chain.
        certificates: the chain as given, leaf first.
        fault: the rule broken; None when valid.
        position: the index of the certificate the fault is about, when it is about one.
    """

    status: ChainStatus
    reason: str
    earliest_expiry: dt.datetime | None
    certificates: tuple[x509.Certificate, ...]
    fault: ChainFault | None = None
    position: int | None = None

    @property
    def ok(self) -> bool:
        """True only for a valid chain."""
        return self.status is ChainStatus.VALID


class _Broken(Exception):
    def __init__(self, fault: ChainFault, reason: str, position: int | None = None) -> None:
        super().__init__(reason)
        self.fault, self.reason, self.position = fault, reason, position


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def validity_fault(
    certs: Sequence[x509.Certificate], now: dt.datetime
) -> tuple[ChainFault, int] | None:
    """The first certificate outside its validity period at ``now`` (inclusive bounds).

    Returns:
        ``(NOT_YET_VALID or EXPIRED, index)``, or None when every certificate is valid.
    """
    for i, cert in enumerate(certs):
        if now < cert.not_valid_before_utc:
            return ChainFault.NOT_YET_VALID, i
        if now > cert.not_valid_after_utc:
            return ChainFault.EXPIRED, i
    return None


def validate_chain(
    chain: Sequence[x509.Certificate],
    anchor: x509.Certificate,
    now: dt.datetime,
    profile: ChainProfile = ANY_CHAIN,
) -> ChainResult:
    """Validate a leaf-first chain that must end in ``anchor`` (rules: the module docstring).

    Args:
        chain: leaf first, root last.
        anchor: the pinned root.
        now: the verification time (timezone-aware).
        profile: what this kind of chain differs in (length, signature algorithms).

    Returns:
        A :class:`ChainResult`; this function does not raise for bad chains.

    Raises:
        ValueError: ``now`` is naive.
    """
    if now.tzinfo is None:
        raise ValueError("verification time must be timezone-aware")
    certs = tuple(chain)
    for i, cert in enumerate(certs):
        why = unparseable(cert)
        if why is not None:
            reason = f"certificate {i} of the chain cannot be parsed: {why}"
            return ChainResult(ChainStatus.INVALID, reason, None, certs, ChainFault.MALFORMED, i)
    try:
        earliest = min((c.not_valid_after_utc for c in certs), default=None)
        broken = _links_broken(certs, anchor, profile)
        if broken is not None:
            status = ChainStatus.INVALID
            return ChainResult(
                status, broken.reason, earliest, certs, broken.fault, broken.position
            )
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:  # an unparseable field
        reason = f"a certificate cannot be parsed: {exc}"
        return ChainResult(ChainStatus.INVALID, reason, None, certs, ChainFault.MALFORMED)
    outside = validity_fault(certs, now)
    if outside is None:
        return ChainResult(ChainStatus.VALID, "", earliest, certs)
    fault, i = outside
    name, cert = common_name(certs[i]), certs[i]
    if fault is ChainFault.NOT_YET_VALID:
        reason = f"'{name}' is not valid before {cert.not_valid_before_utc.isoformat()}"
    else:
        reason = f"'{name}' expired on {cert.not_valid_after_utc.isoformat()}"
    return ChainResult(ChainStatus.EXPIRED, reason, earliest, certs, fault, i)


@functools.lru_cache(maxsize=256)
def _links_broken(
    certs: tuple[x509.Certificate, ...], anchor: x509.Certificate, profile: ChainProfile
) -> _Broken | None:
    """Rules 1 to 3 for these certificates, this anchor and profile: the first rule broken,
    or None.

    Nothing here depends on the time, so the answer for the same certificates (equal and
    hashed by their DER bytes), anchor and profile is the same every time: it is kept for
    the process (a holder sees the same RIM and device chains in every offer). Validity at
    ``now`` (rule 4) is judged at every call and never kept; a ``ValueError`` or
    ``TypeError`` from an unparseable field is raised, never kept.
    """
    try:
        _check_links(certs, anchor, profile)
    except _Broken as broken:
        return broken
    return None


def _check_links(
    certs: tuple[x509.Certificate, ...], anchor: x509.Certificate, profile: ChainProfile
) -> None:
    """Rules 1 to 3; raise :class:`_Broken` at the first one broken."""
    max_length, expected_length = profile.max_length, profile.expected_length
    if not certs:
        raise _Broken(ChainFault.EMPTY, "the chain is empty")
    if len(certs) > max_length:
        raise _Broken(
            ChainFault.TOO_LONG, f"the chain has {len(certs)} certificates, more than {max_length}"
        )
    if expected_length is not None and len(certs) != expected_length:
        raise _Broken(
            ChainFault.WRONG_LENGTH, f"expected {expected_length} certificates, found {len(certs)}"
        )
    if _der(certs[-1]) != _der(anchor):
        raise _Broken(
            ChainFault.NOT_ANCHORED,
            f"the chain ends in '{common_name(certs[-1])}', which is not the pinned root",
            len(certs) - 1,
        )
    seen: set[bytes] = set()
    for i, cert in enumerate(certs):
        name = common_name(cert)
        der = _der(cert)
        if der in seen:
            raise _Broken(ChainFault.REPEATED, f"'{name}' appears twice in the chain", i)
        seen.add(der)
        unknown = [
            e.oid.dotted_string
            for e in cert.extensions
            if e.critical and e.oid not in KNOWN_CRITICAL
        ]
        if unknown:
            raise _Broken(
                ChainFault.UNKNOWN_CRITICAL,
                f"'{name}' has unknown critical extensions {', '.join(unknown)}",
                i,
            )
        issuer = certs[i + 1] if i + 1 < len(certs) else cert
        by = common_name(issuer)
        if cert.issuer != issuer.subject:
            raise _Broken(
                ChainFault.WRONG_ISSUER,
                f"'{name}' is not issued by '{by}' (wrong order or gap)",
                i,
            )
        refusal = profile.signature.refusal(cert)
        if refusal:
            raise _Broken(ChainFault.SIGNATURE_ALGORITHM, refusal, i)
        try:
            cert.verify_directly_issued_by(issuer)
        except InvalidSignature:
            raise _Broken(
                ChainFault.BAD_SIGNATURE,
                f"the signature on '{name}' does not verify with the key of '{by}'",
                i,
            ) from None
        except Exception as exc:  # whatever class the library raises for a key it cannot use
            raise _Broken(
                ChainFault.BAD_SIGNATURE,
                f"'{name}' cannot be checked against its issuer: {_first_line(exc)}",
                i,
            ) from None
        if i + 1 < len(certs):
            # The CA certificates between the issuer and the leaf (1..i) count against its
            # path-length constraint.
            _check_issuer(issuer, below=i, position=i + 1)


def _check_issuer(issuer: x509.Certificate, *, below: int, position: int) -> None:
    """Rule 3e: ``issuer`` may issue a chain with ``below`` CA certificates under it."""
    name = common_name(issuer)
    try:
        bc = issuer.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        raise _Broken(
            ChainFault.NOT_CA, f"'{name}' has no basicConstraints and cannot act as a CA", position
        ) from None
    if not bc.ca:
        raise _Broken(ChainFault.NOT_CA, f"'{name}' is not a CA certificate", position)
    if bc.path_length is not None and below > bc.path_length:
        raise _Broken(
            ChainFault.PATH_LENGTH,
            f"'{name}' path length constraint {bc.path_length} exceeded",
            position,
        )
    try:
        ku = issuer.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return
    if not ku.key_cert_sign:
        raise _Broken(
            ChainFault.KEY_USAGE,
            f"'{name}' key usage does not allow certificate signing",
            position,
        )
