"""Appraise a device's evidence against CoRIM reference values (docs/CORIM.md).

The evidence is a neutral value, :class:`EvidenceValues`: entries of (environment,
measurement key, values), gathered from whatever the device offers:

* :func:`toc_evidence`: the SPDM table of contents (block 0xFD, decoded once by
  :func:`gpuattest.spdm_toc.parse_toc`) with its block-index indirection resolved against
  the report's measurement blocks (Rubin);
* :func:`block_evidence`: the measurement blocks themselves under one environment, keyed by
  SPDM index (Blackwell FSP, which has no table);
* :func:`tcbinfo_evidence`: the leaf certificate's DICE TcbInfo (layer 0: SVN and FWIDs).

:func:`appraise` compares the reference triples of accepted CoRIMs with those entries:

* dependency triples form a graph; its roots each name a purpose (measurement key
  ``purpose``, a ``name`` value). Exactly one root must name the purpose the evidence
  names, and only that root's subtree is appraised; with no dependency triples every
  reference triple counts. A policy's ``required_purpose`` must equal the evidence's.
* for each (environment, key) with reference values: the evidence must hold a value that
  matches one of the alternatives (several reference measurements for the same
  environment and key). A match compares every kind the reference states: digests per
  algorithm (at least one algorithm in common, every common one equal), SVN exact or
  minimum, raw values exactly or under their mask, name, version.
* an environment of the subtree with no reference value, or a reference with no
  evidence, is a mismatch (fail closed); nothing corroborated at all is not trusted.

Every mismatch is listed (:class:`CorimMismatch`: environment, key, reference, evidence).
:func:`appraise_corim_files` is the one call a verifier makes: evidence values, CoRIM file
bytes, policy, root and time in, a :class:`CorimAppraisal` out.
"""

from __future__ import annotations

import datetime as dt
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509

from gpucc.core.errors import MalformedEvidenceError

from ._internal import der
from .corim import (
    Corim,
    CorimPolicy,
    Digest,
    Environment,
    MalformedCorimError,
    MeasurementKey,
    RawValue,
    Svn,
    Values,
    read_corim,
)
from .spdm_toc import PURPOSE_KEY, TOC_BLOCK_INDEX, SpdmBlock, SpdmToc, parse_toc

__all__ = [
    "DIGEST_SHA384",
    "PURPOSE_KEY",
    "REVOCATION_CHECK",
    "TCBINFO_OIDS",
    "CorimAppraisal",
    "CorimMismatch",
    "EvidenceEntry",
    "EvidenceValues",
    "MalformedTocError",
    "SPDM_BLOCK_LAYER",
    "TOC_BLOCK",
    "SpdmBlock",
    "appraise",
    "appraise_corim_files",
    "block_evidence",
    "device_evidence",
    "merge_evidence",
    "tcbinfo_evidence",
    "toc_evidence",
]

#: The check :func:`appraise` leaves to the verifier (reported in ``skipped``).
REVOCATION_CHECK = "corim-signer-revocation"
#: IANA named-information SHA-384.
DIGEST_SHA384 = 7
#: DICE TcbInfo extension OIDs, in the order looked for (NVIDIA's leaves use the first).
TCBINFO_OIDS = (
    x509.ObjectIdentifier("2.23.133.5.4.1.1"),
    x509.ObjectIdentifier("2.23.133.5.4.1"),
)
_HASH_OIDS = {
    bytes.fromhex("608648016503040201"): 1,
    bytes.fromhex("608648016503040202"): 7,
    bytes.fromhex("608648016503040203"): 8,
}
_RAW_BIT = 0x80
#: DICE TcbInfo's fields (TCG DICE Attestation Architecture): IMPLICIT context tags.
_TCBINFO_FIELDS = {
    0x80: "vendor",
    0x81: "model",
    0x82: "version",
    0x83: "svn",
    0x84: "layer",
    0x85: "index",
    0xA6: "fwids",
    0x87: "flags",
    0x88: "vendorInfo",
    0x89: "type",
    0x8A: "flagsMask",
    0xAB: "integrityRegisters",
}
#: The SPDM measurement block that holds the table of contents, where a device has one.
TOC_BLOCK = TOC_BLOCK_INDEX
#: The layer of NVIDIA's CoRIM environments for SPDM measurement blocks (the FSP's CoRIM).
SPDM_BLOCK_LAYER = 1
_MAX_ENTRIES = 4096


