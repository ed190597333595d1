"""Collateral bundles: everything a piece of evidence needs, for offline verification.

A bundle is one JSON document::

    {"format": "gpucc-collateral", "version": 1, "created": "2026-01-15T12:00:00+00:00",
     "rims": {"<RIM_ID>": "<base64 RIM XML>", ...},
     "ocsp": [{"cert_id": "<hex SHA-256 of the DER CertID>", "hash_algorithm": "sha1",
               "issuer_name_hash": "<hex>", "issuer_key_hash": "<hex>",
               "serial_number": "<hex>", "subject": "<RFC 4514>", "issuer": "<RFC 4514>",
               "response": "<base64 DER OCSPResponse>"}, ...]}

:func:`collect_collateral` gathers it on a connected machine;
:class:`BundleRimSource` and :class:`BundleOcspChecker` answer from it on an
air-gapped one.

Nothing in a bundle is trusted because it is in the bundle. RIMs are verified by
the caller exactly like RIM files. Stored OCSP responses go through
:func:`gpuattest.ocsp_response.evaluate_response` on every use: signature, responder
authorisation and chain to the anchor, CertID, and the validity window at the
verification time. A response outside its window gives ``not-checked`` with
``collateral_missing=True`` and a reason such as "stale: response expired 3 days
ago"; there was no nonce for this use, so ``nonce_match`` is None and freshness is
bounded by ``nextUpdate`` alone.

:func:`load_bundle` validates strictly (size cap, exact keys, types, base64, IDs,
CertIDs consistent with their fields, DER that parses) and raises
:class:`MalformedBundleError` on anything else.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from cryptography import x509
from cryptography.x509 import ocsp as x509_ocsp

from gpucc.core.errors import (
    CollateralUnavailableError,
    MalformedInputError,
    NotTrustedError,
    RimNotFoundError,
)
from gpucc.core.files import read_capped, write_atomic
from gpucc.core.jsonio import loads_untrusted

from ._internal.x509names import common_name
from .collateral import (
    MAX_RIM_BYTES,
    ChainKind,
    OcspOutcome,
    OcspStatus,
    OcspTarget,
    RimSource,
    ocsp_targets,
)
from .ocsp import MAX_OCSP_RESPONSE_BYTES, OcspClient
from .ocsp_response import (
    DEFAULT_CLOCK_SKEW,
    DEFAULT_MAX_AGE_WITHOUT_NEXT_UPDATE,
    CertId,
    OcspRules,
    evaluate_response,
    usable,
)
from .rim import ReferenceManifest
from .rim_service import valid_rim_id
from .trust import TrustRoots

if TYPE_CHECKING:
    from .evidence import GpuEvidence

__all__ = [
    "BUNDLE_FORMAT",
    "evidence_rim_ids",
    "BUNDLE_VERSION",
    "MAX_BUNDLE_BYTES",
    "Bundle",
    "BundleOcspChecker",
    "BundleOcspEntry",
    "BundleRimSource",
    "CollectionResult",
    "MalformedBundleError",
    "collect_collateral",
    "load_bundle",
    "rim_kind",
    "write_bundle",
]

BUNDLE_FORMAT = "gpucc-collateral"
BUNDLE_VERSION = 1
# Two RIMs of ~20 KiB and a dozen OCSP responses per GPU type; 32 MiB is far beyond any real need.
MAX_BUNDLE_BYTES = 32 * 1024 * 1024
_MAX_RIMS = 256
_MAX_OCSP = 1024
_MAX_TEXT = 1024
_TOP_KEYS = frozenset({"format", "version", "created", "rims", "ocsp"})
_OCSP_KEYS = frozenset(
    {
        "cert_id",
        "hash_algorithm",
        "issuer_name_hash",
        "issuer_key_hash",
        "serial_number",
        "subject",
        "issuer",
        "response",
    }
)
_DIGEST_SIZES = {"sha1": 20, "sha256": 32, "sha384": 48, "sha512": 64}
_HEX_RE = re.compile(r"^[0-9a-f]+$")


class MalformedBundleError(MalformedInputError):
    """A collateral bundle cannot be read (not a gpucc bundle, damaged, or a newer version)."""

    hint = "create it again with 'gpucc collateral fetch'"


@dataclass(frozen=True)
class BundleOcspEntry:
    """One stored OCSP response.

    Attributes:
        cert_id: the CertID it was requested for.
        response: the DER ``OCSPResponse`` as received.
        subject / issuer: the certificate's subject and issuer (informational).
    """

    cert_id: CertId
    response: bytes
    subject: str = ""
    issuer: str = ""


@dataclass(frozen=True)
class Bundle:
    """A collateral bundle in memory.

    Attributes:
        created: when it was collected.
        rims: RIM ID to raw RIM document.
        ocsp: the stored OCSP responses.
    """

    created: dt.datetime
    rims: Mapping[str, bytes] = field(default_factory=dict)
    ocsp: tuple[BundleOcspEntry, ...] = ()

    SCHEMA: ClassVar[str] = "gpucc.collateral.show/v1"

    def to_dict(self, path: str | Path) -> dict[str, Any]:
        """The ``gpucc.collateral.show/v1`` document: what the bundle at ``path`` holds, each
        OCSP response's validity window included (``None`` for an unsuccessful response)."""
        from cryptography.x509 import ocsp as x509_ocsp

        entries = []
        for entry in self.ocsp:
            resp = x509_ocsp.load_der_ocsp_response(entry.response)
            this_update = next_update = None
            if resp.response_status is x509_ocsp.OCSPResponseStatus.SUCCESSFUL:
                this_update = resp.this_update_utc.isoformat()
                nxt = resp.next_update_utc
                next_update = nxt.isoformat() if nxt else None
            entries.append(
                {"subject": entry.subject, "this_update": this_update, "next_update": next_update}
            )
        return {
            "schema": self.SCHEMA,
            "bundle": str(path),
            "created": self.created.isoformat(),
            "rims": [{"id": rim_id, "bytes": len(data)} for rim_id, data in self.rims.items()],
            "ocsp": entries,
        }

    def __post_init__(self) -> None:
        if self.created.tzinfo is None:
            raise ValueError("created must be timezone-aware")
        object.__setattr__(self, "rims", MappingProxyType(dict(self.rims)))
        object.__setattr__(self, "ocsp", tuple(self.ocsp))

    def ocsp_entry(self, cert_id: CertId) -> BundleOcspEntry | None:
        """The stored response for exactly ``cert_id``, if any."""
        return next((e for e in self.ocsp if e.cert_id == cert_id), None)

    def to_json(self) -> bytes:
        """The bundle file's bytes."""
        doc = {
            "format": BUNDLE_FORMAT,
            "version": BUNDLE_VERSION,
            "created": self.created.astimezone(dt.UTC).isoformat(),
            "rims": {k: base64.b64encode(v).decode("ascii") for k, v in sorted(self.rims.items())},
            "ocsp": [
                {
                    "cert_id": e.cert_id.key,
                    "hash_algorithm": e.cert_id.hash_algorithm,
                    "issuer_name_hash": e.cert_id.issuer_name_hash.hex(),
                    "issuer_key_hash": e.cert_id.issuer_key_hash.hex(),
                    "serial_number": format(e.cert_id.serial_number, "x"),
                    "subject": e.subject,
                    "issuer": e.issuer,
                    "response": base64.b64encode(e.response).decode("ascii"),
                }
                for e in self.ocsp
            ],
        }
        return (json.dumps(doc, indent=1, sort_keys=False) + "\n").encode("ascii")

    @classmethod
    def from_json(cls, data: bytes) -> Bundle:
        """Parse and validate a bundle document.

        Raises:
            MalformedBundleError: anything that is not a well-formed version-1 bundle.
        """
        if len(data) > MAX_BUNDLE_BYTES:
            raise MalformedBundleError(f"collateral bundle is larger than {MAX_BUNDLE_BYTES} bytes")
        doc: Any = loads_untrusted(data, what="collateral bundle", error=MalformedBundleError)
        if not isinstance(doc, dict):
            raise MalformedBundleError("collateral bundle is not a JSON object")
        if doc.get("format") != BUNDLE_FORMAT:
            raise MalformedBundleError("not a gpucc collateral bundle (format field)")
        version = doc.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise MalformedBundleError("collateral bundle has no integer version")
        if version != BUNDLE_VERSION:
            raise MalformedBundleError(
                f"collateral bundle version {version} is not supported (this gpucc reads "
                f"version {BUNDLE_VERSION})"
            )
        unknown = set(doc) - _TOP_KEYS
        missing = _TOP_KEYS - set(doc)
        if unknown or missing:
            raise MalformedBundleError(
                "collateral bundle keys are wrong: "
                + ", ".join(
                    [f"unknown {k!r}" for k in sorted(unknown)]
                    + [f"missing {k!r}" for k in sorted(missing)]
                )
            )
        created = _timestamp(doc["created"])
        rims = _rims(doc["rims"])
        entries = _ocsp_entries(doc["ocsp"])
        return cls(created=created, rims=rims, ocsp=entries)


