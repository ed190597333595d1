"""The holder's audit records and requester identity, with real processes: a `gpucc holder
serve --config` on 127.0.0.1 whose second dataset is released only to offers signed by the
requester key K1, its state in SQLite or in a real PostgreSQL server; offers signed by K1, by
K2, unsigned and with a signature moved from another offer; then `gpucc holder receipts
--state` reads every decision back, filtered."""

from __future__ import annotations

import datetime as dt
import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import requests

from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.keyrelease.protocol import Offer, create_offer
from gpucc.keyrelease.requester import sign_offer
from gpucc.travel.client import HolderClient
from gpucc.travel.signing import generate_signing_key, key_id, public_pem
from tests.e2e.test_travel_e2e import World, _holder_files
from tests.support.cli import run_cli
from tests.support.netfixtures import free_port
from tests.support.postgres import postgres_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("holder-audit")
    w = World(tmp=tmp, gpu=SimulatedGpu.create(now=dt.datetime.now(dt.UTC)), roots=tmp / "roots")
    w.write_roots()
    yield w


def _offer(world: World, url: str) -> Offer:
    return create_offer(
        HolderClient(url).challenge(), world.collect, collect_cvm=world.collect_cvm
    )[0]


def _post(url: str, offer: Offer) -> requests.Response:
    return requests.post(url + "/v1/offer", data=offer.to_json(), timeout=30)


def _receipts(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("holder", "receipts", *args, cwd=work)


def _json(work: Path, *args: str) -> list[dict[str, Any]]:
    run = _receipts(work, *args, "-f", "json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["schema"] == "gpucc.holder.audit/v1"
    records: list[dict[str, Any]] = doc["records"]
    return records


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_identity_policies_and_every_decision_in_the_audit_records(
    world: World, backend: str
) -> None:
    name = f"aud-{backend[:2]}"
    _holder_files(world.tmp, name, [2_000, 3_000])
    k1, k2 = generate_signing_key(), generate_signing_key()
    (world.tmp / "k1.pub").write_bytes(public_pem(k1))
    with ExitStack() as stack:
        state = (
            stack.enter_context(postgres_server())
            if backend == "postgresql"
            else str(world.tmp / f"{name}.sqlite3")
        )
        port = free_port()
        conf = world.tmp / f"{name}.yaml"
        conf.write_text(
            f"datasets: {name}/data\ndata-key: {name}/data.key\nholder-key: {name}/holder.key\n"
            f"listen: '127.0.0.1:{port}'\nsimulate: roots\nstate: '{state}'\n"
            "rate: 500\nburst: 500\n"
            f"releases:\n  - {{name: k1-only, datasets: [{name}-1], requesters: [k1.pub]}}\n"
        )
        log = world.tmp / f"{name}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpucc.cli.holder", "serve", "--config", str(conf)],
            stdout=subprocess.DEVNULL, stderr=log.open("wb"),
        )  # fmt: skip
        stack.callback(proc.wait, 20)
        stack.callback(proc.send_signal, signal.SIGTERM)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(url + "/healthz", timeout=1)
                break
            except requests.RequestException:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline
                time.sleep(0.05)
        started = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)

        def released(resp: requests.Response) -> list[str]:
            assert resp.status_code == 200, resp.text
            events = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
            last: list[str] = [e for e in events if e["event"] == "release"][-1]["released"]
            return last

        # signed by K1: both datasets; unsigned or signed by K2: only the first
        by_k1 = sign_offer(_offer(world, url), k1)
        assert released(_post(url, by_k1)) == [f"{name}-0", f"{name}-1"]
        assert released(_post(url, _offer(world, url))) == [f"{name}-0"]
        assert released(_post(url, sign_offer(_offer(world, url), k2))) == [f"{name}-0"]
        # K1's signature moved onto another offer (another challenge): refused outright
        moved = replace(
            _offer(world, url),
            requester_public_key=by_k1.requester_public_key,
            requester_signature=by_k1.requester_signature,
        )
        refused = _post(url, moved)
        assert refused.status_code == 403, refused.text
        assert {r["check"] for r in refused.json()["reasons"]} == {"requester identity"}
        # K1's offer again: the challenge is used
        assert _post(url, by_k1).status_code == 409

        work = world.tmp
        everything = _json(work, "--state", state)
        assert [r["decision"] for r in everything] == [
            "released", "released", "released", "refused", "refused",
        ]  # fmt: skip
        first = everything[0]
        assert first["requester"] == key_id(k1) and first["client"] == "127.0.0.1"
        assert first["simulated"] is True and len(first["challenge_id"]) == 64
        assert by_k1.challenge.hex() not in json.dumps(everything)  # an id, not the challenge
        assert [d["decision"] for d in first["datasets"]] == ["released", "released"]
        assert everything[2]["requester"] == key_id(k2)
        assert everything[4]["datasets"][0]["rule"] == "challenge"
        # the refusals of the identity-bound dataset, with the rule each one did not meet
        withheld = _json(work, "--state", state, "--dataset", f"{name}-1", "--decision", "refused")
        assert len(withheld) == 4  # unsigned, K2, the moved signature, the replay (whole offer)
        rules = [d["rule"] for r in withheld for d in r["datasets"]]
        assert rules == ["requester identity"] * 3 + ["challenge"]
        assert all(d["policy"] == "k1-only" for r in withheld[:3] for d in r["datasets"])
        # by requester key id prefix, by client, by time
        mine = _json(work, "--state", state, "--requester", key_id(k1)[:12])
        assert [r["challenge_id"] for r in mine] == [first["challenge_id"]]
        assert len(_json(work, "--state", state, "--requester", "127.0.0.1")) == 5
        assert len(_json(work, "--state", state, "--since", started.isoformat())) == 5
        later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
        assert _json(work, "--state", state, "--since", later) == []
        assert len(_json(work, "--state", state, "--until", later)) == 5
        # text: an aligned table, one row per dataset decision
        text = _receipts(work, "--state", state, "--decision", "released")
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        assert lines[0].split()[:4] == ["TIME", "DECISION", "DATASET", "RULE"]
        column = lines[0].index("DATASET")
        assert [x[column:].split()[0] for x in lines[1:]] == [
            f"{name}-0", f"{name}-1", f"{name}-0", f"{name}-0",
        ]  # fmt: skip
        assert "Traceback" not in text.stderr


