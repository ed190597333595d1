"""Every benchmark script runs, as a real process, in its ``--smoke`` mode.

Benchmarks are run by hand, so nothing noticed when one broke. Here each script in
``benchmarks/`` runs with ``--smoke`` (tiny sizes, seconds; the GPU scripts on
``tests/support/fake_cupy.py`` where no GPU is usable) and must exit 0 and print the part of
its report that shows its flow got to the end. The numbers are not checked: timings are never
asserted. A new script without an entry here fails :func:`test_every_script_has_a_smoke_run`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.support.paths import ROOT

BENCHMARKS = ROOT / "benchmarks"


@dataclass(frozen=True)
class Smoke:
    script: str
    expect: tuple[str, ...]
    slow: bool = False
    needs: str | None = None  # a module the script cannot run without


SMOKES = [
    Smoke(
        "bench_seal_stage.py",
        (
            "raw decrypt_into",
            "gpucc stage (CLI)",
            "stage_cpu arena",
            "default (fresh memory every call)",
        ),
        slow=True,
    ),
    Smoke("bench_attest.py", ("full verify() of set A", "whole process: gpucc attest"), slow=True),
    Smoke("bench_ppcie.py", ("8 GPUs + 4 NVSwitches + topology", "real LS10 switch")),
    Smoke(
        "bench_startup.py",
        ("gpucc attest 550.90.07 sample", "NVIDIA's verifier skipped"),
        slow=True,
    ),
    Smoke(
        "bench_holder.py",
        ("errors", "PostgreSQL, 2 processes", "ratios to the first row"),
        slow=True,
    ),
    Smoke("bench_model.py", ("gpucc sha256",), slow=True),
    Smoke("bench_cvm.py", ("dcap-qvl",)),
    Smoke("bench_mirror.py", ("from files", "through a warm mirror", "ratios to the first row")),
    Smoke(
        "bench_remote_stage.py",
        ("s3: plain download", "s3: remote P=1 part=whole", "s3: remote P=2 part=4MiB"),
        slow=True,
        needs="moto",
    ),
    Smoke("bench_torch_data.py", ("stream, workers=2",), slow=True, needs="torch"),
    Smoke("bench_ddp.py", ("a2a",), slow=True, needs="torch"),
    Smoke("bench_gpu.py", ("kernel open, device-resident", "D2D copy (ceiling)")),
    Smoke("bench_ddp_gpu.py", ("a2a N=2", "one message")),
    Smoke("gpu_smoke.py", ("RESULT smoke: ok",)),
    Smoke("gpu_report.py", ("pytest: 1 passed", "clock samples: 2")),
]
#: Run by the CI script itself (.ci/run), with its own pass mark, wherever nvcc is installed.
RUN_BY_CI = {"sass_model.py"}
#: Shell scripts, checked elsewhere: gpu_validate.sh's dry run in tests/e2e/test_gpu_validate.py;
#: fetch_gpu_wheels.sh only downloads wheels (it needs a package index) and is parsed below.
SHELL = {"gpu_validate.sh", "fetch_gpu_wheels.sh"}


def test_every_script_has_a_smoke_run() -> None:
    scripts = {p.name for p in BENCHMARKS.iterdir() if p.suffix in (".py", ".sh")}
    assert scripts == {s.script for s in SMOKES} | SHELL | RUN_BY_CI
    ci = (ROOT / ".ci" / "run").read_text()
    for script in RUN_BY_CI:
        assert f"python3 benchmarks/{script}" in ci


def test_the_download_script_parses() -> None:
    subprocess.run(["bash", "-n", str(BENCHMARKS / "fetch_gpu_wheels.sh")], check=True)


def _params() -> list[object]:
    return [
        pytest.param(s, id=s.script, marks=[pytest.mark.slow] if s.slow else []) for s in SMOKES
    ]


@pytest.mark.parametrize("smoke", _params())
def test_benchmark_smoke(smoke: Smoke) -> None:
    if smoke.needs is not None:
        pytest.importorskip(smoke.needs)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCC_", "NVAT_", "GV_"))}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / smoke.script), "--smoke"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "Traceback" not in done.stderr
    for text in smoke.expect:
        assert text in done.stdout, (text, done.stdout[-3000:])
