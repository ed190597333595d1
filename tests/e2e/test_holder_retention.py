"""Retention of the holder's state, with real processes and real databases (a SQLite file, a
PostgreSQL server started from Debian's package): two `gpucc holder serve` processes sharing
the state delete the answered and issued challenges that expired long ago on their own, keep
refusing an answered challenge presented again (to the process that issued it, which still
holds it, and to the other), and `gpucc holder prune` deletes the audit records and receipts
before a time, keeps the later ones, and with --dry-run deletes nothing."""

from __future__ import annotations

import datetime as dt
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import requests

from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.holder.state import PostgresState, SqliteState
from gpucc.keyrelease.protocol import create_offer
from gpucc.travel.client import HolderClient
from tests.e2e.test_travel_e2e import World, _holder_files
from tests.support.cli import run_cli
from tests.support.postgres import postgres_server

pytestmark = pytest.mark.slow

DAY = 86_400.0


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("holder-retention")
    w = World(tmp=tmp, gpu=SimulatedGpu.create(now=dt.datetime.now(dt.UTC)), roots=tmp / "roots")
    w.write_roots()
    yield w


def _state(url: str, at: float) -> SqliteState | PostgresState:
    """The state as a process whose clock reads ``at`` sees it."""
    if url.startswith("postgresql://"):
        return PostgresState(url, clock=lambda: at)
    return SqliteState(url, clock=lambda: at)


