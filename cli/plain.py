"""``gpucc attest``'s text report for output that is not a terminal, without Rich's console.

Rich's console and table modules cost more to import than the verification of a report.
When stdout is not a terminal (a pipe, a file, a CI log) the report has no colours, its
tables use ASCII rules and its lines of text are never wrapped (a pipeline greps whole
lines), so it is written here with plain strings, laid out exactly as
:func:`cli.render.render_text` lays it out through Rich (same column widths from
:func:`cli.render.fit_widths`, same word wrapping in table cells as Rich's); a test
compares the two for every kind of result and several widths. A terminal still gets Rich.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TextIO

from rich.cells import cell_len, chop_cells

from .render import (
    _VERDICT_LINE,
    _longest_line,
    _longest_word,
    _source_label,
    _summary_rows,
    counted,
    fit_widths,
    measurement_lines,
    shorten_hex,
    verdict_words,
)
from .terminal import UNBOUNDED, is_terminal, pipe_width

if TYPE_CHECKING:
    from gpucc.assembly import PlatformResult
    from gpucc.gpuattest.result import GpuResult

__all__ = ["UNBOUNDED", "is_terminal", "pipe_width", "render_plain"]


#: What Rich's ``Text`` drops from every string (bell, backspace, VT, FF, CR).
_RICH_STRIPS = dict.fromkeys((7, 8, 11, 12, 13))


def _expand_tabs(line: str, size: int = 8) -> str:
    """Tabs to spaces at ``size``-cell stops, positions counted in cells as Rich counts."""
    if "\t" not in line:
        return line
    out: list[str] = []
    position = 0
    parts = line.split("\t")
    for part in parts[:-1]:
        position += cell_len(part) + 1
        spaces = (size - position % size) % size
        out.append(part + " " * (1 + spaces))
        position += spaces
    out.append(parts[-1])
    return "".join(out)


#: A word and the blanks after it, as Rich splits a line to wrap it.
_WORD = re.compile(r"\s*\S+\s*")


def _breaks(line: str, width: int) -> list[int]:
    """Where Rich breaks ``line`` to fit ``width`` cells: before each word (blanks before
    it included) whose text does not fit what is left of the line, unless the line is
    still empty; a word wider than a whole line is folded into pieces of ``width`` cells."""
    cuts: list[int] = []
    used = 0
    for match in _WORD.finditer(line):
        start, word = match.start(), match.group()
        needed = cell_len(word.rstrip())
        if needed <= width - used:
            used += cell_len(word)
        elif needed > width:
            pieces = chop_cells(word, width)
            for piece in pieces[:-1]:
                if start:
                    cuts.append(start)
                start += len(piece)
            if start:
                cuts.append(start)
            used = cell_len(pieces[-1])
        elif used and start:
            cuts.append(start)
            used = cell_len(word)
    return cuts


def _wrap(text: str, width: int) -> list[str]:
    """``text`` wrapped at words, long words folded, as Rich wraps a ``Text`` (which drops
    a few control characters and expands tabs first)."""
    lines: list[str] = []
    for raw in text.translate(_RICH_STRIPS).split("\n"):
        line = _expand_tabs(raw)
        cuts = [0, *_breaks(line, width), len(line)]
        for start, end in zip(cuts, cuts[1:], strict=False):
            piece = line[start:end]
            excess = cell_len(piece) - width
            if excess > 0:  # Rich drops trailing blanks that overflow the width
                blanks = len(piece) - len(piece.rstrip())
                piece = piece[: len(piece) - min(blanks, excess)]
            lines.append(piece)
    return lines


def _whole(text: str) -> list[str]:
    """``text`` as Rich prints it with ``soft_wrap``: never wrapped (a pipeline greps whole
    lines), the same control characters dropped and tabs expanded."""
    return [_expand_tabs(line) for line in text.translate(_RICH_STRIPS).split("\n")]


def _pad(text: str, width: int) -> str:
    return text + " " * (width - cell_len(text))


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> list[str]:
    """An ASCII-ruled table sized as :func:`cli.render.sized_table` sizes it."""
    n = len(headers)
    minimums = [
        max([_longest_word(h)] + [_longest_word(r[i]) for r in rows]) for i, h in enumerate(headers)
    ]
    maximums = [
        max([_longest_line(h)] + [_longest_line(r[i]) for r in rows]) for i, h in enumerate(headers)
    ]
    widths = fit_widths(minimums, maximums, width - (3 * n + 1), rows)
    if sum(widths) + 3 * n + 1 > width:
        raise _TooNarrow  # Rich then shrinks columns its own way: leave it to Rich
    rule = "-" * (sum(w + 2 for w in widths) + n - 1)
    out = [f"+{rule}+"]

    def add(cells: Sequence[str]) -> None:
        wrapped = [[x.rstrip() for x in _wrap(c, w)] for c, w in zip(cells, widths, strict=True)]
        for k in range(max(len(lines) for lines in wrapped)):
            parts = [
                f" {_pad(lines[k] if k < len(lines) else '', w)} "
                for lines, w in zip(wrapped, widths, strict=True)
            ]
            out.append("|" + "|".join(parts) + "|")

    add(headers)
    out.append("|" + "+".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        add(row)
    out.append(f"+{rule}+")
    return out


class _TooNarrow(Exception):  # noqa: N818 - a condition, not an error
    """The content's words do not fit the width."""


