"""A simulated NSCQ library, built from tests/support/nscq_sim.c with the system's C compiler,
answering with a simulated board's switch reports and chains."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpucc.gpuattest.simulate_board import SimulatedBoard

SOURCE = Path(__file__).with_name("nscq_sim.c")


def build_nscq(directory: Path) -> Path:
    """``libnvidia-nscq`` simulated, compiled into ``directory``; skipped without a C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler to build the simulated NSCQ library")
    library = directory / "libnvidia-nscq-sim.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(SOURCE)],
        check=True,
        capture_output=True,
    )
    return library


def write_switches(board: SimulatedBoard, nonce: bytes, directory: Path) -> list[bytes]:
    """Each switch's report over ``nonce`` and chain where the library reads them."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "nonce.bin").write_bytes(nonce)
    reports = []
    for i, switch in enumerate(board.switches):
        report = switch.report(nonce, board.gpu_pdis)
        (directory / f"report-{i}.bin").write_bytes(report)
        (directory / f"chain-{i}.pem").write_bytes(switch.device_pki.pem())
        reports.append(report)
    return reports
