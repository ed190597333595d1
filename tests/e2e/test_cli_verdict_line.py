"""The verdict line of `gpucc attest`: one token per verdict that no other verdict's line
holds, an account of the verdict on stderr that fits it, and no error line for a verdict."""

from __future__ import annotations

import re
import subprocess

from cli.render import VERDICT_TOKENS
from tests.support.cli import gpucc

REFUSED_AT = "2026-01-01T00:00:00Z"  # the sample's RIM signers expired in 2025


def verdict_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    tokens = "|".join(VERDICT_TOKENS.values())
    return [line for line in proc.stdout.splitlines() if re.match(rf"({tokens}):", line)]


def test_no_token_is_part_of_another() -> None:
    tokens = list(VERDICT_TOKENS.values())
    assert len(set(tokens)) == 3
    for token in tokens:
        assert [t for t in tokens if token in t] == [token], token


def test_the_sample_alone_is_verified_as_of_its_own_time_and_says_so() -> None:
    proc = gpucc("attest", "--sample", "--offline")
    assert proc.returncode == 0, proc.stderr
    assert verdict_lines(proc) == ["TRUSTED: 1 GPU verified as of 2024-01-01T00:00:00Z"]
    assert "--sample: verifying as of 2024-01-01T00:00:00Z" in proc.stderr
    assert "trusted with: " in proc.stderr and "error" not in proc.stderr


def test_a_refused_verdict_has_its_token_its_reasons_and_no_error_line() -> None:
    proc = gpucc("attest", "--sample", "--offline", "--at", REFUSED_AT)
    assert proc.returncode == 1, proc.stderr
    (line,) = verdict_lines(proc)
    assert line.startswith("REFUSED: 1 GPU not trusted as of 2026-01-01T00:00:00Z; ")
    assert "verified" not in line
    assert not re.search(r"\bTRUSTED\b", proc.stdout)  # grep -w TRUSTED finds nothing
    assert "trusted with" not in proc.stderr and "error" not in proc.stderr
    refusals = [x for x in proc.stderr.splitlines() if x.startswith("gpucc: refused by: ")]
    assert len(refusals) == 2 and all("HCC RIM L4 Signer" in x for x in refusals)
    assert "--sample: verifying" not in proc.stderr  # --at was given


def test_quiet_leaves_the_verdict_line_alone() -> None:
    for at, code in (("2024-01-01T00:00:00Z", 0), (REFUSED_AT, 1)):
        proc = gpucc("attest", "-q", "--sample", "--offline", "--at", at)
        assert proc.returncode == code, proc.stderr
        assert len(verdict_lines(proc)) == 1
        assert proc.stderr == ""


def test_json_carries_the_verdict_without_an_error_document() -> None:
    proc = gpucc("attest", "--sample", "--offline", "--at", REFUSED_AT, "-f", "json")
    assert proc.returncode == 1
    assert '"verdict": "not-trusted"' in proc.stdout and "error:" not in proc.stderr
