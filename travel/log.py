"""The hand-over log (``travel-log.jsonl``): one signed, hash-chained entry per visit.

Each line is the canonical JSON (:func:`gpucc.travel.signing.canonical_json`) of an entry::

    {"schema": "gpucc.travel-log/v1", "seq": n, "prev": hex, ..., "signature": base64}

* ``prev`` is ``SHA-256(line n-1)`` over the previous line's exact bytes (without its
  newline); the first entry has 64 zeros.
* ``signature`` is DER ECDSA-P384-SHA384 by the orchestrator's key over
  ``"gpucc/travel-log/v1" || 0x00 || canonical_json(entry without "signature")``.

The last entry closes the journey (``"kind": "closing"``): how many visits were planned,
how many were done, the head it closes (the hash of the last visit entry) and whether the
journey completed. A log without it was cut at its end (or its run was killed). What a
chain cannot show, that entries were removed from its end *with* the closing entry, is
caught by comparing with a head hash kept elsewhere (``expect_head``) or with a holder's
receipt (:mod:`gpucc.travel.receipt`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.core.files import read_capped
from gpucc.core.jsonio import loads_untrusted

from .errors import LogTamperedError, MalformedLogError
from .receipt import Receipt
from .signing import canonical_json

__all__ = [
    "CLOSING",
    "GENESIS",
    "LOG_LABEL",
    "LOG_SCHEMA",
    "LogSummary",
    "entry_hash",
    "entry_signing_input",
    "closing_entry",
    "sign_entry",
    "verify_log",
    "verify_log_lines",
]

LOG_SCHEMA = "gpucc.travel-log/v1"
LOG_LABEL = b"gpucc/travel-log/v1\x00"
GENESIS = "0" * 64
CLOSING = "closing"
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


def closing_entry(
    *, seq: int, prev: str, orchestrator_key_id: str, planned: int, done: int, finished: str
) -> dict[str, Any]:
    """The unsigned closing entry after ``done`` of ``planned`` visits (``prev``: the head)."""
    return {
        "schema": LOG_SCHEMA,
        "kind": CLOSING,
        "seq": seq,
        "prev": prev,
        "orchestrator_key_id": orchestrator_key_id,
        "visits_planned": planned,
        "visits_done": done,
        "head": prev,
        "complete": done == planned,
        "finished": finished,
    }


@dataclass(frozen=True)
class LogSummary:
    """A verified log.

    Attributes:
        entries: visit entries (the closing entry not counted).
        head: SHA-256 of the last line (the closing entry's, when there is one).
        holders: the visited holders, in order.
        entry_hashes: SHA-256 of each visit entry's line, in order.
        planned: visits the closing entry says were planned (``None``: no closing entry).
        complete: the closing entry says every planned visit was done.
    """

    entries: int
    head: str
    holders: tuple[str, ...]
    entry_hashes: tuple[str, ...] = ()
    planned: int | None = None
    complete: bool = False

    SCHEMA: ClassVar[str] = "gpucc.travel.verify-log/v1"

    def to_dict(self, *, head_checked: bool, receipts_checked: int) -> dict[str, Any]:
        """The ``gpucc.travel.verify-log/v1`` document: this summary, and whether the head
        was compared with one kept elsewhere and how many receipts were checked."""
        return {
            "schema": self.SCHEMA,
            "entries": self.entries,
            "planned": self.planned,
            "complete": self.complete,
            "holders": list(self.holders),
            "head": self.head,
            "head_checked": head_checked,
            "receipts_checked": receipts_checked,
        }

    @property
    def closed(self) -> bool:
        """Whether the log ends with its closing entry."""
        return self.planned is not None


def _check_closing(doc: dict[str, Any], where: str, prev: str, done: int) -> int:
    planned = doc.get("visits_planned")
    numbers = (planned, doc.get("visits_done"))
    if any(isinstance(n, bool) or not isinstance(n, int) for n in numbers):
        raise MalformedLogError(f"{where}: the closing entry's counts are not integers")
    assert isinstance(planned, int)
    if doc.get("visits_done") != done or doc.get("head") != prev or not 0 <= done <= planned:
        raise LogTamperedError(
            f"{where}: the closing entry does not match the {done} visit entries before it"
        )
    if doc.get("complete") is not (done == planned):
        raise LogTamperedError(f"{where}: the closing entry's 'complete' is wrong")
    return planned


def verify_log_lines(
    lines: Sequence[bytes],
    key: ec.EllipticCurvePublicKey,
    *,
    require_closed: bool = True,
    expect_head: str | None = None,
    receipts: Sequence[Receipt] = (),
) -> LogSummary:
    """Check every entry's form, sequence number, chain link and signature, the closing
    entry, and the log against a head hash and holders' receipts kept elsewhere.

    Raises:
        MalformedLogError: a line is not a log entry.
        LogTamperedError: a signature, sequence number or chain link does not check; no
            closing entry (with ``require_closed``); another head than ``expect_head``; a
            receipt that does not match the log (entries removed or replaced).
    """
    summary = _verify_chain(lines, key)
    if require_closed and not summary.closed:
        raise LogTamperedError(
            "the log has no closing entry: it was cut at its end (or its run was killed)"
        )
    if expect_head is not None and not hmac.compare_digest(
        summary.head.encode(), expect_head.strip().lower().encode()
    ):
        raise LogTamperedError(
            f"the log's head {summary.head[:16]}… is not the expected head "
            f"{expect_head.strip()[:16]}…: entries were removed or replaced"
        )
    for receipt in receipts:
        receipt.verify(key)
        where = f"holder {receipt.holder_id}'s receipt for entry {receipt.seq + 1}"
        if receipt.seq >= summary.entries:
            raise LogTamperedError(
                f"{where}: the log has only {summary.entries} visit entries (cut back)"
            )
        if summary.entry_hashes[receipt.seq] != receipt.entry_hash:
            raise LogTamperedError(f"{where}: the log holds another entry there")
        if summary.holders[receipt.seq] != receipt.holder_id:
            raise LogTamperedError(f"{where}: the log names another holder there")
    return summary


def _verify_chain(lines: Sequence[bytes], key: ec.EllipticCurvePublicKey) -> LogSummary:
    prev = GENESIS
    holders: list[str] = []
    digests: list[str] = []
    planned: int | None = None
    for n, line in enumerate(lines):
        where = f"log entry {n + 1}"
        if planned is not None:
            raise LogTamperedError(f"{where} follows the closing entry")
        doc = loads_untrusted(line, what=where, error=MalformedLogError)
        if not isinstance(doc, dict) or doc.get("schema") != LOG_SCHEMA:
            raise MalformedLogError(f"{where} is not a {LOG_SCHEMA} entry")
        closing = doc.get("kind") == CLOSING
        sig_text = doc.pop("signature", None)
        if not isinstance(sig_text, str) or not (closing or isinstance(doc.get("holder_id"), str)):
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
        if doc.get("seq") != n or isinstance(doc.get("seq"), bool):
            raise LogTamperedError(f"{where}: sequence number {doc.get('seq')!r}, expected {n}")
        if doc.get("prev") != prev:
            raise LogTamperedError(
                f"{where}: the hash chain is broken (entries removed or reordered)"
            )
        if closing:
            planned = _check_closing(doc, where, prev, len(holders))
        else:
            holders.append(doc["holder_id"])
            digests.append(entry_hash(line))
        prev = entry_hash(line)
    return LogSummary(
        entries=len(holders),
        head=prev,
        holders=tuple(holders),
        entry_hashes=tuple(digests),
        planned=planned,
        complete=planned is not None and planned == len(holders),
    )


def verify_log(
    path: Path,
    key: ec.EllipticCurvePublicKey,
    *,
    require_closed: bool = True,
    expect_head: str | None = None,
    receipts: Sequence[Receipt] = (),
) -> LogSummary:
    """Verify the log file at ``path`` (see :func:`verify_log_lines`).

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
    return verify_log_lines(
        data[:-1].split(b"\n"),
        key,
        require_closed=require_closed,
        expect_head=expect_head,
        receipts=receipts,
    )