def test_an_older_database_gains_the_audit_table(tmp_path: Path) -> None:
    old = tmp_path / "old.sqlite3"
    db = sqlite3.connect(old)
    db.execute(
        "CREATE TABLE gpucc_records (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, "
        "key TEXT NOT NULL, at REAL NOT NULL, body TEXT NOT NULL, UNIQUE (kind, key))"
    )
    body = {
        "event": "refusal",
        "client": "192.0.2.7",
        "reasons": [{"dataset": "x", "policy": "strict", "check": "driver", "detail": "old"}],
    }
    db.execute(
        "INSERT INTO gpucc_records (kind, key, at, body) VALUES ('decision', 'refusal:1', ?, ?)",
        (1_700_000_000.0, json.dumps(body)),
    )
    db.commit()
    db.close()
    (record,) = _json(tmp_path, "--state", str(old))
    assert record["decision"] == "refused" and record["client"] == "192.0.2.7"
    assert record["datasets"][0]["rule"] == "driver"
    assert record["time"].startswith("2023-11-14T22:13:20")
    db = sqlite3.connect(old)
    assert db.execute("SELECT value FROM gpucc_meta WHERE name = 'schema'").fetchone() == ("2",)
    db.execute("UPDATE gpucc_meta SET value = '9' WHERE name = 'schema'")
    db.commit()
    db.close()
    newer = _receipts(tmp_path, "--state", str(old))
    assert newer.returncode != 0 and "schema 9, newer than this gpucc" in newer.stderr
    assert "Traceback" not in newer.stderr
    absent = _receipts(tmp_path, "--state", str(tmp_path / "absent.sqlite3"))
    assert absent.returncode == 8 and "no such state database" in absent.stderr
    assert not (tmp_path / "absent.sqlite3").exists()