class MalformedTocError(MalformedEvidenceError):
    """The SPDM table of contents or the TcbInfo cannot be read, or names a missing block."""


@dataclass(frozen=True)
class EvidenceEntry:
    """One measured value: where (environment, key), what, and from which source."""

    environment: Environment
    key: MeasurementKey
    values: Values
    source: str


@dataclass(frozen=True)
class EvidenceValues:
    """A device's measured values, from any mix of sources (module docstring).

    Attributes:
        entries: the values.
        purpose: the purpose the evidence names (``CC MPT``...), with its environment.
        profile: the evidence profile the table of contents names, if any.
        locators: the RIM locators the table of contents names (unsigned hints).
    """

    entries: tuple[EvidenceEntry, ...]
    purpose: tuple[Environment, str] | None = None
    profile: str | None = None
    locators: tuple[str, ...] = ()

    def lookup(self) -> dict[tuple[Environment, MeasurementKey], list[Values]]:
        """The values by (environment, key)."""
        out: dict[tuple[Environment, MeasurementKey], list[Values]] = {}
        for e in self.entries:
            out.setdefault((e.environment, e.key), []).append(e.values)
        return out


def merge_evidence(*parts: EvidenceValues) -> EvidenceValues:
    """One :class:`EvidenceValues` of several; at most one part may name a purpose."""
    purposes = [p.purpose for p in parts if p.purpose is not None]
    if len(purposes) > 1:
        raise MalformedTocError("more than one evidence source names a purpose")
    entries = tuple(e for p in parts for e in p.entries)
    if len(entries) > _MAX_ENTRIES:
        raise MalformedTocError(f"more than {_MAX_ENTRIES} evidence values")
    profile = next((p.profile for p in parts if p.profile), None)
    locators = tuple(loc for p in parts for loc in p.locators)
    return EvidenceValues(entries, purposes[0] if purposes else None, profile, locators)


def _block_values(index: int, block: SpdmBlock, digest_alg: int) -> Values:
    if block.value_type & _RAW_BIT:
        return Values(raw=RawValue(bytes(block.value)))
    return Values(digests=(Digest(digest_alg, bytes(block.value)),))


def block_evidence(
    environment: Environment,
    blocks: Mapping[int, SpdmBlock],
    *,
    digest_alg: int = DIGEST_SHA384,
) -> EvidenceValues:
    """Concise evidence from SPDM measurement blocks: one entry per block, keyed by index.

    A block whose DMTF value type has bit 7 set is a raw value, any other a digest of
    ``digest_alg`` (the report's negotiated measurement hash; SHA-384 for NVIDIA's GPUs).
    """
    entries = tuple(
        EvidenceEntry(environment, index, _block_values(index, block, digest_alg), "spdm-blocks")
        for index, block in sorted(blocks.items())
    )
    return EvidenceValues(entries)


def toc_evidence(
    toc: SpdmToc, blocks: Mapping[int, SpdmBlock], *, digest_alg: int = DIGEST_SHA384
) -> EvidenceValues:
    """Evidence values from a decoded SPDM table of contents (:func:`parse_toc`): each
    evidence triple's values as given, or, for the block indirection (key 12), the named
    measurement blocks (a raw value or a digest by their DMTF value type).

    Raises:
        MalformedTocError: a block the table names is absent.
    """
    entries: list[EvidenceEntry] = []
    for env in toc.environments:
        for m in env.measurements:
            entries.extend(_resolved(env.environment, m.key, m.values, blocks, digest_alg))
    purpose = (
        (toc.purpose_environment, toc.purpose)
        if toc.purpose is not None and toc.purpose_environment is not None
        else None
    )
    return EvidenceValues(tuple(entries), purpose, toc.profile, toc.rim_locators)


def _resolved(
    env: Environment,
    key: MeasurementKey,
    values: Values,
    blocks: Mapping[int, SpdmBlock],
    digest_alg: int,
) -> Iterable[EvidenceEntry]:
    if not values.indices:
        yield EvidenceEntry(env, key, values, "spdm-toc")
        return
    for index in values.indices:
        block = blocks.get(index)
        if block is None:
            raise MalformedTocError(f"{env} names measurement block {index}, which is absent")
        yield EvidenceEntry(
            env, key, _block_values(index, block, digest_alg), f"spdm-block-{index}"
        )


def _der_int(content: bytes, what: str) -> int:
    if not content or len(content) > 8 or content[0] & 0x80:
        raise MalformedTocError(f"TcbInfo {what} is not a small non-negative integer")
    return int.from_bytes(content, "big")