def _bad(text: str) -> MalformedBundleError:
    return MalformedBundleError(f"collateral bundle: {text}")


def _timestamp(value: object) -> dt.datetime:
    if not isinstance(value, str) or len(value) > 64:
        raise _bad("'created' is not a timestamp")
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise _bad("'created' is not an ISO 8601 timestamp") from None
    if when.tzinfo is None:
        raise _bad("'created' has no time zone")
    return when


def _b64(value: object, what: str, cap: int) -> bytes:
    if not isinstance(value, str) or len(value) > (cap * 4) // 3 + 8:
        raise _bad(f"{what} is not base64 text of at most {cap} bytes")
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(f"{what} is not valid base64") from None
    if not raw or len(raw) > cap:
        raise _bad(f"{what} is empty or larger than {cap} bytes")
    return raw


def _rims(value: object) -> dict[str, bytes]:
    if not isinstance(value, dict):
        raise _bad("'rims' is not an object")
    if len(value) > _MAX_RIMS:
        raise _bad(f"more than {_MAX_RIMS} RIMs")
    rims: dict[str, bytes] = {}
    for rim_id, encoded in value.items():
        if not isinstance(rim_id, str) or not valid_rim_id(rim_id):
            raise _bad(f"RIM ID {str(rim_id)[:80]!r} is not valid")
        rims[rim_id] = _b64(encoded, f"RIM {rim_id}", MAX_RIM_BYTES)
    return rims


