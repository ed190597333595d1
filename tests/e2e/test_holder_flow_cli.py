"""The holder flow from the command line, with real processes and real HTTP: `gpucc travel
run` against a holder whose release policy withholds one of the plan's datasets (a refusal,
exit 1, naming the holder, the dataset and the rule, never a wrong key) and against one that
cannot be reached (the cause kept, a kind of its own); `gpucc session accept --holder-pub`
opening the holder's signed envelope only under the holder's key."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpucc.travel.client import HolderClient
from gpucc.travel.signing import generate_signing_key, key_id, public_pem
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


@contextlib.contextmanager
def _holder(
    work: Path, extra: str = ""
) -> Iterator[tuple[str, Any, list[Any], subprocess.Popen[bytes]]]:
    """A holder serving h-0 to anyone and h-1 only to offers signed by k1 (configuration
    ``extra`` added): its URL, its signing key, its datasets and its process."""
    *_, datasets, _keys, key = _holder_files(work, "h", [1_000, 2_000])
    made = run_cli("travel", "keygen", "--orchestrator-key", "k1.key",
                   "--orchestrator-pub", "k1.pub", cwd=work)  # fmt: skip
    assert made.returncode == 0, made.stderr
    _simulation(work)
    (work / "holder.yaml").write_text(
        "datasets: h/data\ndata-key: h/data.key\nholder-key: h/holder.key\n"
        "listen: '127.0.0.1:0'\naddress-file: address\nsimulate: sim\nstate: memory\n"
        "releases:\n  - {name: k1-only, datasets: [h-1], requesters: [k1.pub]}\n" + extra
    )
    log = work / "holder.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucc.cli.holder", "serve", "--config", "holder.yaml"],
        cwd=work, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (work / "address").exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield "http://" + (work / "address").read_text().strip(), key, datasets, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def test_a_withheld_dataset_is_a_refusal_naming_holder_dataset_and_rule(tmp_path: Path) -> None:
    with _holder(tmp_path) as (url, key, datasets, _):
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


def test_session_accept_opens_a_holder_envelope_under_the_holder_key(tmp_path: Path) -> None:
    with _holder(tmp_path) as (url, key, datasets, _):
        challenge = HolderClient(url).challenge().hex()
        made = run_cli("session", "offer", "--challenge", challenge, "-o", "offer.json",
                       "--host-key", "host.key", "--simulate", "sim", cwd=tmp_path)  # fmt: skip
        assert made.returncode == 0, made.stderr
        reply = requests.post(url + "/v1/offer", data=(tmp_path / "offer.json").read_bytes())
        assert reply.status_code == 200, reply.text
        (tmp_path / "envelope.json").write_bytes(reply.content)
    (tmp_path / "holder.pub").write_bytes(public_pem(key))
    accept = ("session", "accept", "envelope.json", "--host-key", "host.key")
    bare = run_cli(*accept, cwd=tmp_path)
    assert bare.returncode == 2 and "--holder-pub" in bare.stderr, bare.stderr
    for pin in ("holder.pub", "sha256:" + key_id(key)):
        opened = run_cli(*accept, "--holder-pub", pin, "--dataset", str(datasets[0][1]),
                         "-f", "json", cwd=tmp_path)  # fmt: skip
        assert opened.returncode == 0, opened.stderr
        doc = json.loads(opened.stdout)
        assert doc["holder_key_id"] == key_id(key)
        assert doc["header_digests"] == [datasets[0][2].hex()]  # h-1 was withheld
    opened = run_cli(*accept, "--holder-pub", "holder.pub", "-o", "answer.json", cwd=tmp_path)
    assert opened.returncode == 0, opened.stderr
    staged = run_cli("stage", str(datasets[0][1]), "--session", "answer.json",
                     "--host-key", "host.key", cwd=tmp_path)  # fmt: skip
    assert staged.returncode == 0, staged.stderr
    other = "sha256:" + key_id(generate_signing_key())
    forged = run_cli(*accept, "--holder-pub", other, cwd=tmp_path)
    assert forged.returncode == 6 and "not by the pinned holder key" in forged.stderr


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


def test_one_command_pins_the_simulated_cvm_for_a_users_policy(tmp_path: Path) -> None:
    """A simulated holder under the user's own policy refuses the simulated CVM until `gpucc
    cvm pin --simulate DIR` adds it to that policy; then the journey travels."""
    (tmp_path / "mine.yaml").write_text("version: 1\nocsp:\n  require: false\n")
    (tmp_path / "policy.yaml").write_text("version: 1\nocsp:\n  require: false\n")
    with _holder(tmp_path, "policy: policy.yaml\n") as (url, key, datasets, holder):
        plan = _plan(tmp_path / "plan.json", "hospital", url, key, datasets[:1])
        refused = run_cli("travel", "run", str(plan), "--simulate", "sim", cwd=tmp_path)
        assert refused.returncode == 1, refused.stderr
        pinned = run_cli("cvm", "pin", "--simulate", "sim", "--base", "mine.yaml",
                         "-o", "policy.yaml", "--force", cwd=tmp_path)  # fmt: skip
        assert pinned.returncode == 0, pinned.stderr
        assert "SIMULATED CVM" in pinned.stderr
        log = tmp_path / "holder.log"
        holder.send_signal(signal.SIGHUP)  # the holder re-reads its configuration and policy
        deadline = time.monotonic() + 30
        while '"reloaded"' not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        signed = json.loads(plan.read_text())  # the log is signed with the orchestrator key
        plan.write_text(
            json.dumps({**signed, "orchestrator": {"key": "k1.key", "log": "log.jsonl"}})
        )
        travelled = run_cli("travel", "run", str(plan), "--simulate", "sim", cwd=tmp_path)
        assert travelled.returncode == 0, travelled.stderr
    seen = run_cli("inspect", "log.jsonl", "-f", "json", cwd=tmp_path)
    assert seen.returncode == 0, seen.stderr
    doc = json.loads(seen.stdout)
    assert doc["kind"] == "travel-log" and doc["details"]["visits"] == 1
    assert doc["details"]["closed"] is True and doc["details"]["holders"] == "hospital"