def tcbinfo_evidence(leaf: x509.Certificate) -> EvidenceValues:
    """Layer-0 evidence from the leaf certificate's DICE TcbInfo: SVN, FWIDs, version.

    The environment is the TcbInfo's (vendor, model, layer).

    Raises:
        MalformedTocError: the leaf has no TcbInfo, or it cannot be read.
    """
    for oid in TCBINFO_OIDS:
        try:
            ext = leaf.extensions.get_extension_for_oid(oid)
        except x509.ExtensionNotFound:
            continue
        raw = ext.value.value if isinstance(ext.value, x509.UnrecognizedExtension) else b""
        try:
            return _tcbinfo(raw)
        except der.DerError as exc:
            raise MalformedTocError(f"the leaf's TcbInfo cannot be read: {exc}") from None
    raise MalformedTocError("the leaf certificate has no DICE TcbInfo")


def _tcbinfo(raw: bytes) -> EvidenceValues:
    items = der.read_all(der.read_one(raw, der.SEQUENCE))
    fields = {t.tag: t.content for t in items}
    if len(fields) != len(items) or not fields.keys() <= _TCBINFO_FIELDS.keys() or not fields:
        raise MalformedTocError(
            "the extension is not a DICE TcbInfo (fields other than [0]..[11], or repeated)"
        )
    try:
        vendor = fields[0x80].decode("utf-8") if 0x80 in fields else None
        model = fields[0x81].decode("utf-8") if 0x81 in fields else None
        version = fields[0x82].decode("utf-8") if 0x82 in fields else None
    except UnicodeDecodeError:
        raise MalformedTocError("TcbInfo text fields are not UTF-8") from None
    layer = _der_int(fields[0x84], "layer") if 0x84 in fields else 0
    if layer != 0:
        raise MalformedTocError(f"the leaf's TcbInfo is for layer {layer}, not 0")
    digests = []
    for fwid in der.read_all(fields.get(0xA6, b"")):
        pair = der.read_all(fwid.content) if fwid.tag == der.SEQUENCE else []
        if len(pair) != 2 or pair[0].tag != der.OID or pair[1].tag != der.OCTET_STRING:
            raise MalformedTocError("a TcbInfo FWID is not { OID, OCTET STRING }")
        alg = _HASH_OIDS.get(pair[0].content)
        if alg is not None:
            digests.append(Digest(alg, pair[1].content))
    values = Values(
        version=version,
        svn=Svn(_der_int(fields[0x83], "svn")) if 0x83 in fields else None,
        digests=tuple(digests),
    )
    env = Environment(vendor=vendor, model=model, layer=layer)
    return EvidenceValues((EvidenceEntry(env, None, values, "tcbinfo"),))


def device_evidence(
    blocks: Mapping[int, SpdmBlock], leaf: x509.Certificate, *, digest_alg: int = DIGEST_SHA384
) -> EvidenceValues:
    """A device's evidence values: its leaf's TcbInfo, and its table of contents (block
    0xFD) where it has one, else its measurement blocks keyed by SPDM index.

    Without a table, the blocks' environment is the TcbInfo's vendor and model at
    :data:`SPDM_BLOCK_LAYER` (as NVIDIA's Blackwell FSP CoRIM names it).

    Raises:
        MalformedTocError: no TcbInfo.
        MalformedReportError: a table that cannot be read or names a missing block.
    """
    tcb = tcbinfo_evidence(leaf)
    if TOC_BLOCK in blocks:
        toc = parse_toc(bytes(blocks[TOC_BLOCK].value), blocks)
        return merge_evidence(toc_evidence(toc, blocks, digest_alg=digest_alg), tcb)
    env = tcb.entries[0].environment
    layer = Environment(vendor=env.vendor, model=env.model, layer=SPDM_BLOCK_LAYER)
    return merge_evidence(tcb, block_evidence(layer, blocks, digest_alg=digest_alg))


# --- appraisal -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CorimMismatch:
    """One reference value the evidence does not satisfy (or a structural refusal)."""

    environment: str
    key: str
    reference: str
    evidence: str

    def __str__(self) -> str:
        return (
            f"{self.environment} [{self.key}]: reference {self.reference}, evidence {self.evidence}"
        )


