"""Retention of a holder's state (:mod:`gpucc.holder.state`): what is deleted, when, and why
that is sound; the value objects of a housekeeping batch and of a prune.

Rows that only serve the replay check are deleted by :meth:`housekeep
<gpucc.holder.state.SqliteState.housekeep>`, in batches of at most ``batch`` rows per
table and transaction (the holder service runs it in the background; ``gpucc session
answer`` runs one batch after it answers), never inside a claim. A row goes only when it
expired more than :data:`HOUSEKEEPING_MARGIN_S` ago by the clock of the process deleting it.
This is sound:

* An answered challenge can be presented again only while an issued copy of it is valid
  somewhere. The shared copy (``gpucc_challenges``) is taken once (a ``DELETE ...
  RETURNING``: of two processes one gets it); the issuing process's own copy, in memory,
  lives at most the challenge TTL (``--challenge-ttl``, at most an hour). The claim lives
  ``ttl_s`` (30 days) from the clock of the process that made it, and the holder service
  refuses a state whose ``ttl_s`` is not longer than the challenge TTL plus the margin.
  The margin absorbs clock skew between processes sharing PostgreSQL: a deleting process
  whose clock is ahead of the claiming one's by less than an hour deletes nothing early.
* A claim is never replaced by a new one while its row exists, expired or not (the
  primary key refuses the insert), so a claim is only ever re-made after housekeeping
  removed a row more than 30 days old.
* ``gpucc session answer --challenge C`` has no issued copy: the challenge is the
  holder's own, and a holder must never reuse one; a claim is remembered for 30 days
  (plus the margin), as the file store does (docs/PROTOCOL.md, "Replay store").
* Deleting an issued challenge (``gpucc_challenges``) past its expiry can only refuse an
  offer ("unknown challenge"), never answer one; the margin keeps a skewed clock from
  refusing an honest one.

Audit records and receipts are kept until :meth:`prune <gpucc.holder.state.SqliteState.prune>`
deletes those older than a time the operator chooses (``gpucc holder prune``); nothing else
deletes them.

The functions here run their SQL on a cursor inside the caller's transaction (``?``
placeholders); the state classes open it and turn a database's failure into
:class:`~gpucc.holder.state.StateUnavailableError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "EXPIRED_BATCHES",
    "EXPIRED_BATCHES_SKIP_LOCKED",
    "HOUSEKEEPING_MARGIN_S",
    "Housekeeping",
    "PruneCounts",
    "delete_expired",
    "prune_records",
]

#: seconds past its expiry before housekeeping deletes a replay row (clock skew between
#: processes sharing one database stays well under it)
HOUSEKEEPING_MARGIN_S = 3600.0

#: one housekeeping batch of each table: its expired rows (``?``: before, batch size)
EXPIRED_BATCHES = (
    "DELETE FROM gpucc_challenges WHERE digest IN (SELECT digest FROM gpucc_challenges "
    "WHERE expires <= ? ORDER BY expires LIMIT ?)",
    "DELETE FROM gpucc_answered WHERE digest IN (SELECT digest FROM gpucc_answered "
    "WHERE expires <= ? ORDER BY expires LIMIT ?)",
)
#: the same for PostgreSQL: rows another process is deleting are skipped, not waited on
#: (no deadlock between two)
EXPIRED_BATCHES_SKIP_LOCKED = (
    "DELETE FROM gpucc_challenges WHERE digest IN (SELECT digest FROM gpucc_challenges "
    "WHERE expires <= ? ORDER BY expires LIMIT ? FOR UPDATE SKIP LOCKED)",
    "DELETE FROM gpucc_answered WHERE digest IN (SELECT digest FROM gpucc_answered "
    "WHERE expires <= ? ORDER BY expires LIMIT ? FOR UPDATE SKIP LOCKED)",
)

#: what a prune counts (dry run) or deletes, by name: (count, delete); ``?``: before
_PRUNED = {
    "audit": (
        "SELECT COUNT(*) FROM gpucc_audit WHERE at < ?",
        "DELETE FROM gpucc_audit WHERE at < ?",
    ),
    "receipts": (
        "SELECT COUNT(*) FROM gpucc_records WHERE kind = 'receipt' AND at < ?",
        "DELETE FROM gpucc_records WHERE kind = 'receipt' AND at < ?",
    ),
}


@dataclass(frozen=True)
class Housekeeping:
    """What one housekeeping batch deleted.

    Attributes:
        challenges: issued challenges, never taken, expired past the margin.
        answered: answered-challenge claims expired past the margin.
        batch: the most rows a table could lose in this batch (a table that lost as many
            may have more to lose: :attr:`more`).
    """

    challenges: int
    answered: int
    batch: int

    @property
    def more(self) -> bool:
        """Whether a table lost a full batch (another batch may find more)."""
        return max(self.challenges, self.answered) >= self.batch


@dataclass(frozen=True)
class PruneCounts:
    """Audit records and stored receipts kept before a time: deleted, or counted only."""

    audit: int
    receipts: int


def delete_expired(
    cur: Any, statements: tuple[str, str], *, before: float, batch: int
) -> Housekeeping:
    """Run one housekeeping batch (``statements``: :data:`EXPIRED_BATCHES` or its PostgreSQL
    form) for rows that expired at or before ``before``."""
    deleted = []
    for statement in statements:
        cur.execute(statement, (before, batch))
        deleted.append(max(cur.rowcount, 0))
    return Housekeeping(challenges=deleted[0], answered=deleted[1], batch=batch)


def prune_records(cur: Any, before: float, *, dry_run: bool) -> PruneCounts:
    """Delete (or with ``dry_run`` count) the audit records and stored receipts kept before
    ``before`` (seconds since the epoch)."""
    counts: dict[str, int] = {}
    for name, (count, delete) in _PRUNED.items():
        if dry_run:
            cur.execute(count, (before,))
            counts[name] = int(cur.fetchone()[0])
        else:
            cur.execute(delete, (before,))
            counts[name] = max(cur.rowcount, 0)
    return PruneCounts(**counts)
