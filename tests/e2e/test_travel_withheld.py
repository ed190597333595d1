"""`gpucc travel run` against a holder whose release policy withholds one of the plan's
datasets, and against one that cannot be reached: real processes, real HTTP. A withheld
dataset is a refusal (exit 1) naming the holder, the dataset and the rule, never a wrong key;
a connection failure keeps its cause and has a kind of its own."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpucc.travel.signing import key_id
from tests.e2e.test_travel_e2e import _holder_files
from tests.support.cli import run_cli
from tests.support.netfixtures import free_port

pytestmark = pytest.mark.slow


def _plan(path: Path, holder_id: str, url: str, key: Any, datasets: list[Any]) -> Path:
    doc = {
        "version": 1,
        "holders": [
            {
                "id": holder_id,
                "url": url,
                "public_key": "sha256:" + key_id(key),
                "datasets": [
                    {"name": d, "path": str(p), "header_digest": h.hex()} for d, p, h, _ in datasets
                ],
            }
        ],
    }
    path.write_text(json.dumps(doc))
    return path


def _simulation(work: Path) -> None:
    """A simulated GPU and CVM in ``work/sim``, made by the first command that uses it."""
    (work / "sim").mkdir()
    made = run_cli("session", "offer", "--challenge", "00" * 32, "-o", "sim/offer.json",
                   "--host-key", "sim/host.key", "--simulate", "sim", cwd=work)  # fmt: skip
    assert made.returncode == 0, made.stderr


def test_a_withheld_dataset_is_a_refusal_naming_holder_dataset_and_rule(tmp_path: Path) -> None:
    *_, datasets, _keys, key = _holder_files(tmp_path, "h", [1_000, 2_000])
    made = run_cli("travel", "keygen", "--orchestrator-key", "k1.key",
                   "--orchestrator-pub", "k1.pub", cwd=tmp_path)  # fmt: skip
    assert made.returncode == 0, made.stderr
    _simulation(tmp_path)
    (tmp_path / "holder.yaml").write_text(
        "datasets: h/data\ndata-key: h/data.key\nholder-key: h/holder.key\n"
        "listen: '127.0.0.1:0'\naddress-file: address\nsimulate: sim\nstate: memory\n"
        "releases:\n  - {name: k1-only, datasets: [h-1], requesters: [k1.pub]}\n"
    )
    log = tmp_path / "holder.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucc.cli.holder", "serve", "--config", "holder.yaml"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "address").exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        url = "http://" + (tmp_path / "address").read_text().strip()
        plan = _plan(tmp_path / "plan.json", "hospital", url, key, datasets)
        for fmt in ("text", "json"):
            run = run_cli("travel", "run", str(plan), "--simulate", "sim", "-f", fmt,
                          cwd=tmp_path)  # fmt: skip
            assert run.returncode == 1, run.stderr
            if fmt == "text":
                (line,) = [x for x in run.stderr.splitlines() if "error:" in x]
                assert "holder hospital withheld h-1" in line
                assert "dataset h-1 (policy k1-only): requester identity" in line
                assert "no key for this dataset" not in run.stderr
            else:
                error = json.loads(run.stdout)["error"]
                assert error["kind"] == "not-trusted" and "withheld h-1" in error["message"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def test_a_refused_connection_keeps_its_cause_and_its_kind(tmp_path: Path) -> None:
    *_, datasets, _keys, key = _holder_files(tmp_path, "g", [1_000])
    _simulation(tmp_path)
    url = f"http://127.0.0.1:{free_port()}"
    plan = _plan(tmp_path / "plan.json", "gone", url, key, datasets)
    run = run_cli("travel", "run", str(plan), "--simulate", "sim", "-f", "json", cwd=tmp_path)
    assert run.returncode == 3, run.stderr
    error = json.loads(run.stdout)["error"]
    assert error["kind"] == "connection-failed"
    assert error["message"] == f"holder {url}: connection failed: Connection refused"
