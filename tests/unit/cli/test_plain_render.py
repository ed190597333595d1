"""The plain text report (output that is not a terminal) is exactly what Rich writes there.

``gpucc attest`` writes its text report without Rich's console when stdout is not a
terminal (Rich costs more to import than verification takes); these tests hold the two
renderers to the same bytes for every kind of result, at several widths, with and without
``-v``.
"""

from __future__ import annotations

import dataclasses
import io
import re

import pytest

from gpucc.assembly import PlatformResult
from gpucc.cli.plain import UNBOUNDED, is_terminal, pipe_width, render_plain
from gpucc.gpuattest.result import AttestationResult
from tests.support.samples import SET_A_REPORT, report_bytes
from tests.support.spdm import spdm_measurement_blocks
from tests.unit.cli.test_render import RESULTS, render
from tests.unit.gpuattest.test_verifier import run_set_a
from tests.unit.gpuattest.test_verifier import set_a as evidence_of_set_a


@pytest.mark.parametrize("kind", sorted(RESULTS))
@pytest.mark.parametrize("width", [40, 60, 80, 100, 132])
@pytest.mark.parametrize("verbose", [False, True])
def test_plain_report_equals_rich_on_a_non_terminal(kind: str, width: int, verbose: bool) -> None:
    result = RESULTS[kind]()
    out = io.StringIO()
    if not render_plain(PlatformResult.of_gpus(result), out, width=width, verbose=verbose):
        assert width < 80  # only a narrow console needs Rich's column shrinking
        assert out.getvalue() == ""
        return
    assert out.getvalue() == render(result, width, verbose=verbose)


def _hostile() -> object:
    """A result whose strings carry control characters, tabs and newlines, as untrusted
    collateral can: both renderers must treat them the same way."""
    result = RESULTS["undecided"]()
    gpu = result.gpus[0]
    bad = "evil\x1b[2J\rname\tcol\x07bell\nforged TRUSTED line\u202e"
    checks = (dataclasses.replace(gpu.checks[0], reason=bad, title="Arch\x1b]0;t\x07"),)
    gpu = dataclasses.replace(gpu, checks=checks + gpu.checks[1:], driver_rim_id=bad)
    return dataclasses.replace(result, gpus=(gpu,))


@pytest.mark.parametrize("width", [60, 80, 132])
def test_plain_report_equals_rich_with_control_characters(width: int) -> None:
    result = _hostile()
    out = io.StringIO()
    assert render_plain(result, out, width=width)  # type: ignore[arg-type]
    assert out.getvalue() == render(result, width)  # type: ignore[arg-type]


def test_width_and_terminal_follow_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    assert pipe_width({"COLUMNS": "123"}) == 123
    assert pipe_width({}) == pipe_width({"COLUMNS": "0"}) == UNBOUNDED
    assert not is_terminal(io.StringIO(), {})
    assert is_terminal(io.StringIO(), {"FORCE_COLOR": "1"})
    assert not is_terminal(io.StringIO(), {"FORCE_COLOR": "1", "TTY_COMPATIBLE": "0"})
    assert is_terminal(io.StringIO(), {"TTY_COMPATIBLE": "1"})


def test_cell_wrapping_breaks_where_rich_breaks() -> None:
    """The plain renderer's own line breaking against Rich's (its private ``divide_line``,
    used here only as the oracle): words, runs of blanks, words longer than the width
    (folded), wide characters and leading blanks, at widths from 1 to 24."""
    import random

    from rich._wrap import divide_line

    from gpucc.cli.plain import _breaks

    pieces = [
        "a",
        "bb",
        "ccc",
        "NVIDIA",
        "GH100",
        "x" * 30,
        " ",
        "  ",
        "\u754c",
        "\u754c\u754c\u754c",
    ]
    rng = random.Random(7)
    for _ in range(3000):
        line = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        for width in (1, 2, 3, 5, 8, 13, 24):
            assert _breaks(line, width) == divide_line(line, width, fold=True), (line, width)


MEASUREMENT_LINE = re.compile(r"^(unverified )?measurement \d")


def _bad_signature() -> AttestationResult:
    data = bytearray(report_bytes(SET_A_REPORT))
    data[-5] ^= 0x10  # inside the signature: the blocks stay as they were
    return run_set_a(evidence=evidence_of_set_a(bytes(data)))


@pytest.mark.parametrize("unverified", [False, True])
def test_verbose_prints_every_runtime_measurement_in_full(unverified: bool) -> None:
    result = _bad_signature() if unverified else RESULTS["trusted"]()
    blocks = spdm_measurement_blocks(report_bytes(SET_A_REPORT))
    prefix = "unverified measurement" if unverified else "measurement"
    expected = [f"{prefix} {i:<2}  {blocks[i].hex()}" for i in sorted(blocks)]
    out = io.StringIO()
    assert render_plain(PlatformResult.of_gpus(result), out, width=132, verbose=True)
    rich = render(result, 132, verbose=True)
    assert out.getvalue() == rich
    assert [line for line in rich.splitlines() if MEASUREMENT_LINE.match(line)] == expected
    assert len(expected) == 64 and all(len(line.split()[-1]) == 96 for line in expected)
    quiet = render(result, 132)  # without -v: nothing of it
    assert not [line for line in quiet.splitlines() if MEASUREMENT_LINE.match(line)]
