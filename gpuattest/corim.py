"""CoRIM reference values in NVIDIA's profile (IETF CoRIM draft 11 subset), read strictly.

A CoRIM file is either unsigned, ``#6.501(corim-map)``, or a COSE_Sign1 (tag 18, ES384,
:mod:`gpucc.gpuattest.cose`) whose payload is that. :func:`read_corim` returns a frozen
:class:`Corim` or raises; nothing is repaired or guessed. docs/CORIM.md lists every rule
and where gpucc is stricter than NVIDIA's verifier.

* **Signature.** A signed CoRIM's chain must end in the CoRIM signing root (the same root
  as XML RIMs). An unsigned CoRIM is refused (:class:`CorimNotAcceptedError`, reason
  ``unsigned``) unless :attr:`CorimPolicy.allow_unsigned` is set: a named relaxation,
  :data:`RELAXATION_UNSIGNED`, that the returned :class:`Corim` carries.
* **corim-map.** ``0`` id, ``1`` tags (1 to :data:`MAX_TAGS`; CoMIDs ``#6.506(bstr)``
  are read, CoSWID 505 and CoTL 508 tags are skipped as NVIDIA skips them), ``2``
  dependent RIMs refused, ``3`` profile refused unless the policy allows it, ``4``
  validity with integer epoch times (a float is refused while decoding), ``5`` entities.
* **CoMID.** Reference triples (0) and dependency triples (4) are read; endorsed (1) and
  conditional-endorsement triples (8, 10) are ignored; identity (2), attest-key (3) and
  membership (5) triples are refused, as is any other triple kind.
* **Values.** version (0), SVN (1: exact ``#6.552`` or plain, minimum ``#6.553``),
  digests (2), raw values (4: ``#6.560`` bytes or ``#6.563`` masked) and name (11).
  The deprecated raw-value mask (5) is refused; so are evidence-only kinds (12, the SPDM
  block indirection) in reference values, and every other kind (gpucc cannot compare it).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cbor2
from cryptography import x509

from gpucc.core.errors import MalformedRimError, NotTrustedError

from .cbor_strict import CborLimits, decode_strict
from .corim_format import looks_like_corim
from .cose import VerifiedSign1, is_cose_sign1, verify_cose_sign1
from .x509chain import ChainProfile

__all__ = [
    "CORIM_CHAIN",
    "CORIM_TAGS",
    "MAX_TAGS",
    "RELAXATION_UNSIGNED",
    "Comid",
    "Corim",
    "CorimNotAcceptedError",
    "CorimPolicy",
    "Digest",
    "DependencyTriple",
    "Environment",
    "MalformedCorimError",
    "Measurement",
    "MeasurementKey",
    "RawValue",
    "ReferenceTriple",
    "Svn",
    "Values",
    "environment_of",
    "looks_like_corim",
    "measurement_key_of",
    "measurements_of",
    "oid_text",
    "read_corim",
    "values_of",
]

#: The most CoMIDs one CoRIM may carry (NVIDIA refuses its 26-tag fixture).
MAX_TAGS = 16
#: The named relaxation under which an unsigned CoRIM is accepted.
RELAXATION_UNSIGNED = "allow_unsigned_corim"
#: The CoRIM signer's chain: any length up to the shared bound, any declared algorithm.
CORIM_CHAIN = ChainProfile("CoRIM signer")

TAG_EPOCH, TAG_COSE_SIGN1, TAG_URI, TAG_UUID, TAG_OID = 1, 18, 32, 37, 111
TAG_CORIM, TAG_COSWID, TAG_COMID, TAG_COTL = 501, 505, 506, 508
TAG_SVN, TAG_MIN_SVN, TAG_RAW, TAG_MASKED_RAW = 552, 553, 560, 563
TAG_CONCISE_EVIDENCE_TOC, TAG_CONCISE_EVIDENCE = 570, 571
#: Every tag the CoRIM profile uses; any other is refused while decoding.
CORIM_TAGS = frozenset(
    {
        TAG_EPOCH,
        TAG_COSE_SIGN1,
        TAG_URI,
        TAG_UUID,
        TAG_OID,
        TAG_CORIM,
        TAG_COSWID,
        TAG_COMID,
        TAG_COTL,
        TAG_SVN,
        TAG_MIN_SVN,
        TAG_RAW,
        TAG_MASKED_RAW,
        TAG_CONCISE_EVIDENCE_TOC,
        TAG_CONCISE_EVIDENCE,
    }
)
_LIMITS = CborLimits(max_bytes=1 << 20, max_depth=24, max_items=4096, max_string=256 * 1024)
_IGNORED_TRIPLES = {
    1: "endorsed",
    8: "conditional-endorsement-series",
    10: "conditional-endorsement",
}
_REFUSED_TRIPLES = {2: "identity", 3: "attest-key", 5: "membership"}
_MAX_OID_BYTES = 64
_MAX_TEXT = 1024


class MalformedCorimError(MalformedRimError):
    """A CoRIM cannot be read, or holds what NVIDIA's profile refuses; ``reason`` names it.

    Attributes:
        reason: a short name (``dependent-rims``, ``too-many-tags``, ``unknown-profile``,
            ``identity-triples``, ``deprecated-raw-value-mask``, ``evidence-only-value``...).
    """

    portable = ("reason",)

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(f"CoRIM refused ({reason}): {detail}")


class CorimNotAcceptedError(NotTrustedError):
    """A well-formed CoRIM the policy does not accept: unsigned, or outside its validity.

    Attributes:
        reason: ``unsigned``, ``expired`` or ``not-yet-valid``.
    """

    portable = ("reason",)

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(f"CoRIM not accepted ({reason}): {detail}")


@dataclass(frozen=True)
class CorimPolicy:
    """What a caller accepts beyond NVIDIA's profile.

    Attributes:
        allow_unsigned: accept unsigned CoRIMs (the relaxation :data:`RELAXATION_UNSIGNED`).
        allowed_profiles: CoRIM profile identifiers (``uri:...`` or ``oid:...``) accepted.
        required_purpose: the purpose (``CC MPT``...) the device must be appraised for;
            None accepts the purpose the evidence names.
    """

    allow_unsigned: bool = False
    allowed_profiles: frozenset[str] = frozenset()
    required_purpose: str | None = None

    @property
    def relaxations(self) -> tuple[str, ...]:
        """The named relaxations this policy grants."""
        return (RELAXATION_UNSIGNED,) if self.allow_unsigned else ()


@dataclass(frozen=True)
class Environment:
    """A CoRIM environment: a class (id, vendor, model, layer, index).

    ``class_id`` is ``oid:<dotted>``, ``uuid:<uuid>`` or ``bytes:<hex>``.
    """

    class_id: str | None = None
    vendor: str | None = None
    model: str | None = None
    layer: int | None = None
    index: int | None = None

    def __str__(self) -> str:
        parts = [self.class_id, self.vendor, self.model]
        if self.layer is not None:
            parts.append(f"layer {self.layer}")
        if self.index is not None:
            parts.append(f"index {self.index}")
        return " ".join(p for p in parts if p) or "(empty environment)"


#: A measurement key: an SPDM index or other integer, a text, ``oid:...``/``uuid:...``; None
#: when the measurement has none.
MeasurementKey = int | str | None


@dataclass(frozen=True)
class Svn:
    """An SVN: ``minimum`` (``#6.553``) in a reference means "at least ``value``"."""

    value: int
    minimum: bool = False

    def __str__(self) -> str:
        return f"svn >= {self.value}" if self.minimum else f"svn {self.value}"


@dataclass(frozen=True)
class Digest:
    """One digest: IANA named-information algorithm (7 = SHA-384) and value."""

    alg: int
    value: bytes

    def __str__(self) -> str:
        return f"{self.alg}:{self.value.hex()}"


@dataclass(frozen=True)
class RawValue:
    """A raw value, with the mask that selects its compared bits (``#6.563``)."""

    value: bytes
    mask: bytes | None = None

    def __str__(self) -> str:
        return self.value.hex() + (f"/{self.mask.hex()}" if self.mask is not None else "")


@dataclass(frozen=True)
class Values:
    """The measurement values gpucc compares (module docstring)."""

    version: str | None = None
    svn: Svn | None = None
    digests: tuple[Digest, ...] = ()
    raw: RawValue | None = None
    name: str | None = None
    #: Evidence only: SPDM block indices holding the value (key 12).
    indices: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        """True when no comparable value is present."""
        return (
            self.version is None
            and self.svn is None
            and not self.digests
            and self.raw is None
            and self.name is None
        )


@dataclass(frozen=True)
class Measurement:
    """One measurement: key and values."""

    key: MeasurementKey
    values: Values


@dataclass(frozen=True)
class ReferenceTriple:
    """Reference values for one environment."""

    environment: Environment
    measurements: tuple[Measurement, ...]


@dataclass(frozen=True)
class DependencyTriple:
    """``domain`` depends on each of ``dependents``."""

    domain: Environment
    dependents: tuple[Environment, ...]


@dataclass(frozen=True)
class Comid:
    """One CoMID: its tag id and the triples gpucc reads."""

    tag_id: str
    references: tuple[ReferenceTriple, ...]
    dependencies: tuple[DependencyTriple, ...]
    ignored_triples: tuple[str, ...] = ()


@dataclass(frozen=True)
class Corim:
    """A CoRIM that was read and accepted.

    Attributes:
        corim_id: its id (text, or ``uuid:``/hex of bytes).
        comids: its CoMIDs.
        profile: its profile identifier, if any.
        not_before, not_after: its validity, if given.
        signer: the signer's common name; None when unsigned.
        relaxations: the named relaxations it was accepted under (``allow_unsigned_corim``).
        skipped_tags: how many CoSWID/CoTL tags were skipped.
    """

    corim_id: str
    comids: tuple[Comid, ...]
    profile: str | None = None
    not_before: dt.datetime | None = None
    not_after: dt.datetime | None = None
    signer: str | None = None
    relaxations: tuple[str, ...] = ()
    skipped_tags: int = 0
    chain: tuple[x509.Certificate, ...] = field(default=(), repr=False, compare=False)

    @property
    def signed(self) -> bool:
        """True when its signature and chain verified."""
        return self.signer is not None


# --- small readers -------------------------------------------------------------------


def _bad(reason: str, detail: str) -> MalformedCorimError:
    return MalformedCorimError(reason, detail)


def _map(value: Any, what: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise _bad("schema", f"{what} is not a map")
    return value


def _array(value: Any, what: str, *, nonempty: bool = False) -> Sequence[Any]:
    if not isinstance(value, tuple | list):
        raise _bad("schema", f"{what} is not an array")
    if nonempty and not value:
        raise _bad("schema", f"{what} is empty")
    return value


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad("schema", f"{what} is not an integer")
    return value


def _uint(value: Any, what: str) -> int:
    n = _int(value, what)
    if n < 0 or n >= 1 << 64:
        raise _bad("schema", f"{what} is not an unsigned integer")
    return n


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise _bad("schema", f"{what} is not a text string")
    if len(value) > _MAX_TEXT:
        raise _bad("schema", f"{what} is longer than {_MAX_TEXT} characters")
    return value


def _bytes(value: Any, what: str) -> bytes:
    if not isinstance(value, bytes):
        raise _bad("schema", f"{what} is not a byte string")
    return value


def _tag(value: Any, number: int) -> bool:
    return isinstance(value, cbor2.CBORTag) and value.tag == number


def _keys(value: Mapping[Any, Any], allowed: set[int], what: str) -> None:
    extra = [k for k in value if k not in allowed]
    if extra:
        raise _bad("schema", f"{what} has unknown keys {sorted(map(str, extra))}")


def oid_text(der_body: bytes) -> str:
    """The dotted form of an OID's BER content bytes (tag 111's value).

    Raises:
        MalformedCorimError: empty, too long, or a non-minimal or truncated arc.
    """
    if not der_body or len(der_body) > _MAX_OID_BYTES or der_body[-1] & 0x80:
        raise _bad("schema", "an OID is empty, too long or truncated")
    arcs: list[int] = []
    current, fresh = 0, True
    for b in der_body:
        if fresh and b == 0x80:
            raise _bad("schema", "an OID arc is not minimally encoded")
        current = (current << 7) | (b & 0x7F)
        fresh = not b & 0x80
        if fresh:
            arcs.append(current)
            current = 0
    first = min(arcs[0] // 40, 2)
    return ".".join(str(a) for a in (first, arcs[0] - 40 * first, *arcs[1:]))


def _identifier(value: Any, what: str) -> str:
    """A class id, tag id or key in its text form (``oid:``, ``uuid:``, ``bytes:``)."""
    if _tag(value, TAG_OID):
        return "oid:" + oid_text(_bytes(value.value, what))
    if isinstance(value, uuid.UUID):
        return f"uuid:{value}"
    if _tag(value, TAG_UUID):
        raw = _bytes(value.value, what)
        if len(raw) != 16:
            raise _bad("schema", f"{what} is not a 16-byte UUID")
        return f"uuid:{uuid.UUID(bytes=raw)}"
    if _tag(value, TAG_RAW):
        return "bytes:" + _bytes(value.value, what).hex()
    if isinstance(value, bytes):
        return "bytes:" + value.hex()
    raise _bad("schema", f"{what} is not an OID, UUID or byte string")


# --- environments and values -----------------------------------------------------------


def environment_of(value: Any, what: str = "environment") -> Environment:
    """An environment-map (only a class is supported: instance and group are refused)."""
    env = _map(value, what)
    if 1 in env or 2 in env:
        raise _bad("unsupported-environment", f"{what} names an instance or group")
    _keys(env, {0}, what)
    cls = _map(env.get(0), f"{what} class")
    _keys(cls, {0, 1, 2, 3, 4}, f"{what} class")
    if not cls:
        raise _bad("schema", f"{what} class is empty")
    return Environment(
        class_id=_identifier(cls[0], f"{what} class id") if 0 in cls else None,
        vendor=_text(cls[1], f"{what} vendor") if 1 in cls else None,
        model=_text(cls[2], f"{what} model") if 2 in cls else None,
        layer=_uint(cls[3], f"{what} layer") if 3 in cls else None,
        index=_uint(cls[4], f"{what} index") if 4 in cls else None,
    )


def measurement_key_of(value: Any, what: str = "measurement key") -> MeasurementKey:
    """A measurement key: unsigned integer, text, OID or UUID."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _uint(value, what)
    if isinstance(value, str):
        return _text(value, what)
    return _identifier(value, what)


_DIGEST_NAMES = {"sha-256": 1, "sha-384": 7, "sha-512": 8}
_DIGEST_SIZES = {1: 32, 7: 48, 8: 64}


def _svn(value: Any, what: str, *, reference: bool) -> Svn:
    if _tag(value, TAG_SVN):
        return Svn(_uint(value.value, what))
    if _tag(value, TAG_MIN_SVN):
        if not reference:
            raise _bad("schema", f"{what} is a minimum SVN in evidence")
        return Svn(_uint(value.value, what), minimum=True)
    return Svn(_uint(value, what))


def _digests(value: Any, what: str) -> tuple[Digest, ...]:
    out = []
    for i, item in enumerate(_array(value, what, nonempty=True)):
        pair = _array(item, f"{what} {i}")
        if len(pair) != 2:
            raise _bad("schema", f"{what} {i} is not [algorithm, value]")
        alg_raw, digest = pair
        alg = _DIGEST_NAMES.get(alg_raw) if isinstance(alg_raw, str) else _int(alg_raw, what)
        if alg is None:
            raise _bad("unsupported-digest", f"{what} {i} names algorithm {alg_raw!r}")
        raw = _bytes(digest, f"{what} {i} value")
        size = _DIGEST_SIZES.get(alg)
        if size is not None and len(raw) != size:
            raise _bad("schema", f"{what} {i} is {len(raw)} bytes for algorithm {alg}")
        out.append(Digest(alg, raw))
    return tuple(out)


def _raw(value: Any, what: str) -> RawValue:
    if _tag(value, TAG_RAW):
        return RawValue(_bytes(value.value, what))
    if _tag(value, TAG_MASKED_RAW):
        pair = _array(value.value, what)
        if len(pair) != 2:
            raise _bad("schema", f"{what} is not [value, mask]")
        raw, mask = _bytes(pair[0], what), _bytes(pair[1], f"{what} mask")
        if len(raw) != len(mask):
            raise _bad("schema", f"{what} value and mask differ in length")
        return RawValue(raw, mask)
    raise _bad("schema", f"{what} is neither #6.560 nor #6.563")


_EVIDENCE_ONLY = {12: "SPDM block indirection"}


def values_of(value: Any, what: str = "measurement values", *, reference: bool = True) -> Values:
    """A measurement-values-map (module docstring has the kinds read and refused).

    ``reference`` False reads evidence: minimum SVNs and masks are then refused, and the
    SPDM indirection (12) is read into :attr:`Values.indices`.
    """
    mval = _map(value, what)
    if 5 in mval:
        raise _bad("deprecated-raw-value-mask", f"{what} uses the deprecated raw-value-mask (5)")
    if reference:
        for key, name in _EVIDENCE_ONLY.items():
            if key in mval:
                raise _bad(
                    "evidence-only-value", f"{what} holds {name} ({key}), an evidence-only kind"
                )
    known = {0, 1, 2, 4, 11} | (set() if reference else {12})
    unknown = [k for k in mval if k not in known]
    if unknown:
        raise _bad("unsupported-value-kind", f"{what} holds kinds {sorted(map(str, unknown))}")
    version = None
    if 0 in mval:
        ver = _map(mval[0], f"{what} version")
        _keys(ver, {0, 1}, f"{what} version")
        version = _text(ver.get(0), f"{what} version")
    indices: tuple[int, ...] = ()
    if 12 in mval:
        ind = _map(mval[12], f"{what} indirection")
        _keys(ind, {0}, f"{what} indirection")
        indices = tuple(
            _uint(i, f"{what} block index") for i in _array(ind.get(0), what, nonempty=True)
        )
    raw = None
    if 4 in mval:
        raw = _raw(mval[4], f"{what} raw value")
        if raw.mask is not None and not reference:
            raise _bad("schema", f"{what} is a masked raw value in evidence")
    values = Values(
        version=version,
        svn=_svn(mval[1], f"{what} svn", reference=reference) if 1 in mval else None,
        digests=_digests(mval[2], f"{what} digests") if 2 in mval else (),
        raw=raw,
        name=_text(mval[11], f"{what} name") if 11 in mval else None,
        indices=indices,
    )
    if values.empty and not indices:
        raise _bad("schema", f"{what} holds no value")
    return values


def _measurement(value: Any, what: str, *, reference: bool = True) -> Measurement:
    m = _map(value, what)
    _keys(m, {0, 1, 2}, what)  # 2: authorized-by, not used in NVIDIA's profile
    if 1 not in m:
        raise _bad("schema", f"{what} has no values")
    key = measurement_key_of(m[0], f"{what} key") if 0 in m else None
    return Measurement(key, values_of(m[1], f"{what} values", reference=reference))


def measurements_of(value: Any, what: str, *, reference: bool = True) -> tuple[Measurement, ...]:
    """A non-empty array of measurement-maps."""
    items = _array(value, what, nonempty=True)
    return tuple(_measurement(m, f"{what} {i}", reference=reference) for i, m in enumerate(items))


# --- CoMID and CoRIM ---------------------------------------------------------------------


def _comid(raw: bytes, n: int) -> Comid:
    what = f"CoMID {n}"
    value = decode_strict(
        raw, what=what, allowed_tags=CORIM_TAGS, limits=_LIMITS, error=_schema_error
    )
    comid = _map(value, what)
    _keys(comid, {0, 1, 2, 3, 4}, what)
    if 3 in comid:
        raise _bad("linked-tags", f"{what} links other tags (not supported)")
    ident = _map(comid.get(1), f"{what} tag-identity")
    tag_id_raw = ident.get(0)
    tag_id = tag_id_raw if isinstance(tag_id_raw, str) else _identifier(tag_id_raw, f"{what} id")
    triples = _map(comid.get(4), f"{what} triples")
    for key, name in _REFUSED_TRIPLES.items():
        if key in triples:
            raise _bad(
                f"{name}-triples", f"{what} holds {name} triples, which NVIDIA's profile refuses"
            )
    unknown = [k for k in triples if k not in (0, 4) and k not in _IGNORED_TRIPLES]
    if unknown:
        raise _bad("unknown-triples", f"{what} holds triple kinds {sorted(map(str, unknown))}")
    refs = []
    for i, t in enumerate(_array(triples.get(0, ()), f"{what} reference triples")):
        pair = _array(t, f"{what} reference triple {i}")
        if len(pair) != 2:
            raise _bad("schema", f"{what} reference triple {i} is not [environment, measurements]")
        env = environment_of(pair[0], f"{what} reference triple {i} environment")
        refs.append(
            ReferenceTriple(
                env, measurements_of(pair[1], f"{what} reference triple {i} measurement")
            )
        )
    deps = []
    for i, t in enumerate(_array(triples.get(4, ()), f"{what} dependency triples")):
        pair = _array(t, f"{what} dependency triple {i}")
        if len(pair) != 2:
            raise _bad("schema", f"{what} dependency triple {i} is not [domain, dependents]")
        domain = environment_of(pair[0], f"{what} dependency triple {i} domain")
        dependents = tuple(
            environment_of(d, f"{what} dependency triple {i} dependent {j}")
            for j, d in enumerate(_array(pair[1], f"{what} dependency triple {i}", nonempty=True))
        )
        deps.append(DependencyTriple(domain, dependents))
    if not refs:
        raise _bad("schema", f"{what} holds no reference triples")
    ignored = tuple(_IGNORED_TRIPLES[k] for k in sorted(triples) if k in _IGNORED_TRIPLES)
    return Comid(tag_id, tuple(refs), tuple(deps), ignored)


def _schema_error(message: str) -> MalformedCorimError:
    return MalformedCorimError("cbor", message)


def _time(value: Any, what: str) -> dt.datetime:
    if not isinstance(value, dt.datetime):
        raise _bad("validity", f"{what} is not an epoch time (#6.1 integer)")
    return value


def _profile(value: Any) -> str:
    if _tag(value, TAG_URI):
        return "uri:" + _text(value.value, "CoRIM profile")
    if _tag(value, TAG_OID):
        return "oid:" + oid_text(_bytes(value.value, "CoRIM profile"))
    raise _bad("schema", "the CoRIM profile is neither a URI (#6.32) nor an OID (#6.111)")


def _corim_map(
    value: Any, policy: CorimPolicy, now: dt.datetime
) -> tuple[str, tuple[Comid, ...], str | None, dt.datetime | None, dt.datetime | None, int]:
    if not _tag(value, TAG_CORIM):
        raise _bad("schema", "the payload is not an unsigned CoRIM (#6.501)")
    corim = _map(value.value, "corim-map")
    _keys(corim, {0, 1, 2, 3, 4, 5}, "corim-map")
    if 2 in corim:
        raise _bad(
            "dependent-rims", "the CoRIM names dependent RIMs, which NVIDIA's profile refuses"
        )
    raw_id = corim.get(0)
    corim_id = raw_id if isinstance(raw_id, str) else _identifier(raw_id, "CoRIM id")
    tags = _array(corim.get(1), "CoRIM tags", nonempty=True)
    if len(tags) > MAX_TAGS:
        raise _bad("too-many-tags", f"the CoRIM holds {len(tags)} tags, more than {MAX_TAGS}")
    profile = _profile(corim[3]) if 3 in corim else None
    if profile is not None and profile not in policy.allowed_profiles:
        raise _bad("unknown-profile", f"profile {profile} is not one gpucc is told to accept")
    not_before = not_after = None
    if 4 in corim:
        validity = _map(corim[4], "CoRIM validity")
        _keys(validity, {0, 1}, "CoRIM validity")
        if 1 not in validity:
            raise _bad("validity", "the CoRIM validity has no not-after")
        not_after = _time(validity[1], "not-after")
        not_before = _time(validity[0], "not-before") if 0 in validity else None
    if 5 in corim:
        _array(corim[5], "CoRIM entities")
    comids, skipped = [], 0
    for i, tag in enumerate(tags):
        if _tag(tag, TAG_COMID):
            comids.append(_comid(_bytes(tag.value, f"CoMID {i}"), i))
        elif _tag(tag, TAG_COSWID) or _tag(tag, TAG_COTL):
            skipped += 1
        else:
            raise _bad("schema", f"CoRIM tag {i} is not a CoMID, CoSWID or CoTL")
    if not comids:
        raise _bad("schema", "the CoRIM holds no CoMID")
    if not_before is not None and now < not_before:
        raise CorimNotAcceptedError("not-yet-valid", f"valid from {not_before.isoformat()}")
    if not_after is not None and now > not_after:
        raise CorimNotAcceptedError("expired", f"expired on {not_after.isoformat()}")
    return corim_id, tuple(comids), profile, not_before, not_after, skipped


def read_corim(
    data: bytes,
    *,
    anchor: x509.Certificate,
    now: dt.datetime,
    policy: CorimPolicy | None = None,
) -> Corim:
    """Read, verify and accept one CoRIM file (signed or, under the relaxation, unsigned).

    Args:
        data: the file's bytes.
        anchor: the CoRIM signing root (``gpuattest/_roots/rim_root.pem`` in production).
        now: the verification time (timezone-aware).
        policy: what the caller accepts beyond NVIDIA's profile (None: the default,
            which refuses unsigned CoRIMs).

    Raises:
        MalformedCorimError: not CBOR, not a CoRIM, or refused by NVIDIA's profile (reason).
        MalformedCoseError: signed, but not a COSE_Sign1 structure.
        CoseCheckError: the signature, chain or headers failed a check.
        CorimNotAcceptedError: unsigned without the relaxation, or outside its validity.
    """
    if now.tzinfo is None:
        raise ValueError("verification time must be timezone-aware")
    policy = policy if policy is not None else CorimPolicy()
    value = decode_strict(
        data, what="CoRIM", allowed_tags=CORIM_TAGS, limits=_LIMITS, error=_schema_error
    )
    verified: VerifiedSign1 | None = None
    if is_cose_sign1(value):
        verified = verify_cose_sign1(
            value, anchor=anchor, now=now, profile=CORIM_CHAIN, what="CoRIM"
        )
        value = decode_strict(
            verified.payload,
            what="CoRIM payload",
            allowed_tags=CORIM_TAGS - {TAG_COSE_SIGN1},
            limits=_LIMITS,
            error=_schema_error,
        )
    elif not policy.allow_unsigned:
        raise CorimNotAcceptedError(
            "unsigned",
            f"the CoRIM is not signed; accepting it needs the relaxation {RELAXATION_UNSIGNED}",
        )
    corim_id, comids, profile, not_before, not_after, skipped = _corim_map(value, policy, now)
    return Corim(
        corim_id=corim_id,
        comids=comids,
        profile=profile,
        not_before=not_before,
        not_after=not_after,
        signer=verified.signer if verified is not None else None,
        relaxations=() if verified is not None else (RELAXATION_UNSIGNED,),
        skipped_tags=skipped,
        chain=verified.chain.certificates if verified is not None else (),
    )
