"""The hand-over log (``travel-log.jsonl``): one signed, hash-chained entry per visit.

Each line is the canonical JSON (:func:`gpucc.travel.signing.canonical_json`) of an entry::

    {"schema": "gpucc.travel-log/v1", "seq": n, "prev": hex, ..., "signature": base64}

* ``prev`` is ``SHA-256(line n-1)`` over the previous line's exact bytes (without its
  newline); the first entry has 64 zeros.
* ``signature`` is DER ECDSA-P384-SHA384 by the orchestrator's key over
  ``"gpucc/travel-log/v1" || 0x00 || canonical_json(entry without "signature")``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.gpuattest._internal.jsonio import loads_untrusted
from gpucc.gpuattest.files import read_capped

from .errors import LogTamperedError, MalformedLogError
from .signing import canonical_json

__all__ = [
    "GENESIS",
    "LOG_LABEL",
    "LOG_SCHEMA",
    "LogSummary",
    "entry_hash",
    "entry_signing_input",
    "sign_entry",
    "verify_log",
    "verify_log_lines",
]

LOG_SCHEMA = "gpucc.travel-log/v1"
LOG_LABEL = b"gpucc/travel-log/v1\x00"
GENESIS = "0" * 64
MAX_LOG_BYTES = 64 * 1024 * 1024


def entry_signing_input(body: Mapping[str, Any]) -> bytes:
    """``label || canonical_json(body)``, ``body`` being the entry without its signature."""
    return LOG_LABEL + canonical_json(dict(body))


def entry_hash(line: bytes) -> str:
    """SHA-256 of one log line (no newline), hex: the next entry's ``prev``."""
    return hashlib.sha256(line).hexdigest()


def sign_entry(key: ec.EllipticCurvePrivateKey, body: Mapping[str, Any]) -> bytes:
    """The signed log line for ``body`` (which holds ``schema``, ``seq`` and ``prev``)."""
    signature = key.sign(entry_signing_input(body), ec.ECDSA(hashes.SHA384()))
    return canonical_json({**body, "signature": base64.b64encode(signature).decode()})


@dataclass(frozen=True)
class LogSummary:
    """A verified log: how many entries, the hash of the last line, and the holders."""

    entries: int
    head: str
    holders: tuple[str, ...]


def verify_log_lines(lines: Sequence[bytes], key: ec.EllipticCurvePublicKey) -> LogSummary:
    """Check every entry's form, sequence number, chain link and signature.

    Raises:
        MalformedLogError: a line is not a log entry.
        LogTamperedError: a signature, sequence number or chain link does not check.
    """
    prev = GENESIS
    holders = []
    for n, line in enumerate(lines):
        where = f"log entry {n + 1}"
        doc = loads_untrusted(line, what=where, error=MalformedLogError)
        if not isinstance(doc, dict) or doc.get("schema") != LOG_SCHEMA:
            raise MalformedLogError(f"{where} is not a {LOG_SCHEMA} entry")
        sig_text = doc.pop("signature", None)
        if not isinstance(sig_text, str) or not isinstance(doc.get("holder_id"), str):
            raise MalformedLogError(f"{where} has no signature or holder id")
        try:
            signature = base64.b64decode(sig_text, validate=True)
        except (binascii.Error, ValueError):
            raise MalformedLogError(f"{where}: the signature is not base64") from None
        try:
            key.verify(signature, entry_signing_input(doc), ec.ECDSA(hashes.SHA384()))
        except InvalidSignature:
            raise LogTamperedError(f"{where}: the signature does not verify") from None
        if canonical_json({**doc, "signature": sig_text}) != line:
            raise LogTamperedError(f"{where} is not in canonical form")
        if doc.get("seq") != n:
            raise LogTamperedError(f"{where}: sequence number {doc.get('seq')!r}, expected {n}")
        if doc.get("prev") != prev:
            raise LogTamperedError(
                f"{where}: the hash chain is broken (entries removed or reordered)"
            )
        prev = entry_hash(line)
        holders.append(doc["holder_id"])
    return LogSummary(entries=len(lines), head=prev, holders=tuple(holders))


def verify_log(path: Path, key: ec.EllipticCurvePublicKey) -> LogSummary:
    """Verify the log file at ``path``.

    Raises:
        FileAccessError: unreadable.
        MalformedLogError, LogTamperedError: see :func:`verify_log_lines`.
    """
    data = read_capped(path, MAX_LOG_BYTES)
    if len(data) > MAX_LOG_BYTES:
        raise MalformedLogError(f"{path} is larger than {MAX_LOG_BYTES} bytes")
    if not data:
        raise MalformedLogError(f"{path} is empty")
    if not data.endswith(b"\n"):
        raise MalformedLogError(f"{path}: the last line is cut off")
    return verify_log_lines(data[:-1].split(b"\n"), key)
