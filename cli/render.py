"""Renderers for attestation results (a table per GPU, or one JSON document) and
the exit status each verdict maps to.

Text output is sized to the console: every column is at least as wide as the
longest word in it, so RIM IDs, digests, dates and URLs are never broken in the
middle (long hex values are shortened instead; ``-v`` and JSON carry them in
full), and no table is wider than its content. When the output is not a
terminal (a CI log, a pipe) tables are drawn with ASCII characters only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpucc.gpuattest.result import Verdict

from .exitcodes import verdict_outcome

if TYPE_CHECKING:
    from rich.box import Box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from gpucc.assembly import PlatformResult
    from gpucc.assembly.parts import Part, Section
    from gpucc.gpuattest.cvm.appraise import CvmResult
    from gpucc.gpuattest.measurements import MismatchRecord
    from gpucc.gpuattest.result import GpuResult, RuntimeMeasurement
    from gpucc.gpuattest.switch_result import SwitchResult
    from gpucc.gpuattest.topology import TopologyResult

_STATUS_STYLE = {
    "pass": "green",
    "fail": "bold red",
    "not-checked": "yellow",
    "not-present": "cyan",
}
# One token per verdict, first on the verdict line, none inside another (``grep -w``, a
# ``^TOKEN:`` prefix and a plain ``grep TOKEN`` each find one verdict only): README's
# "Gating a CI pipeline" documents them.
VERDICT_TOKENS = {"trusted": "TRUSTED", "not-trusted": "REFUSED", "undecided": "UNDECIDED"}
_VERDICT_LINE = {
    "trusted": (VERDICT_TOKENS["trusted"], "bold green"),
    "not-trusted": (VERDICT_TOKENS["not-trusted"], "bold red"),
    "undecided": (VERDICT_TOKENS["undecided"], "bold yellow"),
}
# What follows the token: a refused or undecided subject is never "verified".
_VERDICT_WORDS = {
    "trusted": "{subject} verified as of {at}",
    "not-trusted": "{subject} not trusted as of {at}",
    "undecided": "{subject} not decided as of {at} (collateral missing)",
}
# Hex runs longer than this are shortened in text mode (a SHA-256 digest is 64).
_LONG_HEX = re.compile(r"\b[0-9a-fA-F]{33,}\b")
_HEX_KEEP = 8
_ELLIPSIS = "..."


def verdict_words(verdict: Verdict, subject: str, at: str) -> str:
    """The verdict line's words after its token: what was (or was not) decided, as of when."""
    return _VERDICT_WORDS[str(verdict)].format(subject=subject, at=at)


def verdict_exit_code(verdict: Verdict) -> int:
    """The exit status ``gpucc attest`` ends with for a verdict."""
    return verdict_outcome(verdict).code


def attest_document(result: PlatformResult) -> dict[str, Any]:
    """The ``gpucc.attest/v1`` document: the result's JSON with the exit status after
    ``trusted``."""
    doc: dict[str, Any] = {}
    for key, value in result.to_dict().items():
        doc[key] = value
        if key == "trusted":
            doc["exit_code"] = verdict_exit_code(result.verdict)
    return doc


def render_json(result: PlatformResult) -> str:
    """The ``gpucc.attest/v1`` document, indented."""
    return json.dumps(attest_document(result), indent=2, sort_keys=False)


# --- text ---------------------------------------------------------------------------------


def shorten_hex(text: str) -> str:
    """``text`` with every hex run longer than 32 characters cut to its first and last
    eight characters (``8048dfd1...e51da338``)."""
    return _LONG_HEX.sub(
        lambda m: f"{m.group()[:_HEX_KEEP]}{_ELLIPSIS}{m.group()[-_HEX_KEEP:]}", text
    )


def _longest_word(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(word) for word in text.split()), default=0)


def _longest_line(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(line) for line in text.splitlines()), default=0)


def _wrapped_height(text: str, width: int) -> int:
    """Lines ``text`` takes when wrapped at whitespace to ``width`` cells."""
    from rich.cells import cell_len

    height = 0
    for line in text.splitlines() or [""]:
        lines, used = 1, 0
        for word in line.split():
            size = cell_len(word)
            if used and used + 1 + size > width:
                lines, used = lines + 1, size
            else:
                used = used + 1 + size if used else size
        height += lines
    return height


