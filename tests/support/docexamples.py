"""The documentation's examples, as tests run them.

Every fenced ``sh``/``bash``/``console``/``python`` block of README.md and docs/*.md is an
example. A block runs in a fresh temporary directory, in a shell that defines only what a
reader has, against the bundled NVIDIA sample and the simulated GPU. What a block needs that a
test machine lacks is said in the doc itself, in an HTML comment on the line before the block
(rendered markdown hides it):

    <!-- not run: needs a GPU -->            the block is skipped with that reason
    <!-- run: slow -->                       runs, marked slow
    <!-- run: continues -->                 runs after the block before it, in its directory
    <!-- run: file train.py -->             is written to train.py for a later block, not run
    <!-- example: examples/travel.sh -->    is that file of examples/, verbatim (checked here);
                                             tests/e2e/test_examples.py runs it

Words combine: ``<!-- run: continues, slow -->``. A few lines that need a GPU or the network
are replaced by stand-ins on the sample (``STAND_INS``); everything else runs as written.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support.paths import ROOT

SAMPLE_AT = "2024-01-01T00:00:00Z"
SHELLS = ("sh", "bash", "console")
LANGUAGES = (*SHELLS, "python")

#: Lines of run blocks that need a GPU or the network, replaced by stand-ins on the sample.
STAND_INS = {
    "gpucc evidence collect -o evidence.json --nonce": (
        'cp "$TEST_SAMPLE_EVIDENCE" evidence.json; NONCE="$TEST_SAMPLE_NONCE"; '
        'export GPUCC_AT="$TEST_SAMPLE_AT" GPUCC_POLICY="$TEST_SAMPLE_POLICY"',
        "needs a GPU: NVIDIA's sample evidence (and the nonce it answers) stands in; it "
        "verifies as of 2024-01-01, and NVIDIA publishes no stored OCSP answers for it",
    ),
    "pip install 'gpucc[s3]' 'moto[server]'": (
        'python -c "import boto3, moto"',
        "installs packages: the test environment has them (the test extra)",
    ),
    "gpucc collateral fetch --evidence evidence.json -o bundle.json": (
        'cp "$TEST_SAMPLE_BUNDLE" bundle.json',
        "needs the network: a bundle of the sample's RIMs stands in",
    ),
}

#: What an untagged block must not start with: a command belongs in a tagged block.
COMMANDS = ("gpucc ", "python", "pip ", "torchrun ", "openssl ", "curl ", "model_signing ")

_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```[ \t]*$", re.M | re.S)
_MARK = re.compile(r"<!--\s*(not run|run|example):\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a doc, with what its mark says."""

    doc: str  # relative to the repository root
    line: int  # of the opening fence
    lang: str
    text: str
    skip: str | None = None  # the reason it is not run
    slow: bool = False
    continues: bool = False
    file: str | None = None
    example: str | None = None  # the file of examples/ the block shows, relative to the root

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


_TORCH = re.compile(
    r"\bimport torch\b|\bfrom torch\b|\btorchrun\b|gpucc\.ddp\b|\bfrom gpucc import ddp\b"
    r"|torch_dataset|torch_stream|examples/(?:ddp|torch)\.sh"
)


def needs_torch(block: Block) -> bool:
    """Whether the block runs PyTorch (the torch extra)."""
    return bool(_TORCH.search(block.text)) or (
        block.example is not None and bool(_TORCH.search(block.example))
    )


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _mark(text: str, start: int) -> tuple[str, str] | None:
    before = text[:start].rstrip("\n ").rsplit("\n", 1)[-1]
    match = _MARK.search(before)
    return (match.group(1), match.group(2)) if match else None


def blocks(doc: Path) -> list[Block]:
    """Every fenced block of ``doc``, in order."""
    text = doc.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        indent = len(match.group(1))
        body = "\n".join(line[indent:] for line in match.group(3).splitlines())
        mark = _mark(text, match.start())
        kind, words = mark if mark else ("", "")
        parts = [w.strip() for w in words.split(",")] if kind == "run" else []
        file = next((p.split(None, 1)[1] for p in parts if p.startswith("file ")), None)
        found.append(
            Block(
                doc=str(doc.relative_to(ROOT)),
                line=text.count("\n", 0, match.start()) + 1,
                lang=match.group(2),
                text=body,
                skip=words if kind == "not run" else None,
                slow="slow" in parts,
                continues="continues" in parts,
                file=file,
                example=words if kind == "example" else None,
            )
        )
    return found


