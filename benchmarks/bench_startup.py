"""Whole-process start-up and verification time: gpucc beside NVIDIA's Python verifier.

Run by hand: ``python benchmarks/bench_startup.py [--runs N] [--nvidia-python PATH]``
(``--smoke``: one run of each, a quick check that CI runs).

Each command runs as a separate process, interleaved round by round so that all of them
see the same machine load; the table gives the median, min and max wall time of N runs
and each median's ratio to NVIDIA's verifier. Nothing is asserted: the numbers are for
reading side by side.

Commands:

* ``gpucc --version``: the CLI's start-up alone.
* ``gpucc attest --sample --offline --at 2024-01-01T00:00:00Z``: the bundled set A
  (driver 545.00), fully verified with its RIMs.
* ``gpucc attest`` on NVIDIA's 550.90.07 sample (report, chain, nonce; ``--offline``):
  the sample NVIDIA's current verifier ships. No RIM for it exists offline, so gpucc
  verifies report, chain, FWID, signature and nonce and ends undecided (exit 3).
* with ``--baseline OLD``: the same three commands run by another gpucc executable (an
  install of an earlier commit), in the same rounds, so before and after share the load.
* NVIDIA's verifier, ``python -m verifier.cc_admin --test_no_gpu`` (package
  ``nv-local-gpu-verifier``): the same 550.90.07 sample. It verifies the chain and FWID,
  then stops at the device-certificate OCSP request, which is pointed at a closed local
  port (``NV_OCSP_URL``) so that it never uses the network. It writes ``verifier.log``
  in its working directory, so it runs in a temporary directory.

NVIDIA's verifier is not a gpucc dependency. Install it into a separate environment::

    python3 -m venv /tmp/nvverifier
    /tmp/nvverifier/bin/pip install nv-local-gpu-verifier

and pass that environment's interpreter with ``--nvidia-python`` (default: the
``NV_VERIFIER_PYTHON`` variable). Without it, its row is skipped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAD = ROOT / "tests" / "data" / "nvidia-samples" / "h100-550.90.07"
HEAD_NONCE = "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb"
CLOSED_PORT = "http://127.0.0.1:9/"


@dataclass
class Command:
    """One command line to time, and the exit statuses it may end with."""

    label: str
    argv: list[str]
    ok_codes: tuple[int, ...]
    cwd: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)


def gpucc_argv(given: str | None) -> list[str]:
    if given:
        return [given]
    exe = shutil.which("gpucc", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "gpucc"]


def gpucc_commands(gpucc: list[str], tag: str = "") -> list[Command]:
    """The three gpucc rows; ``tag`` marks a baseline's rows."""
    head = [
        "attest", "--evidence", str(HEAD / "attestation-report.hex"),
        "--cert-chain", str(HEAD / "cert-chain.pem"), "--nonce", HEAD_NONCE, "--offline",
    ]  # fmt: skip
    return [
        Command(f"gpucc --version{tag}", [*gpucc, "--version"], (0,)),
        Command(
            f"gpucc attest --sample (545.00, full){tag}",
            [*gpucc, "attest", "--sample", "--offline", "--at", "2024-01-01T00:00:00Z"],
            (0,),
        ),
        Command(f"gpucc attest 550.90.07 sample{tag}", [*gpucc, *head], (3,)),
    ]


def commands(
    gpucc: list[str], nvidia_python: str | None, workdir: Path, baseline: str | None = None
) -> list[Command]:
    cmds = gpucc_commands(gpucc)
    if baseline:
        cmds += gpucc_commands([baseline], " [baseline]")
    if nvidia_python:
        cmds.append(
            Command(
                "NVIDIA verifier --test_no_gpu (550.90.07)",
                [nvidia_python, "-W", "ignore", "-m", "verifier.cc_admin", "--test_no_gpu"],
                (0, 1),
                cwd=workdir,
                env={"NV_OCSP_URL": CLOSED_PORT, "NV_RIM_URL": CLOSED_PORT},
            )
        )
    return cmds


def run_once(cmd: Command, base_env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd.argv,
        cwd=cmd.cwd,
        env={**base_env, **cmd.env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    elapsed = time.perf_counter() - t0
    if proc.returncode not in cmd.ok_codes:
        sys.exit(
            f"{cmd.label}: exit {proc.returncode}, expected {cmd.ok_codes}\n"
            + proc.stderr.decode(errors="replace")[-2000:]
        )
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="timed runs per command")
    parser.add_argument(
        "--nvidia-python",
        default=os.environ.get("NV_VERIFIER_PYTHON"),
        help="python of an environment with nv-local-gpu-verifier installed",
    )
    parser.add_argument(
        "--gpucc",
        help="gpucc executable to time (default: the one beside this interpreter); an "
        "editable (development) install starts slower than a regular one",
    )
    parser.add_argument(
        "--baseline",
        help="a second gpucc executable (e.g. an install of an earlier commit), timed in the "
        "same rounds; its rows are marked [baseline]",
    )
    parser.add_argument("--smoke", action="store_true", help="one run of each: a quick check")
    args = parser.parse_args()
    if args.smoke:
        args.runs = 1
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCC_", "NVAT_", "NV_"))}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        cmds = commands(gpucc_argv(args.gpucc), args.nvidia_python, Path(tmp), args.baseline)
        for cmd in cmds:  # warm-up: bytecode caches, page cache
            run_once(cmd, base_env)
        for _ in range(args.runs):
            for cmd in cmds:
                cmd.times.append(run_once(cmd, base_env))
    reference = cmds[-1] if args.nvidia_python else None
    ref_median = statistics.median(reference.times) if reference else None
    print(f"{os.cpu_count()} CPUs, {args.runs} runs each; gpucc: {' '.join(cmds[0].argv[:-1])}")
    print(f"{'command':55} {'median ms':>9} {'min':>7} {'max':>7} {'vs NVIDIA':>9}")
    for cmd in cmds:
        median = statistics.median(cmd.times)
        ratio = f"{median / ref_median:.2f}x" if ref_median else "-"
        print(
            f"{cmd.label:55} {median * 1000:9.0f} {min(cmd.times) * 1000:7.0f} "
            f"{max(cmd.times) * 1000:7.0f} {ratio:>9}"
        )
    if not args.nvidia_python:
        print("NVIDIA's verifier skipped: pass --nvidia-python (see the module docstring)")


if __name__ == "__main__":
    main()
