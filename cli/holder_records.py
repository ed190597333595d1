"""``gpucc holder receipts`` and ``gpucc holder prune``: the records a holder keeps.

``receipts`` shows the orchestrator's signed receipts kept in ``--receipt-dir``, or the audit
records of a state database (``--state``: every release decision, filtered by dataset, time,
decision or requester); ``prune`` deletes the audit records and stored receipts kept before a
time. With ``--state`` both open an existing database only (neither creates one).
:mod:`gpucc.cli.holder` registers both commands on its group.
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpucc.core.errors import UsageError

from .options import FormatOption, OutputFormat
from .output import emit, note, out, write_stdout
from .terminal import safe_text

if TYPE_CHECKING:
    from gpucc.holder.state import PostgresState, SqliteState

    HolderState = SqliteState | PostgresState

__all__ = ["Decision", "prune_cmd", "receipts_cmd"]


def _trusted(record: dict[str, Any]) -> str:
    """A receipt's record of the release, in a few words."""
    items = sorted({str(r.get("item")) for r in record.get("relaxations") or []})
    text = "; ".join(items) if items else "no policy relaxation"
    return text + ("; SIMULATED roots" if record.get("simulated") else "")


class Decision(StrEnum):
    """``--decision``."""

    RELEASED = "released"
    REFUSED = "refused"


def receipts_cmd(
    receipt_dir: Annotated[
        Path | None,
        typer.Option(
            "--receipt-dir",
            exists=True,
            file_okay=False,
            help="The service's --receipt-dir: show the orchestrator's receipts kept there.",
        ),
    ] = None,
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            metavar="URL",
            help="The service's --state (a SQLite file or postgresql://...): show its audit "
            "records, one per release decision.",
        ),
    ] = None,
    dataset: Annotated[
        str | None, typer.Option("--dataset", help="Only decisions about this dataset.")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", metavar="TIME", help="Only decisions at or after (ISO 8601)."),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", metavar="TIME", help="Only decisions before (ISO 8601)."),
    ] = None,
    decision: Annotated[
        Decision | None, typer.Option("--decision", help="Only datasets released, or refused.")
    ] = None,
    requester: Annotated[
        str | None,
        typer.Option(
            "--requester",
            help="Only this client address, or the requester key id starting so (8+ hex).",
        ),
    ] = None,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Show the receipts this holder kept: for each visit, the log entry index and hash the
    orchestrator signed (give the file to `gpucc travel verify-log --receipt`); with --state,
    its audit records: every release decision, released or refused, with the requester, each
    dataset's outcome, the unmet rule of a refusal and the relaxations a release used."""
    if (receipt_dir is None) == (state is None):
        raise UsageError("give --receipt-dir (receipts) or --state (audit records), one of them")
    filters = (dataset, since, until, decision, requester)
    if state is None:
        if any(f is not None for f in filters):
            raise UsageError("--dataset, --since, --until, --decision, --requester need --state")
        assert receipt_dir is not None
        _receipt_files(receipt_dir, fmt)
        return
    _audit_records(
        state,
        fmt,
        dataset=dataset,
        since=None if since is None else _time("--since", since),
        until=None if until is None else _time("--until", until),
        decision=None if decision is None else decision.value,
        requester=requester,
    )


def _time(option: str, text: str) -> dt.datetime:
    from .options import parse_time

    try:
        return parse_time(text)
    except UsageError:
        raise UsageError(f"{option} {text!r} is not an ISO 8601 time or Unix seconds") from None


def _open_existing_state(url: str) -> HolderState:
    """The state named by ``url``; a SQLite file must exist (a query never creates one)."""
    from gpucc.core.errors import FileAccessError
    from gpucc.holder.state import open_state

    if url == "memory":
        raise UsageError("--state memory keeps no audit records: give the service's database")
    if not url.startswith(("postgresql://", "postgres://")):
        path = Path(url.removeprefix("sqlite:"))
        if path.is_dir():
            raise FileAccessError(f"--state {path} is a directory, not a state database")
        if not path.is_file():
            raise FileAccessError(f"--state {path}: no such state database")
    return open_state(url)