@dataclass(frozen=True)
class CorimAppraisal:
    """The outcome of appraising one device's evidence against its CoRIMs.

    Attributes:
        trusted: True only when every counted reference matched and something did.
        purpose: the purpose appraised (the evidence's), if any.
        mismatches: every mismatch, in reference order.
        matched: the (environment, key) pairs that matched, as text.
        corims: (id, signer or "unsigned") of each CoRIM used.
        relaxations: the named relaxations the CoRIMs were accepted under.
        skipped: (check, reason) of each check this appraisal did not make: the
            revocation status of the signers' chains is the verifier's OCSP step.
        signer_chains: each signed CoRIM's validated chain (leaf first), for that step.
    """

    trusted: bool
    purpose: str | None
    mismatches: tuple[CorimMismatch, ...]
    matched: tuple[str, ...]
    corims: tuple[tuple[str, str], ...]
    relaxations: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    signer_chains: tuple[tuple[x509.Certificate, ...], ...] = field(default=(), repr=False)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "trusted": self.trusted,
            "purpose": self.purpose,
            "mismatches": [
                {
                    "environment": m.environment,
                    "key": m.key,
                    "reference": m.reference,
                    "evidence": m.evidence,
                }
                for m in self.mismatches
            ],
            "matched": list(self.matched),
            "corims": [{"id": i, "signer": s} for i, s in self.corims],
            "relaxations": list(self.relaxations),
            "skipped": [{"check": c, "reason": r} for c, r in self.skipped],
        }


def _key_text(key: MeasurementKey) -> str:
    return "-" if key is None else str(key)


def _values_text(values: Values) -> str:
    parts = []
    if values.version is not None:
        parts.append(f"version {values.version}")
    if values.svn is not None:
        parts.append(str(values.svn))
    parts.extend(f"digest {d}" for d in values.digests)
    if values.raw is not None:
        parts.append(f"raw {values.raw}")
    if values.name is not None:
        parts.append(f"name {values.name!r}")
    return ", ".join(parts) or "no value"


def _digests_match(ref: Sequence[Digest], ev: Sequence[Digest]) -> bool:
    common = {d.alg for d in ref} & {d.alg for d in ev}
    if not common:
        return False
    for alg in common:
        ours = [d.value for d in ev if d.alg == alg]
        theirs = [d.value for d in ref if d.alg == alg]
        found = False
        for r in theirs:
            for e in ours:
                found |= len(r) == len(e) and hmac.compare_digest(r, e)
        if not found:
            return False
    return True


def _raw_match(ref_value: bytes, mask: bytes | None, ev: bytes) -> bool:
    if len(ev) != len(ref_value):
        return False
    if mask is None:
        return hmac.compare_digest(ref_value, ev)
    a = bytes(x & m for x, m in zip(ref_value, mask, strict=True))
    b = bytes(x & m for x, m in zip(ev, mask, strict=True))
    return hmac.compare_digest(a, b)


def _matches(ref: Values, ev: Values) -> bool:
    if ref.version is not None and ev.version != ref.version:
        return False
    if ref.svn is not None:
        if ev.svn is None:
            return False
        if ref.svn.minimum and ev.svn.value < ref.svn.value:
            return False
        if not ref.svn.minimum and ev.svn.value != ref.svn.value:
            return False
    if ref.digests and not _digests_match(ref.digests, ev.digests):
        return False
    if ref.raw is not None:
        if ev.raw is None or not _raw_match(ref.raw.value, ref.raw.mask, ev.raw.value):
            return False
    return not (ref.name is not None and ev.name != ref.name)


