"""docs/ARCHITECTURE.md's Python examples run as written."""

from __future__ import annotations

import re

from tests.support.paths import ROOT

DOC = ROOT / "docs" / "ARCHITECTURE.md"


def test_every_python_block_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {})  # noqa: S102 - the document's own example


def test_the_layers_named_are_the_layers_tested() -> None:
    from tests.unit.test_layers import LAYERS

    text = DOC.read_text(encoding="utf-8")
    for package in LAYERS:
        assert f"{package}/" in text