def fit_widths(
    minimums: Sequence[int], maximums: Sequence[int], budget: int, cells: Sequence[Sequence[str]]
) -> list[int]:
    """Column content widths that fit ``budget`` cells.

    Every column gets at least its minimum (its longest word) and at most its maximum
    (its longest line). When the content does not fit on one line per row, the widths
    that make the table shortest (fewest wrapped lines) are chosen. Only when the
    minimums alone do not fit is the widest column cut (its longest word then has to
    be folded).
    """
    import itertools

    lows = [max(1, min(lo, hi)) for lo, hi in zip(minimums, maximums, strict=True)]
    highs = [max(1, hi) for hi in maximums]
    if sum(highs) <= budget:
        return highs
    spare = budget - sum(lows)
    if spare < 0:
        widest = lows.index(max(lows))
        lows[widest] = max(1, lows[widest] + spare)
        return lows
    # The last column takes what the others leave; search the others' widths.
    ranges = [
        range(lo, min(hi, lo + spare) + 1) for lo, hi in zip(lows[:-1], highs[:-1], strict=True)
    ]
    best, best_height = lows, None
    count = 1
    for r in ranges:
        count *= len(r)
    if count > 50_000:
        return lows[:-1] + [lows[-1] + spare]
    for head in itertools.product(*ranges):
        last = budget - sum(head)
        if last < lows[-1]:
            continue
        widths = [*head, min(last, highs[-1])]
        height = sum(
            max(_wrapped_height(cell, w) for cell, w in zip(row, widths, strict=True))
            for row in cells
        )
        if best_height is None or height < best_height:
            best, best_height = widths, height
    return best


def _box(console: Console) -> Box:
    from rich import box

    return box.ROUNDED if console.is_terminal else box.ASCII


