"""``gpucc travel``: move one GPU through the data holders of a plan (docs/TRAVEL.md).

::

    gpucc travel keygen --orchestrator-key orchestrator.key \\
        --orchestrator-pub orchestrator.pub.pem
    gpucc travel run plan.yaml
    gpucc travel verify-log travel-log.jsonl --orchestrator-pub orchestrator.pub.pem
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from .command import App
from .holder_setup import write_key_pair
from .options import FormatOption, OutputFormat
from .output import emit, note, out, warn
from .safety_options import ForceOption

__all__ = ["travel_app"]

travel_app = App(
    group="travel",
    help="Visit data holders in turn: attest, stage, train, scrub, rotate, log.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@travel_app.command("keygen")
def keygen(
    key: Annotated[
        Path,
        typer.Option(
            "--orchestrator-key",
            dir_okay=False,
            help="The orchestrator's private key to create (0600).",
        ),
    ],
    pub: Annotated[
        Path,
        typer.Option("--orchestrator-pub", dir_okay=False, help="Its public key PEM to write."),
    ],
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Make the orchestrator's P-384 signing key (never replaces a file); print its pin."""
    write_key_pair(key, pub, fmt)


def _show_holder_record(holder: str, record: dict[str, Any]) -> None:
    """What the holder said its release relied on (signed in its answer); on stderr even
    with -q when anything was relaxed or simulated."""
    relaxations = sorted({str(r.get("item")) for r in record.get("relaxations") or []})
    simulated = bool(record.get("simulated"))
    text = "; ".join(relaxations) if relaxations else "no policy relaxation"
    line = f"{holder} released keys trusting: {text}" + ("; SIMULATED roots" if simulated else "")
    (warn if relaxations or simulated else note)(line)


@travel_app.command("run")
def run(
    plan_file: Annotated[
        Path,
        typer.Argument(exists=True, dir_okay=False, metavar="PLAN", help="The travel plan."),
    ],
    log: Annotated[
        Path | None,
        typer.Option("--log", dir_okay=False, help="Hand-over log (default: the plan's)."),
    ] = None,
    force: ForceOption = False,
    simulate: Annotated[
        Path | None,
        typer.Option(
            "--simulate",
            file_okay=False,
            metavar="DIR",
            rich_help_panel="Simulation (no GPU; never for production)",
            help="Use a SIMULATED GPU and TDX platform whose self-made roots and RIMs are "
            "written to DIR (for holders started with --simulate DIR). It attests "
            "nothing real; never trust it in production.",
        ),
    ] = None,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Visit every holder of PLAN in order; stop at the first failure (nothing stays staged)."""
    from gpucc.assembly import PlatformVerifier, Settings, assemble
    from gpucc.travel.orchestrator import run_plan
    from gpucc.travel.plan import load_plan

    plan = load_plan(plan_file)
    if simulate is not None:
        warn("SIMULATED GPU: for tests and demos only, this attests nothing real")
    settings = Settings(simulation=simulate)
    platform = assemble(settings)
    result = run_plan(
        plan,
        collect=platform.collect(),
        collect_cvm=platform.collect_cvm(),
        log_path=log,
        force=force,
        cvm_verifier=lambda policy: PlatformVerifier(dataclasses.replace(settings, policy=policy)),
    )
    for holder_id, digest in result.cvm_policies.items():
        note(f"this CVM satisfied {holder_id}'s image policy (sha256 {digest[:16]}…)")
    for visit in result.visits:
        note(
            f"{visit.holder_id}: {visit.bytes_staged} bytes staged and scrubbed "
            f"(read back zero), transcript {visit.transcript_hash[:16]}…"
        )
        _show_holder_record(visit.holder_id, visit.trusted_with)
    if fmt is OutputFormat.JSON:
        emit(result.to_dict())
        return
    where = f"; log {result.log_path}, head {result.head}" if result.log_path else ""
    out(f"visited {len(result.visits)} holder(s); model digest {result.model_digest}{where}")


@travel_app.command("verify-log")
def verify_log(
    log_file: Annotated[
        Path,
        typer.Argument(exists=True, dir_okay=False, metavar="LOG", help="travel-log.jsonl"),
    ],
    key: Annotated[
        Path,
        typer.Option(
            "--orchestrator-pub",
            exists=True,
            dir_okay=False,
            help="The orchestrator's public key.",
        ),
    ],
    expect_head: Annotated[
        str | None,
        typer.Option("--expect-head", help="The head hash kept from the run (64 hex)."),
    ] = None,
    receipt: Annotated[
        list[Path] | None,
        typer.Option(
            "--receipt", exists=True, dir_okay=False, help="A holder's receipt (repeatable)."
        ),
    ] = None,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Check every signature, the hash chain and the closing entry, and the log against a
    kept head or holders' receipts (exit 6 tampered or cut back, 4 malformed)."""
    from gpucc.core.errors import UsageError
    from gpucc.core.files import read_capped
    from gpucc.travel.log import verify_log as check
    from gpucc.travel.receipt import MAX_RECEIPT_BYTES, Receipt
    from gpucc.travel.signing import load_public_key

    if expect_head is not None and not (
        len(expect_head) == 64 and all(c in "0123456789abcdefABCDEF" for c in expect_head)
    ):
        raise UsageError("--expect-head must be 64 hex characters (the head verify-log printed)")
    receipts = [
        Receipt.from_json(read_capped(p, MAX_RECEIPT_BYTES, what="receipt")) for p in receipt or ()
    ]
    summary = check(
        log_file,
        load_public_key(read_capped(key, 16 * 1024), str(key)),
        expect_head=expect_head,
        receipts=receipts,
    )
    if fmt is OutputFormat.JSON:
        emit(summary.to_dict(head_checked=expect_head is not None, receipts_checked=len(receipts)))
        return
    state = "complete" if summary.complete else "STOPPED EARLY"
    out(
        f"log verified: {summary.entries} of {summary.planned} planned visits ({state}: "
        f"{', '.join(summary.holders) or 'none'}), head {summary.head}"
    )
    if expect_head is None and not receipts:
        note("a log cut back with its end re-signed is caught only by --expect-head or --receipt")


if __name__ == "__main__":  # pragma: no cover
    from .boundary import run_app

    sys.exit(run_app(travel_app))