def _audit_records(url: str, fmt: OutputFormat, **filters: Any) -> None:
    from gpucc.holder.audit import query_audit

    holder_state = _open_existing_state(url)
    try:
        found = query_audit(holder_state, **filters)
    finally:
        holder_state.close()
    if fmt is OutputFormat.JSON:
        from gpucc.holder.audit import AuditRecords

        emit(AuditRecords(tuple(found)).to_dict())
        return
    headers = ("TIME", "DECISION", "DATASET", "RULE", "REQUESTER", "CLIENT", "CHALLENGE")
    rows = [
        (
            r.time.isoformat(timespec="seconds").replace("+00:00", "Z"),
            d.decision,
            d.dataset,
            d.rule or "-",
            (r.requester or "-")[:16],
            r.client,
            (r.challenge_id or "-")[:16],
            "; ".join(r.relaxations) or "-",
        )
        for r in found
        for d in r.datasets
    ]
    cells = [tuple(safe_text(c) for c in row) for row in rows]
    head = (*headers, "RELAXATIONS")
    widths = [max(len(row[i]) for row in [head, *cells]) for i in range(len(head) - 1)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in [head, *cells]
    ]
    write_stdout("".join(line.rstrip() + "\n" for line in lines))
    note(f"{len(found)} decision(s); -f json gives each refusal's detail")


def prune_cmd(
    state: Annotated[
        str,
        typer.Option(
            "--state",
            metavar="URL",
            help="The service's --state (a SQLite file, which must exist, or postgresql://...).",
        ),
    ],
    before: Annotated[
        str,
        typer.Option(
            "--before",
            metavar="TIME",
            help="Delete the audit records and receipts kept before this time (ISO 8601 or "
            "Unix seconds); at least 24 hours ago unless --force, never in the future.",
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be deleted; delete nothing.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Also prune records of the last 24 hours.")
    ] = False,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Delete the audit records (and the receipts the state keeps) older than --before, in one
    transaction, and say how many. Expired answered challenges need no pruning: the service
    deletes them itself, once no challenge they protect can be answered."""
    from gpucc.holder.audit import PruneFloorError, prune_audit

    if not before.strip():
        raise UsageError("--before needs a time (ISO 8601 or Unix seconds)")
    at = _time("--before", before)
    holder_state = _open_existing_state(state)
    try:
        done = prune_audit(
            holder_state, at, now=dt.datetime.now(dt.UTC), force=force, dry_run=dry_run
        )
    except PruneFloorError as exc:
        raise UsageError(f"--before {before!r}: {exc}; --force prunes them") from None
    except UsageError as exc:
        raise UsageError(f"--before {before!r}: {exc}") from None
    finally:
        holder_state.close()
    if fmt is OutputFormat.JSON:
        emit(done.to_dict())
        return
    verb = "would delete" if done.dry_run else "deleted"
    out(
        f"{verb} {done.audit} audit record(s) and {done.receipts} receipt(s) kept before "
        f"{done.to_dict()['before']}"
    )
    if done.dry_run:
        note("dry run: nothing was deleted")


def _receipt_files(receipt_dir: Path, fmt: OutputFormat) -> None:
    from gpucc.holder.receipts import KeptReceipts

    kept = KeptReceipts.read(receipt_dir)
    found = kept.receipts
    if fmt is OutputFormat.JSON:
        emit(kept.to_dict())
        return
    out(
        *(
            f"{p.name}: entry {r.seq} hash {r.entry_hash} signed by orchestrator "
            f"{r.orchestrator_key_id[:16]}…; released trusting: {_trusted(r.trusted_with)}"
            for p, r in found
        )
    )
    note(f"{len(found)} receipt(s) in {receipt_dir}")
