"""README.md is checked against the code: its exit-code table and its shell examples."""

from __future__ import annotations

import re
from pathlib import Path

from gpucc.cli.exitcodes import TABLE

README = Path(__file__).resolve().parent.parent / "README.md"


def _section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _exit_code_rows() -> list[tuple[int, str, str]]:
    rows = []
    for line in _section("Exit codes").splitlines():
        match = re.fullmatch(r"\|\s*(\d+)\s*\|\s*`([a-z-]+)`\s*\|\s*(.+?)\s*\|", line.strip())
        if match:
            rows.append((int(match.group(1)), match.group(2), match.group(3)))
    return rows


def test_readme_exit_code_table_is_the_code_table() -> None:
    rows = _exit_code_rows()
    table = [(o.code, o.kind, o.meaning) for o in TABLE]
    for row in rows:  # README -> code
        assert row in table, f"README row not in cli/exitcodes.TABLE: {row}"
    for row in table:  # code -> README
        assert row in rows, f"cli/exitcodes.TABLE row missing from README: {row}"
    assert len(rows) == len(table) == len({r[0] for r in rows})