def sized_table(console: Console, headers: Sequence[str], rows: Sequence[Sequence[Text]]) -> Table:
    """A Rich table whose columns never split a word and whose width is at most the
    console's and at most its content's."""
    from rich.table import Table as RichTable

    n = len(headers)
    minimums = [
        max([_longest_word(h)] + [_longest_word(r[i].plain) for r in rows])
        for i, h in enumerate(headers)
    ]
    maximums = [
        max([_longest_line(h)] + [_longest_line(r[i].plain) for r in rows])
        for i, h in enumerate(headers)
    ]
    # Each column has one cell of padding on both sides; n + 1 vertical rules.
    budget = console.width - (3 * n + 1)
    widths = fit_widths(minimums, maximums, budget, [[c.plain for c in r] for r in rows])
    table = RichTable(box=_box(console), expand=False, show_edge=True, header_style="bold")
    for header, width in zip(headers, widths, strict=True):
        table.add_column(header, width=width, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def _check_rows(
    gpu: GpuResult | CvmResult | SwitchResult | TopologyResult | Section,
) -> list[list[Text]]:
    from rich.text import Text

    rows: list[list[Text]] = []
    for check in gpu.checks:
        status = str(check.status)
        cell = Text(status, style=_STATUS_STYLE.get(status, ""))
        if check.decision != "accept" and status != "fail":
            cell.append(f" ({check.decision})")
        detail = check.reason
        if check.note:
            detail = f"{detail} (policy: {check.note})" if detail else f"policy: {check.note}"
        rows.append([Text(check.title), cell, Text(shorten_hex(detail))])
    return rows


def _source_label(source: str) -> str:
    return "VBIOS" if source == "vbios" else source


def mismatch_rows(mismatches: Sequence[MismatchRecord]) -> list[list[Text]]:
    """One row per mismatching RIM index: index, source, reason, golden values (one per
    line), runtime value; long values shortened."""
    from rich.text import Text

    rows: list[list[Text]] = []
    for m in mismatches:
        golden = "\n".join(shorten_hex(v) for v in m.golden_values)
        runtime = shorten_hex(m.runtime_value) if m.runtime_value is not None else "(missing)"
        rows.append(
            [
                Text(m.label),
                Text(_source_label(m.source)),
                Text(m.reason),
                Text(golden),
                Text(runtime, style="bold red"),
            ]
        )
    return rows


def measurement_lines(measurements: Sequence[RuntimeMeasurement]) -> list[str]:
    """With ``-v``: each runtime measurement of a report in full, one line each,
    ``measurement 12  <hex>``; a value whose report did not authenticate (signature or
    device chain failed) reads ``unverified measurement 12  <hex>`` instead, so a line
    starting ``measurement`` is always a verified value."""
    return [
        f"{'' if m.authenticated else 'unverified '}measurement {m.index:<2}  {m.value.hex()}"
        for m in measurements
    ]


def _summary_rows(gpu: GpuResult) -> list[tuple[str, str]]:
    claims = gpu.claims
    absent = "(not in the report)"  # a report without opaque versions (Blackwell FSP)
    driver, vbios = (claims.get(f"x-nvidia-gpu-{k}-version") for k in ("driver", "vbios"))
    return [
        ("driver", absent if "x-nvidia-gpu-driver-version" not in claims else str(driver)),
        ("VBIOS", absent if "x-nvidia-gpu-vbios-version" not in claims else str(vbios)),
        ("hwmodel", str(claims.get("hwmodel"))),
        ("measres", str(claims.get("measres"))),
        ("driver RIM", gpu.driver_rim_id or "(none)"),
        ("VBIOS RIM", gpu.vbios_rim_id or "(none)"),
        *_hint_rows(claims.get("x-nvidia-unsigned-hints")),
    ]


def _hint_rows(hints: object) -> list[tuple[str, str]]:
    """The evidence file's unsigned hints, said to be unsigned (they never decide)."""
    if not isinstance(hints, dict) or not hints:
        return []
    listed = ", ".join(f"{k} {v}" for k, v in sorted(hints.items()))
    return [("hints", f"{listed} (unsigned: never used to decide)")]


def _whole(console: Console) -> bool:
    """Whether a line of text is printed whole (never wrapped): on output that is not a
    terminal, where a pipeline greps whole lines. Tables keep the console's width."""
    return not console.is_terminal


def _print_pairs(console: Console, pairs: Sequence[tuple[str, str]]) -> None:
    from rich.text import Text

    key_width = max(len(k) for k, _ in pairs)
    for key, value in pairs:
        console.print(
            Text(f"{key:<{key_width}}  {value}"), highlight=False, soft_wrap=_whole(console)
        )


def render_text(result: PlatformResult, console: Console, *, verbose: bool = False) -> None:
    """Each part in report order (the CVM, a table per GPU with every check and its reason,
    its versions and RIM IDs and a table of measurement mismatches, each NVSwitch, the
    topology; a part of another kind as a check table per section), then one verdict line.

    With ``verbose`` the full values (evidence digest, every golden and runtime value
    of a mismatch) follow, one per line and never wrapped, so they can be copied.
    """
    from rich.text import Text

    for part in result.parts:
        _PART_RENDERERS.get(part.kind.name, _render_sections)(part, console, verbose=verbose)
    label, style = _VERDICT_LINE[str(result.verdict)]
    at = result.verified_at.isoformat().replace("+00:00", "Z")
    line = Text(f"{label}", style=style)
    subject = device_count(result)
    cvm_part = next((p for p in result.parts if p.kind.slot == "cvm"), None)
    if cvm_part is not None:  # a CVM alone is not "the CVM and no device"
        cvm = f"the CVM ({getattr(cvm_part.result, 'kind', cvm_part.kind.name)})"
        subject = cvm if subject == "no device" else f"{cvm} and {subject}"
    line.append(f": {verdict_words(result.verdict, subject, at)}", style="")
    if result.reasons:
        line.append(f"; {shorten_hex(result.reasons[0])}", style="")
        if len(result.reasons) > 1:
            line.append(f" (+{len(result.reasons) - 1} more)", style="")
    console.print(line, highlight=False, soft_wrap=_whole(console))


def _render_gpus(part: Part, console: Console, *, verbose: bool) -> None:
    """A table per GPU: its checks, versions and RIM IDs, its measurement mismatches."""
    from rich.text import Text

    for gpu in part.result.gpus:
        title = f"GPU {gpu.index}" + (f" {gpu.uuid}" if gpu.uuid else "") + f" ({gpu.arch})"
        console.print(Text(title, style="bold"), highlight=False, soft_wrap=_whole(console))
        console.print(sized_table(console, ("check", "result", "detail"), _check_rows(gpu)))
        _print_pairs(console, _summary_rows(gpu))
        mismatches = gpu.measurements.mismatches if gpu.measurements else ()
        if mismatches:
            console.print(Text(f"Measurement mismatches ({len(mismatches)})", style="bold"))
            console.print(
                sized_table(
                    console,
                    ("index", "source", "reason", "golden", "runtime"),
                    mismatch_rows(mismatches),
                )
            )
        if verbose:  # Text, never markup: the values come from evidence and RIMs
            console.print(Text(f"evidence sha256 {gpu.report_digest.hex()}"), soft_wrap=True)
            for m in mismatches:
                label = f"index {m.label} {_source_label(m.source)}"
                for n, value in enumerate(m.golden_values):
                    console.print(Text(f"{label} golden[{n}] {value}"), soft_wrap=True)
                runtime = m.runtime_value or "(missing)"
                console.print(Text(f"{label} runtime {runtime}"), soft_wrap=True)
            for entry in measurement_lines(gpu.runtime_measurements):
                console.print(Text(entry), highlight=False, soft_wrap=True)


def _render_switches(part: Part, console: Console, *, verbose: bool) -> None:
    """A table per NVSwitch (checks, BIOS version, RIM ID, PDI); with ``verbose`` each
    switch's runtime measurements in full (:func:`measurement_lines`)."""
    from rich.text import Text

    for switch in part.result.switches:
        console.print(Text(f"NVSwitch {switch.index} ({switch.arch})", style="bold"))
        console.print(sized_table(console, ("check", "result", "detail"), _check_rows(switch)))
        claims = switch.claims
        _print_pairs(
            console,
            [
                ("BIOS", str(claims.get("x-nvidia-switch-bios-version"))),
                ("hwmodel", str(claims.get("hwmodel"))),
                ("measres", str(claims.get("measres"))),
                ("BIOS RIM", switch.bios_rim_id),
                ("PDI", switch.device_pdi.hex()),
            ],
        )
        mismatches = switch.measurements.mismatches if switch.measurements else ()
        if mismatches:
            console.print(Text(f"Measurement mismatches ({len(mismatches)})", style="bold"))
            headers = ("index", "source", "reason", "golden", "runtime")
            console.print(sized_table(console, headers, mismatch_rows(mismatches)))
        if verbose:
            for entry in measurement_lines(switch.runtime_measurements):
                console.print(Text(entry), highlight=False, soft_wrap=True)


def _render_topology(part: Part, console: Console, *, verbose: bool) -> None:
    """The Protected PCIe topology checks."""
    from rich.text import Text

    topology: TopologyResult = part.result
    expected = topology.expected
    title = f"Protected PCIe topology ({expected.gpus} GPUs, {expected.switches} NVSwitches)"
    console.print(Text(title, style="bold"))
    console.print(sized_table(console, ("check", "result", "detail"), _check_rows(topology)))


def _render_cvm_part(part: Part, console: Console, *, verbose: bool) -> None:
    _render_cvm(part.result, console, verbose=verbose)


def _render_sections(part: Part, console: Console, *, verbose: bool) -> None:
    """A part of a kind with no renderer of its own: a check table per section."""
    from rich.text import Text

    for section in part.sections:
        console.print(Text(section.label, style="bold"), highlight=False)
        console.print(sized_table(console, ("check", "result", "detail"), _check_rows(section)))


#: How each kind of part is drawn (another kind: a check table per section).
_PART_RENDERERS = {
    "gpu": _render_gpus,
    "nvswitch": _render_switches,
    "topology": _render_topology,
    **dict.fromkeys(("tdx", "snp", "vtpm"), _render_cvm_part),
}


def counted(n: int, one: str, many: str) -> str:
    """``1 GPU``, ``2 GPUs``, ``0 GPUs``."""
    return f"{n} {one if n == 1 else many}"


def device_count(result: PlatformResult) -> str:
    """``8 GPUs, 4 NVSwitches`` (``1 GPU``) for the verdict line."""
    from gpucc.assembly.parts import Channel

    parts = [
        counted(len(p.kind.devices(p.result)), p.kind.label, p.kind.plural)
        for p in result.parts
        if p.kind.channel is Channel.DEVICE
    ]
    text = ", ".join(parts) or "no device"
    if result.topology is not None:
        text += " and the PPCIe topology"
    return text


# TDX's, then SEV-SNP's.
_CVM_SUMMARY = (
    *("tcb_status", "mrtd", "rtmr0", "rtmr1", "rtmr2", "rtmr3"),
    *("measurement", "host_data"),
)


def _vtpm_pairs(vtpm: dict[str, Any], *, verbose: bool) -> list[tuple[str, str]]:
    """A paravisor CVM's claims: its VM configuration, the quote's qualifying data, PCRs."""
    config = vtpm.get("vm_configuration") or {}
    flags = ("secure-boot", "tpm-enabled", "console-enabled")
    pairs = [(name, str(config.get(name))) for name in flags if name in config]
    pairs.append(("qualifying data", str(vtpm.get("qualifying_data"))))
    pcrs: dict[str, str] = vtpm.get("pcrs") or {}
    shown = pcrs if verbose else {i: v for i, v in pcrs.items() if i in ("0", "4", "7", "11")}
    pairs += [(f"PCR{i}", v) for i, v in shown.items()]
    return pairs


def _claim_text(value: object) -> str:
    """A claim's value as one line: text as it is, anything else as compact JSON."""
    import json

    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _render_cvm(cvm: CvmResult, console: Console, *, verbose: bool) -> None:
    """The CVM's checks, then its TCB status and measurements (in full with ``verbose``)."""
    from rich.text import Text

    console.print(Text(f"CVM ({cvm.kind})", style="bold"), highlight=False)
    console.print(sized_table(console, ("check", "result", "detail"), _check_rows(cvm)))
    pairs = [(k, str(cvm.claims[k])) for k in _CVM_SUMMARY if k in cvm.claims]
    pairs.append(("report data", str(cvm.claims.get("report_data"))))
    if verbose:  # every other claim too (MRCONFIGID, MRSEAM, ID key digests...), in full
        shown = {*_CVM_SUMMARY, "report_data", "kind", "vtpm"}
        pairs += [(k, _claim_text(v)) for k, v in cvm.claims.items() if k not in shown]
    vtpm = cvm.claims.get("vtpm")
    if isinstance(vtpm, dict):
        pairs += _vtpm_pairs(vtpm, verbose=verbose)
    _print_pairs(console, [(k, v if verbose else shorten_hex(v)) for k, v in pairs])
    if cvm.event_log is not None:
        _render_events(cvm.event_log, console, verbose=verbose)
    if verbose:
        console.print(f"CVM evidence sha256 {cvm.evidence_sha256.hex()}", soft_wrap=True)


def _render_events(log: dict[str, Any], console: Console, *, verbose: bool) -> None:
    """The event log's events: register, type, SHA-384 digest, description (escaped)."""
    from rich.text import Text

    from .terminal import safe_text

    events = log.get("events") or []
    console.print(Text(f"Event log ({len(events)} events)", style="bold"), highlight=False)
    rows = []
    for e in events:
        digest = str(e.get("digest") or "-")
        rows.append(
            [
                Text(str(e.get("seq"))),
                Text(str(e.get("register") or "-")),
                Text(safe_text(e.get("type_name"))),
                Text(digest if verbose else shorten_hex(digest)),
                Text(safe_text(e.get("description"))),
            ]
        )
    headers = ("#", "register", "type", "sha384", "description")
    console.print(sized_table(console, headers, rows))
