"""Host-side helpers of ``benchmarks/gpu_validate.sh``: they read results, they touch no GPU.

::

    python benchmarks/gpu_report.py junit FILE.xml [--allow-skip REGEX]
    python benchmarks/gpu_report.py ncu RAW.csv [--model MODEL.json]
    python benchmarks/gpu_report.py clocks SAMPLES.csv
    python benchmarks/gpu_report.py imports
    python benchmarks/gpu_report.py --smoke    # each reader on tiny inputs (CI runs it)

* ``junit``: the verdict of a pytest run from its JUnit XML. It fails when a test failed or
  errored, when nothing passed, and when a test was skipped for a reason ``--allow-skip`` does
  not match: the GPU tests skip when the kernels do not build or fail their known answers,
  and here that is a failure, not a skip.
* ``ncu``: the pipe, issue, occupancy and memory metrics of ``ncu --page raw --csv``, one
  column per profiled kernel, and, with the static model's JSON (``benchmarks/sass_model.py
  --json``), the measured rate of ``gcm_chunks`` and each pipe's measured utilisation beside
  the utilisation the model predicts at that measured rate and clock.
* ``clocks``: SM clock and power under load from the sampler's CSV.
* ``imports``: the version and location of every Python package the GPU path imports.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import re
import statistics
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

# --- pytest --------------------------------------------------------------------------------------


def junit(path: Path, allow_skip: str | None) -> int:
    """Print the counts of a JUnit XML report; 0 only for a clean, non-empty, unskipped run."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        print(f"pytest: no report ({exc})")
        return 1
    allowed = re.compile(allow_skip) if allow_skip else None
    passed = failed = errors = 0
    skips: Counter[str] = Counter()
    bad_skips: Counter[str] = Counter()
    failing: list[str] = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None:
            failed += 1
            failing.append(name)
        elif case.find("error") is not None:
            errors += 1
            failing.append(name)
        elif (skipped := case.find("skipped")) is not None:
            reason = " ".join((skipped.get("message") or "?").split())[:200]
            skips[reason] += 1
            if allowed is None or not allowed.search(reason):
                bad_skips[reason] += 1
        else:
            passed += 1
    n_skipped = sum(skips.values())
    print(f"pytest: {passed} passed, {failed} failed, {errors} errors, {n_skipped} skipped")
    for name in failing[:20]:
        print(f"  FAILED {name}")
    for reason, n in skips.items():
        mark = "NOT ALLOWED" if reason in bad_skips else "allowed"
        print(f"  skipped x{n} ({mark}): {reason}")
    verdict = passed > 0 and not failed and not errors and not bad_skips
    if passed == 0:
        print("  nothing passed")
    return 0 if verdict else 1


# --- Nsight Compute ------------------------------------------------------------------------------

#: Raw metrics worth reading, by name pattern.
NCU_WANT = re.compile(
    r"^(gpu__time_duration\.sum|sm__cycles_elapsed\.avg\.per_second"
    r"|launch__(grid_size|block_size|registers_per_thread|occupancy_limit_\w+)"
    r"|sm__warps_active\.avg\.pct_of_peak_sustained_active"
    r"|sm__throughput\.avg\.pct_of_peak_sustained_elapsed"
    r"|dram__throughput\.avg\.pct_of_peak_sustained_elapsed"
    r"|smsp__issue_active\.avg\.pct_of_peak_sustained_active"
    r"|smsp__inst_executed\.sum"
    r"|sm__inst_executed_pipe_\w+\.avg\.pct_of_peak_sustained_active"
    r"|sm__pipe_\w+_cycles_active\.avg\.pct_of_peak_sustained_active"
    r"|l1tex__data_bank_conflicts_pipe_lsu_mem_shared\w*\.sum"
    r"|l1tex__data_pipe_lsu_wavefronts_mem_shared\w*\.sum)$"
)

#: For each pipe of the static model, the ncu metrics that measure the same hardware.
MODEL_TO_NCU = {
    "alu": ("sm__inst_executed_pipe_alu", "sm__pipe_alu_cycles_active"),
    "fma": (
        "sm__inst_executed_pipe_fma",
        "sm__pipe_fma_cycles_active",
        "sm__pipe_fmaheavy_cycles_active",
    ),
    "shared": ("sm__inst_executed_pipe_lsu", "sm__pipe_shared_cycles_active"),
    "global": ("sm__inst_executed_pipe_lsu",),
    "xu": ("sm__inst_executed_pipe_xu", "sm__pipe_xu_cycles_active"),
    "issue": ("smsp__issue_active",),
}