def _serve(world: World, stack: ExitStack, name: str, state: str, n: int) -> tuple[str, Path]:
    conf = world.tmp / f"{name}-{n}.yaml"
    address = world.tmp / f"{name}-{n}.address"
    conf.write_text(
        f"datasets: {name}/data\ndata-key: {name}/data.key\nholder-key: {name}/holder.key\n"
        f"listen: '127.0.0.1:0'\naddress-file: {address}\nsimulate: roots\n"
        f"state: '{state}'\nrate: 500\nburst: 500\n"
    )
    log = world.tmp / f"{name}-{n}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucc.cli.holder", "serve", "--config", str(conf)],
        cwd=world.tmp, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )  # fmt: skip
    stack.callback(proc.wait, 20)
    stack.callback(proc.send_signal, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while not address.exists():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    return "http://" + address.read_text().strip(), log


def _housekept(logs: list[Path], expect: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    """The logs' ``housekeeping`` records, once they deleted ``expect`` claims (or in time)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [x for log in logs for x in log.read_text().splitlines() if x.startswith("{")]
        found = [e for e in map(json.loads, lines) if e.get("event") == "housekeeping"]
        done = sum(e["answered_challenges_deleted"] for e in found)
        if done >= expect or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _prune(world: World, *args: str) -> dict[str, Any]:
    run = run_cli("holder", "prune", *args, "-f", "json", cwd=world.tmp)
    assert run.returncode == 0, run.stderr
    doc: dict[str, Any] = json.loads(run.stdout)
    return doc


def _audit(world: World, state: str) -> list[dict[str, Any]]:
    run = run_cli("holder", "receipts", "--state", state, "-f", "json", cwd=world.tmp)
    assert run.returncode == 0, run.stderr
    records: list[dict[str, Any]] = json.loads(run.stdout)["records"]
    return records


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_housekeeping_and_prune_keep_what_replay_protection_needs(
    world: World, backend: str
) -> None:
    name = f"ret-{backend[:2]}"
    _holder_files(world.tmp, name, [2_000])
    now = time.time()
    with ExitStack() as stack:
        state = (
            stack.enter_context(postgres_server())
            if backend == "postgresql"
            else str(world.tmp / f"{name}.sqlite3")
        )
        # 40 days ago: challenges answered (remembered 30 days), issued and never used, and
        # decisions with their receipts; 10 days ago: more decisions and receipts
        old = _state(state, now - 40 * DAY)
        for n in range(30):
            old.claim(b"old-answered-%02d" % n + bytes(16))
            old.issue(b"old-issued-%02d" % n + bytes(17), 120)
            old.put_audit({"decision": "refused", "client": f"192.0.2.{n}", "datasets": []})
            old.put_record("receipt", f"{n:02x}:old:1", {"seq": n})
        old.close()
        recent = _state(state, now - 10 * DAY)
        recent.put_audit({"decision": "refused", "client": "198.51.100.1", "datasets": []})
        recent.put_record("receipt", "ab:recent:1", {"seq": 1})
        recent.close()

        a_url, a_log = _serve(world, stack, name, state, 0)
        b_url, b_log = _serve(world, stack, name, state, 1)
        # each process deletes, in the background, what expired long ago (the first one
        # all of it, the other what is left); nothing else
        rounds = _housekept([a_log, b_log], 30)
        assert sum(e["answered_challenges_deleted"] for e in rounds) == 30, rounds
        assert sum(e["expired_challenges_deleted"] for e in rounds) == 30, rounds
        check = _state(state, now)
        assert not check.answered(b"old-answered-00" + bytes(16))
        assert check.take(b"old-issued-00" + bytes(17)) is None

        # a challenge A issued (and holds in memory) is answered by B; presented again to
        # either, after housekeeping and after a prune of every record, it is refused
        challenge = HolderClient(a_url).challenge()
        offer = create_offer(challenge, world.collect, collect_cvm=world.collect_cvm)[0]
        first = requests.post(b_url + "/v1/offer", data=offer.to_json(), timeout=30)
        assert first.status_code == 200, first.text
        assert check.answered(challenge)
        check.close()
        assert len(_audit(world, state)) == 32  # 30 old, 1 recent, the release

        before = dt.datetime.fromtimestamp(now - 5 * DAY, dt.UTC).isoformat()
        counted = _prune(world, "--state", state, "--before", before, "--dry-run")
        assert (counted["audit_records"], counted["receipts"], counted["dry_run"]) == (31, 31, True)
        assert len(_audit(world, state)) == 32  # a dry run deletes nothing
        done = _prune(world, "--state", state, "--before", before)
        assert (done["audit_records"], done["receipts"], done["dry_run"]) == (31, 31, False)
        kept = _audit(world, state)
        assert [r["decision"] for r in kept] == ["released"]  # after the time: kept
        left = _state(state, now)
        assert [k for _, k, _ in left.records("receipt")] == []  # all were before it
        left.close()
        assert _prune(world, "--state", state, "--before", before)["audit_records"] == 0

        everything = dt.datetime.now(dt.UTC).isoformat()
        assert (
            _prune(world, "--state", state, "--before", everything, "--force")["audit_records"] == 1
        )
        for url in (a_url, b_url):
            again = requests.post(url + "/v1/offer", data=offer.to_json(), timeout=30)
            assert again.status_code == 409, (url, again.text)
            assert "already used" in again.json()["message"]
        assert "Traceback" not in a_log.read_text() + b_log.read_text()


def test_a_state_that_forgets_answers_before_its_challenges_expire_is_refused(
    world: World, tmp_path: Path
) -> None:
    """A claim must outlive every copy of its challenge: the service refuses a state that
    remembers answered challenges no longer than the challenge TTL and the margin."""
    from dataclasses import replace

    from gpucc.assembly import PlatformVerifier, Settings
    from gpucc.core.errors import UsageError
    from gpucc.holder.service import HolderConfig, build_app
    from gpucc.holder.state import HOUSEKEEPING_MARGIN_S
    from gpucc.travel.signing import generate_signing_key

    config = HolderConfig(
        datasets=(),
        signing_key=generate_signing_key(),
        verifier=PlatformVerifier(Settings(simulation=world.roots)),
        challenge_ttl=3600,
        state=SqliteState(tmp_path / "short.sqlite3", ttl_s=3600 + HOUSEKEEPING_MARGIN_S),
    )
    with pytest.raises(UsageError, match="not longer than the challenge TTL"):
        build_app(config)
    longer = SqliteState(tmp_path / "long.sqlite3", ttl_s=3601 + HOUSEKEEPING_MARGIN_S)
    assert build_app(replace(config, state=longer)) is not None