def _hex(value: object, what: str, size: int | None = None) -> bytes:
    if not isinstance(value, str) or not value or len(value) > 256 or not _HEX_RE.match(value):
        raise _bad(f"{what} is not lower-case hex")
    if size is not None and len(value) != 2 * size:
        raise _bad(f"{what} has the wrong length")
    return bytes.fromhex(value) if len(value) % 2 == 0 else bytes.fromhex("0" + value)


def _ocsp_entries(value: object) -> tuple[BundleOcspEntry, ...]:
    if not isinstance(value, list):
        raise _bad("'ocsp' is not a list")
    if len(value) > _MAX_OCSP:
        raise _bad(f"more than {_MAX_OCSP} OCSP responses")
    entries: list[BundleOcspEntry] = []
    seen: set[str] = set()
    for n, item in enumerate(value):
        what = f"OCSP entry {n}"
        if not isinstance(item, dict) or set(item) != _OCSP_KEYS:
            raise _bad(f"{what} does not have exactly the keys {sorted(_OCSP_KEYS)}")
        algorithm = item["hash_algorithm"]
        if not isinstance(algorithm, str) or algorithm not in _DIGEST_SIZES:
            raise _bad(f"{what} has an unsupported hash algorithm")
        size = _DIGEST_SIZES[algorithm]
        cert_id = CertId(
            hash_algorithm=algorithm,
            issuer_name_hash=_hex(item["issuer_name_hash"], f"{what} issuer_name_hash", size),
            issuer_key_hash=_hex(item["issuer_key_hash"], f"{what} issuer_key_hash", size),
            serial_number=int.from_bytes(_hex(item["serial_number"], f"{what} serial"), "big"),
        )
        if item["cert_id"] != cert_id.key:
            raise _bad(f"{what} cert_id does not match its fields")
        if cert_id.key in seen:
            raise _bad(f"{what} repeats a certificate")
        seen.add(cert_id.key)
        response = _b64(item["response"], f"{what} response", MAX_OCSP_RESPONSE_BYTES)
        try:
            x509_ocsp.load_der_ocsp_response(response)
        except ValueError:
            raise _bad(f"{what} response is not a DER OCSP response") from None
        subject, issuer = item["subject"], item["issuer"]
        if not isinstance(subject, str) or not isinstance(issuer, str):
            raise _bad(f"{what} subject/issuer are not text")
        entries.append(BundleOcspEntry(cert_id, response, subject[:_MAX_TEXT], issuer[:_MAX_TEXT]))
    return tuple(entries)