def examples() -> list[Block]:
    """Every shell and Python block of README.md and docs/*.md."""
    return [b for doc in docs() for b in blocks(doc) if b.lang in LANGUAGES]


def untagged_commands() -> list[Block]:
    """Untagged blocks that hold a command (which would escape the tests)."""
    return [
        b
        for doc in docs()
        for b in blocks(doc)
        if not b.lang and b.text.lstrip().startswith(COMMANDS)
    ]


def chain(block: Block) -> list[Block]:
    """The blocks that run for ``block``: those it continues, then itself."""
    own = [b for b in blocks(ROOT / block.doc) if b.lang in LANGUAGES]
    index = next(i for i, b in enumerate(own) if b.line == block.line)
    start = index
    while own[start].continues and start > 0:
        start -= 1
    return own[start : index + 1]


# --- the sandbox ---------------------------------------------------------------------------


def make_sandbox(base: Path) -> dict[str, str]:
    """Inputs the stand-ins use, and the environment the examples run in."""
    from gpucc.gpuattest.bundle import Bundle, write_bundle
    from gpucc.gpuattest.evidence import dump_evidence_json, load_raw_evidence
    from gpucc.gpuattest.samples import nvidia_h100_sample

    sample = nvidia_h100_sample()
    report, chain_path = sample.report_path, sample.cert_chain_path
    d_rim, v_rim = sample.driver_rim_path, sample.vbios_rim_path
    evidence = load_raw_evidence(report, chain_path)
    (base / "evidence.json").write_bytes(dump_evidence_json(evidence))
    rims = {
        "NV_GPU_DRIVER_GH100_545.00": d_rim.read_bytes(),
        "NV_GPU_VBIOS_1010_0200_882_96005E0001": v_rim.read_bytes(),
    }
    write_bundle(Bundle(created=dt.datetime(2024, 1, 1, tzinfo=dt.UTC), rims=rims), base / "b.json")
    (base / "policy.yaml").write_text("version: 1\nocsp:\n  require: false\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCC_", "NVAT_"))}
    # The repository on PYTHONPATH, as for an editable install (docs name tests/data/ files
    # relative to the checkout: the examples run in a temporary copy of nothing else).
    path = [str(ROOT), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env |= {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(path)),
        "COLUMNS": "100",
        "TEST_SAMPLE_EVIDENCE": str(base / "evidence.json"),
        "TEST_SAMPLE_NONCE": sample.nonce.hex(),
        "TEST_SAMPLE_BUNDLE": str(base / "b.json"),
        "TEST_SAMPLE_AT": SAMPLE_AT,
        "TEST_SAMPLE_POLICY": str(base / "policy.yaml"),
    }
    return env


def workdir(path: Path) -> Path:
    """A directory holding the plain inputs the examples name, and the checkout's test data
    (docs point at ``tests/data/...`` as a reader in a checkout sees it)."""
    path.mkdir(parents=True, exist_ok=True)
    for name, size in (("dataset.bin", 300_000), ("train.bin", 100_000)):
        (path / name).write_bytes(os.urandom(size))
    (path / "tests").mkdir(exist_ok=True)
    (path / "tests" / "data").symlink_to(ROOT / "tests" / "data")
    return path


def runnable(script: str) -> str:
    lines = []
    for line in script.splitlines():
        stand_in = next((v for k, v in STAND_INS.items() if line.startswith(k)), None)
        lines.append(stand_in[0] if stand_in else line)
    return "\n".join(lines)


def bash(
    script: str, cwd: Path, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` under ``bash -euo pipefail``; whatever it left running (a service it
    started in the background) is ended with it."""
    with subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    result = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return result


def run_chain(block: Block, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``block`` after the blocks it continues; the first failure is returned."""
    result: subprocess.CompletedProcess[str] | None = None
    for step in chain(block):
        if step.file is not None:
            (cwd / step.file).write_text(step.text + "\n", encoding="utf-8")
            continue
        if step.lang == "python":
            (cwd / "example.py").write_text(step.text + "\n", encoding="utf-8")
            script = f"{sys.executable} example.py"
        else:
            script = runnable(step.text)
        result = bash(script, cwd, env)
        if result.returncode != 0:
            return result
    assert result is not None, f"{block.id} only writes files: nothing runs them"
    return result
