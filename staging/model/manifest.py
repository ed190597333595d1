"""Model manifests in the OpenSSF model-signing v1.0 format, as immutable value objects.

A manifest is the in-toto statement that ``model_signing`` signs::

    {
      "_type": "https://in-toto.io/Statement/v1",
      "subject": [{"name": MODEL_NAME, "digest": {"sha256": SUBJECT}}],
      "predicateType": "https://model_signing/signature/v1.0",
      "predicate": {
        "serialization": {"method": "shards", "hash_type": "sha256", "shard_size": N,
                          "allow_symlinks": false, "ignore_paths": [...]},
        "resources": [{"name": "w.bin:0:N", "algorithm": "sha256-sharded-N", "digest": HEX}, ...]
      }
    }

Resources are sorted the way ``model_signing`` sorts them (by path components, then shard
offsets); ``SUBJECT`` is SHA-256 over the concatenated raw digests in that order. Parsing is
strict: duplicate keys, non-finite numbers, unknown methods, names that are not canonical
relative paths, and a subject digest that does not match the resources are all refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from gpucc.core.errors import IntegrityError
from gpucc.core.jsonio import loads_untrusted

from .errors import MalformedManifestError

__all__ = [
    "GIT_IGNORE_PATHS",
    "HASH_TYPES",
    "MAX_MANIFEST_SIZE",
    "PREDICATE_TYPE",
    "STATEMENT_TYPE",
    "DigestReport",
    "Manifest",
    "ModelMismatchError",
    "Resource",
    "ResourceProblem",
    "Serialization",
    "VerificationResult",
    "check_relative_name",
    "path_sort_key",
]

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
MAX_MANIFEST_SIZE = 64 * 1024 * 1024
HASH_TYPES = ("sha256", "blake3")
GIT_IGNORE_PATHS = (".git", ".gitattributes", ".github", ".gitignore")
_DIGEST_SIZE = 32
#: the largest size or offset a manifest may state (bounded before any conversion)
_MAX_INTEGER = 2**63 - 1


def path_sort_key(name: str) -> tuple[str, ...]:
    """The order ``model_signing`` gives paths: component by component."""
    return PurePosixPath(name).parts


def check_relative_name(name: str, what: str) -> None:
    """Refuse a path that is not a canonical relative POSIX path inside the model.

    ``"."`` (a model that is a single file) is allowed.

    Raises:
        MalformedManifestError: absolute, ``..``, empty or non-canonical components, NUL.
    """
    if name == ".":
        return
    pure = PurePosixPath(name)
    if (
        not name
        or "\x00" in name
        or pure.is_absolute()
        or str(pure) != name
        or any(part in ("..", ".") for part in pure.parts)
    ):
        raise MalformedManifestError(f"{what} {name!r} is not a relative path inside the model")


@dataclass(frozen=True)
class Serialization:
    """How a model was turned into resources (``predicate.serialization``)."""

    method: str
    hash_type: str
    shard_size: int | None = None
    allow_symlinks: bool = False
    ignore_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.method not in ("files", "shards"):
            raise MalformedManifestError(f"unknown serialization method {self.method!r}")
        if self.hash_type not in HASH_TYPES:
            raise MalformedManifestError(
                f"unsupported hash_type {self.hash_type!r} (gpucc supports {', '.join(HASH_TYPES)})"
            )
        if self.method == "shards":
            if self.hash_type != "sha256":
                raise MalformedManifestError("shard serialization is defined for sha256 only")
            if self.shard_size is None or self.shard_size <= 0:
                raise MalformedManifestError("shard serialization needs a positive shard_size")
        elif self.shard_size is not None:
            raise MalformedManifestError("file serialization has no shard_size")
        for path in self.ignore_paths:
            check_relative_name(path, "ignore path")
            if path == ".":
                raise MalformedManifestError(
                    "ignore path '.' leaves out the whole model: the manifest would cover nothing"
                )
        object.__setattr__(self, "ignore_paths", tuple(sorted(set(self.ignore_paths))))

    @property
    def resource_algorithm(self) -> str:
        """The ``algorithm`` every resource of this serialization carries."""
        if self.method == "shards":
            return f"{self.hash_type}-sharded-{self.shard_size}"
        return self.hash_type

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "hash_type": self.hash_type}
        if self.method == "shards":
            out["shard_size"] = self.shard_size
        out["allow_symlinks"] = self.allow_symlinks
        if self.ignore_paths:
            out["ignore_paths"] = list(self.ignore_paths)
        return out

    @classmethod
    def from_json(cls, obj: object) -> Serialization:
        data = _object(obj, "predicate.serialization")
        method = _string(data.get("method"), "serialization.method")
        hash_type = _string(data.get("hash_type"), "serialization.hash_type")
        allow = data.get("allow_symlinks", False)
        if not isinstance(allow, bool):
            raise MalformedManifestError("serialization.allow_symlinks is not a boolean")
        ignore = data.get("ignore_paths", [])
        if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
            raise MalformedManifestError("serialization.ignore_paths is not a list of strings")
        shard_size = None
        if method == "shards":
            shard_size = _integer(data.get("shard_size"), "serialization.shard_size")
        return cls(method, hash_type, shard_size, allow, tuple(ignore))


@dataclass(frozen=True)
class Resource:
    """One file or shard and its digest; ``start``/``end`` are byte offsets (end excluded)."""

    name: str
    algorithm: str
    digest: bytes = field(repr=False)
    path: str = field(init=False)
    start: int | None = field(init=False)
    end: int | None = field(init=False)

    def __post_init__(self) -> None:
        path, start, end = _split_name(self.name, self.algorithm)
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "end", end)

    @property
    def sort_key(self) -> tuple[tuple[str, ...], int, int]:
        return (path_sort_key(self.path), self.start or 0, self.end or 0)

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "algorithm": self.algorithm, "digest": self.digest.hex()}


def _split_name(name: str, algorithm: str) -> tuple[str, int | None, int | None]:
    if "-sharded-" not in algorithm:
        check_relative_name(name, "resource")
        return name, None, None
    path, sep1, rest = name.rpartition(":")
    path, sep0, start_text = path.rpartition(":")
    if not (sep0 and sep1):
        raise MalformedManifestError(f"shard resource {name!r} is not PATH:START:END")
    check_relative_name(path, "resource")
    offsets = []
    for text in (start_text, rest):
        if not text.isdigit() or not text.isascii() or (len(text) > 1 and text[0] == "0"):
            raise MalformedManifestError(f"shard resource {name!r} has a bad offset")
        offsets.append(int(text))
    start, end = offsets
    if end <= start:
        raise MalformedManifestError(f"shard resource {name!r} is empty or reversed")
    return path, start, end


@dataclass(frozen=True)
class ResourceProblem:
    """One resource that did not verify: ``mismatch``, ``missing``, ``extra`` or ``algorithm``."""

    name: str
    kind: str
    expected: str | None = None
    actual: str | None = None

    def to_json(self) -> dict[str, str | None]:
        return {"name": self.name, "problem": self.kind, "expected": self.expected,
                "actual": self.actual}  # fmt: skip


@dataclass(frozen=True)
class VerificationResult:
    """Outcome of comparing a model with a trusted manifest; ``ok`` only when nothing differs."""

    model_name: str
    subject_digest: str
    serialization: Serialization
    resources_checked: int
    problems: tuple[ResourceProblem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def of_kind(self, kind: str) -> tuple[ResourceProblem, ...]:
        return tuple(p for p in self.problems if p.kind == kind)

    def summary(self) -> str:
        if self.ok:
            return f"model {self.model_name!r}: all {self.resources_checked} resources verified"
        parts = []
        for kind, label in (
            ("mismatch", "digest mismatch"),
            ("algorithm", "wrong algorithm"),
            ("missing", "missing"),
            ("extra", "not in the manifest"),
        ):
            names = [p.name for p in self.of_kind(kind)]
            if names:
                shown = ", ".join(names[:5]) + (
                    f" and {len(names) - 5} more" if len(names) > 5 else ""
                )
                parts.append(f"{label}: {shown}")
        return f"model {self.model_name!r} does not match its manifest ({'; '.join(parts)})"

    def to_json(self) -> dict[str, Any]:
        return {
            "verified": self.ok,
            "model_name": self.model_name,
            "subject_sha256": self.subject_digest,
            "serialization": self.serialization.to_json(),
            "resources_checked": self.resources_checked,
            "problems": [p.to_json() for p in self.problems],
        }

    SCHEMA: ClassVar[str] = "gpucc.model.verify/v1"

    def to_dict(self) -> dict[str, Any]:
        """The ``gpucc.model.verify/v1`` document (``gpucc model verify -f json``)."""
        return {"schema": self.SCHEMA, **self.to_json()}


class ModelMismatchError(IntegrityError):
    """The model's resources differ from the trusted manifest."""

    def __init__(self, result: VerificationResult) -> None:
        self.result = result
        super().__init__(result.summary())