_TIME_SCALE = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}
_CLOCK_SCALE = {"hz": 1e-9, "khz": 1e-6, "mhz": 1e-3, "ghz": 1.0, "cycle/second": 1e-9,
                "cycle/nsecond": 1.0, "cycle/usecond": 1e-3}  # fmt: skip


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def read_ncu_csv(path: Path) -> tuple[list[str], list[str], list[list[str]]]:
    """(metric names, units, one row per profiled kernel) of ``ncu --page raw --csv``."""
    lines = path.read_text(errors="replace").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return [], [], []
    rows = list(csv.reader(lines[start:]))
    if len(rows) < 3:
        return rows[0] if rows else [], [], []
    return rows[0], rows[1], rows[2:]


def ncu(path: Path, model_path: Path | None) -> int:
    head, units, rows = read_ncu_csv(path)
    if not rows:
        print("ncu: no profiled kernels in the raw page")
        return 1
    col = {name: i for i, name in enumerate(head)}

    def cell(row: list[str], name: str) -> str:
        i = col.get(name)
        return row[i] if i is not None and i < len(row) else ""

    names = [cell(r, "Kernel Name") or "?" for r in rows]
    print(
        "metric | " + " | ".join(f"{n} #{cell(r, 'ID')}" for n, r in zip(names, rows, strict=True))
    )
    for name in head:
        if NCU_WANT.match(name):
            unit = units[col[name]] if col[name] < len(units) else ""
            print(f"{name} [{unit}] | " + " | ".join(cell(r, name) for r in rows))
    if model_path is None:
        return 0
    try:
        model = json.loads(model_path.read_text())
    except (OSError, ValueError) as exc:
        print(f"\nstatic model: not available ({exc})")
        return 0
    # The measured gcm_chunks launch: the longest one (the 128 MiB open in 4 MiB chunks).
    chunk_rows = [r for r, n in zip(rows, names, strict=True) if n.startswith("gcm_chunks")]
    if not chunk_rows:
        print("\nno gcm_chunks launch profiled: nothing to set beside the model")
        return 0

    def seconds(row: list[str]) -> float:
        value = _number(cell(row, "gpu__time_duration.sum")) or 0.0
        unit = units[col["gpu__time_duration.sum"]] if "gpu__time_duration.sum" in col else ""
        return value * _TIME_SCALE.get(unit.strip().lower(), 1e-9)

    row = max(chunk_rows, key=seconds)
    compare(model, row, seconds(row), cell, units, col)
    return 0


def compare(
    model: dict[str, Any],
    row: list[str],
    took: float,
    cell: Any,
    units: list[str],
    col: dict[str, int],
) -> None:
    """Measured pipe utilisation of one gcm_chunks launch beside the static model's prediction."""
    text_bytes = 128 * (1 << 20)  # the ncu driver's first open: 128 MiB in 4 MiB chunks
    measured = text_bytes / took / 1e9 if took > 0 else 0.0
    clock_name = "sm__cycles_elapsed.avg.per_second"
    clock = _number(cell(row, clock_name)) if clock_name in col else None
    unit = units[col[clock_name]].strip().lower() if clock_name in col else ""
    ghz = clock * _CLOCK_SCALE.get(unit, 1.0) if clock is not None else None
    boost = float(model["machine"]["boost_ghz"])
    at = ghz if ghz else boost
    amort = model["amortized"]
    print(
        f"\ngcm_chunks, 128 MiB in 4 MiB chunks: {took * 1e3:.3f} ms = {measured:.0f} GB/s of text "
        f"at {at:.2f} GHz ({'measured' if ghz else 'assumed: boost'}) under ncu's replay"
    )
    print(
        f"static model ({model['arch']}, amortized): {amort['gbps_boost']} GB/s at {boost} GHz, "
        f"{amort['limiter']}-limited; scaled to {at:.2f} GHz: "
        f"{float(amort['gbps_boost']) * at / boost:.0f} GB/s"
    )
    print(f"{'pipe':<8} {'model GB/s':>10} {'predicted busy':>14}  measured by ncu")
    for mrow in amort["rows"]:
        pipe = mrow["pipe"]
        bound = mrow["gbps_boost"]
        if bound is None:
            continue
        scaled = float(bound) * at / boost
        predicted = 100.0 * measured / scaled if scaled else 0.0
        found = []
        for prefix in MODEL_TO_NCU.get(pipe, ()):
            for name, i in col.items():
                if name.startswith(prefix + ".") and name.endswith("pct_of_peak_sustained_active"):
                    found.append(f"{name.split('.')[0]} {row[i] if i < len(row) else '?'}%")
        print(f"{pipe:<8} {scaled:>10.0f} {predicted:>13.0f}%  {'; '.join(found) or '-'}")
    print(
        "predicted busy = measured GB/s / the pipe's bound at that clock: what the model says the "
        "pipe must be doing to deliver the measured rate. A measured value well above it means "
        "the machine code does more on that pipe than the model counts (replays, bank conflicts, "
        "the tail path); well below it and near 100% elsewhere, another pipe or latency limits."
    )


