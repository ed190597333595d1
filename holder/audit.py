"""The holder's audit records: one per release decision, released or refused, in its state.

Each record says when, for whom (the client's address and, when the offer was signed, the
requester's key id), which challenge (its id: a labelled SHA-256, never the challenge), what
became of each dataset (released, or refused with the release policy and the unmet rule),
and which policy relaxations the release relied on (the trust record's). Records hold no
secret: no key, no challenge, no evidence. :func:`query_audit` reads them back as
:class:`AuditRecord` values (``gpucc holder receipts --state`` prints them).

Retention: :func:`prune_audit` deletes the records (and the receipts the state keeps) older
than a time the operator chooses (``gpucc holder prune``). It refuses a time in the future,
and one less than :data:`PRUNE_FLOOR` ago unless forced: the last day's records are what an
operator reads when something just went wrong. A receipt for a session whose release record
is pruned is refused from then on (409 ``unknown-session``): prune no later than your
longest job's end. Nothing else deletes audit records.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from gpucc.core.errors import UsageError

__all__ = [
    "AuditRecord",
    "AuditRecords",
    "AuditSource",
    "DatasetDecision",
    "PRUNE_FLOOR",
    "PruneFloorError",
    "PruneSource",
    "Pruned",
    "audit_document",
    "challenge_id",
    "prune_audit",
    "query_audit",
]

Decision = Literal["released", "refused"]
_CHALLENGE_ID = b"gpucc/session/v1/challenge-id"


def challenge_id(challenge: bytes) -> str:
    """The name a challenge has in audit records (hex of a labelled SHA-256)."""
    return hashlib.sha256(_CHALLENGE_ID + challenge).hexdigest()


@dataclass(frozen=True)
class DatasetDecision:
    """What one decision did with one dataset.

    Attributes:
        dataset: the dataset's name.
        decision: ``released`` or ``refused``.
        policy: the release policy that governed it (None: not recorded).
        rule: for a refusal, the unmet rule (``requester identity``, a check's name).
        detail: for a refusal, why, in one line.
    """

    dataset: str
    decision: Decision
    policy: str | None = None
    rule: str | None = None
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "decision": self.decision,
            "policy": self.policy,
            "rule": self.rule,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class AuditRecord:
    """One release decision (see the module docstring).

    Attributes:
        time: when it was kept (UTC).
        decision: ``released`` when any dataset was released, else ``refused``.
        client: the client's address (the proxy's ``X-Forwarded-For`` behind a trusted one).
        requester: the key id of the requester that signed the offer (None: not signed).
        challenge_id: :func:`challenge_id` of the offer's challenge (None: not recorded).
        transcript_hash: the answered session's transcript hash (releases only).
        datasets: each dataset's outcome.
        relaxations: the policy relaxations the release relied on.
        simulated: the release trusted a simulation's roots.
    """

    time: dt.datetime
    decision: Decision
    client: str
    requester: str | None
    challenge_id: str | None
    transcript_hash: str | None
    datasets: tuple[DatasetDecision, ...]
    relaxations: tuple[str, ...]
    simulated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "time": self.time.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "decision": self.decision,
            "client": self.client,
            "requester": self.requester,
            "challenge_id": self.challenge_id,
            "transcript_hash": self.transcript_hash,
            "datasets": [d.to_dict() for d in self.datasets],
            "relaxations": list(self.relaxations),
            "simulated": self.simulated,
        }


def audit_document(
    *,
    client: str,
    requester: str | None,
    challenge: bytes,
    released: Sequence[tuple[str, str]],
    refused: Sequence[dict[str, str]],
    trusted_with: dict[str, Any] | None = None,
    transcript_hash: str | None = None,
) -> dict[str, Any]:
    """The stored form of one decision.

    Args:
        released: (dataset, policy) of each dataset released.
        refused: ``{dataset, policy, check, detail}`` of each refused (a ``dataset``-less
            entry is a reason for the whole offer).
        trusted_with: the release's trust record (``TrustRecord.to_dict``).
    """
    record = trusted_with or {}
    datasets = [
        {"name": name, "decision": "released", "policy": policy, "rule": None, "detail": None}
        for name, policy in released
    ]
    datasets += [
        {
            "name": r.get("dataset"),
            "decision": "refused",
            "policy": r.get("policy") or None,
            "rule": r.get("check"),
            "detail": r.get("detail"),
        }
        for r in refused
    ]
    items = {str(r.get("item")) for r in record.get("relaxations") or [] if isinstance(r, dict)}
    return {
        "decision": "released" if released else "refused",
        "client": client,
        "requester": requester,
        "challenge_id": challenge_id(challenge),
        "transcript_hash": transcript_hash,
        "datasets": datasets,
        "relaxations": sorted(items),
        "simulated": bool(record.get("simulated", False)),
    }


class AuditSource(Protocol):
    """Where audit records are kept (:class:`gpucc.holder.state.SqliteState`, …)."""

    def audit(
        self, *, since: float | None = None, until: float | None = None, limit: int = 100_000
    ) -> list[tuple[float, dict[str, Any]]]: ...


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _record(at: float, doc: dict[str, Any]) -> AuditRecord:
    datasets = tuple(
        DatasetDecision(
            dataset=str(d.get("name") or "*"),
            decision="released" if d.get("decision") == "released" else "refused",
            policy=_text(d.get("policy")),
            rule=_text(d.get("rule")),
            detail=_text(d.get("detail")),
        )
        for d in doc.get("datasets") or []
        if isinstance(d, dict)
    )
    return AuditRecord(
        time=dt.datetime.fromtimestamp(at, dt.UTC),
        decision="released" if doc.get("decision") == "released" else "refused",
        client=str(doc.get("client", "")),
        requester=_text(doc.get("requester")),
        challenge_id=_text(doc.get("challenge_id")),
        transcript_hash=_text(doc.get("transcript_hash")),
        datasets=datasets,
        relaxations=tuple(str(r) for r in doc.get("relaxations") or []),
        simulated=bool(doc.get("simulated", False)),
    )


@dataclass(frozen=True)
class AuditRecords:
    """Audit records found by :func:`query_audit`, oldest first."""

    SCHEMA: ClassVar[str] = "gpucc.holder.audit/v1"

    records: tuple[AuditRecord, ...]

    def to_dict(self) -> dict[str, Any]:
        """The ``gpucc.holder.audit/v1`` document (``gpucc holder audit -f json``)."""
        return {"schema": self.SCHEMA, "records": [r.to_dict() for r in self.records]}


def query_audit(
    state: AuditSource,
    *,
    dataset: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    decision: Decision | None = None,
    requester: str | None = None,
) -> list[AuditRecord]:
    """The audit records in ``state`` that match every filter given, oldest first.

    ``dataset`` and ``decision`` select the datasets of a record: a record is kept when one
    of its datasets matches both, and keeps only those (a whole-offer refusal, named ``*``,
    matches any dataset). ``requester`` is the client's address or a prefix of the
    requester's key id (8 hex digits at least). ``since`` is inclusive, ``until`` exclusive.

    Raises:
        StateUnavailableError: the state cannot be read.
    """
    rows = state.audit(
        since=None if since is None else since.timestamp(),
        until=None if until is None else until.timestamp(),
    )
    found = []
    for at, doc in rows:
        record = _record(at, doc)
        if requester is not None and not _is_requester(record, requester):
            continue
        if dataset is not None or decision is not None:
            chosen = tuple(
                d
                for d in record.datasets
                if (dataset is None or d.dataset in (dataset, "*"))
                and (decision is None or d.decision == decision)
            )
            if not chosen:
                continue
            record = AuditRecord(**{**record.__dict__, "datasets": chosen})
        found.append(record)
    return found


def _is_requester(record: AuditRecord, wanted: str) -> bool:
    if record.client == wanted:
        return True
    key = wanted.lower().removeprefix("sha256:")
    return len(key) >= 8 and record.requester is not None and record.requester.startswith(key)


#: the most recent records :func:`prune_audit` deletes without ``force``: those this old
PRUNE_FLOOR = dt.timedelta(hours=24)


class PruneFloorError(UsageError):
    """A prune of records more recent than :data:`PRUNE_FLOOR`, not forced."""


class _Counts(Protocol):
    @property
    def audit(self) -> int: ...

    @property
    def receipts(self) -> int: ...


class PruneSource(Protocol):
    """A state whose audit records can be pruned (:class:`gpucc.holder.state.SqliteState`,
    …)."""

    def prune(self, before: float, *, dry_run: bool = False) -> _Counts: ...


@dataclass(frozen=True)
class Pruned:
    """What :func:`prune_audit` deleted (or, with ``dry_run``, would delete).

    Attributes:
        before: records kept before this time went (UTC).
        audit: audit records.
        receipts: receipts kept in the state.
        dry_run: nothing was deleted; the counts are what would be.
    """

    before: dt.datetime
    audit: int
    receipts: int
    dry_run: bool

    SCHEMA: ClassVar[str] = "gpucc.holder.prune/v1"

    def to_dict(self) -> dict[str, Any]:
        """The ``gpucc.holder.prune/v1`` document (``gpucc holder prune -f json``)."""
        return {
            "schema": self.SCHEMA,
            "before": self.before.isoformat(timespec="seconds").replace("+00:00", "Z"),
            "audit_records": self.audit,
            "receipts": self.receipts,
            "dry_run": self.dry_run,
        }


def prune_audit(
    state: PruneSource,
    before: dt.datetime,
    *,
    now: dt.datetime,
    force: bool = False,
    dry_run: bool = False,
) -> Pruned:
    """Delete the audit records and stored receipts kept before ``before``, in one
    transaction (``dry_run``: count them only).

    Raises:
        UsageError: ``before`` is after ``now``.
        PruneFloorError: ``before`` is less than :data:`PRUNE_FLOOR` before ``now`` and not
            ``force``.
        StateUnavailableError: the state cannot be used.
    """
    if before.tzinfo is None:
        raise UsageError("the time to prune before needs a time zone")
    if before > now:
        raise UsageError(f"{_iso(before)} is in the future (now {_iso(now)})")
    if not force and before > now - PRUNE_FLOOR:
        hours = PRUNE_FLOOR.total_seconds() / 3600
        raise PruneFloorError(
            f"{_iso(before)} is less than {hours:g} hours ago (now {_iso(now)}): the records "
            "of the last day are kept unless forced"
        )
    counts = state.prune(before.timestamp(), dry_run=dry_run)
    return Pruned(
        before=before.astimezone(dt.UTC),
        audit=counts.audit,
        receipts=counts.receipts,
        dry_run=dry_run,
    )


def _iso(at: dt.datetime) -> str:
    return at.astimezone(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
