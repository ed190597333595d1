"""The holder's durable state with real processes: two `gpucc holder serve` processes of one
identity sharing a real PostgreSQL server never answer one challenge twice, and a holder
killed with SIGKILL while it releases keys, restarted on its SQLite file, has lost no record
of what it answered."""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.keyrelease.protocol import create_offer
from gpucc.travel.client import HolderClient
from tests.e2e.test_travel_e2e import Holder, World, _start, _stop, _wait_healthy
from tests.support.netfixtures import free_port
from tests.support.postgres import postgres_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("holder-state")
    w = World(tmp=tmp, gpu=SimulatedGpu.create(now=dt.datetime.now(dt.UTC)), roots=tmp / "roots")
    w.write_roots()
    try:
        yield w
    finally:
        for holder in w.holders.values():
            _stop(holder)


def _replica(world: World, holder: Holder, name: str, port: int | None = None) -> Holder:
    """Another process of ``holder``'s identity (its key, datasets and state)."""
    args = [str(a) for a in holder.proc.args]  # type: ignore[union-attr]
    port = port or free_port()
    args[args.index("--listen") + 1] = f"127.0.0.1:{port}"
    log = world.tmp / f"{name}.log"
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    replica = Holder(
        name, f"http://127.0.0.1:{port}", holder.key, holder.datasets, holder.dataset_keys,
        log, proc,
    )  # fmt: skip
    world.holders[name] = replica
    _wait_healthy(replica)
    return replica


def _offer(world: World, challenge: bytes) -> bytes:
    return create_offer(challenge, world.collect, collect_cvm=world.collect_cvm)[0].to_json()


def test_two_holders_sharing_postgres_never_answer_one_challenge_twice(world: World) -> None:
    with postgres_server() as dsn:
        a = _start(world, "pg-a", [5_000], "--state", dsn)
        world.holders["pg-a"] = a
        _wait_healthy(a)
        b = _replica(world, a, "pg-b")
        # a challenge issued by one process is answered by the other (a load balancer's choice)
        challenge = HolderClient(a.url).challenge()
        assert requests.post(b.url + "/v1/offer", data=_offer(world, challenge), timeout=20).ok
        again = requests.post(a.url + "/v1/offer", data=_offer(world, challenge), timeout=20)
        assert again.status_code == 409 and "already used" in again.json()["message"]
        # two offers for one challenge, one to each process at once: exactly one is answered
        for round_ in range(8):
            issuer = (a, b)[round_ % 2]
            challenge = HolderClient(issuer.url).challenge()
            bodies = [_offer(world, challenge) for _ in range(2)]
            statuses: list[int] = []
            barrier = threading.Barrier(2)

            def send(
                url: str,
                body: bytes,
                barrier: threading.Barrier = barrier,
                out: list[int] = statuses,
            ) -> None:
                barrier.wait()
                out.append(requests.post(url + "/v1/offer", data=body, timeout=30).status_code)

            threads = [
                threading.Thread(target=send, args=(h.url, body))
                for h, body in zip((a, b), bodies, strict=True)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(statuses) == [200, 409], (round_, statuses)
        for h in (a, b):
            _stop(h)
            del world.holders[h.name]


def test_a_holder_killed_mid_release_forgets_nothing(world: World) -> None:
    state = world.tmp / "kill.sqlite3"
    first = _start(world, "kill", [5_000], "--state", str(state))
    world.holders["kill"] = first
    _wait_healthy(first)
    port = int(first.url.rsplit(":", 1)[1])
    current = first
    answered_twice, firsts = [], []
    for round_, delay in enumerate((0.0, 0.005, 0.02, 0.05, 0.1, 1.0)):
        challenge = HolderClient(current.url).challenge()
        body = _offer(world, challenge)
        got: list[int] = []

        def send(url: str = current.url, body: bytes = body, out: list[int] = got) -> None:
            try:
                out.append(requests.post(url + "/v1/offer", data=body, timeout=10).status_code)
            except requests.RequestException:
                out.append(0)  # killed before it answered

        sender = threading.Thread(target=send)
        sender.start()
        time.sleep(delay)
        current.proc.send_signal(signal.SIGKILL)
        current.proc.wait()
        sender.join()
        current = _replica(world, first, f"kill-{round_}", port=port)
        retry = requests.post(current.url + "/v1/offer", data=body, timeout=20)
        if got == [200]:  # answered before the kill: the record survived it
            assert retry.status_code == 409 and "already used" in retry.json()["message"]
        answered_twice.append(got == [200] and retry.status_code == 200)
        firsts += got
    assert not any(answered_twice)
    assert 200 in firsts and 0 in firsts  # answered before some kills, cut off by others
