"""Every shell and Python block of README.md and docs/*.md runs as written, or its doc says
why not (tests/support/docexamples.py describes the marks)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.support import docexamples
from tests.support.docexamples import Block
from tests.support.paths import ROOT


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return docexamples.make_sandbox(tmp_path_factory.mktemp("doc-inputs"))


def _param(block: Block) -> object:
    marks = (
        [pytest.mark.slow] if block.slow or any(b.slow for b in docexamples.chain(block)) else []
    )
    if any(docexamples.needs_torch(b) for b in [*docexamples.chain(block), block]):
        marks.append(pytest.mark.torch)
    return pytest.param(block, id=block.id, marks=marks)


def test_every_command_is_in_a_tagged_block() -> None:
    """An untagged block is text; one holding a command would escape the tests below."""
    found = [f"{b.id}: {b.text.splitlines()[0]}" for b in docexamples.untagged_commands()]
    assert not found, "tag these blocks sh or python (or text for a synopsis):\n" + "\n".join(found)


def test_examples_use_nothing_the_test_defines(env: dict[str, str]) -> None:
    """The stand-ins' variables are the test's own: no doc names them."""
    own = [name for name in env if name.startswith("TEST_")]
    assert len(own) >= 5
    for doc in docexamples.docs():
        assert not [n for n in own if n in doc.read_text(encoding="utf-8")], doc


def test_marks_are_well_formed() -> None:
    examples = docexamples.examples()
    assert len(examples) >= 30
    for block in examples:
        assert block.skip is None or len(block.skip) >= 12, f"{block.id}: say why it is not run"
        if block.file is not None:
            later = [b for b in examples if b.doc == block.doc and b.line > block.line]
            assert any(block in docexamples.chain(b) for b in later), (
                f"{block.id} is written to {block.file} but no block after it runs it"
            )


def test_what_a_block_needs_is_said_where_a_reader_sees_it() -> None:
    """The marks are HTML comments, hidden when the doc is rendered: a block that needs a
    GPU, a confidential VM or a firmware image (its mark says "needs" or "runs inside")
    says so in its own first line, a comment."""
    hidden = []
    for block in docexamples.examples():
        wants = re.search(r"(needs|runs inside)[^;]*", block.skip or "")
        if wants is None:
            continue
        first = block.text.splitlines()[0] if block.text else ""
        if not (first.startswith("#") and ("needs" in first or "inside" in first)):
            hidden.append(f"{block.id}: {wants.group(0)}")
    assert not hidden, "say what these blocks need in their first line:\n" + "\n".join(hidden)


def test_every_example_file_is_in_a_doc() -> None:
    """The walk-throughs' scripts (examples/) are what the docs show, each in some doc."""
    shown = {b.example for b in docexamples.examples() if b.example is not None}
    files = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "examples").iterdir()
        if p.suffix in (".sh", ".py")
    }
    assert files and files <= shown, f"in no doc: {sorted(files - shown)}"


@pytest.mark.parametrize("block", [_param(b) for b in docexamples.examples()])
def test_doc_example_runs(block: Block, env: dict[str, str], tmp_path: Path) -> None:
    if block.example is not None:  # run by tests/e2e/test_examples.py; shown here verbatim
        path = ROOT / block.example
        assert path.parent == ROOT / "examples" and path.is_file(), f"{block.id}: no {path}"
        assert block.text.rstrip("\n") == path.read_text(encoding="utf-8").rstrip("\n"), (
            f"{block.id} differs from {block.example}: show the file as it is"
        )
        return
    if block.skip is not None:
        if block.lang == "python":  # not run, but at least it is Python
            compile(block.text, block.id, "exec")
        pytest.skip(f"{block.id}: {block.skip}")
    if block.file is not None:
        compile(block.text, block.id, "exec") if block.lang == "python" else None
        return  # run by the block that continues it (test_marks_are_well_formed)
    result = docexamples.run_chain(block, docexamples.workdir(tmp_path), env)
    assert result.returncode == 0, f"{block.id}\n{block.text}\n--- stderr:\n{result.stderr}"


def test_every_documented_command_runs_with_the_internal_error_check(
    env: dict[str, str],
) -> None:
    """The examples above run every documented command; each gpucc process among them loads
    the suite's hooks, so one that exits 70 fails its example (tests/conftest.py) even where
    the block goes on past a non-zero status (``|| true``, a status it expects)."""
    from tests.conftest import BUGS

    hooks = str(ROOT / "tests" / "support" / "childhooks")
    assert hooks in env["PYTHONPATH"].split(os.pathsep)
    assert env["GPUCCTEST_BUGS"] == str(BUGS)


@pytest.mark.internal_error
def test_an_internal_error_a_block_swallows_is_still_seen(
    env: dict[str, str], tmp_path: Path
) -> None:
    """lxml made unimportable: attest meets a ModuleNotFoundError of a base dependency, a
    bug (exit 70) that the block's ``|| true`` hides from bash but not from the suite."""
    from tests.conftest import BUGS

    before = set(BUGS.iterdir())
    script = f"gpucc attest --sample --at {docexamples.SAMPLE_AT} || true"
    result = docexamples.bash(script, tmp_path, {**env, "GPUCCTEST_BLOCK": "lxml"})
    assert result.returncode == 0 and "internal error" in result.stderr
    found = sorted(set(BUGS.iterdir()) - before)
    assert len(found) == 1 and "No module named 'lxml'" in found[0].read_text(encoding="utf-8")
