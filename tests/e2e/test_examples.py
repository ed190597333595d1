"""Every script under examples/ runs end to end, as a reader runs it, and leaves nothing behind.

Each example is started as a real process (bash or Python) from an empty directory, with a
home, cache and temporary directory of its own, against the simulated devices and the bundled
samples. It must exit 0 and print what its walk-through says a reader sees; afterwards the
directory it ran from, its home and the temporary directory must be as empty as before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.paths import ROOT

EXAMPLES = ROOT / "examples"


@dataclass(frozen=True)
class Example:
    expect: tuple[str, ...]  # lines (or parts of lines) of stdout, in this order
    anywhere: tuple[str, ...] = ()  # lines of stdout in any order (from parallel ranks)
    uses: tuple[str, ...] = ()  # other files of examples/ the script runs
    slow: bool = False
    torch: bool = False  # runs PyTorch (torchrun)


RUNS = {
    "travel.sh": Example(
        expect=(
            "visited 2 holder(s); model digest",
            "log verified: 2 of 2 planned visits (complete: alice, bob)",
        ),
        slow=True,
    ),
    "ddp.sh": Example(
        expect=(
            "epoch 0: loss",
            "epoch 1: loss",
            "sealed 10 gradient bucket(s) in 10 steps",
            # gradients exchanged sealed and opened sum exactly as plain DDP's
            "largest difference from plain DDP: 0\n",
        ),
        # each rank verified the other's simulated GPU and CVM (no GPU-only relaxation)
        anywhere=(
            "rank 0: verified its 1 peer(s); relaxations: none\n",
            "rank 1: verified its 1 peer(s); relaxations: none\n",
        ),
        uses=("ddp_train.py",),
        slow=True,
        torch=True,
    ),
    "torch.sh": Example(
        expect=(
            "train-00000-of-00003.gcc",
            "train-00002-of-00003.gcc",
            "epoch 0: loss",
            "epoch 1: loss",
        ),
        uses=("torch_train.py",),
        slow=True,
        torch=True,
    ),
    "cvm.sh": Example(
        expect=(
            "trusted: True | cvm: snp trusted",
            "measurement: 8922ebbd",
            "TRUSTED: the CVM (snp) and 1 GPU verified",
            "REFUSED: the CVM (snp) and 1 GPU not trusted",
            "differs from the policy: measurement",
            "exit 1",
            "verdict: undecided",
            "not-checked  Collateral current",
            "exit 3",
        ),
    ),
    "eat.sh": Example(
        expect=(
            "TRUSTED: 1 GPU verified as of 2024-01-01T00:00:00Z",
            "valid signed result (1 GPU token(s)",
            "overall result: True | devices: GPU-0",
            "the ES384 signature does not verify",
            "exit 1",
            "eat_nonce is not the nonce sent",
            "exit 1",
        ),
    ),
}


def test_every_example_is_run_here() -> None:
    """An example without a test would rot: each file is a script below or one it runs."""
    files = {p.name for p in EXAMPLES.iterdir() if p.name != "__pycache__"}
    covered = set(RUNS) | {u for e in RUNS.values() for u in e.uses}
    assert files == covered, (
        f"not run by a test: {sorted(files - covered)}; gone: {sorted(covered - files)}"
    )
    for name, example in RUNS.items():
        script = (EXAMPLES / name).read_text(encoding="utf-8")
        for used in example.uses:
            assert used in script, f"{name} does not run {used}"


def _run(path: Path, tmp: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Path]]:
    places = {name: tmp / name for name in ("cwd", "home", "tmp")}
    for place in places.values():
        place.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCC_", "NVAT_", "XDG_"))}
    env |= {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
        "HOME": str(places["home"]),
        "TMPDIR": str(places["tmp"]),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    command = ["bash", str(path)] if path.suffix == ".sh" else [sys.executable, str(path)]
    with subprocess.Popen(
        command,
        cwd=places["cwd"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            out, err = process.communicate(timeout=240)
        finally:  # whatever it left running is ended with it (and fails the test below)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(command, process.returncode, out, err), places


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n,
            marks=([pytest.mark.slow] if e.slow else []) + ([pytest.mark.torch] if e.torch else []),
        )
        for n, e in RUNS.items()
    ],
)
def test_example_runs_and_cleans_up(name: str, tmp_path: Path) -> None:
    result, places = _run(EXAMPLES / name, tmp_path)
    assert result.returncode == 0, f"{name} exited {result.returncode}\n{result.stderr}"
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    at = 0
    for line in RUNS[name].expect:
        found = result.stdout.find(line, at)
        assert found >= 0, f"{name} did not print {line!r} (after offset {at}):\n{result.stdout}"
        at = found + len(line)
    for line in RUNS[name].anywhere:
        assert line in result.stdout, f"{name} did not print {line!r}:\n{result.stdout}"
    for label, place in places.items():
        left = sorted(str(p.relative_to(place)) for p in place.rglob("*"))
        assert not left, f"{name} left files in its {label} directory: {left}"
