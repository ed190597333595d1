"""Text output of real attestation results at 80 and 200 columns, in a terminal and not.

Each case asserts the properties a reader (or a CI log) depends on: no line wider than
the console, no RIM ID / date / URL / digest split across lines, mismatches as a table,
tables no wider than their content, ASCII only when the output is not a terminal.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console

from gpucc.assembly import PlatformResult
from gpucc.cli.render import fit_widths, render_text, shorten_hex
from gpucc.gpuattest.collateral import FileRimSource, NoOcsp, NoRimSource
from gpucc.gpuattest.evidence import load_raw_evidence
from gpucc.gpuattest.policy import parse_policy
from gpucc.gpuattest.result import AttestationResult
from gpucc.gpuattest.trust import TrustRoots
from gpucc.gpuattest.verifier import verify
from tests.support.samples import (
    HEAD_CHAIN,
    HEAD_NONCE,
    HEAD_REPORT,
    IN_WINDOW,
    SET_A_CHAIN,
    SET_A_DRIVER_RIM,
    SET_A_NONCE,
    SET_A_PROD_VBIOS_RIM,
    SET_A_REPORT,
    SET_A_VBIOS_RIM,
)

ROOTS = TrustRoots.nvidia()
# A fixed "now" after the set-A RIM signers expired (2025-06), so the reasons name dates.
LATER = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
GPUCC = shutil.which("gpucc", path=str(Path(sys.executable).parent)) or "gpucc"


def set_a(vbios: Path = SET_A_VBIOS_RIM, now: dt.datetime = IN_WINDOW) -> AttestationResult:
    return verify(
        load_raw_evidence(SET_A_REPORT, SET_A_CHAIN),
        expected_nonce=bytes.fromhex(SET_A_NONCE),
        roots=ROOTS,
        now=now,
        rims=FileRimSource(SET_A_DRIVER_RIM, vbios),
        ocsp=NoOcsp(),
        policy=parse_policy({"ocsp": {"require": False}}),
    )


def head_without_rims() -> AttestationResult:
    return verify(
        load_raw_evidence(HEAD_REPORT, HEAD_CHAIN),
        expected_nonce=bytes.fromhex(HEAD_NONCE),
        roots=ROOTS,
        now=LATER,
        rims=NoRimSource(),
        ocsp=NoOcsp(),
    )


RESULTS = {
    "trusted": lambda: set_a(),
    "expired": lambda: set_a(now=LATER),
    "mismatch": lambda: set_a(vbios=SET_A_PROD_VBIOS_RIM),
    "undecided": head_without_rims,
}


def render(
    result: AttestationResult, width: int, *, terminal: bool = False, verbose: bool = False
) -> str:
    out = io.StringIO()
    console = Console(
        file=out, width=width, force_terminal=terminal, color_system=None, legacy_windows=False
    )
    render_text(PlatformResult.of_gpus(result), console, verbose=verbose)
    return out.getvalue()


def tokens(result: AttestationResult) -> set[str]:
    """Words that must come out whole: every word of every title and (shortened) reason,
    the RIM IDs, and the shortened mismatch values."""
    words: set[str] = set()
    for gpu in result.gpus:
        for check in gpu.checks:
            words.update(check.title.split())
            words.update(shorten_hex(check.reason).split())
            words.update(shorten_hex(check.note).split())
        words.update((gpu.driver_rim_id, gpu.vbios_rim_id))
        for m in gpu.measurements.mismatches if gpu.measurements else ():
            words.update(shorten_hex(v) for v in m.golden_values)
            words.add(shorten_hex(m.runtime_value or ""))
    return {w.strip("()'\",;:") for w in words} - {""}


def lines_words(text: str) -> set[str]:
    """Every whitespace-separated word of every line, with table rules removed."""
    found: set[str] = set()
    for line in text.splitlines():
        for word in re.split(r"[\s|│┃]+", line):
            found.add(word.strip("()'\",;:"))
    return found


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "tty"])
@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("case", sorted(RESULTS))
def test_no_line_too_wide_and_no_token_split(case: str, width: int, terminal: bool) -> None:
    result = RESULTS[case]()
    text = render(result, width, terminal=terminal)
    for line in text.splitlines():  # on a pipe only tables keep the width: text is whole
        assert cell_len(line) <= width or not (terminal or line[:1] in "+|"), line
    missing = tokens(result) - lines_words(text)
    assert not missing, f"split or lost at {width} columns: {sorted(missing)}"


@pytest.mark.parametrize("case", sorted(RESULTS))
def test_on_a_pipe_the_verdict_and_its_reason_are_one_line(case: str) -> None:
    result = RESULTS[case]()
    for width in (40, 80):
        lines = render(result, width).splitlines()
        verdict = lines[-1]
        assert verdict.startswith(("TRUSTED: ", "REFUSED: ", "UNDECIDED: ")), lines[-3:]
        if result.reasons:
            assert shorten_hex(result.reasons[0]) in verdict


@pytest.mark.parametrize("case", sorted(RESULTS))
def test_not_a_terminal_is_plain_ascii(case: str) -> None:
    text = render(RESULTS[case](), 80)
    assert text.isascii()
    assert "+---" in text  # ASCII table rules


def test_terminal_uses_box_drawing() -> None:
    text = render(set_a(), 80, terminal=True)
    assert "│" in text and "|" not in text


def test_expired_signer_dates_and_rim_ids_stay_whole_at_80() -> None:
    text = render(set_a(now=LATER), 80)
    assert "2025-06-26T06:10:12+00:00" in text and "2025-06-22T09:38:54+00:00" in text
    assert "NV_GPU_VBIOS_1010_0200_882_96005E0001" in text


def mismatch_table(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Measurement mismatches"))
    table = []
    for line in lines[start + 1 :]:
        if not line.startswith(("+", "|")):
            break
        table.append(line)
    return table


@pytest.mark.parametrize("width", [80, 200])
def test_mismatches_are_a_per_index_table(width: int) -> None:
    result = set_a(vbios=SET_A_PROD_VBIOS_RIM)
    meas = result.gpus[0].measurements
    assert meas is not None
    text = render(result, width)
    table = mismatch_table(text)
    header = table[1]
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "index",
        "source",
        "reason",
        "golden",
        "runtime",
    ]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table[3:-1]]
    assert [r[0] for r in rows] == ["1", "2", "3", "9"]
    for row, m in zip(rows, meas.mismatches, strict=True):
        assert row[1] == "VBIOS" and row[2] == "value"
        assert row[3] == shorten_hex(m.golden_values[0])
        assert row[4] == shorten_hex(m.runtime_value or "")
        assert len(row[3]) < len(m.golden_values[0])  # shortened, not wrapped
    # No stretching: the same narrow table at 80 and at 200 columns.
    assert table == mismatch_table(render(result, 80))
    assert max(len(line) for line in table) < 80


def test_tables_are_no_wider_than_their_content() -> None:
    result = set_a(vbios=SET_A_PROD_VBIOS_RIM)
    wide = render(result, 400)
    assert render(result, 1000) == wide
    assert max(len(line) for line in wide.splitlines()) < 400


def test_verbose_prints_every_full_value_on_one_line() -> None:
    result = set_a(vbios=SET_A_PROD_VBIOS_RIM)
    meas = result.gpus[0].measurements
    assert meas is not None
    lines = render(result, 80, verbose=True).splitlines()
    full = [v for m in meas.mismatches for v in (*m.golden_values, m.runtime_value)]
    full.append(result.gpus[0].report_digest.hex())
    for value in full:
        assert value is not None and len(value) >= 64
        assert any(line.endswith(value) for line in lines), value


def test_shorten_hex_keeps_short_hex_and_words() -> None:
    digest = "ab" * 48
    assert shorten_hex(f"golden {digest} x") == "golden abababab...abababab x"
    assert shorten_hex("a" * 32) == "a" * 32
    assert shorten_hex("NV_GPU_VBIOS_1010_0200_882_96005E0001") == (
        "NV_GPU_VBIOS_1010_0200_882_96005E0001"
    )


def test_fit_widths_keeps_words_and_prefers_fewer_lines() -> None:
    cells = [["Driver RIM certificate chain", "pass", "one two three four five six"]]
    widths = fit_widths([11, 4, 5], [28, 4, 27], 40, cells)
    assert sum(widths) <= 40 and widths[0] >= 11 and widths[1] == 4 and widths[2] >= 5
    assert fit_widths([3, 3], [10, 10], 30, [["a", "b"]]) == [10, 10]


@pytest.mark.parametrize("columns", [80, 200])
def test_real_process_at_columns(columns: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCC_", "NVAT_", "NV_"))}
    env["COLUMNS"] = str(columns)
    args = [
        GPUCC, "attest",
        "--evidence", str(SET_A_REPORT), "--cert-chain", str(SET_A_CHAIN),
        "--nonce", SET_A_NONCE, "--driver-rim", str(SET_A_DRIVER_RIM),
        "--vbios-rim", str(SET_A_PROD_VBIOS_RIM), "--offline", "--at", "2024-01-01T00:00:00Z",
    ]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.isascii()
    for line in proc.stdout.splitlines():  # tables fit COLUMNS; lines of text are whole
        assert len(line) <= columns or line[:1] not in "+|", line
    verdict = [line for line in proc.stdout.splitlines() if line.startswith("REFUSED: ")]
    assert len(verdict) == 1 and verdict[0].endswith(" more)"), proc.stdout  # reason included
    words = lines_words(proc.stdout)
    assert {"NV_GPU_VBIOS_1010_0200_882_96005E0001", "NV_GPU_DRIVER_GH100_545.00"} <= words
    assert "https://ocsp.ndis.nvidia.com" in words
    assert [line.split("|")[1].strip() for line in mismatch_table(proc.stdout)[3:-1]] == [
        "1",
        "2",
        "3",
        "9",
    ]