def write_bundle(bundle: Bundle, path: Path, *, force: bool = False) -> None:
    """Write ``bundle`` to ``path`` atomically (a reader sees the old file or the new one).

    An existing file is replaced only with ``force``.

    Raises:
        OutputExistsError: ``path`` exists and ``force`` is not set.
        FileAccessError: the file cannot be written.
    """
    write_atomic(Path(path), bundle.to_json(), mode=0o644, force=force, what="bundle")


def load_bundle(path: Path) -> Bundle:
    """Read and validate a bundle file.

    Raises:
        FileAccessError: missing, not a regular file (never blocks on a FIFO), unreadable.
        MalformedBundleError: oversized or invalid.
    """
    data = read_capped(path, MAX_BUNDLE_BYTES, what="collateral bundle")
    return Bundle.from_json(data)


# --- answering from a bundle ----------------------------------------------------------------


class BundleRimSource:
    """RIMs from a bundle; an absent ID is :class:`RimNotFoundError`."""

    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle

    def get_rim(self, rim_id: str) -> bytes:
        """The stored RIM.

        Raises:
            RimNotFoundError: the bundle does not contain it.
        """
        try:
            return self.bundle.rims[rim_id]
        except KeyError:
            raise RimNotFoundError(rim_id, "not in the collateral bundle") from None


class BundleOcspChecker:
    """Answers OCSP questions from a bundle's stored responses, re-verifying each one.

    Args:
        bundle: the loaded bundle.
        clock_skew / max_age_without_next_update: as for
            :class:`~gpuattest.ocsp.OcspClient`.
    """

    def __init__(
        self,
        bundle: Bundle,
        *,
        clock_skew: dt.timedelta = DEFAULT_CLOCK_SKEW,
        max_age_without_next_update: dt.timedelta = DEFAULT_MAX_AGE_WITHOUT_NEXT_UPDATE,
    ) -> None:
        self.bundle = bundle
        self.rules = OcspRules(clock_skew, max_age_without_next_update)

    def check(self, target: OcspTarget) -> OcspOutcome:
        """Evaluate the stored response for the target; never raises for a bad or absent one."""
        cert, issuer = target.cert, target.issuer
        algorithms = dict.fromkeys(e.cert_id.hash_algorithm for e in self.bundle.ocsp)
        for algorithm in algorithms:
            entry = self.bundle.ocsp_entry(CertId.for_certificate(cert, issuer, algorithm))
            if entry is None:
                continue
            outcome = evaluate_response(
                entry.response, target, rules=self.rules, nonce=None, hash_algorithm=algorithm
            )
            if usable(outcome):
                created = self.bundle.created.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                note = f"from the collateral bundle created {created} (no nonce for this use)"
                reason = f"{outcome.reason}; {note}" if outcome.reason else note
                outcome = dataclasses.replace(outcome, reason=reason)
            return outcome
        return OcspOutcome(
            OcspStatus.NOT_CHECKED,
            reason=f"the collateral bundle has no OCSP response for '{common_name(cert)}'",
            collateral_missing=True,
        )


