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


#: The travel hand-over log's schema (``gpucc.travel.log.LOG_SCHEMA``, a layer above this one;
#: tests/e2e/test_cli_inspect.py keeps the two equal).
TRAVEL_LOG_SCHEMA = "gpucc.travel-log/v1"


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
    if head.startswith(b"eyJ"):
        return _ear(path)
    if head.lstrip()[:1] in (b"{", b"["):
        return _json(path)
    raise MalformedInputError(
        f"{path} is not a file gpucc knows (a sealed dataset, a key file, a signed result or "
        "gpucc's JSON)"
    )


def _jwt_part(token: str, index: int, path: Path) -> dict[str, Any]:
    """One JSON part of a compact JWS (0 header, 1 claims), decoded but not verified."""
    import base64
    import binascii

    from gpucc.core.errors import MalformedInputError
    from gpucc.core.jsonio import loads_untrusted

    parts = token.split(".")
    if len(parts) != 3:
        raise MalformedInputError(f"{path} holds a token that is not a compact JWS")
    try:
        raw = base64.urlsafe_b64decode(parts[index] + "=" * (-len(parts[index]) % 4))
    except (binascii.Error, ValueError):
        raise MalformedInputError(f"{path} holds a token that is not base64url") from None
    doc = loads_untrusted(raw, what=f"token in {path}", error=MalformedInputError)
    return _mapping(doc)


def _ear(path: Path) -> dict[str, Any]:
    """An EAR (``gpucc attest --ear-out``): one compact JWS."""
    from gpucc.core.files import read_capped

    token = read_capped(path, _MAX_JSON, what="file").decode("ascii", "replace").strip()
    header, claims = _jwt_part(token, 0, path), _jwt_part(token, 1, path)
    status = claims.get("ear.status", "?")
    return {
        "kind": "ear",
        "summary": f"a signed attestation result (EAR), status {status!s}, key "
        f"{header.get('kid', 'without kid')!s}, not verified",
        "details": {
            "status": str(status),
            "kid": str(header.get("kid")),
            "alg": str(header.get("alg")),
        },
    }


def _eat(doc: list[Any], path: Path) -> dict[str, Any]:
    """An EAT (``gpucc attest --sign-eat``): the overall token, then one per GPU."""
    token = str(doc[0][1])
    header, claims = _jwt_part(token, 0, path), _jwt_part(token, 1, path)
    devices = _mapping(doc[1]) if len(doc) > 1 else {}
    return {
        "kind": "eat",
        "summary": f"a signed attestation result (EAT) of {len(devices)} GPU token(s), key "
        f"{header.get('kid', 'without kid')!s}, not verified",
        "details": {
            "gpus": len(devices),
            "kid": str(header.get("kid")),
            "issuer": str(claims.get("iss")),
            "nonce": str(claims.get("eat_nonce")),
        },
    }


def _signature_bundle(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """A model signature (a Sigstore bundle whose DSSE payload is the manifest)."""
    import base64
    import binascii

    from gpucc.core.errors import MalformedInputError
    from gpucc.core.jsonio import loads_untrusted

    envelope = _mapping(doc.get("dsseEnvelope"))
    try:
        payload = base64.b64decode(str(envelope.get("payload", "")), validate=True)
    except (binascii.Error, ValueError):
        raise MalformedInputError(f"{path}: the signature's payload is not base64") from None
    statement = _mapping(
        loads_untrusted(payload, what=f"payload of {path}", error=MalformedInputError)
    )
    subjects = statement.get("subject")
    first = subjects[0] if isinstance(subjects, list) and subjects else {}
    name = first.get("name", "?") if isinstance(first, dict) else "?"
    resources = _mapping(statement.get("predicate")).get("resources")
    count = len(resources) if isinstance(resources, list) else 0
    key = _mapping(_mapping(doc.get("verificationMaterial")).get("publicKey")).get("hint")
    return {
        "kind": "model-signature",
        "summary": f"a model signature of {name!s}: {count} resource(s), not verified",
        "details": {"model_name": str(name), "resources": count, "key_hint": str(key)},
    }


def _travel_log(lines: list[bytes], path: Path) -> dict[str, Any]:
    """A travel hand-over log: one signed entry per line, the last closing the journey."""
    from gpucc.core.errors import MalformedInputError
    from gpucc.core.jsonio import loads_untrusted

    entries = [
        _mapping(loads_untrusted(line, what=f"line {n} of {path}", error=MalformedInputError))
        for n, line in enumerate(lines, 1)
    ]
    closing = entries[-1] if entries and entries[-1].get("kind") == "closing" else None
    visits = [e for e in entries if e.get("kind") != "closing"]
    state = "closed" if closing is not None else "not closed (cut, or its run was stopped)"
    return {
        "kind": "travel-log",
        "summary": f"a travel hand-over log of {len(visits)} visit(s), {state}, not verified",
        "details": {
            "entries": len(entries),
            "visits": len(visits),
            "closed": closing is not None,
            "holders": ", ".join(str(e["holder_id"]) for e in visits if e.get("holder_id")),
        },
    }


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
    lines = [line for line in data.splitlines() if line.strip()]
    if lines and b'"prev"' in lines[0] and b'"seq"' in lines[0]:  # a hash-chained log
        if f'"schema":"{TRAVEL_LOG_SCHEMA}"'.encode() in lines[0]:
            return _travel_log(lines, path)
    try:
        doc = loads_untrusted(
            data, what=f"file {path}", error=MalformedInputError, max_bytes=_MAX_JSON
        )
    except MalformedInputError as exc:  # it only starts like JSON
        raise MalformedInputError(
            f"{path} is not a file gpucc knows: it starts like JSON, but {exc}"
        ) from None
    if isinstance(doc, list) and doc and isinstance(doc[0], list) and doc[0][:1] == ["JWT"]:
        return _eat(doc, path)
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
    if str(doc.get("mediaType", "")).startswith("application/vnd.dev.sigstore.bundle"):
        return _signature_bundle(doc, path)
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
