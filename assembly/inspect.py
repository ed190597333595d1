"""What a file is, without its secrets: the ``gpucc.inspect/v1`` document (``gpucc inspect``).

A sealed dataset or shard (its header), a key file (its key id), evidence, a collateral
bundle, a model manifest or a gpucc JSON result: :func:`inspect_file` says which and
describes it in a :class:`FileDescription`; nothing is verified here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

__all__ = ["FileDescription", "describe_file", "inspect_file"]

#: How a key file starts (docs/FORMAT.md); ``read_key_file`` checks the rest.
_KEY_FILE_START = b"gpucc-key v"
#: Bytes read to recognise a file; JSON files are read whole up to this size.
_MAX_JSON = 64 * 1024 * 1024


@dataclass(frozen=True)
class FileDescription:
    """What ``file`` is: its ``kind``, a one-line ``summary`` and, besides, every other
    field of the description (``details`` and the like), in order."""

    SCHEMA: ClassVar[str] = "gpucc.inspect/v1"

    file: Path
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        return str(self.fields.get("summary", ""))

    @property
    def details(self) -> dict[str, Any]:
        details = self.fields.get("details", {})
        return details if isinstance(details, dict) else {}

    def to_dict(self) -> dict[str, Any]:
        """The ``gpucc.inspect/v1`` document."""
        return {"schema": self.SCHEMA, "file": str(self.file), **self.fields}


def inspect_file(path: Path) -> FileDescription:
    """The description of ``path`` (:func:`describe_file`'s fields).

    Raises:
        MalformedInputError: not a file gpucc knows.
        FileAccessError, KeyFileError: the file cannot be read.
    """
    return FileDescription(path, describe_file(path))


def describe_file(path: Path) -> dict[str, Any]:
    """``kind``, a one-line ``summary`` and ``details`` (names to plain values) of ``path``.

    Raises:
        MalformedInputError: not a file gpucc knows.
        FileAccessError, KeyFileError: the file cannot be read (a key file readable by
            others is refused, as everywhere).
    """
    import os

    from gpucc.core.errors import MalformedInputError
    from gpucc.core.files import open_regular
    from gpucc.staging.format import MAGIC

    fd = open_regular(path, what="file")
    with os.fdopen(fd, "rb") as fh:
        head = fh.read(64)
    if head.startswith(MAGIC):
        return _sealed(path)
    if head.startswith(_KEY_FILE_START):
        return _key_file(path)
    if head.lstrip()[:1] in (b"{", b"["):
        return _json(path)
    raise MalformedInputError(
        f"{path} is not a file gpucc knows (a sealed dataset, a key file or gpucc's JSON)"
    )


def _sealed(path: Path) -> dict[str, Any]:
    from gpucc.staging import open_sealed
    from gpucc.staging.format import WrapKind
    from gpucc.staging.shards import ShardId

    sealed = open_sealed(path)
    header = sealed.header
    details: dict[str, Any] = {
        "dataset_id": header.dataset_id.hex(),
        "header_digest": header.digest.hex(),
        "plaintext_bytes": header.plaintext_length,
        "chunk_size": header.chunk_size,
        "chunks": header.chunk_count,
        "file_bytes": sealed.file_length,
        "expected_file_bytes": header.file_size,
    }
    wrap = sealed.wrap
    if wrap is None:
        details["key"] = "not in the file (a dataset key held elsewhere)"
    elif wrap.kind is WrapKind.KEY_FILE:
        details["key"] = f"wrapped for the key file with key id {wrap.context.hex()}"
    else:
        details["key"] = f"wrapped for the attested session {wrap.context.hex()}"
    shard = ShardId.parse(header.dataset_id)
    kind = "sealed-dataset"
    summary = f"a sealed dataset of {header.plaintext_length} bytes in {header.chunk_count} chunks"
    if shard is not None:
        kind = "shard"
        details |= {"shard_set": shard.set_id.hex(), "shard": shard.index, "shards": shard.count}
        summary = f"shard {shard.index + 1} of {shard.count} of set {shard.set_id.hex()}, " + (
            f"{header.plaintext_length} bytes in {header.chunk_count} chunks"
        )
    if sealed.file_length != header.file_size:
        summary += f" (the file is {sealed.file_length} bytes, not {header.file_size})"
    return {
        "kind": kind,
        "summary": summary + " (not verified: that needs the key)",
        "details": details,
    }


def _key_file(path: Path) -> dict[str, Any]:
    from gpucc.staging.format import key_id, read_key_file

    key = read_key_file(path)  # a file others can read is refused, as everywhere
    kid = key_id(key).hex()
    return {
        "kind": "key-file",
        "summary": f"a gpucc key file, key id {kid} (the key itself is never shown)",
        "details": {"key_id": kid},
    }


def _cmw(doc: dict[str, Any]) -> dict[str, Any]:
    """NVIDIA's CMW evidence file: its devices, as their leaf certificates name them."""
    from gpucc.gpuattest.evidence import load_cmw

    evidence = load_cmw(doc)
    archs = sorted({gpu.arch for gpu in evidence.gpus})
    nonces = sorted({gpu.nonce.hex() for gpu in evidence.gpus if gpu.nonce is not None})
    hints = [dict(gpu.hints) for gpu in evidence.gpus if gpu.hints]
    details: dict[str, Any] = {
        "devices": len(evidence.gpus),
        "arch": ", ".join(archs),
        "nonce": ", ".join(nonces) or "none",
        "format": "cmw",
    }
    if hints:
        details["unsigned_hints"] = json.dumps(hints)
    return {
        "kind": "evidence",
        "summary": f"CMW evidence from {len(evidence.gpus)} device(s) ({', '.join(archs)}), "
        "not verified",
        "details": details,
    }


def _json(path: Path) -> dict[str, Any]:
    from gpucc.core.errors import MalformedInputError
    from gpucc.core.files import read_capped
    from gpucc.core.jsonio import loads_untrusted

    data = read_capped(path, _MAX_JSON, what="file")
    doc = loads_untrusted(data, what=str(path), error=MalformedInputError, max_bytes=_MAX_JSON)
    if isinstance(doc, list) and doc and all(isinstance(e, dict) and "evidence" in e for e in doc):
        archs = sorted({str(e.get("arch")) for e in doc})
        nonces = sorted({str(e.get("nonce")) for e in doc if e.get("nonce")})
        details = {
            "devices": len(doc),
            "arch": ", ".join(archs),
            "nonce": ", ".join(nonces) or "none",
        }
        return {
            "kind": "evidence",
            "summary": f"evidence from {len(doc)} device(s) ({', '.join(archs)}), not verified",
            "details": details,
        }
    if not isinstance(doc, dict):
        raise MalformedInputError(f"{path} is JSON, but not a file gpucc knows")
    if "__cmwc_t" in doc:
        return _cmw(doc)
    if doc.get("format") == "gpucc-collateral":
        rims = _mapping(doc.get("rims"))
        ocsp = _mapping(doc.get("ocsp"))
        details = {"created": str(doc.get("created")), "rims": len(rims), "ocsp_answers": len(ocsp)}
        return {
            "kind": "collateral-bundle",
            "summary": f"a collateral bundle of {len(rims)} RIM(s), created {doc.get('created')}",
            "details": details,
        }
    if doc.get("_type") == "https://in-toto.io/Statement/v1":
        subject = doc.get("subject")
        subjects: list[Any] = subject if isinstance(subject, list) else []
        predicate = _mapping(doc.get("predicate"))
        resources = predicate.get("resources")
        count = len(resources) if isinstance(resources, list) else 0
        name = subjects[0].get("name") if subjects and isinstance(subjects[0], dict) else "?"
        return {
            "kind": "model-manifest",
            "summary": f"a model manifest of {name!s}: {count} resource(s), not verified",
            "details": {"model_name": str(name), "resources": count},
        }
    schema = doc.get("schema")
    if isinstance(schema, str) and schema.startswith("gpucc."):
        details = {
            k: doc[k]
            for k in ("verdict", "trusted", "verified", "complete", "exit_code")
            if isinstance(doc.get(k), (str, bool, int))
        }
        return {
            "kind": "result",
            "summary": f"a gpucc document {schema} (as written; not checked again)",
            "details": {"document_schema": schema, **details},
        }
    raise MalformedInputError(f"{path} is JSON, but not a file gpucc knows")


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