# --- collecting a bundle --------------------------------------------------------------------


@dataclass(frozen=True)
class CollectionResult:
    """What :func:`collect_collateral` gathered, and what it could not.

    Attributes:
        bundle: everything obtained.
        problems: one line per RIM or OCSP response that could not be obtained or verified.
        outcomes: (certificate common name, chain kind, outcome) for every OCSP question asked.
    """

    bundle: Bundle
    problems: tuple[str, ...]
    outcomes: tuple[tuple[str, ChainKind, OcspOutcome], ...] = ()

    SCHEMA: ClassVar[str] = "gpucc.collateral.fetch/v1"

    @property
    def complete(self) -> bool:
        """Nothing is missing."""
        return not self.problems

    def to_dict(self, output: str | Path, *, gpus: int, switches: int) -> dict[str, Any]:
        """The ``gpucc.collateral.fetch/v1`` document: this collection, written to ``output``,
        for the evidence of ``gpus`` GPUs and ``switches`` NVSwitches."""
        ocsp = [
            {
                "subject": name,
                "chain": str(kind),
                "status": str(outcome.status),
                "revocation_reason": outcome.revocation_reason or None,
            }
            for name, kind, outcome in self.outcomes
        ]
        return {
            "schema": self.SCHEMA,
            "output": str(output),
            "gpus": gpus,
            "switches": switches,
            "complete": self.complete,
            "rims": list(self.bundle.rims),
            "ocsp": ocsp,
            "missing": list(self.problems),
        }


def evidence_rim_ids(entries: Iterable[GpuEvidence]) -> list[str]:
    """The RIM IDs the devices' reports imply, in order: a GPU's driver and VBIOS RIMs,
    an NVSwitch's (LS10) BIOS RIM ``NV_SWITCH_BIOS_5612_0002_890_<version>``, and the
    CoRIM IDs of a device whose reference values are CoRIMs (Rubin: its table of
    contents' locators; Blackwell FSP: built from its model, APSKU and firmware-version
    hint, none without the hint; see :mod:`gpuattest.device`).

    Raises:
        MalformedReportError: a report does not parse, or a GPU architecture gpucc does
            not know.
    """
    from .device import CorimInputs, leaf_common_name, profile_for
    from .report import Architecture
    from .spdm_toc import parse_toc

    ids: list[str] = []
    for entry in entries:
        profile = profile_for(entry.arch, entry.cert_chain_pem)
        report = profile.parse(entry.report)
        if profile.corim_ids is not None:
            block = report.blocks.get(profile.toc_block) if profile.toc_block else None
            toc = parse_toc(block.value, report.blocks) if block is not None else None
            inputs = CorimInputs(
                report, toc, leaf_common_name(entry.cert_chain_pem), dict(entry.hints or {})
            )
            ids += [rim_id for _, rim_id in profile.corim_ids(inputs).ids]
            continue
        arch = None if profile.device_type != "gpu" else Architecture.parse(entry.arch)
        ids += [ref.rim_id for ref in profile.rims(report, arch)]
    return ids


