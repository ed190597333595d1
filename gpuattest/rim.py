"""Reference integrity manifests (RIMs): parsing, XSD validation and XML-DSig.

A RIM is a SWID 2015 tag (ISO/IEC 19770-2) that NVIDIA signs with an enveloped
XML signature. It carries one ``Resource`` per measurement index with the golden
SHA-384 values the GPU's SPDM measurement blocks must match.

The three steps are separate because policies treat their failures differently:

* :meth:`ReferenceManifest.parse` reads the document safely (no DTDs, no
  entities, no network, bounded size) and extracts what the verifier uses. A
  document it cannot make sense of raises :class:`~gpuattest.errors.MalformedRimError`.
* :func:`validate_schema` checks the document against the packaged SWID XSD,
  fully offline, and returns a :class:`SchemaResult`.
* :func:`verify_signature` checks the XML signature against a strict profile and
  the embedded certificate chain against an explicit anchor and time, and
  returns a :class:`RimSignatureResult`. A bad signature is a result, not an error.

The signature profile is deliberately narrow, to rule out signature wrapping:
:mod:`gpuattest.xmldsig` accepts exactly the one NVIDIA uses and refuses the
rest. The signing key comes from the leaf of the embedded chain, and that chain
is validated here against the caller's anchor; nothing in ``KeyInfo`` decides
trust by itself.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import functools
import hashlib
import hmac
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.utils import CryptographyDeprecationWarning
from lxml import etree

from gpucc.core.errors import EnvironmentProblemError, MalformedRimError, UsageError

from ._internal.xmltree import DSIG_NS, element_children, one_line, qname
from .collateral import MAX_RIM_BYTES
from .report import OPAQUE_INDEX_BASE
from .x509chain import MAX_CHAIN_CERTS, ChainProfile, ChainResult, validate_chain
from .xmldsig import (
    ALLOWED_C14N,
    ALLOWED_DIGEST,
    ALLOWED_SIGNATURE,
    ALLOWED_TRANSFORMS,
    signature_refusal,
)

__all__ = [
    "ALLOWED_C14N",
    "ALLOWED_DIGEST",
    "ALLOWED_SIGNATURE",
    "ALLOWED_TRANSFORMS",
    "RIM_CHAIN",
    "RIM_CHAIN_LENGTH",
    "MeasurementEntry",
    "ReferenceManifest",
    "RimSignatureResult",
    "SchemaResult",
    "validate_schema",
    "verify_document",
    "verify_signature",
]

SWID_NS = "http://standards.iso.org/iso/19770/-2/2015/schema.xsd"
HASH_NS = "http://www.w3.org/2001/04/xmlenc#sha384"
TCG_RIM_NS = "https://trustedcomputinggroup.org/resource/tcg-reference-integrity-manifest-rim-information-model/"

# L4 signer, L3, CA, root: every known RIM chain has exactly four certificates.
RIM_CHAIN_LENGTH = 4
#: A RIM's signing chain: L4 signer to NVIDIA's RIM root, any verifiable algorithm.
RIM_CHAIN = ChainProfile("RIM signing", expected_length=RIM_CHAIN_LENGTH)

# SPDM measurement indices run 1..254 and RIM index i is SPDM block i + 1.
_MAX_INDEX = 253
_MAX_OPAQUE_INDEX = OPAQUE_INDEX_BASE + 254
_MAX_SVN = 2**64 - 1
_MAX_ALTERNATIVES = 64
_MAX_SIZE = 512
_UINT_RE = re.compile(r"[0-9]{1,6}")
_HEX_UINT_RE = re.compile(r"0[xX][0-9A-Fa-f]{1,4}")
_SVN_RE = re.compile(r"[0-9]{1,20}")
_HEX_RE = re.compile(r"[0-9A-Fa-f]*")
_SCHEMA_FILES = ("swidSchema2015.xsd", "signSchema.xsd", "xml.xsd")
_SCHEMA_BASE = "gpuattest-schemas/"


_ROOT_TAG = qname(SWID_NS, "SoftwareIdentity")
_SIGNATURE_TAG = qname(DSIG_NS, "Signature")


def _safe_parser() -> etree.XMLParser:
    """A parser that never loads DTDs, expands entities or touches the network."""
    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        huge_tree=False,
        load_dtd=False,
        dtd_validation=False,
        remove_blank_text=False,
    )


@dataclass(frozen=True)
class MeasurementEntry:
    """One ``Resource`` of a RIM's payload: the golden values for one index.

    Attributes:
        index: the RIM index; it is compared with SPDM block ``index + 1``.
        active: whether the verifier must compare this index.
        alternatives: how many golden values the RIM lists (equals ``len(values)``).
        name: NVIDIA's label, e.g. ``HashedMeasurement_32_GSP``.
        size: the expected runtime value length in bytes.
        values: the golden values ``Hash0 .. Hash{alternatives-1}``, as bytes.
        min_svn: for an opaque-data entry (index :data:`OPAQUE_INDEX_BASE` or more), the
            lowest SVN the report's opaque entry of type ``index - 0x1000`` may hold;
            None for a measurement entry. Opaque entries are not hashed.
        include_in_result: an opaque entry's ``includeInResult`` (show the value).
    """

    index: int
    active: bool
    alternatives: int
    name: str
    size: int
    values: tuple[bytes, ...]
    min_svn: int | None = None
    include_in_result: bool = False

    @property
    def opaque_type(self) -> int | None:
        """The opaque-data type an opaque entry names (``index - 0x1000``), else None."""
        return self.index - OPAQUE_INDEX_BASE if self.index >= OPAQUE_INDEX_BASE else None

    def matches(self, runtime: bytes) -> bool:
        """True when ``runtime`` has the golden size and equals one alternative."""
        return len(runtime) == self.size and any(
            hmac.compare_digest(runtime, v) for v in self.values
        )


@dataclass(frozen=True)
class SchemaResult:
    """Outcome of XSD validation.

    Attributes:
        valid: the document conforms to the SWID 2015 schema.
        reason: the first schema error, one line; empty when valid.
    """

    valid: bool
    reason: str

    @property
    def ok(self) -> bool:
        """Same as :attr:`valid`."""
        return self.valid

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"valid": self.valid, "reason": self.reason}


@dataclass(frozen=True)
class RimSignatureResult:
    """Outcome of checking a RIM's XML signature and its signing chain.

    The two parts are independent: a signature can be mathematically valid under
    a chain that is expired or anchored elsewhere, and the caller (policy) decides
    what each combination means.

    Attributes:
        signature_valid: the signature profile is the allowed one, the digest of
            the document matches and the ECDSA signature verifies with the
            leaf certificate's key.
        signature_reason: why the signature is not valid; empty when it is.
        chain: the embedded chain validated against the anchor at ``now``.
        signer: the leaf (L4 signer) certificate, or None when there is none.
    """

    signature_valid: bool
    signature_reason: str
    chain: ChainResult
    signer: x509.Certificate | None

    @property
    def ok(self) -> bool:
        """True only when the signature verifies and the chain is valid."""
        return self.signature_valid and self.chain.ok

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (certificates reduced to subject and validity)."""
        signer: dict[str, Any] | None = None
        if self.signer is not None:
            signer = {
                "subject": self.signer.subject.rfc4514_string(),
                "serial": format(self.signer.serial_number, "X"),
                "not_before": self.signer.not_valid_before_utc.isoformat(),
                "not_after": self.signer.not_valid_after_utc.isoformat(),
            }
        expiry = self.chain.earliest_expiry
        return {
            "signature_valid": self.signature_valid,
            "signature_reason": self.signature_reason,
            "chain_status": str(self.chain.status),
            "chain_reason": self.chain.reason,
            "chain_earliest_expiry": expiry.isoformat() if expiry is not None else None,
            "signer": signer,
        }


