"""A data holder's durable state in a database: answered challenges, issued challenges, records.

Two backends with one interface (a :class:`~gpucc.keyrelease.replay.ReplayStore` and more):

* :class:`SqliteState` (the default): one file, WAL journal, ``synchronous=FULL``; each claim
  is committed before it returns, so a holder killed mid-release (``kill -9``) has the
  record when it starts again, and never answers that challenge twice. Processes on one
  host may share the file.
* :class:`PostgresState`: for several holder processes or hosts serving one identity
  (``psycopg``, the ``state-postgres`` extra). The replay check is the primary key of
  ``gpucc_answered``: of two processes inserting one challenge exactly one succeeds.

Tables: answered challenges, issued challenges, records (receipts), audit records (one per
release decision, which :mod:`gpucc.holder.audit` reads) and the schema version; they, and
the migration of an older database when it is opened, are in
:mod:`gpucc.holder.state_schema`. A database of a newer schema than this code knows is
refused (:class:`StateUnavailableError`), never written. Challenges are stored as labelled
SHA-256 hashes, never as issued. The clock (seconds since the epoch) is an argument.

Retention (:mod:`gpucc.holder.state_retention`, which says why it is sound):
:meth:`housekeep <SqliteState.housekeep>` deletes, in batches, the replay rows that expired
more than :data:`HOUSEKEEPING_MARGIN_S` ago, never inside a claim; audit records and receipts
are kept until :meth:`prune <SqliteState.prune>` deletes those older than a time the operator
chooses (``gpucc holder prune``); nothing else deletes them.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpucc.core.errors import EnvironmentProblemError, FileAccessError
from gpucc.keyrelease.replay import DEFAULT_REPLAY_TTL, _replay_error

from .state_retention import (
    EXPIRED_BATCHES,
    EXPIRED_BATCHES_SKIP_LOCKED,
    HOUSEKEEPING_MARGIN_S,
    Housekeeping,
    PruneCounts,
    delete_expired,
    prune_records,
)
from .state_schema import (
    SCHEMA_VERSION,
    create_tables,
    insert_audit,
    migrate,
    stored_version,
)

__all__ = [
    "HOUSEKEEPING_MARGIN_S",
    "Housekeeping",
    "PostgresState",
    "PruneCounts",
    "SqliteState",
    "StateUnavailableError",
    "open_state",
]

_ANSWERED = b"gpucc/session/v1/answered-challenge"
_ISSUED = b"gpucc/session/v1/issued-challenge"


class StateUnavailableError(EnvironmentProblemError):
    """The holder's state database cannot be used (an offer is refused, never answered)."""


def _digest(label: bytes, challenge: bytes) -> bytes:
    return hashlib.sha256(label + challenge).digest()