def _signer_chain(
    data: bytes, *, roots: TrustRoots, now: dt.datetime
) -> tuple[x509.Certificate, ...]:
    """A RIM's signing chain: an XML RIM's embedded one, or a signed CoRIM's (read and
    verified here, since only its verified envelope names a chain)."""
    from .corim_format import looks_like_corim

    if looks_like_corim(data):
        from .corim import CorimPolicy, read_corim  # the CoRIM reader only for a CoRIM

        corim = read_corim(
            data, anchor=roots.rim_root, now=now, policy=CorimPolicy(allow_unsigned=True)
        )
        return corim.chain
    return ReferenceManifest.parse(data).certificates


def rim_kind(rim_id: str) -> ChainKind:
    """The chain kind of a RIM ID (driver or VBIOS)."""
    return ChainKind.DRIVER_RIM if "DRIVER" in rim_id.upper() else ChainKind.VBIOS_RIM


def collect_collateral(
    *,
    device_chains: Sequence[Sequence[x509.Certificate]],
    rim_ids: Iterable[str],
    rim_source: RimSource,
    ocsp: OcspClient | None,
    roots: TrustRoots,
    now: dt.datetime,
) -> CollectionResult:
    """Gather every RIM and OCSP response a piece of evidence needs.

    OCSP is asked for device chain certificates 1..n-2 and, for every RIM
    obtained, its embedded chain's certificates 0..n-2, each with the next
    certificate as issuer (:func:`gpuattest.collateral.ocsp_targets`). A response is
    stored only when it verified completely at ``now`` and its nonce (if sent)
    was echoed. Certificates shared between GPUs are asked about once.

    Args:
        device_chains: the GPUs' certificate chains, leaf first.
        rim_ids: the driver and VBIOS RIM IDs the reports imply.
        rim_source: where RIMs come from (service, cache, directory).
        ocsp: the OCSP client, or None to collect RIMs only.
        roots: the pinned anchors (device chains and RIM chains).
        now: the collection time (stored as ``created`` and used for verification).

    Returns:
        The bundle and a list of problems; this function raises only for
        programming errors, never for network, service or response failures.
    """
    problems: list[str] = []
    rims: dict[str, bytes] = {}
    for rim_id in dict.fromkeys(rim_ids):
        try:
            rims[rim_id] = rim_source.get_rim(rim_id)
        except (CollateralUnavailableError, MalformedInputError) as exc:
            problems.append(exc.diagnostics())
    entries: dict[str, BundleOcspEntry] = {}
    outcomes: list[tuple[str, ChainKind, OcspOutcome]] = []
    if ocsp is not None:
        targets: list[OcspTarget] = []
        for chain in device_chains:
            targets.extend(
                ocsp_targets(chain, kind=ChainKind.DEVICE, anchor=roots.device_root, now=now)
            )
        for rim_id, xml in rims.items():
            try:
                certs = _signer_chain(xml, roots=roots, now=now)
            except (MalformedInputError, NotTrustedError) as exc:
                problems.append(f"RIM {rim_id}: {exc}")
                continue
            targets.extend(
                ocsp_targets(certs, kind=rim_kind(rim_id), anchor=roots.rim_root, now=now)
            )
        asked: set[str] = set()
        for target in targets:
            cert_id = CertId.for_certificate(target.cert, target.issuer, ocsp.hash_algorithm)
            if cert_id.key in asked:
                continue
            asked.add(cert_id.key)
            fetched = ocsp.fetch(target)
            out = fetched.outcome
            outcomes.append((common_name(target.cert), target.kind, out))
            if fetched.response is not None and usable(out) and out.nonce_match is not False:
                entries[cert_id.key] = BundleOcspEntry(
                    cert_id,
                    fetched.response,
                    target.cert.subject.rfc4514_string(),
                    target.issuer.subject.rfc4514_string(),
                )
            else:
                problem = out.reason or str(out.status)
                problems.append(f"OCSP for '{common_name(target.cert)}' ({target.kind}): {problem}")
    bundle = Bundle(created=now, rims=rims, ocsp=tuple(entries.values()))
    return CollectionResult(bundle, tuple(problems), tuple(outcomes))
