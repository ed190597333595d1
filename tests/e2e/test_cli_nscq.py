"""``gpucc evidence collect --device nvswitch`` through a simulated NSCQ library: the real
ctypes path loads a shared library built here with the system's C compiler, which exports
NSCQ's calls and answers with a simulated board's switches."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from gpucc.cli.schemas import load_schema
from gpucc.gpuattest.simulate_board import SimulatedBoard
from tests.support.cli import run_cli
from tests.support.nscq import build_nscq, write_switches
from tests.unit.assembly.test_ppcie import write_board

NOW = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[SimulatedBoard, Path, Path]:
    """The board (2 GPUs, 2 switches), its roots and RIMs, and the simulated NSCQ library."""
    board = SimulatedBoard.create(now=NOW, gpus=2, switches=2)
    base = tmp_path_factory.mktemp("nscq")
    return board, write_board(board, base / "sim"), build_nscq(base)


def collect(library: Path | str, data: Path, out: Path, nonce: bytes, *extra: str):  # type: ignore[no-untyped-def]
    return run_cli(
        "evidence", "collect", "--device", "nvswitch", "--nonce", nonce.hex(), "-o", out,
        "--nscq-library", library, *extra, env={"GPUCC_TEST_NSCQ_DIR": str(data)},
    )  # fmt: skip


def test_switch_evidence_through_nscq_is_nvattests_and_verifies(
    world: tuple[SimulatedBoard, Path, Path], tmp_path: Path
) -> None:
    board, sim, library = world
    nonce = os.urandom(32)
    reports = write_switches(board, nonce, tmp_path / "nscq")
    out = tmp_path / "switches.json"
    proc = collect(library, tmp_path / "nscq", out, nonce, "-f", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    Draft202012Validator(load_schema("gpucc.evidence/v1")).validate(doc)
    assert doc["switches"] == 2 and doc["gpus"] == 0 and doc["nonce"] == nonce.hex()
    entries = json.loads(out.read_text())
    assert [e["arch"] for e in entries] == ["LS10", "LS10"]
    assert [base64.b64decode(e["evidence"]) for e in entries] == reports
    assert base64.b64decode(entries[0]["certificate"]) == board.switches[0].device_pki.pem()
    assert all(e["nonce"] == nonce.hex() for e in entries)
    verified = run_cli(
        "attest", "--device", "nvswitch", "--simulate", sim, "--evidence", out,
        "--nonce", nonce.hex(), "-f", "json",
    )  # fmt: skip
    result = json.loads(verified.stdout)
    assert verified.returncode == 0, result["reasons"]
    assert len(result["switches"]) == 2


def test_the_nonce_reaches_nscq(world: tuple[SimulatedBoard, Path, Path], tmp_path: Path) -> None:
    """The simulated library answers only the nonce its reports were made for."""
    board, _, library = world
    write_switches(board, os.urandom(32), tmp_path / "nscq")
    out = tmp_path / "switches.json"
    proc = collect(library, tmp_path / "nscq", out, os.urandom(32))
    assert proc.returncode == 5, proc.stderr
    assert "NSCQ could not read the attestation report: sim-switch-0: unexpected value (-5)" in (
        proc.stderr
    )
    assert not out.exists()


def test_a_switch_that_is_not_ls10_is_refused(
    world: tuple[SimulatedBoard, Path, Path], tmp_path: Path
) -> None:
    board, _, library = world
    nonce = os.urandom(32)
    write_switches(board, nonce, tmp_path / "nscq")
    proc = run_cli(
        "evidence", "collect", "--device", "nvswitch", "--nonce", nonce.hex(), "-o",
        tmp_path / "out.json", "--nscq-library", library,
        env={"GPUCC_TEST_NSCQ_DIR": str(tmp_path / "nscq"), "GPUCC_TEST_NSCQ_ARCH": "1"},
    )  # fmt: skip
    assert proc.returncode == 5 and "NVSwitch sim-switch-0 is LR10, not LS10" in proc.stderr


def test_without_nscq_it_is_exit_5_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "switches.json"
    proc = collect(tmp_path / "libnvidia-nscq.so.2", tmp_path, out, os.urandom(32))
    assert proc.returncode == 5, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpucc: error: the NSCQ library"), lines
    assert "Traceback" not in proc.stderr and not out.exists()


def test_cvm_evidence_goes_with_gpus(tmp_path: Path) -> None:
    proc = run_cli(
        "evidence", "collect", "--device", "nvswitch", "-o", tmp_path / "s.json",
        "--cvm", tmp_path / "q.bin",
    )  # fmt: skip
    assert proc.returncode == 2 and "--cvm goes with GPU evidence" in proc.stderr


def test_without_the_system_library_it_says_nscq_is_not_installed(tmp_path: Path) -> None:
    import ctypes.util

    if ctypes.util.find_library("nvidia-nscq") is not None:
        pytest.skip("this machine has NVIDIA's NSCQ library installed")
    proc = run_cli("evidence", "collect", "--device", "nvswitch", "-o", tmp_path / "s.json")
    assert proc.returncode == 5, proc.stderr
    assert "NVIDIA's NSCQ library (libnvidia-nscq) is not installed" in proc.stderr


def test_switch_evidence_as_cmw_verifies(
    world: tuple[SimulatedBoard, Path, Path], tmp_path: Path
) -> None:
    board, sim, library = world
    nonce = os.urandom(32)
    reports = write_switches(board, nonce, tmp_path / "nscq")
    out = tmp_path / "switches.cmw.json"
    proc = collect(library, tmp_path / "nscq", out, nonce, "--evidence-format", "cmw")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["__cmwc_t"].startswith("tag:nvidia.com,2026:verifier-input/")
    assert sorted(k for k in doc if k.startswith("switch_")) == ["switch_0", "switch_1"]
    media, value = doc["switch_0"]["evidence"]
    assert media == "application/vnd.nvidia.spdm-measurement-transcript"
    assert base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)) == reports[0]
    verified = run_cli(
        "attest", "--device", "nvswitch", "--simulate", sim, "--evidence", out,
        "--nonce", nonce.hex(), "-f", "json",
    )  # fmt: skip
    result = json.loads(verified.stdout)
    assert verified.returncode == 0, result["reasons"]
    assert len(result["switches"]) == 2