def _check_cells(gpu: GpuResult) -> list[list[str]]:
    rows: list[list[str]] = []
    for check in gpu.checks:
        status = str(check.status)
        if check.decision != "accept" and status != "fail":
            status += f" ({check.decision})"
        detail = check.reason
        if check.note:
            detail = f"{detail} (policy: {check.note})" if detail else f"policy: {check.note}"
        rows.append([check.title, status, shorten_hex(detail)])
    return rows


def _report_lines(result: PlatformResult, width: int, verbose: bool) -> Iterable[str]:
    for gpu in result.gpus:
        title = f"GPU {gpu.index}" + (f" {gpu.uuid}" if gpu.uuid else "") + f" ({gpu.arch})"
        yield from _whole(title)
        yield from _table(("check", "result", "detail"), _check_cells(gpu), width)
        pairs = _summary_rows(gpu)
        key_width = max(len(k) for k, _ in pairs)
        for key, value in pairs:
            yield from _whole(f"{key:<{key_width}}  {value}")
        mismatches = gpu.measurements.mismatches if gpu.measurements else ()
        if mismatches:
            yield from _wrap(f"Measurement mismatches ({len(mismatches)})", width)
            rows = [
                [
                    m.label,
                    _source_label(m.source),
                    m.reason,
                    "\n".join(shorten_hex(v) for v in m.golden_values),
                    shorten_hex(m.runtime_value) if m.runtime_value is not None else "(missing)",
                ]
                for m in mismatches
            ]
            yield from _table(("index", "source", "reason", "golden", "runtime"), rows, width)
        if verbose:
            yield f"evidence sha256 {gpu.report_digest.hex()}"
            for m in mismatches:
                label = f"index {m.label} {_source_label(m.source)}"
                for n, value in enumerate(m.golden_values):
                    yield f"{label} golden[{n}] {value}"
                yield f"{label} runtime {m.runtime_value or '(missing)'}"
            yield from measurement_lines(gpu.runtime_measurements)
    label, _style = _VERDICT_LINE[str(result.verdict)]
    at = result.verified_at.isoformat().replace("+00:00", "Z")
    subject = counted(len(result.gpus), "GPU", "GPUs")
    line = f"{label}: {verdict_words(result.verdict, subject, at)}"
    if result.reasons:
        line += f"; {shorten_hex(result.reasons[0])}"
        if len(result.reasons) > 1:
            line += f" (+{len(result.reasons) - 1} more)"
    yield from _whole(line)


def render_plain(
    result: PlatformResult,
    out: TextIO | None = None,
    *,
    width: int | None = None,
    verbose: bool = False,
) -> bool:
    """Write the text report of ``result`` as :func:`cli.render.render_text` writes it to a
    console that is not a terminal, ``width`` cells wide (default :func:`pipe_width`: rows
    are not wrapped unless ``COLUMNS`` asks for a width); ``False`` (nothing written) when
    a table's words do not fit the width, where Rich's own column shrinking applies."""
    try:
        lines = list(_report_lines(result, width or pipe_width(), verbose))
    except _TooNarrow:
        return False
    text = "".join(f"{line}\n" for line in lines)
    if out is None:
        from .output import write_stdout

        write_stdout(text)  # a closed pipe is 141, as for every other write
    else:
        out.write(text)
    return True