class _State:
    """The SQL both backends share; ``?`` placeholders (rewritten for PostgreSQL)."""

    blob = "BLOB"
    real = "REAL"
    serial = "INTEGER PRIMARY KEY AUTOINCREMENT"
    backend = ""
    #: one housekeeping batch of each table: its expired rows (``?``: before, batch size)
    expired_batches = EXPIRED_BATCHES

    def __init__(self, *, ttl_s: float, clock: Callable[[], float]) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()

    # --- backend hooks ---------------------------------------------------------------------

    def _tx(self) -> Any:  # pragma: no cover - each backend has its own
        raise NotImplementedError

    def _is_unique_violation(self, exc: Exception) -> bool:  # pragma: no cover
        raise NotImplementedError

    def _create(self, cur: Any) -> None:
        """The tables, and an older schema migrated (inside the caller's transaction)."""
        create_tables(cur, blob=self.blob, real=self.real, serial=self.serial)
        version = stored_version(cur)
        if version > SCHEMA_VERSION:
            raise StateUnavailableError(
                f"the {self.backend} state has schema {version}, newer than this gpucc "
                f"({SCHEMA_VERSION}): upgrade gpucc, or give --state another database"
            )
        migrate(cur, version)

    # --- the replay store ------------------------------------------------------------------

    def claim(self, challenge: bytes) -> None:
        """Record ``challenge`` as answered (committed before this returns).

        Raises:
            ChallengeReplayError: it is recorded already (and not expired).
            StateUnavailableError: the database cannot be used.
        """
        now = self.clock()
        digest = _digest(_ANSWERED, challenge)
        try:
            with self._tx() as cur:  # an expired row still refuses it (see housekeep)
                cur.execute(
                    "INSERT INTO gpucc_answered (digest, expires) VALUES (?, ?)",
                    (digest, now + self.ttl_s),
                )
        except Exception as exc:
            if self._is_unique_violation(exc):
                raise _replay_error(challenge) from None
            raise self._unavailable(exc) from None

    def answered(self, challenge: bytes) -> bool:
        """Whether ``challenge`` is recorded as answered (until housekeeping deletes it)."""
        with self._tx() as cur:
            cur.execute(
                "SELECT 1 FROM gpucc_answered WHERE digest = ?", (_digest(_ANSWERED, challenge),)
            )
            return cur.fetchone() is not None

    # --- issued challenges -----------------------------------------------------------------

    def issue(self, challenge: bytes, ttl_s: float) -> None:
        """Keep ``challenge`` as issued, for ``ttl_s`` seconds."""
        now = self.clock()
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO gpucc_challenges (digest, expires) VALUES (?, ?)",
                (_digest(_ISSUED, challenge), now + ttl_s),
            )

    def take(self, challenge: bytes) -> bool | None:
        """Remove an issued ``challenge``: True if it was still valid, False if it had
        expired, None if it was never issued here (or taken already)."""
        digest = _digest(_ISSUED, challenge)
        with self._tx() as cur:  # one statement: of two processes taking it, one gets it
            cur.execute(
                "DELETE FROM gpucc_challenges WHERE digest = ? RETURNING expires", (digest,)
            )
            row = cur.fetchone()
        return None if row is None else float(row[0]) > self.clock()

    # --- retention ------------------------------------------------------------------------

    def housekeep(self, *, batch: int = 500) -> Housekeeping:
        """Delete one batch (at most ``batch`` rows per table) of issued challenges and
        answered-challenge claims that expired more than :data:`HOUSEKEEPING_MARGIN_S` ago
        (why that is sound: :mod:`gpucc.holder.state_retention`), in one transaction.

        Raises:
            StateUnavailableError: the database cannot be used.
        """
        before = self.clock() - HOUSEKEEPING_MARGIN_S
        try:
            with self._tx() as cur:
                done = delete_expired(cur, self.expired_batches, before=before, batch=batch)
        except StateUnavailableError:
            raise
        except Exception as exc:
            raise self._unavailable(exc) from None
        return done

    def prune(self, before: float, *, dry_run: bool = False) -> PruneCounts:
        """Delete the audit records and stored receipts kept before ``before`` (seconds
        since the epoch), in one transaction; with ``dry_run`` only count them.

        Raises:
            StateUnavailableError: the database cannot be used.
        """
        try:
            with self._tx() as cur:
                counts = prune_records(cur, before, dry_run=dry_run)
        except StateUnavailableError:
            raise
        except Exception as exc:
            raise self._unavailable(exc) from None
        return counts

    # --- records ---------------------------------------------------------------------------

    def put_record(self, kind: str, key: str, doc: dict[str, Any]) -> bool:
        """Keep ``doc`` under (``kind``, ``key``); False when one is kept there already."""
        body = json.dumps(doc, sort_keys=True)
        try:
            with self._tx() as cur:
                cur.execute(
                    "INSERT INTO gpucc_records (kind, key, at, body) VALUES (?, ?, ?, ?)",
                    (kind, key, self.clock(), body),
                )
        except Exception as exc:
            if self._is_unique_violation(exc):
                return False
            raise self._unavailable(exc) from None
        return True

    def count_records(self, kind: str, key_prefix: str) -> int:
        """How many records of ``kind`` have a key starting with ``key_prefix``."""
        with self._tx() as cur:
            cur.execute(
                "SELECT COUNT(*) FROM gpucc_records WHERE kind = ? AND key LIKE ?",
                (kind, key_prefix.replace("%", "").replace("_", "") + "%"),
            )
            return int(cur.fetchone()[0])

    def records(
        self, kind: str, *, since: float | None = None, limit: int = 10_000
    ) -> list[tuple[float, str, dict[str, Any]]]:
        """Records of ``kind`` (oldest first): (time, key, document)."""
        with self._tx() as cur:
            cur.execute(
                "SELECT at, key, body FROM gpucc_records WHERE kind = ? AND at >= ? "
                "ORDER BY id LIMIT ?",
                (kind, since if since is not None else 0.0, limit),
            )
            rows = cur.fetchall()
        return [(float(at), str(key), json.loads(body)) for at, key, body in rows]

    # --- audit records ---------------------------------------------------------------------

    def put_audit(self, doc: dict[str, Any]) -> float:
        """Keep one decision's audit record (``decision``, ``client``, ``requester``,
        ``transcript_hash`` are its indexed fields); the time it is kept under.

        Raises:
            StateUnavailableError: the database cannot be used.
        """
        at = self.clock()
        try:
            with self._tx() as cur:
                insert_audit(cur, at, doc)
        except StateUnavailableError:
            raise
        except Exception as exc:
            raise self._unavailable(exc) from None
        return at

    def released(self, transcript_hash: str) -> bool:
        """Whether some process sharing this state answered the session ``transcript_hash``."""
        with self._tx() as cur:
            cur.execute(
                "SELECT 1 FROM gpucc_audit WHERE transcript = ? AND decision = 'released'",
                (transcript_hash,),
            )
            return cur.fetchone() is not None

    def audit(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        limit: int = 100_000,
    ) -> list[tuple[float, dict[str, Any]]]:
        """Audit records kept at ``since <= time < until`` (oldest first): (time, document).

        Raises:
            StateUnavailableError: the database cannot be used.
        """
        try:
            with self._tx() as cur:
                cur.execute(
                    "SELECT at, body FROM gpucc_audit WHERE at >= ? AND at < ? ORDER BY id LIMIT ?",
                    (
                        since if since is not None else -1e300,
                        until if until is not None else 1e300,
                        limit,
                    ),
                )
                rows = cur.fetchall()
        except StateUnavailableError:
            raise
        except Exception as exc:
            raise self._unavailable(exc) from None
        return [(float(at), json.loads(body)) for at, body in rows]

    def _unavailable(self, exc: Exception) -> StateUnavailableError:
        detail = " ".join(str(exc).split())[:200]
        return StateUnavailableError(f"the {self.backend} state cannot be used: {detail}")