@dataclass(frozen=True)
class Manifest:
    """A model's resources under one serialization, unique by name.

    :meth:`build` puts them in model_signing's canonical order; :meth:`parse` keeps the order a
    statement lists them in, since its subject digest covers that order.
    """

    model_name: str
    serialization: Serialization
    resources: tuple[Resource, ...]

    def __post_init__(self) -> None:
        names = [r.name for r in self.resources]
        if len(set(names)) != len(names):
            raise MalformedManifestError("the manifest lists a resource twice")
        for res in self.resources:
            if len(res.digest) != _DIGEST_SIZE:
                raise MalformedManifestError(f"resource {res.name!r} has a digest of wrong length")
            if res.start is not None and res.end is not None and self.serialization.shard_size:
                if res.end - res.start > self.serialization.shard_size:
                    raise MalformedManifestError(f"shard {res.name!r} exceeds the shard size")

    @classmethod
    def build(
        cls, model_name: str, serialization: Serialization, resources: list[Resource]
    ) -> Manifest:
        """A manifest with resources in canonical order (by path components, then offsets)."""
        return cls(model_name, serialization, tuple(sorted(resources, key=lambda r: r.sort_key)))

    @property
    def subject_digest(self) -> bytes:
        """SHA-256 over every resource digest, in manifest order (model_signing's subject)."""
        h = hashlib.sha256()
        for res in self.resources:
            h.update(res.digest)
        return h.digest()

    def statement(self) -> dict[str, Any]:
        return {
            "_type": STATEMENT_TYPE,
            "subject": [{"name": self.model_name, "digest": {"sha256": self.subject_digest.hex()}}],
            "predicateType": PREDICATE_TYPE,
            "predicate": {
                "serialization": self.serialization.to_json(),
                "resources": [r.to_json() for r in self.resources],
            },
        }

    def to_bytes(self) -> bytes:
        """The statement as model_signing lays it out (2-space indent, no final newline)."""
        return json.dumps(self.statement(), indent=2, ensure_ascii=False).encode()

    @classmethod
    def parse(cls, data: bytes) -> Manifest:
        """Parse and check a statement.

        Raises:
            MalformedManifestError: oversized, not JSON, wrong types or predicate, or a
                subject digest that does not match the resources.
        """
        if len(data) > MAX_MANIFEST_SIZE:
            raise MalformedManifestError(
                f"the manifest is larger than {MAX_MANIFEST_SIZE // (1024 * 1024)} MiB"
            )
        obj = _object(_loads(data), "the manifest")
        if obj.get("_type") != STATEMENT_TYPE:
            raise MalformedManifestError(
                f"not an in-toto statement (_type must be {STATEMENT_TYPE})"
            )
        if obj.get("predicateType") != PREDICATE_TYPE:
            raise MalformedManifestError(f"predicateType is not {PREDICATE_TYPE}")
        subjects = obj.get("subject")
        if not isinstance(subjects, list) or len(subjects) != 1:
            raise MalformedManifestError("the statement must have exactly one subject")
        subject = _object(subjects[0], "subject")
        name = _string(subject.get("name"), "subject.name")
        digest = _object(subject.get("digest"), "subject.digest")
        claimed = _hex_digest(digest.get("sha256"), "subject.digest.sha256")
        predicate = _object(obj.get("predicate"), "predicate")
        serialization = Serialization.from_json(predicate.get("serialization"))
        raw = predicate.get("resources")
        if not isinstance(raw, list):
            raise MalformedManifestError("predicate.resources is not a list")
        resources = []
        for i, item in enumerate(raw):
            entry = _object(item, f"resource {i}")
            rname = _string(entry.get("name"), f"resource {i} name")
            resources.append(
                Resource(
                    rname,
                    _string(entry.get("algorithm"), f"resource {rname!r} algorithm"),
                    _hex_digest(entry.get("digest"), f"resource {rname!r} digest"),
                )
            )
        if not resources:
            raise MalformedManifestError("the manifest lists no resource: it covers nothing")
        # The subject covers the digests in the order the statement lists them.
        listed = hashlib.sha256(b"".join(r.digest for r in resources)).digest()
        if not hmac.compare_digest(listed, claimed):
            raise MalformedManifestError(
                "the subject digest does not match the listed resources (edited manifest?)"
            )
        return cls(name, serialization, tuple(resources))

    def compare(self, actual: Manifest) -> VerificationResult:
        """Check ``actual`` (hashed from the local model) against this trusted manifest."""
        have = {r.name: r for r in actual.resources}
        problems: list[ResourceProblem] = []
        for want in self.resources:
            got = have.pop(want.name, None)
            if got is None:
                problems.append(ResourceProblem(want.name, "missing", want.digest.hex()))
            elif want.algorithm != got.algorithm:
                problems.append(
                    ResourceProblem(want.name, "algorithm", want.algorithm, got.algorithm)
                )
            elif not hmac.compare_digest(want.digest, got.digest):
                problems.append(
                    ResourceProblem(want.name, "mismatch", want.digest.hex(), got.digest.hex())
                )
        for extra in sorted(have.values(), key=lambda r: r.sort_key):
            problems.append(ResourceProblem(extra.name, "extra", None, extra.digest.hex()))
        return VerificationResult(
            self.model_name,
            self.subject_digest.hex(),
            self.serialization,
            len(self.resources),
            tuple(problems),
        )