# --- the clock sampler ---------------------------------------------------------------------------


def clocks(path: Path) -> int:
    """nvidia-smi samples: timestamp, SM MHz, memory MHz, power W, temperature C, util %."""
    rows: list[tuple[float, float, float, float]] = []
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        print(f"clock samples: none ({exc})")
        return 0
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 6:
            continue
        sm, power, temp, util = (_number(fields[i]) for i in (1, 3, 4, 5))
        if sm is not None and power is not None and temp is not None and util is not None:
            rows.append((sm, power, temp, util))
    busy = [r for r in rows if r[3] >= 50]
    print(f"clock samples: {len(rows)}, {len(busy)} with utilisation >= 50%")
    if busy:
        mhz = [r[0] for r in busy]
        watts = [r[1] for r in busy]
        print(
            f"SM clock under load: min {min(mhz):.0f}, median {statistics.median(mhz):.0f}, "
            f"max {max(mhz):.0f} MHz; power median {statistics.median(watts):.0f} W, max "
            f"{max(watts):.0f} W; temperature max {max(r[2] for r in busy):.0f} C"
        )
    return 0


# --- imports -------------------------------------------------------------------------------------

IMPORTS = ("gpucc", "cryptography", "cffi", "signxml", "platformdirs", "jwt", "blake3", "lxml",
           "typer", "rich", "yaml", "requests", "numpy", "cupy", "pytest")  # fmt: skip


def imports(optional: list[str]) -> int:
    """Import each package the GPU path needs; 1 when one that is not optional fails."""
    missing = 0
    for name in IMPORTS:
        try:
            mod = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - report every kind of import failure
            print(f"import {name}: FAILED ({type(exc).__name__}: {exc})")
            missing += name not in optional
            continue
        print(
            f"import {name}: {getattr(mod, '__version__', '?')} ({getattr(mod, '__file__', '?')})"
        )
    return 1 if missing else 0


def smoke() -> int:
    """``--smoke``: each reader on a tiny input of the shape the validation run writes."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpu-report-smoke-") as tmp:
        report = Path(tmp) / "junit.xml"
        report.write_text(
            '<testsuites><testsuite name="pytest">'
            '<testcase classname="t" name="a" time="0.1" />'
            '<testcase classname="t" name="b" time="0.1">'
            '<skipped type="pytest.skip" message="needs two GPUs" /></testcase>'
            "</testsuite></testsuites>"
        )
        samples = Path(tmp) / "clocks.csv"
        samples.write_text(
            "2026/11/25 10:00:00.000, 1980, 2619, 650.2, 60, 100\n"
            "2026/11/25 10:00:00.500, 1755, 2619, 700.0, 62, 98\n"
        )
        status = junit(report, "needs two GPUs") | clocks(samples)
    return status | imports(list(IMPORTS))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument(
        "--smoke", action="store_true", help="run the readers on tiny inputs (a check CI runs)"
    )
    sub = ap.add_subparsers(dest="cmd")
    j = sub.add_parser("junit", help="verdict of a pytest JUnit XML report")
    j.add_argument("xml", type=Path)
    j.add_argument("--allow-skip", help="regex of skip reasons that are not failures")
    n = sub.add_parser("ncu", help="metrics from ncu's raw CSV, beside the static model")
    n.add_argument("csv", type=Path)
    n.add_argument("--model", type=Path, help="benchmarks/sass_model.py --json output")
    c = sub.add_parser("clocks", help="summary of the nvidia-smi sampler")
    c.add_argument("csv", type=Path)
    i = sub.add_parser("imports", help="versions of the packages the GPU path imports")
    i.add_argument("--optional", action="append", default=[], help="may be missing")
    args = ap.parse_args(argv)
    if args.smoke:
        return smoke()
    if args.cmd is None:
        ap.error("a command is required")
    if args.cmd == "junit":
        return junit(args.xml, args.allow_skip)
    if args.cmd == "ncu":
        return ncu(args.csv, args.model)
    if args.cmd == "clocks":
        return clocks(args.csv)
    return imports(args.optional)


if __name__ == "__main__":
    sys.exit(main())