class SqliteState(_State):
    """The state in one SQLite file (created mode 0600; see the module docstring)."""

    backend = "SQLite"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        ttl_s: float = DEFAULT_REPLAY_TTL.total_seconds(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(ttl_s=ttl_s, clock=clock)
        self.path = Path(path)
        try:
            if not self.path.exists():
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            self._db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=10.0
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            with self._tx() as cur:
                self._create(cur)
        except (OSError, sqlite3.Error) as exc:
            raise FileAccessError(f"cannot use the state database {self.path}: {exc}") from None

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                self._db.rollback()
                raise
            else:
                self._db.commit()
            finally:
                cur.close()

    def _is_unique_violation(self, exc: Exception) -> bool:
        return isinstance(exc, sqlite3.IntegrityError)

    def close(self) -> None:
        self._db.close()


class PostgresState(_State):
    """The state in PostgreSQL, shared by holder processes (see the module docstring)."""

    blob = "BYTEA"
    real = "DOUBLE PRECISION"
    serial = "BIGSERIAL PRIMARY KEY"
    backend = "PostgreSQL"
    # rows another process is deleting are skipped, not waited on (no deadlock between two)
    expired_batches = EXPIRED_BATCHES_SKIP_LOCKED

    def __init__(
        self,
        dsn: str,
        *,
        ttl_s: float = DEFAULT_REPLAY_TTL.total_seconds(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(ttl_s=ttl_s, clock=clock)
        try:
            import psycopg
        except ImportError:
            raise EnvironmentProblemError(
                "a PostgreSQL state needs psycopg: pip install 'gpucc[state-postgres]'"
            ) from None
        self._psycopg = psycopg
        self._dsn = dsn
        self._db: Any = None
        with self._tx() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(4242390001)")  # one schema creator
            self._create(cur)

    def _connect(self) -> Any:
        try:
            return self._psycopg.connect(self._dsn, autocommit=False, connect_timeout=10)
        except self._psycopg.Error as exc:
            raise self._unavailable(exc) from None

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        with self._lock:
            if self._db is None or self._db.closed:
                self._db = self._connect()
            cur = self._db.cursor()
            wrapped = _Placeholders(cur)
            try:
                yield wrapped
            except BaseException:
                try:
                    self._db.rollback()
                except self._psycopg.Error:
                    self._db.close()  # reconnect on the next use
                raise
            else:
                try:
                    self._db.commit()
                except self._psycopg.Error as exc:
                    self._db.close()
                    raise self._unavailable(exc) from None
            finally:
                cur.close()

    def _is_unique_violation(self, exc: Exception) -> bool:
        return isinstance(exc, self._psycopg.errors.UniqueViolation)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()


class _Placeholders:
    """A psycopg cursor that takes the ``?`` placeholders the shared SQL uses."""

    def __init__(self, cur: Any) -> None:
        self._cur = cur

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        self._cur.execute(sql.replace("?", "%s"), params)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> Any:
        return self._cur.fetchall()

    @property
    def rowcount(self) -> int:
        return int(self._cur.rowcount)


def open_state(
    url: str, *, ttl_s: float = DEFAULT_REPLAY_TTL.total_seconds()
) -> SqliteState | PostgresState:
    """The state named by ``url``: ``postgresql://…`` (or ``postgres://…``), else a SQLite
    file path (``sqlite:`` prefix optional)."""
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresState(url, ttl_s=ttl_s)
    return SqliteState(url.removeprefix("sqlite:"), ttl_s=ttl_s)
