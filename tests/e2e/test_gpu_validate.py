"""benchmarks/gpu_validate.sh and its helpers, without a GPU.

* The dry run (``GV_FAKE=1``) runs the script's whole flow against ``tests/support/fake_cupy.py``: the
  steps that need the device say so, the others must pass, and ``summary.txt`` has its
  documented structure (docs/GPU-VALIDATION.md).
* ``benchmarks/gpu_report.py`` turns a pytest report into a verdict in which a GPU test skipped
  because the kernels are unusable is a failure, and sets ncu's metrics beside the static model.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_report  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "gpu_validate.sh"
STEPS = [
    "nvidia-smi",
    "wheels",
    "project",
    "imports",
    "smoke",
    "pytest-gpu",
    "bench-model",
    "bench-ddp",
    "ncu",
    "san-memcheck",
    "san-racecheck",
    "bench-gpu",
]
FILES = {
    "summary.txt",
    "nvidia-smi.txt",
    "smoke.log",
    "pytest.log",
    "ncu.txt",
    "sanitizer.log",
    "bench.log",
    "model.log",
    "ddp.log",
}


def _run(
    *args: str, out: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "GV_FAKE": "1", **(env or {})}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard, not a timing: the dry run takes well under a minute
        check=False,
    )


def test_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    if shutil.which("shellcheck"):
        subprocess.run(["shellcheck", str(SCRIPT)], check=True)


def test_help_and_bad_arguments(tmp_path: Path) -> None:
    shown = _run("--help", out=tmp_path)
    assert shown.returncode == 0
    assert "--wheels DIR" in shown.stdout and "GV_FAKE=1" in shown.stdout
    bad = _run("--no-such-option", out=tmp_path)
    assert bad.returncode == 2
    assert "unknown argument" in bad.stderr


@pytest.mark.slow
def test_dry_run_flow_and_summary(tmp_path: Path) -> None:
    out = tmp_path / "out"
    asked = ",".join(STEPS)  # every step but the static model (nvcc: seconds of CPU)
    done = _run("--wheels", str(tmp_path / "none"), "--steps", asked, out=out)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert {p.name for p in out.iterdir()} == FILES
    summary = (out / "summary.txt").read_text()
    assert done.stdout.endswith(summary)  # printed last, for a reply that keeps the tail
    lines = summary.splitlines()
    assert lines[0] == "gpucc GPU validation"
    assert lines[1].startswith("date: 20") and lines[2].startswith("commit: ")
    assert lines[3] == "mode: dry run (tests/support/fake_cupy.py)"
    assert lines[4].startswith("budget: 530s, elapsed ")
    assert lines[-1] == "OVERALL: DRY RUN PASSED"

    table = lines[lines.index("== steps") + 2 :]
    table = table[: table.index("")]
    rows = {row.split()[0]: row.split()[1] for row in table}
    assert [s for s in rows if s != "static-model"] == STEPS
    assert rows["static-model"] == "not-asked"
    device_only = {"nvidia-smi", "wheels", "project", "ncu", "bench-gpu"}
    for step in STEPS:
        assert rows[step] == ("dry-run" if step in device_only else "ok"), (step, rows[step])

    for section in ("device", "smoke: builds, known answers, ceilings, kernels alone",
                    "pytest -m gpu", "ncu beside the static model", "compute-sanitizer",
                    "model hashing (bench_model.py)", "gradient sealing (bench_ddp_gpu.py, GB/s)",
                    "bench_gpu.py (GB/s, x line rate)", "files"):  # fmt: skip
        assert f"== {section}" in lines, section
    assert "  known answers aesgcm: ok" in summary
    for cs in ("64 KiB", "1 MiB"):
        assert f"  tamper {cs} chunks: ok" in summary
        assert f"  kernel open {cs} chunks: " in summary
    assert "  copy D2D: " in summary
    assert "passed, 0 failed, 0 errors" in summary
    assert "skipped x1 (allowed): set GPUCC_GPU_BIG=1" in summary
    assert summary.count("SMALL RUN OK") == 2
    assert "a2a N=4" in summary  # the gradient sealing table, from the dry run


def test_only_some_steps(tmp_path: Path) -> None:
    done = _run("--wheels", str(tmp_path / "none"), "--steps", "imports,smoke", out=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    summary = (tmp_path / "summary.txt").read_text()
    assert "pytest-gpu     not-asked" in summary
    assert "smoke          ok" in summary


# --- gpu_report ---------------------------------------------------------------------------------


def _junit(path: Path, cases: list[str]) -> Path:
    body = "".join(f'<testcase classname="tests.test_x" name="t{i}">{c}</testcase>'
                   for i, c in enumerate(cases))  # fmt: skip
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{body}'
                    "</testsuite></testsuites>")  # fmt: skip
    return path


def test_junit_verdicts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unusable = '<skipped type="pytest.skip" message="the AES-GCM kernels did not build" />'
    two = '<skipped type="pytest.skip" message="needs two GPUs" />'
    allow = "needs two GPUs"
    assert gpu_report.junit(_junit(tmp_path / "a.xml", ["", "", two]), allow) == 0
    assert gpu_report.junit(_junit(tmp_path / "b.xml", ["", unusable]), allow) == 1
    assert "NOT ALLOWED" in capsys.readouterr().out
    assert gpu_report.junit(_junit(tmp_path / "c.xml", [two]), allow) == 1  # nothing passed
    assert gpu_report.junit(_junit(tmp_path / "d.xml", ["", '<failure message="x"/>']), allow) == 1
    assert gpu_report.junit(_junit(tmp_path / "e.xml", ["", '<error message="x"/>']), allow) == 1
    assert gpu_report.junit(tmp_path / "missing.xml", allow) == 1


def test_ncu_beside_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    names = ["ID", "Kernel Name", "gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second",
             "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
             "smsp__issue_active.avg.pct_of_peak_sustained_active"]  # fmt: skip
    units = ["", "", "msecond", "Ghz", "%", "%"]
    rows = [
        ["0", "gcm_chunks", "0.671", "1.98", "80.5", "77.0"],  # 128 MiB: 200 GB/s
        ["1", "gcm_finalize", "0.010", "1.98", "1.0", "2.0"],
        ["2", "gcm_chunks", "0.300", "1.98", "79.0", "76.0"],
    ]
    csv = tmp_path / "raw.csv"
    csv.write_text("==PROF== noise\n" + "\n".join(
        ",".join(f'"{c}"' for c in r) for r in [names, units, *rows]) + "\n")  # fmt: skip
    model = {
        "arch": "sm_90",
        "machine": {"boost_ghz": 1.98},
        "amortized": {
            "limiter": "alu",
            "gbps_boost": 329.0,
            "rows": [
                {"pipe": "alu", "gbps_boost": 329.0},
                {"pipe": "issue", "gbps_boost": 400.0},
                {"pipe": "control", "gbps_boost": None},
            ],  # fmt: skip
        },
    }
    (tmp_path / "m.json").write_text(json.dumps(model))
    assert gpu_report.ncu(csv, tmp_path / "m.json") == 0
    out = capsys.readouterr().out
    assert "gcm_chunks, 128 MiB in 4 MiB chunks: 0.671 ms = 200 GB/s" in out
    assert "sm__inst_executed_pipe_alu 80.5%" in out
    alu = next(line for line in out.splitlines() if line.startswith("alu "))
    assert alu.split()[1:3] == ["329", "61%"]  # 200 / 329 GB/s
    empty = tmp_path / "empty.csv"
    empty.write_text("==PROF== No kernels were profiled.\n")
    assert gpu_report.ncu(empty, None) == 1


def test_clock_samples(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples = tmp_path / "clocks.csv"
    samples.write_text(
        "2026/11/23 10:00:00.000, 345, 2619, 70.1, 31, 0\n"
        "2026/11/23 10:00:00.500, 1980, 2619, 650.2, 60, 100\n"
        "2026/11/23 10:00:01.000, 1755, 2619, 700.0, 62, 98\n"
        "garbage\n"
    )
    assert gpu_report.clocks(samples) == 0
    out = capsys.readouterr().out
    assert "clock samples: 3, 2 with utilisation >= 50%" in out
    assert "min 1755, median 1868, max 1980 MHz" in out
