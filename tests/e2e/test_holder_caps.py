"""The holder's total connection cap holds against many clients (docs/TRAVEL.md): a real
`gpucc holder serve` process, 49 client addresses on loopback (127.0.0.2 to 127.0.0.50)
each opening connections that never send a byte. Every connection past the cap is answered
503 `busy` or reset within seconds; none waits unanswered in the kernel's backlog, also
when the descriptor limit is low (raised at start, or the cap lowered to fit and logged)."""

from __future__ import annotations

import datetime as dt
import json
import resource
import select
import socket
import time
from collections.abc import Iterator

import pytest

from gpucc.gpuattest.simulate import SimulatedGpu
from tests.e2e.test_travel_e2e import Holder, World, _start, _stop, _wait_healthy

pytestmark = pytest.mark.slow

ADDRESSES = [f"127.0.0.{n}" for n in range(2, 51)]  # 49 clients
PER_ADDRESS = 6  # under the per-client cap (16): only the total cap refuses
CAP = 200


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = len(ADDRESSES) * PER_ADDRESS + 256
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"the test needs {wanted} descriptors; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    tmp = tmp_path_factory.mktemp("holder-caps")
    w = World(tmp=tmp, gpu=SimulatedGpu.create(now=dt.datetime.now(dt.UTC)), roots=tmp / "roots")
    w.write_roots()
    yield w
    for holder in w.holders.values():
        _stop(holder)


def _flood(holder: Holder) -> tuple[int, int, int]:
    """Open every client's connections (none sends a byte), wait, and count them: silent
    (held open, no answer), told 503 busy, closed or reset."""
    port = int(holder.url.rsplit(":", 1)[1])
    socks = []
    try:
        for address in ADDRESSES:
            for _ in range(PER_ADDRESS):
                s = socket.socket()
                s.bind((address, 0))
                s.settimeout(5)
                s.connect(("127.0.0.1", port))
                socks.append(s)
        time.sleep(3)  # refusals take a fraction of a second each
        silent = busy = closed = 0
        for s in socks:
            if not select.select([s], [], [], 0)[0]:
                silent += 1
                continue
            try:
                answer = s.recv(4096)
            except OSError:
                answer = b""
            if answer.startswith(b"HTTP/1.1 503 ") and b'"busy"' in answer:
                busy += 1
            else:
                closed += 1
        return silent, busy, closed
    finally:
        for s in socks:
            s.close()


def _capped(holder: Holder) -> list[dict[str, object]]:
    lines = holder.log.read_text().splitlines()
    docs = [json.loads(x) for x in lines if x.startswith("{")]
    return [d for d in docs if d.get("event") == "connections-capped"]


@pytest.mark.parametrize(
    ("name", "nofile"),
    [("raised", "160:8192"), ("lowered", "200")],  # soft:hard; one number sets both
)
def test_the_total_cap_holds_against_many_addresses(world: World, name: str, nofile: str) -> None:
    holder = _start(
        world, name, [1_000],
        "--max-connections", str(CAP), "--idle-timeout-s", "30", "--header-timeout-s", "30",
        prefix=("prlimit", f"--nofile={nofile}", "--"),
    )  # fmt: skip
    world.holders[name] = holder
    _wait_healthy(holder)
    capped = _capped(holder)
    if name == "raised":  # the soft limit was raised to fit the cap: it holds as asked
        assert not capped, capped
        cap = CAP
    else:  # the hard limit holds fewer: the cap is lowered to fit, and the log says so
        (line,) = capped
        cap = int(str(line["max_connections"]))
        assert 0 < cap < CAP and line["asked"] == CAP
    started = time.monotonic()
    silent, busy, closed = _flood(holder)
    total = len(ADDRESSES) * PER_ADDRESS
    assert silent == cap, (silent, busy, closed)
    assert busy + closed == total - cap and busy > 0
    assert time.monotonic() - started < 20
    assert holder.proc.poll() is None