@pytest.mark.parametrize(
    ("requesters", "code", "message"),
    [
        ("[absent.pub]", 8, "absent.pub"),
        ("'k1.pub'", 4, "requesters (public key files or sha256: key ids)"),
        ("['sha256:abc']", 4, "a sha256 pin is 64 hex characters"),
    ],
)
def test_a_bad_requester_list_is_refused_in_one_line(
    world: World, requesters: str, code: int, message: str
) -> None:
    name = f"bad-{code}-{len(requesters)}"
    _holder_files(world.tmp, name, [1_000])
    conf = world.tmp / f"{name}.yaml"
    conf.write_text(
        f"datasets: {name}/data\ndata-key: {name}/data.key\nholder-key: {name}/holder.key\n"
        f"simulate: roots\nstate: memory\n"
        f"releases:\n  - {{name: r, datasets: [{name}-0], requesters: {requesters}}}\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "gpucc.cli.holder", "serve", "--config", str(conf)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == code, run.stderr
    assert message in run.stderr and "Traceback" not in run.stderr


def test_session_answer_keeps_its_decisions_in_the_state(tmp_path: Path) -> None:
    (tmp_path / "d.bin").write_bytes(b"d" * 5000)
    assert (
        run_cli("seal", "d.bin", "-o", "d.gcc", "--data-key", "k.key", cwd=tmp_path).returncode == 0
    )
    challenge = run_cli("session", "challenge", cwd=tmp_path).stdout.strip()
    made = run_cli("session", "offer", "--challenge", challenge, "-o", "offer.json",
                   "--host-key", "host.key", "--simulate", "sim", cwd=tmp_path)  # fmt: skip
    assert made.returncode == 0, made.stderr
    answer = ("session", "answer", "offer.json", "--dataset", "d.gcc", "--data-key", "k.key",
              "--simulate", "sim", "--state", "s.sqlite3")  # fmt: skip
    other = run_cli(*answer, "--challenge", "22" * 32, "-o", "a1.json", cwd=tmp_path)
    assert other.returncode == 1, other.stderr
    done = run_cli(*answer, "--challenge", challenge, "-o", "a2.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    refused, released = _json(tmp_path, "--state", "s.sqlite3")
    assert refused["decision"] == "refused" and refused["client"] == "session answer"
    assert refused["datasets"][0]["dataset"] == "d" and refused["datasets"][0]["rule"] == "offer"
    assert released["decision"] == "released" and released["datasets"][0]["dataset"] == "d"
    assert released["relaxations"] and released["simulated"] is True
    assert len(released["transcript_hash"]) == 96


def test_an_offer_signed_on_the_command_line_gets_the_reserved_dataset(tmp_path: Path) -> None:
    """``gpucc session offer --requester-key``: the offer a host writes is signed by the
    requester key, and a holder reserving a dataset to that key releases it; the same offer
    unsigned gets only the other dataset. Every step is a real process or HTTP request."""
    _holder_files(tmp_path, "h", [1_000, 2_000])
    assert run_cli("travel", "keygen", "--orchestrator-key", "k1.key",
                   "--orchestrator-pub", "k1.pub", cwd=tmp_path).returncode == 0  # fmt: skip
    (tmp_path / "sim").mkdir()
    first = run_cli("session", "offer", "--challenge", "00" * 32, "-o", "sim/offer.json",
                    "--host-key", "sim/host.key", "--simulate", "sim", cwd=tmp_path)  # fmt: skip
    assert first.returncode == 0, first.stderr
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
        released = []
        for n, signing in enumerate(([], ["--requester-key", "k1.key"])):
            challenge = HolderClient(url).challenge().hex()
            made = run_cli("session", "offer", "--challenge", challenge, "-o", f"offer{n}.json",
                           "--host-key", f"host{n}.key", "--simulate", "sim", *signing,
                           "-f", "json", cwd=tmp_path)  # fmt: skip
            assert made.returncode == 0, made.stderr
            doc = json.loads(made.stdout)
            assert (doc["requester_key_id"] is None) == (not signing)
            body = (tmp_path / f"offer{n}.json").read_bytes()
            answer = requests.post(url + "/v1/offer", data=body, timeout=30)
            assert answer.status_code == 200, answer.text
            events = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
            released.append([e for e in events if e["event"] == "release"][-1]["released"])
        assert released == [["h-0"], ["h-0", "h-1"]]
        assert doc["requester_key_id"] is not None and "sha256:" + doc["requester_key_id"] in (
            made.stderr
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