# --- strict JSON helpers ----------------------------------------------------------------------


def _loads(data: bytes, what: str = "manifest") -> Any:
    # the one strict reader: UTF-8, no duplicate keys, no NaN, bounded depth and numbers
    return loads_untrusted(data, what=what, error=MalformedManifestError)


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedManifestError(f"{what} is not a JSON object")
    return value


def _string(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise MalformedManifestError(f"{what} is missing or not a string")
    return value


def _integer(value: object, what: str) -> int:
    # protobuf's JSON writes every number as a double: 1048576 appears as 1048576.0.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MalformedManifestError(f"{what} is missing or not a number")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise MalformedManifestError(f"{what} is not a whole number")
        if abs(value) > _MAX_INTEGER:
            raise MalformedManifestError(f"{what} is out of range")
        value = int(value)
    if value > _MAX_INTEGER:
        raise MalformedManifestError(f"{what} is out of range")
    if value <= 0:
        raise MalformedManifestError(f"{what} must be positive")
    return value


def _hex_digest(value: object, what: str) -> bytes:
    text = _string(value, what)
    if len(text) != 2 * _DIGEST_SIZE or text != text.lower():
        raise MalformedManifestError(f"{what} is not a 64-digit lowercase hex digest")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise MalformedManifestError(f"{what} is not hex") from None


@dataclass(frozen=True)
class DigestReport:
    """A model digested into a manifest (``gpucc model digest``), and signed when
    ``signature`` names the bundle written (``gpucc model sign``).

    Attributes:
        model: the model's directory or file.
        manifest: its manifest.
        seconds: wall time of the digest.
        nbytes: bytes hashed.
        output: the manifest file written (digest only; ``None``: printed).
        statement: the manifest's statement, when it was printed rather than written.
        signature: the signature bundle written (sign only).
    """

    DIGEST_SCHEMA: ClassVar[str] = "gpucc.model.digest/v1"
    SIGN_SCHEMA: ClassVar[str] = "gpucc.model.sign/v1"

    model: Path
    manifest: Manifest
    seconds: float
    nbytes: int
    output: Path | None = None
    statement: dict[str, Any] | None = None
    signature: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``gpucc.model.digest/v1`` or, signed, ``gpucc.model.sign/v1`` document."""
        manifest = self.manifest
        doc: dict[str, Any] = {
            "schema": self.DIGEST_SCHEMA if self.signature is None else self.SIGN_SCHEMA,
            "model": str(self.model),
            "resources": len(manifest.resources),
            "bytes": self.nbytes,
            "seconds": round(self.seconds, 6),
            "algorithm": manifest.serialization.resource_algorithm,
            "subject_sha256": manifest.subject_digest.hex(),
        }
        if self.signature is None:
            doc["output"] = None if self.output is None else str(self.output)
            doc["statement"] = self.statement
        else:
            doc["signature"] = str(self.signature)
        return doc
