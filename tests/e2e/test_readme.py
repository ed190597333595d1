"""README.md is checked against the code: its exit-code table and its shell examples."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpucc.cli.exitcodes import TABLE
from tests.support import docexamples
from tests.support.paths import ROOT

README = ROOT / "README.md"


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
    # one row per kind; a code may have several kinds (3: collateral, or no connection)
    assert len(rows) == len(table) == len({r[1] for r in rows})


def test_readme_layout_lists_every_package() -> None:
    """Each folder ``gpucc/`` links (and ``gpucc/`` itself) has its line in the layout."""
    packages = {p.name for p in (ROOT / "gpucc").iterdir() if p.is_symlink()} | {"gpucc"}
    listed = set(re.findall(r"^- `([a-z_]+)/`", _section("Development"), flags=re.M))
    assert packages - listed == set()


# --- README's inline examples and CI gate, run ----------------------------------------------
#
# README's fenced blocks run with every doc's (tests/e2e/test_doc_examples.py), in the same
# sandbox: the bundled NVIDIA sample and the simulated GPU. Here: every inline
# `gpucc ... --option` example, and the CI gate. What needs a GPU is listed with the reason; a
# new inline example that is neither run nor listed fails the test.

#: Inline examples not run, and why.
SKIPPED_INLINE = {
    "gpucc session local train.gcc --data-key train.key -o answer.json --host-key host.key": (
        "needs a real GPU (the simulated block runs the same protocol)"
    ),
    "gpucc attest --format json": "a description of the option, with no evidence to verify",
    "gpucc evidence collect -o FILE [--nonce HEX]": "a synopsis, and it needs a GPU",
}

_bash, _runnable = docexamples.bash, docexamples.runnable


def _blocks() -> list[str]:
    return [b.text for b in docexamples.blocks(README) if b.lang in docexamples.SHELLS]


def _inline_examples() -> list[str]:
    text = README.read_text(encoding="utf-8")
    return sorted(set(re.findall(r"`(gpucc [^`]*--[^`]*)`", text)))


def _ci_gate_script() -> str:
    text = _section("Gating a CI pipeline")
    yaml_block = text[text.index("```yaml\n") : text.index("```\n", text.index("```yaml\n") + 8)]
    after = yaml_block[yaml_block.index("name: Attest the GPU (the gate)") :]
    lines = after.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "run: |") + 1
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for line in lines[start:]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        body.append(line[indent:])
    return "\n".join(body)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    base = tmp_path_factory.mktemp("readme-inputs")
    return base, docexamples.make_sandbox(base)


def _workdir(tmp_path: Path) -> Path:
    return docexamples.workdir(tmp_path)


def test_every_inline_skip_is_current() -> None:
    assert set(SKIPPED_INLINE) <= set(_inline_examples())
    assert all(SKIPPED_INLINE.values())
    assert len(_blocks()) >= 5


@pytest.mark.parametrize("example", _inline_examples())
def test_readme_inline_example_runs(
    example: str, sandbox: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    if example in SKIPPED_INLINE:
        pytest.skip(SKIPPED_INLINE[example])
    _, env = sandbox
    result = _bash(example, _workdir(tmp_path), env)
    assert result.returncode == 0, f"{example}\n--- stderr:\n{result.stderr}"


def test_air_gapped_example_verifies_the_sample_offline(
    sandbox: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    block = next(b for b in _blocks() if "--collateral bundle.json --offline" in b)
    _, env = sandbox
    result = _bash(_runnable(block), _workdir(tmp_path), env)
    assert result.returncode == 0, result.stderr
    assert "TRUSTED" in result.stdout
    without_nonce = block.replace(' --nonce "$NONCE" --collateral', " --collateral")
    refused = _bash(_runnable(without_nonce), _workdir(tmp_path / "n"), env)
    assert refused.returncode == 1  # freshness is never assumed


def test_ci_gate_passes_a_trusted_gpu_and_keeps_the_json(
    sandbox: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    from jsonschema import Draft202012Validator

    from gpucc.cli.schemas import load_schema

    _, env = sandbox
    work = _workdir(tmp_path)
    setup = _runnable("gpucc evidence collect -o evidence.json --nonce")
    gate = _ci_gate_script()
    result = _bash(
        f"{setup}\n{gate}",
        work,
        env | {"GPUCC_COLLATERAL": env["TEST_SAMPLE_BUNDLE"], "GPUCC_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "GPU attested: 1 GPU(s) trusted" in result.stdout
    doc = json.loads((work / "attest.json").read_text())
    Draft202012Validator(load_schema("gpucc.attest/v1")).validate(doc)


@pytest.mark.parametrize(
    ("change", "code", "says"),
    [
        ("nonce", 1, "::error::GPU not trusted"),
        ("no-collateral", 3, "::error::undecided, collateral missing"),
        ("no-evidence", 8, "::error::attestation did not run (exit 8)"),
    ],
)
def test_ci_gate_stops_the_pipeline(
    sandbox: tuple[Path, dict[str, str]], tmp_path: Path, change: str, code: int, says: str
) -> None:
    from jsonschema import Draft202012Validator

    from gpucc.cli.schemas import load_schema

    base, env = sandbox
    work = _workdir(tmp_path)
    setup = _runnable("gpucc evidence collect -o evidence.json --nonce")
    extra = {"GPUCC_COLLATERAL": env["TEST_SAMPLE_BUNDLE"], "GPUCC_OFFLINE": "1"}
    if change == "nonce":
        setup += '; NONCE="$(gpucc session challenge)"'
    elif change == "no-collateral":
        extra = {"GPUCC_OFFLINE": "1"}
        setup += '; mkdir empty; export GPUCC_CACHE_DIR="$PWD/empty"'
    else:
        setup += "; rm evidence.json"
    result = _bash(f"{setup}\n{_ci_gate_script()}", work, env | extra)
    assert result.returncode == 1, result.stdout + result.stderr
    assert says in result.stdout, result.stdout
    doc = json.loads((work / "attest.json").read_text())
    schema = "gpucc.attest/v1" if code in (1, 3) else "gpucc.error/v1"
    Draft202012Validator(load_schema(schema)).validate(doc)
    assert doc.get("exit_code", doc.get("error", {}).get("code")) == code
    del base


def test_ci_runs_both_readme_commands_verbatim() -> None:
    block = README.read_text(encoding="utf-8").split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2 and "gpucc demo" in commands[0] and "pytest" in commands[1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert f'(cd "$first" && {commands[0]})' in ci.splitlines()  # in a copy of the tree
    assert commands[1] in ci.splitlines()