@dataclass(frozen=True)
class ReferenceManifest:
    """A parsed RIM.

    Build it with :meth:`parse`; the constructor does no checking.

    Attributes:
        tag_id: the root ``tagId``.
        name: the root ``name`` (``GH100`` for Hopper).
        colloquial_version: ``Meta/@colloquialVersion`` (driver version, or the
            dotted VBIOS version).
        product: ``Meta/@product``, or None when absent.
        platform_manufacturer_id: the TCG ``PlatformManufacturerId`` (NVIDIA's
            ``oemid`` claim), or None when absent.
        measurements: every measurement ``Resource``, in document order.
        certificates: the certificates embedded in the signature's
            ``KeyInfo/X509Data``, in document order (leaf first). Empty when the
            document has no single ``Signature`` element.
        raw: the document bytes as given.
        tree: the parsed document; the signature is checked on this very tree.
    """

    tag_id: str
    name: str
    colloquial_version: str
    product: str | None
    platform_manufacturer_id: str | None
    measurements: tuple[MeasurementEntry, ...]
    certificates: tuple[x509.Certificate, ...]
    raw: bytes = field(repr=False)
    tree: etree._ElementTree = field(repr=False, compare=False, hash=False)

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of :attr:`raw`."""
        return hashlib.sha256(self.raw).hexdigest()

    @property
    def active(self) -> tuple[MeasurementEntry, ...]:
        """The active measurement entries, in document order."""
        return tuple(m for m in self.measurements if m.active)

    @property
    def active_indices(self) -> frozenset[int]:
        """Indices of the active entries."""
        return frozenset(m.index for m in self.measurements if m.active)

    def entry(self, index: int) -> MeasurementEntry | None:
        """The entry with this RIM index, or None."""
        for m in self.measurements:
            if m.index == index:
                return m
        return None

    @classmethod
    def parse(cls, xml: bytes) -> ReferenceManifest:
        """Parse a RIM document.

        Args:
            xml: the raw document (as read from a file or decoded from the RIM service).

        Returns:
            The manifest; its signature and schema are not yet checked.

        Raises:
            MalformedRimError: the input is too large, is not well-formed XML,
                has a DTD or entity declarations, is not a SWID 2015
                ``SoftwareIdentity``, or its metadata, measurements or embedded
                certificates are inconsistent.
        """
        root = _parse_xml(xml)
        tree = root.getroottree()
        tag_id = _required_attr(root, "tagId", "SoftwareIdentity")
        name = _required_attr(root, "name", "SoftwareIdentity")

        metas = root.findall(qname(SWID_NS, "Meta"))
        if len(metas) != 1:
            raise MalformedRimError(f"RIM must have exactly one Meta element, found {len(metas)}")
        meta = metas[0]
        colloquial = _required_attr(meta, "colloquialVersion", "Meta")

        payloads = root.findall(qname(SWID_NS, "Payload"))
        if len(payloads) != 1:
            raise MalformedRimError(
                f"RIM must have exactly one Payload element, found {len(payloads)}"
            )
        measurements = _parse_payload(payloads[0])

        return cls(
            tag_id=tag_id,
            name=name,
            colloquial_version=colloquial,
            product=meta.get("product"),
            platform_manufacturer_id=meta.get(qname(TCG_RIM_NS, "PlatformManufacturerId")),
            measurements=measurements,
            certificates=_embedded_certificates(root),
            raw=bytes(xml),
            tree=tree,
        )

    def validate_schema(self) -> SchemaResult:
        """Validate against the packaged SWID 2015 XSD; see :func:`validate_schema`.

        Raises:
            EnvironmentProblemError: the packaged schemas cannot be loaded.
        """
        return validate_schema(self)

    def verify_signature(self, *, anchor: x509.Certificate, now: dt.datetime) -> RimSignatureResult:
        """Check the XML signature and its chain; see :func:`verify_signature`.

        Raises:
            UsageError: ``now`` is not timezone-aware.
        """
        return verify_signature(self, anchor=anchor, now=now)


# --- parsing ----------------------------------------------------------------


def _parse_xml(xml: bytes) -> etree._Element:
    if len(xml) == 0:
        raise MalformedRimError("RIM is empty")
    if len(xml) > MAX_RIM_BYTES:
        raise MalformedRimError(f"RIM is {len(xml)} bytes, more than {MAX_RIM_BYTES}")
    # Refuse DTDs before libxml2 reads them at all (UTF-8 / ASCII documents);
    # the docinfo check below catches other encodings.
    if b"<!DOCTYPE" in xml or b"<!ENTITY" in xml:
        raise MalformedRimError("RIM contains a DTD or entity declaration")
    try:
        root = etree.fromstring(bytes(xml), _safe_parser())
    except etree.XMLSyntaxError as exc:
        raise MalformedRimError(f"RIM is not well-formed XML: {one_line(str(exc))}") from None
    except (etree.ParserError, ValueError, LookupError) as exc:
        raise MalformedRimError(f"RIM cannot be parsed: {one_line(str(exc))}") from None
    if root is None:
        raise MalformedRimError("RIM has no root element")
    docinfo: Any = root.getroottree().docinfo  # lxml-stubs lack DocInfo.doctype
    if docinfo.doctype or docinfo.internalDTD is not None or docinfo.externalDTD is not None:
        raise MalformedRimError("RIM contains a DTD")
    for node in root.iter():
        if isinstance(node, etree._Entity):
            raise MalformedRimError("RIM contains an entity reference")
    if root.tag != _ROOT_TAG:
        raise MalformedRimError(
            f"RIM root is {one_line(str(root.tag))}, expected SoftwareIdentity in {SWID_NS}"
        )
    return root


def _required_attr(el: etree._Element, attr: str, what: str) -> str:
    value = el.get(attr)
    if value is None or value == "":
        raise MalformedRimError(f"{what} has no {attr} attribute")
    return value


def _uint(value: str | None, what: str, lo: int, hi: int, *, hex_ok: bool = False) -> int:
    if value is None:
        raise MalformedRimError(f"{what} is missing")
    if hex_ok and _HEX_UINT_RE.fullmatch(value):
        number = int(value, 16)
    elif not _UINT_RE.fullmatch(value):
        raise MalformedRimError(f"{what} {one_line(value, 40)!r} is not a decimal integer")
    else:
        number = int(value)
    if not lo <= number <= hi:
        raise MalformedRimError(f"{what} {number} is outside {lo}..{hi}")
    return number


def _active(value: str | None, where: str) -> bool:
    if value is None:
        raise MalformedRimError(f"{where} has no active attribute")
    lowered = value.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    raise MalformedRimError(f"{where} has active={one_line(value, 40)!r}, not True or False")


def _opaque_entry(res: etree._Element, index: int, active: bool, where: str) -> MeasurementEntry:
    """An opaque-data entry: ``minSvn`` (required) and ``includeInResult``; no hashes."""
    text = res.get("minSvn")
    if text is None:
        raise MalformedRimError(
            f"{where} names opaque type {index - OPAQUE_INDEX_BASE} but has no minSvn"
        )
    if not _SVN_RE.fullmatch(text) or int(text) > _MAX_SVN:
        raise MalformedRimError(f"{where} minSvn {one_line(text, 40)!r} is not an SVN")
    include = res.get("includeInResult")
    if include is not None and include.lower() not in ("true", "false"):
        raise MalformedRimError(f"{where} includeInResult is not True or False")
    if any(etree.QName(key).namespace == HASH_NS for key in res.attrib):
        raise MalformedRimError(f"{where} is an opaque-data entry and cannot carry hashes")
    return MeasurementEntry(
        index=index,
        active=active,
        alternatives=0,
        name=res.get("name") or "",
        size=0,
        values=(),
        min_svn=int(text),
        include_in_result=include is not None and include.lower() == "true",
    )


def _parse_payload(payload: etree._Element) -> tuple[MeasurementEntry, ...]:
    entries: list[MeasurementEntry] = []
    seen: set[int] = set()
    for res in element_children(payload):
        if res.tag != qname(SWID_NS, "Resource"):
            raise MalformedRimError(f"unexpected element {one_line(str(res.tag))} in Payload")
        kind = res.get("type")
        if kind != "Measurement":
            raise MalformedRimError(f"Resource of type {kind!r} is not a measurement")
        index = _uint(res.get("index"), "Resource index", 0, _MAX_OPAQUE_INDEX, hex_ok=True)
        where = f"Resource {index}"
        if index in seen:
            raise MalformedRimError(f"duplicate measurement index {index}")
        seen.add(index)
        active = _active(res.get("active"), where)
        if index >= OPAQUE_INDEX_BASE:
            entries.append(_opaque_entry(res, index, active, where))
            continue
        if index > _MAX_INDEX:
            raise MalformedRimError(f"Resource index {index} is outside 0..{_MAX_INDEX}")
        if res.get("minSvn") is not None:
            raise MalformedRimError(f"{where} has minSvn but is not an opaque-data entry")
        count = _uint(res.get("alternatives"), f"{where} alternatives", 1, _MAX_ALTERNATIVES)
        size = _uint(res.get("size"), f"{where} size", 1, _MAX_SIZE)
        name = res.get("name") or ""
        hashes_by_name = {
            etree.QName(key).localname: str(value)
            for key, value in res.attrib.items()
            if etree.QName(key).namespace == HASH_NS
        }
        expected = [f"Hash{j}" for j in range(count)]
        if sorted(hashes_by_name) != sorted(expected):
            raise MalformedRimError(
                f"{where} declares {count} alternatives but has hash attributes "
                f"{one_line(', '.join(sorted(hashes_by_name)), 80) or 'none'}"
            )
        values: list[bytes] = []
        for j, key in enumerate(expected):
            text = hashes_by_name[key]
            if len(text) != 2 * size or not _HEX_RE.fullmatch(text):
                raise MalformedRimError(f"{where} Hash{j} is not {size} bytes of hex")
            values.append(bytes.fromhex(text))
        entries.append(
            MeasurementEntry(
                index=index,
                active=active,
                alternatives=count,
                name=name,
                size=size,
                values=tuple(values),
            )
        )
    if not entries:
        raise MalformedRimError("RIM has no measurement entries")
    return tuple(entries)


def _b64(text: str | None, what: str) -> bytes:
    compact = "".join((text or "").split())
    try:
        return base64.b64decode(compact.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise MalformedRimError(f"{what} is not valid base64") from None


def _embedded_certificates(root: etree._Element) -> tuple[x509.Certificate, ...]:
    signatures = list(root.iter(_SIGNATURE_TAG))
    if len(signatures) != 1:
        # verify_signature reports the structural problem; there is no single
        # KeyInfo to take certificates from.
        return ()
    path = f"{{{DSIG_NS}}}KeyInfo/{{{DSIG_NS}}}X509Data/{{{DSIG_NS}}}X509Certificate"
    elements = signatures[0].findall(path)
    if len(elements) > MAX_CHAIN_CERTS:
        raise MalformedRimError(f"RIM embeds {len(elements)} certificates")
    certs: list[x509.Certificate] = []
    for n, el in enumerate(elements):
        der = _b64(el.text, f"embedded certificate {n}")
        try:
            cert = x509.load_der_x509_certificate(der)
        except (ValueError, x509.InvalidVersion, CryptographyDeprecationWarning):
            # The warning is raised only where warnings are errors; it flags
            # encodings cryptography will refuse in a future release.
            raise MalformedRimError(f"embedded certificate {n} is not a DER certificate") from None
        if cert.serial_number <= 0:
            raise MalformedRimError(f"embedded certificate {n} has a non-positive serial number")
        _check_certificate(cert, n)
        certs.append(cert)
    return tuple(certs)


def _check_certificate(cert: x509.Certificate, n: int) -> None:
    """Decode the parts cryptography parses lazily, so later checks cannot trip on them.

    Chain validation reads names, extensions, the key and the signature
    algorithm; a certificate whose parts do not decode is malformed input here
    rather than an exception in the middle of validation.
    """
    from .x509chain import unparseable

    why = unparseable(cert)
    if why is not None:
        raise MalformedRimError(f"embedded certificate {n} cannot be decoded: {one_line(why, 80)}")


# --- schema -----------------------------------------------------------------


class _PackagedSchemaResolver(etree.Resolver):
    """Serves the XSD imports from package data; refuses every other URL."""

    def resolve(  # type: ignore[override]  # lxml-stubs omit the context argument
        self, system_url: str | None, public_id: str | None, context: Any
    ) -> Any:
        name = (system_url or "").removeprefix(_SCHEMA_BASE)
        if name in _SCHEMA_FILES[1:]:
            return self.resolve_string(_schema_bytes(name), context, base_url=system_url)
        # Raising makes the schema compilation fail instead of going elsewhere.
        raise LookupError(f"schema import {system_url!r} is not packaged")


def _schema_bytes(name: str) -> bytes:
    return (Path(__file__).parent / "_schemas" / name).read_bytes()  # files: see trust.py


@functools.lru_cache(maxsize=1)
def _swid_schema() -> etree.XMLSchema:
    """The compiled SWID 2015 schema, built once per process.

    Raises:
        EnvironmentProblemError: the packaged schema files are missing or broken.
    """
    # The schema files are package data, not input; the internal DTD subset of
    # signSchema.xsd declares entities it uses, so internal entities are resolved
    # here, while external DTDs and the network stay off.
    parser = etree.XMLParser(
        resolve_entities=True, no_network=True, load_dtd=False, huge_tree=False
    )
    parser.resolvers.add(_PackagedSchemaResolver())
    try:
        doc = etree.fromstring(
            _schema_bytes(_SCHEMA_FILES[0]), parser, base_url=_SCHEMA_BASE + _SCHEMA_FILES[0]
        )
        return etree.XMLSchema(doc)
    except (OSError, etree.XMLSyntaxError, etree.XMLSchemaParseError) as exc:
        raise EnvironmentProblemError(
            f"the packaged SWID schema cannot be loaded ({one_line(str(exc))}); reinstall gpucc"
        ) from None


def validate_schema(manifest: ReferenceManifest) -> SchemaResult:
    """Validate a RIM against the packaged SWID 2015 XSD (with XML-DSig and xml.xsd).

    Validation is offline: imports are served from package data and any other
    location is refused. The compiled schema is cached for the process.

    Raises:
        EnvironmentProblemError: the packaged schemas cannot be loaded.
    """
    schema = _swid_schema()
    try:
        schema.assertValid(manifest.tree)
    except etree.DocumentInvalid as exc:
        return SchemaResult(False, one_line(str(exc)) or "document does not match the schema")
    return SchemaResult(True, "")


def verify_signature(
    manifest: ReferenceManifest, *, anchor: x509.Certificate, now: dt.datetime
) -> RimSignatureResult:
    """Verify a RIM's enveloped XML signature and its embedded certificate chain.

    The signature must follow the one profile NVIDIA uses (see the module
    docstring); anything else is refused. The key is the leaf of the embedded
    chain (it must be a non-CA P-384 certificate), and the chain, leaf first,
    is validated with :func:`gpuattest.x509chain.validate_chain` against ``anchor``
    at ``now``; its last certificate must be byte-identical to ``anchor`` and it
    must have exactly :data:`RIM_CHAIN_LENGTH` certificates.

    Args:
        manifest: a parsed RIM.
        anchor: the RIM signing root (``TrustRoots.nvidia().rim_root`` in production).
        now: the verification time (timezone-aware).

    Returns:
        A :class:`RimSignatureResult`. A bad signature or chain is reported
        there, never raised.

    Raises:
        UsageError: ``now`` is not timezone-aware.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise UsageError("verification time must be timezone-aware")
    chain = validate_chain(manifest.certificates, anchor, now, RIM_CHAIN)
    signer = manifest.certificates[0] if manifest.certificates else None
    refusal = signature_refusal(manifest.tree, manifest.certificates)
    return RimSignatureResult(not refusal, refusal, chain, signer)