def _subtree(
    evidence: EvidenceValues,
    corims: Sequence[Corim],
    refs: Mapping[tuple[Environment, MeasurementKey], list[Values]],
    policy: CorimPolicy,
    problems: list[CorimMismatch],
) -> tuple[set[Environment] | None, str | None]:
    """The environments that count (None: all of them) and the purpose appraised."""
    graph: dict[Environment, list[Environment]] = {}
    for corim in corims:
        for comid in corim.comids:
            for dep in comid.dependencies:
                graph.setdefault(dep.domain, []).extend(dep.dependents)
    claimed = evidence.purpose[1] if evidence.purpose is not None else None
    if policy.required_purpose is not None and claimed != policy.required_purpose:
        problems.append(
            CorimMismatch(
                "device",
                PURPOSE_KEY,
                repr(policy.required_purpose),
                repr(claimed) if claimed else "no purpose named",
            )
        )
    if not graph:
        return None, claimed
    dependents = {d for ds in graph.values() for d in ds}
    roots = [env for env in graph if env not in dependents]
    if evidence.purpose is None:
        problems.append(
            CorimMismatch("device", PURPOSE_KEY, "a purpose root", "the evidence names no purpose")
        )
        return set(), None
    env_claimed, name = evidence.purpose
    named = [
        r
        for r in roots
        if r == env_claimed and any(v.name == name for v in refs.get((r, PURPOSE_KEY), []))
    ]
    if len(named) != 1:
        found = ", ".join(str(r) for r in roots) or "none"
        problems.append(
            CorimMismatch(
                str(env_claimed),
                PURPOSE_KEY,
                f"exactly one dependency root naming {name!r} (roots: {found})",
                f"{len(named)} root(s) name it",
            )
        )
        return set(), name
    seen: set[Environment] = set()
    todo = [named[0]]
    while todo:
        env = todo.pop()
        if env in seen:
            continue
        seen.add(env)
        todo.extend(graph.get(env, ()))
    return seen, name


def appraise(
    evidence: EvidenceValues, corims: Sequence[Corim], policy: CorimPolicy | None = None
) -> CorimAppraisal:
    """Compare accepted CoRIMs' reference triples with a device's evidence values.

    ``policy`` None is the default policy (any purpose the evidence names).
    """
    policy = policy if policy is not None else CorimPolicy()
    refs: dict[tuple[Environment, MeasurementKey], list[Values]] = {}
    for corim in corims:
        for comid in corim.comids:
            for triple in comid.references:
                for m in triple.measurements:
                    refs.setdefault((triple.environment, m.key), []).append(m.values)
    problems: list[CorimMismatch] = []
    counted, purpose = _subtree(evidence, corims, refs, policy, problems)
    have = evidence.lookup()
    matched: list[str] = []
    referenced_envs = {env for env, _ in refs}
    for (env, key), alternatives in refs.items():
        if counted is not None and env not in counted:
            continue
        observed = have.get((env, key), [])
        if not observed:
            problems.append(
                CorimMismatch(
                    str(env), _key_text(key), " | ".join(map(_values_text, alternatives)), "absent"
                )
            )
            continue
        if any(_matches(ref, ev) for ref in alternatives for ev in observed):
            matched.append(f"{env} [{_key_text(key)}]")
            continue
        problems.append(
            CorimMismatch(
                str(env),
                _key_text(key),
                " | ".join(map(_values_text, alternatives)),
                " | ".join(map(_values_text, observed)),
            )
        )
    for env in sorted(counted or (), key=str):
        if env not in referenced_envs:
            problems.append(CorimMismatch(str(env), "-", "absent", "not appraised"))
    if not matched and not problems:
        problems.append(CorimMismatch("device", "-", "reference values", "nothing corroborated"))
    relaxations = tuple(sorted({r for c in corims for r in c.relaxations}))
    chains = tuple(c.chain for c in corims if c.signed)
    skipped = (
        (
            (
                REVOCATION_CHECK,
                "not checked by the appraisal: the verifier's OCSP step checks signer_chains",
            ),
        )
        if chains
        else ()
    )
    return CorimAppraisal(
        trusted=not problems,
        purpose=purpose,
        mismatches=tuple(problems),
        matched=tuple(matched),
        corims=tuple((c.corim_id, c.signer or "unsigned") for c in corims),
        relaxations=relaxations,
        skipped=skipped,
        signer_chains=chains,
    )


def appraise_corim_files(
    evidence: EvidenceValues,
    corim_files: Sequence[bytes],
    *,
    policy: CorimPolicy,
    anchor: x509.Certificate,
    now: dt.datetime,
) -> CorimAppraisal:
    """Read every CoRIM (:func:`gpucc.gpuattest.corim.read_corim`) and appraise.

    The one call a device verifier makes: the device's evidence values, the CoRIM files'
    bytes, the policy, the CoRIM signing root and the verification time.

    Raises:
        MalformedCorimError, MalformedCoseError: a CoRIM cannot be read or is refused.
        CoseCheckError, CorimNotAcceptedError: a CoRIM is not accepted (signature, chain,
            unsigned without the relaxation, validity).
    """
    if not corim_files:
        raise MalformedCorimError("schema", "no CoRIM was given")
    corims = [read_corim(data, anchor=anchor, now=now, policy=policy) for data in corim_files]
    return appraise(evidence, corims, policy)
