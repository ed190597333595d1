"""The tables of a holder's state (:mod:`gpucc.holder.state`) and the migration of an older
schema.

Tables: ``gpucc_answered`` (a hash of each answered challenge and when its record expires),
``gpucc_challenges`` (challenges issued and not yet used, so that an offer may reach another
process than the one that issued its challenge, or the same one after a restart), and
``gpucc_records`` (documents by kind and key, each kept once: receipts), ``gpucc_audit`` (one
record per release decision, released or refused: when, for which client and requester, the
JSON document; :mod:`gpucc.holder.audit` reads them) and ``gpucc_meta`` (the schema version).

An older database (schema 1: decisions kept in ``gpucc_records`` under kind ``decision``) is
migrated when it is opened, in one transaction: it gains ``gpucc_audit`` and ``gpucc_meta``,
and its decisions move into ``gpucc_audit``. The state refuses a database of a newer schema
than :data:`SCHEMA_VERSION`, and never writes it.

The functions here run their SQL on a cursor inside the caller's transaction (``?``
placeholders).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["SCHEMA_VERSION", "create_tables", "insert_audit", "migrate", "stored_version"]

#: the schema this code writes (1: before the audit table)
SCHEMA_VERSION = 2


def create_tables(cur: Any, *, blob: str, real: str, serial: str) -> None:
    """Create the tables and indexes that do not exist yet, with the backend's column types
    (``blob``, ``real``, and ``serial``: an auto-incremented primary key)."""
    for statement in (
        f"CREATE TABLE IF NOT EXISTS gpucc_answered (digest {blob} PRIMARY KEY, "
        f"expires {real} NOT NULL)",
        "CREATE INDEX IF NOT EXISTS gpucc_answered_expires ON gpucc_answered (expires)",
        f"CREATE TABLE IF NOT EXISTS gpucc_challenges (digest {blob} PRIMARY KEY, "
        f"expires {real} NOT NULL)",
        "CREATE INDEX IF NOT EXISTS gpucc_challenges_expires ON gpucc_challenges (expires)",
        f"CREATE TABLE IF NOT EXISTS gpucc_records (id {serial}, kind TEXT NOT NULL, "
        f"key TEXT NOT NULL, at {real} NOT NULL, body TEXT NOT NULL, "
        "UNIQUE (kind, key))",
        f"CREATE TABLE IF NOT EXISTS gpucc_audit (id {serial}, at {real} NOT NULL, "
        "decision TEXT NOT NULL, client TEXT NOT NULL, requester TEXT, transcript TEXT, "
        "body TEXT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS gpucc_audit_at ON gpucc_audit (at)",
        "CREATE INDEX IF NOT EXISTS gpucc_audit_transcript ON gpucc_audit (transcript)",
        "CREATE TABLE IF NOT EXISTS gpucc_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ):
        cur.execute(statement)


def stored_version(cur: Any) -> int:
    """The schema of the database (1 when ``gpucc_meta`` names none)."""
    cur.execute("SELECT value FROM gpucc_meta WHERE name = 'schema'")
    row = cur.fetchone()
    return int(row[0]) if row is not None else 1


def migrate(cur: Any, version: int) -> None:
    """Bring a database of schema ``version`` (at most :data:`SCHEMA_VERSION`) to this one."""
    if version < 2:
        cur.execute("SELECT at, key, body FROM gpucc_records WHERE kind = 'decision' ORDER BY id")
        for at, key, body in cur.fetchall():
            insert_audit(cur, float(at), _from_schema_1(str(key), json.loads(body)))
        cur.execute("DELETE FROM gpucc_records WHERE kind = 'decision'")
        cur.execute(
            "INSERT INTO gpucc_meta (name, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),)
        )


def insert_audit(cur: Any, at: float, doc: dict[str, Any]) -> None:
    """Keep one decision's audit record, kept at ``at``, with its indexed fields."""
    cur.execute(
        "INSERT INTO gpucc_audit (at, decision, client, requester, transcript, body) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (
            at,
            str(doc.get("decision", "")),
            str(doc.get("client", "")),
            doc.get("requester"),
            doc.get("transcript_hash"),
            json.dumps(doc, sort_keys=True),
        ),
    )


def _from_schema_1(key: str, old: dict[str, Any]) -> dict[str, Any]:
    """A decision kept by schema 1 (``release:<transcript>`` or ``refusal:<random>``) as an
    audit record; what schema 1 did not keep (challenge, requester) is null."""
    released = key.startswith("release:")
    datasets: list[dict[str, Any]] = [
        {"name": str(n), "decision": "released", "policy": None, "rule": None, "detail": None}
        for n in old.get("released") or []
    ]
    for reason in old.get("withheld") or old.get("reasons") or []:
        datasets.append(
            {
                "name": reason.get("dataset"),
                "decision": "refused",
                "policy": reason.get("policy"),
                "rule": reason.get("check"),
                "detail": reason.get("detail"),
            }
        )
    relaxations = (old.get("trusted_with") or {}).get("relaxations") or []
    return {
        "decision": "released" if released else "refused",
        "client": str(old.get("client", "")),
        "requester": None,
        "challenge_id": None,
        "transcript_hash": key.removeprefix("release:") if released else None,
        "datasets": datasets,
        "relaxations": sorted({str(r.get("item")) for r in relaxations if isinstance(r, dict)}),
        "simulated": bool((old.get("trusted_with") or {}).get("simulated", False)),
        "migrated_from_schema": 1,
    }
