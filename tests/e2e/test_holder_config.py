"""The holder driven by a configuration file: per-dataset release policies, a SIGHUP that
re-reads the file without dropping connections or forgetting answered challenges, and the
Prometheus endpoint. A real `gpucc holder serve --config` process on 127.0.0.1."""

from __future__ import annotations

import datetime as dt
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.keyrelease.protocol import create_offer
from gpucc.travel.client import HolderClient
from tests.e2e.test_travel_e2e import World, _holder_files
from tests.support.netfixtures import free_port

pytestmark = pytest.mark.slow


@pytest.fixture
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("holder-config")
    w = World(tmp=tmp, gpu=SimulatedGpu.create(now=dt.datetime.now(dt.UTC)), roots=tmp / "roots")
    w.write_roots()
    yield w


def _events(log: Any, kind: str) -> list[dict[str, Any]]:
    lines = log.read_text().splitlines()
    return [d for d in (json.loads(x) for x in lines if x.startswith("{")) if d["event"] == kind]


def _offer(world: World, url: str) -> requests.Response:
    offer, _ = create_offer(
        HolderClient(url).challenge(), world.collect, collect_cvm=world.collect_cvm
    )
    return requests.post(url + "/v1/offer", data=offer.to_json(), timeout=20)


def test_a_configured_holder_releases_per_policy_and_reloads_on_sighup(world: World) -> None:
    data, kek, key, _, _, _ = _holder_files(world.tmp, "cfg", [3_000, 4_000])
    strict = world.tmp / "strict.yaml"  # a driver no GPU has: no offer meets it
    strict.write_text(
        "version: 1\nocsp:\n  require: false\nversions:\n  allowed_drivers: ['999.99.99']\n"
    )
    port = free_port()
    conf = world.tmp / "holder.yaml"
    base = (
        f"datasets: cfg/data\ndata-key: cfg/data.key\nholder-key: cfg/holder.key\n"
        f"listen: '127.0.0.1:{port}'\nsimulate: roots\nstate: memory\nmetrics: true\n"
        "rate: 500\nburst: 500\n"
    )
    conf.write_text(
        base + "releases:\n  - {name: strict, policy: strict.yaml, datasets: [cfg-1]}\n"
    )
    log = world.tmp / "cfg.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucc.cli.holder", "serve", "--config", str(conf)],
        stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(url + "/healthz", timeout=1)
                break
            except requests.RequestException:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline
                time.sleep(0.05)
        # the offer meets the default policy but not cfg-1's: only cfg-0 is released
        assert _offer(world, url).status_code == 200
        (release,) = _events(log, "release")
        assert release["released"] == ["cfg-0"]
        assert {w["dataset"] for w in release["withheld"]} == {"cfg-1"}
        assert all(w["policy"] == "strict" for w in release["withheld"])
        # a dataset whose policy nobody meets, alone: the refusal names it and the rule
        conf.write_text(
            base + "releases:\n  - {name: strict, policy: strict.yaml, datasets: [cfg-0, cfg-1]}\n"
        )
        answered = create_offer(
            HolderClient(url).challenge(), world.collect, collect_cvm=world.collect_cvm
        )[0]
        assert (
            requests.post(url + "/v1/offer", data=answered.to_json(), timeout=20).status_code == 200
        )
        kept = socket.create_connection(("127.0.0.1", port), timeout=5)  # open across the reload
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while not _events(log, "reloaded"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        refused = _offer(world, url)
        assert refused.status_code == 403, refused.text
        reasons = refused.json()["reasons"]
        assert {r["dataset"] for r in reasons} == {"cfg-0", "cfg-1"}
        assert all(r["policy"] == "strict" and r["check"] for r in reasons)
        # what was answered before the reload is still answered
        replay = requests.post(url + "/v1/offer", data=answered.to_json(), timeout=20)
        assert replay.status_code == 409 and "already used" in replay.json()["message"]
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert kept.recv(4096).startswith(b"HTTP/1.1 200 ")
        kept.close()
        # the metrics count the decisions
        metrics = requests.get(url + "/metrics", timeout=5).text
        assert "gpucc_holder_releases_total 2.0" in metrics
        assert 'gpucc_holder_refusals_total{reason="not-trusted"} 1.0' in metrics
        assert 'gpucc_holder_requests_total{path="/v1/offer",status="409"} 1.0' in metrics
        assert "gpucc_holder_request_seconds_bucket" in metrics
        assert "gpucc_holder_connections_open" in metrics
        withheld = [
            line
            for line in metrics.splitlines()
            if line.startswith("gpucc_holder_datasets_withheld_total{")
            and 'policy="strict"' in line
            and 'check="versions-policy"' in line
        ]  # cfg-1 in the partial release, then cfg-0 and cfg-1 in the refusal
        assert withheld and sum(float(line.rsplit(" ", 1)[1]) for line in withheld) >= 3, metrics
        # a broken file on reload: logged, and the service goes on as it was
        conf.write_text("datasets: [\n")
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while not _events(log, "reload-failed"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert _offer(world, url).status_code == 403
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def test_an_unknown_key_is_refused_in_one_line(world: World) -> None:
    conf = world.tmp / "bad.yaml"
    conf.write_text("datasets: x\nlisten_on: 1\n")
    run = subprocess.run(
        [sys.executable, "-m", "gpucc.cli.holder", "serve", "--config", str(conf)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode != 0 and "unknown key 'listen_on'" in run.stderr
    assert "Traceback" not in run.stderr


def test_port_zero_serves_on_a_chosen_port_named_in_the_address_file(world: World) -> None:
    """``--listen HOST:0``: the system chooses the port; ``--address-file`` receives the
    address once the holder serves (the start record names it too), and an existing address
    file is refused before anything listens (exit 8)."""
    _holder_files(world.tmp, "zero", [1_000])
    address = world.tmp / "zero" / "address"
    args = [sys.executable, "-m", "gpucc.cli.holder", "serve", "--datasets", "zero/data"]
    args += ["--data-key", "zero/data.key", "--holder-key", "zero/holder.key"]
    args += ["--simulate", "roots", "--state", "memory", "--listen", "127.0.0.1:0"]
    args += ["--address-file", str(address)]
    log = world.tmp / "zero.log"
    proc = subprocess.Popen(args, cwd=world.tmp, stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    try:
        deadline = time.monotonic() + 30
        while not address.exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        host, _, port = address.read_text().strip().rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0
        url = f"http://{host}:{port}"
        assert requests.get(url + "/healthz", timeout=5).status_code == 200
        assert _events(log, "start")[0]["listen"] == f"127.0.0.1:{port}"
        assert _offer(world, url).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    again = subprocess.run(args, cwd=world.tmp, capture_output=True, text=True, timeout=60)
    assert again.returncode == 8, again.stderr
    assert "address" in again.stderr and "Traceback" not in again.stderr
