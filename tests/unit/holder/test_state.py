"""The holder's durable state against real databases: a SQLite file, and a PostgreSQL server
started from Debian's package; several connections (processes' worth) racing for one
challenge, of which exactly one wins."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpucc.holder.state import (
    HOUSEKEEPING_MARGIN_S,
    Housekeeping,
    PostgresState,
    PruneCounts,
    SqliteState,
    StateUnavailableError,
    open_state,
)
from gpucc.keyrelease.replay import ChallengeReplayError
from tests.support.postgres import postgres_server

Factory = Callable[..., SqliteState | PostgresState]


@pytest.fixture(scope="module")
def pg_dsn() -> Iterator[str]:
    with postgres_server() as dsn:
        yield dsn


@pytest.fixture(params=["sqlite", "postgres"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    if request.param == "sqlite":
        path = tmp_path / "state.sqlite3"
        return lambda **kw: SqliteState(path, **kw)
    dsn = request.getfixturevalue("pg_dsn")
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as db:  # each test starts empty
        tables = ("gpucc_answered", "gpucc_challenges", "gpucc_records", "gpucc_audit")
        for table in (*tables, "gpucc_meta"):
            db.execute(f"DROP TABLE IF EXISTS {table}")
    return lambda **kw: PostgresState(dsn, **kw)


def test_a_challenge_is_claimed_once_across_connections(make: Factory) -> None:
    a, b = make(), make()
    a.claim(b"c" * 32)
    with pytest.raises(ChallengeReplayError):
        b.claim(b"c" * 32)
    assert a.answered(b"c" * 32) and b.answered(b"c" * 32) and not b.answered(b"d" * 32)


def test_an_answered_record_outlives_its_ttl_by_the_margin(make: Factory) -> None:
    now = [1000.0]
    state = make(ttl_s=60, clock=lambda: now[0])
    state.claim(b"e" * 32)
    now[0] += 61
    with pytest.raises(ChallengeReplayError):  # expired, but a claim never replaces its row
        state.claim(b"e" * 32)
    assert state.housekeep() == Housekeeping(challenges=0, answered=0, batch=500)
    assert state.answered(b"e" * 32)
    now[0] += HOUSEKEEPING_MARGIN_S
    assert state.housekeep() == Housekeeping(challenges=0, answered=1, batch=500)
    assert not state.answered(b"e" * 32)
    state.claim(b"e" * 32)  # remembered for its TTL and the margin, then forgotten


def test_housekeeping_deletes_expired_rows_in_batches(make: Factory) -> None:
    now = [1000.0]
    old = make(ttl_s=100, clock=lambda: now[0])
    for n in range(7):
        old.claim(n.to_bytes(32, "big"))
        old.issue(n.to_bytes(32, "big"), 50)
    now[0] += 90
    old.claim(b"k" * 32)  # expires at 1190: kept
    old.issue(b"k" * 32, 3600)
    now[0] = 1100 + HOUSEKEEPING_MARGIN_S  # the first seven expired (at 1050, 1100) past it
    done = [old.housekeep(batch=3) for _ in range(4)]
    assert [(d.challenges, d.answered, d.more) for d in done] == [
        (3, 3, True), (3, 3, True), (1, 1, False), (0, 0, False),
    ]  # fmt: skip
    assert old.answered(b"k" * 32) and not old.answered(b"\0" * 32)
    with pytest.raises(ChallengeReplayError):
        old.claim(b"k" * 32)
    # within the margin: kept (and refused as expired); past it: gone
    assert old.take(b"k" * 32) is False and old.take((0).to_bytes(32, "big")) is None


def test_prune_deletes_audit_records_and_receipts_before_a_time(make: Factory) -> None:
    now = [1000.0]
    state = make(clock=lambda: now[0])
    for t in (1000.0, 2000.0, 3000.0):
        now[0] = t
        state.put_audit({"decision": "released", "client": str(t), "transcript_hash": str(t)})
        state.put_record("receipt", f"{t}:k:1", {"seq": 1})
    state.claim(b"p" * 32)
    assert state.prune(2500.0, dry_run=True) == PruneCounts(audit=2, receipts=2)
    assert len(state.audit()) == 3 and state.count_records("receipt", "") == 3
    assert state.prune(2000.0) == PruneCounts(audit=1, receipts=1)
    assert [d["client"] for _, d in state.audit()] == ["2000.0", "3000.0"]
    assert [k for _, k, _ in state.records("receipt")] == ["2000.0:k:1", "3000.0:k:1"]
    assert not state.released("1000.0") and state.released("2000.0")
    assert state.answered(b"p" * 32)  # the replay record is not the operator's to prune
    assert state.prune(2000.0) == PruneCounts(audit=0, receipts=0)


def test_issued_challenges_are_taken_once_by_any_connection(make: Factory) -> None:
    now = [1000.0]
    a, b = make(clock=lambda: now[0]), make(clock=lambda: now[0])
    a.issue(b"x" * 32, 30)
    a.issue(b"y" * 32, 30)
    assert b.take(b"x" * 32) is True
    assert a.take(b"x" * 32) is None  # taken already
    now[0] += 31
    assert b.take(b"y" * 32) is False  # expired
    assert b.take(b"z" * 32) is None


def test_records_are_kept_once_per_key(make: Factory) -> None:
    state = make()
    assert state.put_record("receipt", "ab:1", {"seq": 1})
    assert not state.put_record("receipt", "ab:1", {"seq": 2})
    assert state.put_record("receipt", "ab:2", {"seq": 2})
    state.put_record("decision", "release:ab", {"event": "release"})
    assert [doc for _, _, doc in state.records("receipt")] == [{"seq": 1}, {"seq": 2}]
    assert state.count_records("receipt", "ab") == 2 and state.count_records("receipt", "c") == 0


def _sql(state: SqliteState | PostgresState, *statements: str) -> None:
    with state._tx() as cur:
        for statement in statements:
            cur.execute(statement)


def test_a_schema_1_database_is_migrated_when_opened(make: Factory) -> None:
    old = make()
    # what gpucc wrote before audit records: decisions among the records, no audit table
    old.put_record(
        "decision",
        "release:" + "ab" * 48,
        {"event": "release", "client": "10.0.0.1", "released": ["a"],
         "withheld": [{"dataset": "b", "policy": "p", "check": "driver", "detail": "d"}],
         "trusted_with": {"relaxations": [{"item": "ocsp.require: false"}], "simulated": True}},
    )  # fmt: skip
    old.put_record("decision", "refusal:1", {"event": "refusal", "client": "10.0.0.2"})
    _sql(old, "DROP TABLE gpucc_audit", "DROP TABLE gpucc_meta")
    old.close()
    state = make()
    (release, refusal) = [doc for _, doc in state.audit()]
    assert release["decision"] == "released" and release["transcript_hash"] == "ab" * 48
    assert [d["decision"] for d in release["datasets"]] == ["released", "refused"]
    assert release["relaxations"] == ["ocsp.require: false"] and release["simulated"]
    assert refusal["decision"] == "refused" and refusal["client"] == "10.0.0.2"
    assert state.released("ab" * 48) and not state.released("cd" * 48)
    assert state.count_records("decision", "") == 0  # moved, not copied
    state.close()
    assert len(make().audit()) == 2  # migrated once


def test_a_newer_schema_is_refused_not_written(make: Factory) -> None:
    state = make()
    _sql(state, "UPDATE gpucc_meta SET value = '99' WHERE name = 'schema'")
    state.close()
    with pytest.raises(StateUnavailableError, match="schema 99, newer than this gpucc"):
        make()


def test_audit_records_by_time(make: Factory) -> None:
    now = [1000.0]
    state = make(clock=lambda: now[0])
    for t in (1000.0, 2000.0, 3000.0):
        now[0] = t
        state.put_audit({"decision": "refused", "client": str(t), "datasets": []})
    assert [d["client"] for _, d in state.audit(since=2000.0)] == ["2000.0", "3000.0"]
    assert [d["client"] for _, d in state.audit(until=2000.0)] == ["1000.0"]


def test_racing_claims_have_one_winner(make: Factory) -> None:
    states = [make() for _ in range(6)]
    wins: list[int] = []
    start = threading.Barrier(len(states))

    def race(i: int) -> None:
        start.wait()
        for n in range(40):
            try:
                states[i].claim(n.to_bytes(32, "big"))
                wins.append(n)
            except ChallengeReplayError:
                pass

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(states))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == list(range(40))  # each challenge answered exactly once


def test_the_sqlite_file_is_private_and_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    state = open_state(f"sqlite:{path}")
    assert isinstance(state, SqliteState)
    state.claim(b"w" * 32)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert state._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_an_unreachable_postgres_is_a_typed_error() -> None:
    pytest.importorskip("psycopg")
    from tests.support.netfixtures import free_port

    with pytest.raises(StateUnavailableError, match="PostgreSQL state cannot be used"):
        PostgresState(f"postgresql://postgres@127.0.0.1:{free_port()}/postgres")


def test_housekeeping_races_claims_and_other_housekeepers(make: Factory) -> None:
    """Several connections deleting expired rows while others claim: every expired row goes
    once, no claim fails (on PostgreSQL a batch skips the rows another is deleting)."""
    old = make(clock=lambda: 0.0)  # its claims expired 30 days after the epoch
    for n in range(300):
        old.claim(b"old" + n.to_bytes(29, "big"))
    sweepers, claimers = [make() for _ in range(3)], [make() for _ in range(3)]
    deleted: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(len(sweepers) + len(claimers))

    def sweep(state: SqliteState | PostgresState) -> None:
        start.wait()
        try:
            while True:
                done = state.housekeep(batch=20)
                deleted.append(done.answered)
                if not done.answered:
                    break
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    def claim(i: int, state: SqliteState | PostgresState) -> None:
        start.wait()
        try:
            for n in range(30):
                state.claim(b"new" + (i * 100 + n).to_bytes(29, "big"))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=sweep, args=(s,)) for s in sweepers]
    threads += [threading.Thread(target=claim, args=(i, s)) for i, s in enumerate(claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and sum(deleted) == 300
    check = make()
    assert all(check.answered(b"new" + (i * 100 + n).to_bytes(29, "big"))
               for i in range(3) for n in range(30))  # fmt: skip
    assert not check.answered(b"old" + (0).to_bytes(29, "big"))
