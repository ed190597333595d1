"""``gpucc attest --device nvswitch`` and ``--ppcie`` as real processes."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
from pathlib import Path

import jsonschema

from gpucc.cli.schemas import load_schema
from gpucc.gpuattest.evidence import dump_evidence_json
from gpucc.gpuattest.simulate_board import SimulatedBoard
from tests.conftest import GpuccRunner
from tests.support.samples import (
    SWITCH,
    SWITCH_CHAIN,
    SWITCH_JSON,
    SWITCH_NONCE,
    SWITCH_REPORT,
    report_bytes,
)
from tests.support.spdm import spdm_measurement_blocks
from tests.unit.assembly.test_ppcie import write_board

NOW = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)


def _policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text("ocsp:\n  require: false\n")
    return path


def _switch(run: GpuccRunner, tmp_path: Path, *args: str | Path) -> tuple[int, dict]:  # type: ignore[type-arg]
    base = ["attest", "--device", "nvswitch", "--nonce", SWITCH_NONCE, "--rim-dir", SWITCH]
    result = run(
        *base, "--offline", "--policy", _policy(tmp_path), "-f", "json", *args, cwd=tmp_path
    )
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, load_schema("gpucc.attest/v1"))
    return result.returncode, doc


def test_the_real_switch_is_trusted_in_its_window(run_gpucc: GpuccRunner, tmp_path: Path) -> None:
    code, doc = _switch(
        run_gpucc, tmp_path, "--evidence", SWITCH_JSON, "--at", "2026-12-01T00:00:00Z"
    )
    assert code == 0 and doc["verdict"] == "trusted" and doc["gpus"] == []
    switch = doc["switches"][0]
    assert switch["claims"]["x-nvidia-device-type"] == "nvswitch"
    assert switch["rim_ids"] == {"bios": "NV_SWITCH_BIOS_5612_0002_890_9610550001"}
    assert switch["device_pdi"] == "203eb31ad9ed0008"


def test_the_raw_report_outside_the_window_is_not_trusted(
    run_gpucc: GpuccRunner, tmp_path: Path
) -> None:
    code, doc = _switch(
        run_gpucc, tmp_path, "--evidence", SWITCH_REPORT, "--cert-chain", SWITCH_CHAIN,
        "--at", "2027-11-03T00:00:00Z",
    )  # fmt: skip
    assert code == 1 and doc["verdict"] == "not-trusted"
    assert "L3 LS10 001" in doc["reasons"][0]


def test_without_the_rim_it_is_undecided(run_gpucc: GpuccRunner, tmp_path: Path) -> None:
    result = run_gpucc(
        "attest", "--device", "nvswitch", "--evidence", SWITCH_JSON, "--nonce", SWITCH_NONCE,
        "--offline", "--policy", _policy(tmp_path), "--at", "2026-12-01T00:00:00Z", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 3, result.stdout + result.stderr
    assert "NV_SWITCH_BIOS_5612_0002_890_9610550001" in result.stdout


def test_the_wrong_device_is_a_usage_error(run_gpucc: GpuccRunner, tmp_path: Path) -> None:
    switch = run_gpucc("attest", "--evidence", SWITCH_JSON, "--nonce", SWITCH_NONCE, cwd=tmp_path)
    assert switch.returncode == 2 and "--device nvswitch" in switch.stderr
    gpu = run_gpucc(
        "attest", "--device", "nvswitch", "--evidence", SWITCH.parent / "h100-550.90.07" /
        "attestation-report.hex", "--cert-chain", SWITCH.parent / "h100-550.90.07" / "cert-chain.pem",
        "--nonce", SWITCH_NONCE, cwd=tmp_path,
    )  # fmt: skip
    assert gpu.returncode == 2 and "the evidence is a GPU's (arch HOPPER)" in gpu.stderr


def _one_switch_file(tmp_path: Path, report: bytes) -> Path:
    entry = json.loads(SWITCH_JSON.read_text())[0]
    entry["evidence"] = base64.b64encode(report).decode()
    path = tmp_path / "switch.json"
    path.write_text(json.dumps([entry]))
    return path


def test_truncated_trailing_and_garbled_switch_evidence_is_malformed(
    run_gpucc: GpuccRunner, tmp_path: Path
) -> None:
    raw = bytes.fromhex(SWITCH_REPORT.read_text().strip())
    for report, message in (
        (raw[:-1], "signature needs 96 bytes"),
        (raw + b"\x00", "ends after 2168 bytes"),
        (raw + bytes(0x2000), "maximum"),
        (b"\x11" + raw[1:40], "truncated"),
    ):
        path = _one_switch_file(tmp_path, report)
        result = run_gpucc(
            "attest", "--device", "nvswitch", "--evidence", path, "--nonce", SWITCH_NONCE,
            "--offline", cwd=tmp_path,
        )  # fmt: skip
        assert result.returncode == 4, result.stderr
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    garbled = tmp_path / "garbled.json"
    garbled.write_text('[{"arch": "LS10", "evidence": "%%%", "certificate": ""}]')
    result = run_gpucc("attest", "--device", "nvswitch", "--evidence", garbled, cwd=tmp_path)
    assert result.returncode == 4 and "base64" in result.stderr


def test_ppcie_board_from_files(run_gpucc: GpuccRunner, tmp_path: Path) -> None:
    board = SimulatedBoard.create(now=NOW)
    directory = write_board(board, tmp_path / "sim")
    nonce = os.urandom(32)
    evidence = board.evidence(nonce)
    whole = tmp_path / "board.json"
    whole.write_bytes(dump_evidence_json(evidence))
    base = ["attest", "--ppcie", "--simulate", directory, "--nonce", nonce.hex(), "-f", "json"]
    ok = run_gpucc(*base, "--evidence", whole, cwd=tmp_path)
    doc = json.loads(ok.stdout)
    assert ok.returncode == 0, doc["reasons"]
    assert len(doc["gpus"]) == 8 and len(doc["switches"]) == 4
    assert doc["topology"]["verdict"] == "trusted"
    jsonschema.validate(doc, load_schema("gpucc.attest/v1"))
    # The switches in their own file (nvattest's --nvswitch-evidence-file), one missing.
    gpus = tmp_path / "gpus.json"
    gpus.write_bytes(dump_evidence_json(type(evidence)(gpus=evidence.gpus[:8])))
    switches = tmp_path / "switches.json"
    switches.write_bytes(dump_evidence_json(type(evidence)(gpus=evidence.gpus[8:11])))
    missing = run_gpucc(
        *base, "--evidence", gpus, "--nvswitch-evidence-file", switches, cwd=tmp_path
    )
    doc = json.loads(missing.stdout)
    assert missing.returncode == 1
    failed = [c["id"] for c in doc["topology"]["checks"] if c["status"] == "fail"]
    assert failed == ["switch-count", "switch-pdis-known"]
    text = run_gpucc(
        *base[:-2], "--evidence", gpus, "--nvswitch-evidence-file", switches, cwd=tmp_path
    )
    assert text.returncode == 1 and "Protected PCIe topology" in text.stdout
    assert "NVSwitch count" in text.stdout


def test_the_switch_reports_its_31_measurements_in_full(
    run_gpucc: GpuccRunner, tmp_path: Path
) -> None:
    blocks = spdm_measurement_blocks(report_bytes(SWITCH_REPORT))
    args = ("--evidence", SWITCH_JSON, "--at", "2026-12-01T00:00:00Z")
    code, doc = _switch(run_gpucc, tmp_path, *args)
    assert code == 0
    expected = [{"index": i, "value": blocks[i].hex()} for i in sorted(blocks)]
    assert len(expected) == 31 and doc["switches"][0]["runtime_measurements"] == expected
    assert doc["switches"][0]["unverified_runtime_measurements"] == []
    base = ["attest", "--device", "nvswitch", "--nonce", SWITCH_NONCE, "--rim-dir", SWITCH]
    text = run_gpucc(*base, "--offline", "--policy", _policy(tmp_path), "-v", *args, cwd=tmp_path)
    shown = [line for line in text.stdout.splitlines() if line.startswith("measurement ")]
    assert shown == [f"measurement {i:<2}  {blocks[i].hex()}" for i in sorted(blocks)]
