"""README.md is checked against the code: its exit-code table and its shell examples."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpucc.cli.exitcodes import TABLE
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
    assert len(rows) == len(table) == len({r[0] for r in rows})


# --- README's shell examples, run ----------------------------------------------------------
#
# Every fenced sh/bash/console block, and every inline `gpucc ... --option` example, runs in a
# temporary directory against the bundled NVIDIA sample and the simulated GPU. What needs a
# GPU, the network or an installation is listed here with the reason; everything else must
# exit 0. A new example that is neither run nor listed fails the test.

SAMPLE_AT = "2024-01-01T00:00:00Z"

#: Blocks not run, by their first line, and why.
SKIPPED_BLOCKS = {
    "# 1. Install and run the whole job on NVIDIA's bundled H100 sample (no GPU, no network):": (
        "creates virtual environments and installs packages; gpucc demo itself runs below"
    ),
    "holder$ gpucc session challenge > challenge.hex": (
        "two machines, and the host side needs a real GPU; the same steps run with --simulate"
    ),
    "python3 -m pip install -e '.[test]'": (
        "the development loop: installs, runs this suite, nvcc and GPU benchmarks"
    ),
}

#: Lines of run blocks that need a GPU or the network, replaced by stand-ins on the sample.
STAND_INS = {
    "gpucc evidence collect -o evidence.json --nonce": (
        'cp "$TEST_SAMPLE_EVIDENCE" evidence.json; NONCE="$TEST_SAMPLE_NONCE"; '
        'export GPUCC_AT="$TEST_SAMPLE_AT" GPUCC_POLICY="$TEST_SAMPLE_POLICY"',
        "needs a GPU: NVIDIA's sample evidence (and the nonce it answers) stands in; it "
        "verifies as of 2024-01-01, and NVIDIA publishes no stored OCSP answers for it",
    ),
    "gpucc collateral fetch --evidence evidence.json -o bundle.json": (
        'cp "$TEST_SAMPLE_BUNDLE" bundle.json',
        "needs the network: a bundle of the sample's RIMs stands in",
    ),
}

#: Inline examples not run, and why.
SKIPPED_INLINE = {
    "gpucc session local train.gcc --key-file train.key -o answer.json --host-key host.key": (
        "needs a real GPU (the simulated block runs the same protocol)"
    ),
    "gpucc attest --format json": "a description of the option, with no evidence to verify",
    "gpucc evidence collect -o FILE [--nonce HEX]": "a synopsis, and it needs a GPU",
}


def _blocks() -> list[str]:
    text = README.read_text(encoding="utf-8")
    pattern = re.compile(r"^( *)```(?:sh|bash|console)\n(.*?)^\1```\s*$", re.M | re.S)
    blocks = []
    for match in pattern.finditer(text):
        indent = len(match.group(1))
        blocks.append("\n".join(line[indent:] for line in match.group(2).splitlines()))
    return blocks


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
    """Inputs the examples name, the sample's stand-ins, and an environment for them."""
    from gpucc.gpuattest.samples import nvidia_h100_sample

    sample = nvidia_h100_sample()
    from gpucc.gpuattest.bundle import Bundle, write_bundle
    from gpucc.gpuattest.evidence import dump_evidence_json, load_raw_evidence

    base = tmp_path_factory.mktemp("readme-inputs")
    report, chain = sample.report_path, sample.cert_chain_path
    d_rim, v_rim = sample.driver_rim_path, sample.vbios_rim_path
    (base / "evidence.json").write_bytes(dump_evidence_json(load_raw_evidence(report, chain)))
    rims = {
        "NV_GPU_DRIVER_GH100_545.00": d_rim.read_bytes(),
        "NV_GPU_VBIOS_1010_0200_882_96005E0001": v_rim.read_bytes(),
    }
    write_bundle(Bundle(created=dt.datetime(2024, 1, 1, tzinfo=dt.UTC), rims=rims), base / "b.json")
    (base / "policy.yaml").write_text("version: 1\nocsp:\n  require: false\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCC_", "NVAT_"))}
    env |= {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "COLUMNS": "100",
        "TEST_SAMPLE_EVIDENCE": str(base / "evidence.json"),
        "TEST_SAMPLE_NONCE": sample.nonce.hex(),
        "TEST_SAMPLE_BUNDLE": str(base / "b.json"),
        "TEST_SAMPLE_AT": SAMPLE_AT,
        "TEST_SAMPLE_POLICY": str(base / "policy.yaml"),
    }
    return base, env


def _workdir(tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name, size in (("dataset.bin", 300_000), ("train.bin", 100_000)):
        (tmp_path / name).write_bytes(os.urandom(size))
    return tmp_path


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "Traceback" not in result.stderr + result.stdout
    return result


def _runnable(block: str) -> str:
    lines = []
    for line in block.splitlines():
        stand_in = next((v for k, v in STAND_INS.items() if line.startswith(k)), None)
        lines.append(stand_in[0] if stand_in else line)
    return "\n".join(lines)


def test_examples_use_nothing_the_test_defines(sandbox: tuple[Path, dict[str, str]]) -> None:
    """The examples run in a shell that defines only what a reader has: the variables the
    stand-ins use are the test's own, and no README text names them."""
    _, env = sandbox
    text = README.read_text(encoding="utf-8")
    own = [name for name in env if name.startswith("TEST_")]
    assert len(own) >= 5
    assert not [name for name in own if name in text]


def test_every_example_is_run_or_skipped_with_a_reason() -> None:
    firsts = {b.splitlines()[0] for b in _blocks()}
    assert set(SKIPPED_BLOCKS) <= firsts, set(SKIPPED_BLOCKS) - firsts  # no stale entries
    assert set(SKIPPED_INLINE) <= set(_inline_examples())
    assert all(SKIPPED_BLOCKS.values()) and all(SKIPPED_INLINE.values())
    assert len(_blocks()) >= 5


@pytest.mark.parametrize("block", _blocks(), ids=lambda b: b.splitlines()[0][:40])
def test_readme_block_runs(
    block: str, sandbox: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    first = block.splitlines()[0]
    if first in SKIPPED_BLOCKS:
        pytest.skip(SKIPPED_BLOCKS[first])
    _, env = sandbox
    result = _bash(_runnable(block), _workdir(tmp_path), env)
    assert result.returncode == 0, f"{block}\n--- stderr:\n{result.stderr}"


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