#: The largest RIM kept after its checks (published RIMs are about 20 KiB): at most 16 are
#: kept, so what is kept stays small whatever documents a process is given.
_KEPT_RIM_BYTES = 1024 * 1024


def _check(xml: bytes) -> tuple[ReferenceManifest, SchemaResult, str]:
    manifest = ReferenceManifest.parse(xml)
    refusal = signature_refusal(manifest.tree, manifest.certificates)
    return manifest, validate_schema(manifest), refusal


_kept_check = functools.lru_cache(maxsize=16)(_check)


def _checked(xml: bytes) -> tuple[ReferenceManifest, SchemaResult, str]:
    return _kept_check(xml) if len(xml) <= _KEPT_RIM_BYTES else _check(xml)


def verify_document(
    xml: bytes, *, anchor: x509.Certificate, now: dt.datetime
) -> tuple[ReferenceManifest, SchemaResult, RimSignatureResult]:
    """Parse a RIM, validate its schema, verify its signature and its chain at ``now``.

    The same as :meth:`ReferenceManifest.parse`, :func:`validate_schema` and
    :func:`verify_signature`, with what depends on the document's bytes alone (the parsed
    manifest, the schema result, whether the enveloped signature verifies with the
    embedded leaf) kept for the process per document (a holder reads the same RIMs for
    every offer). The chain is validated against ``anchor`` at ``now`` on every call.

    Raises:
        MalformedRimError: not a parseable RIM (never kept: raised again each time).
        UsageError: ``now`` is not timezone-aware.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise UsageError("verification time must be timezone-aware")
    manifest, schema, refusal = _checked(bytes(xml))
    chain = validate_chain(manifest.certificates, anchor, now, RIM_CHAIN)
    signer = manifest.certificates[0] if manifest.certificates else None
    return manifest, schema, RimSignatureResult(not refusal, refusal, chain, signer)
