"""The holder behind the proxies shipped in deploy/, as deployed: real HAProxy and real nginx
(Debian's packages) terminating TLS with a test certificate, in front of a real `gpucc holder
serve` on loopback that trusts X-Forwarded-For from 127.0.0.1 only. Honest journeys pass
through both; the holder sees each client's own address, never one the client claims; and
behind HAProxy, one client's stalled TLS handshakes and slow bodies neither reach the holder
nor stop an honest journey."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import socket
import ssl
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.travel.orchestrator import run_plan
from tests.e2e.test_holder_hardening import STALLER, _fds, _plan
from tests.e2e.test_holder_service import _access
from tests.e2e.test_travel_e2e import Holder, World, _self_signed, _start, _stop, _wait_healthy
from tests.support.proxies import haproxy, nginx, tls_pem

pytestmark = pytest.mark.slow

SIZE = 10_000
STALLED = 400  # TCP connections the staller keeps trying to hold, none with a ClientHello
SLOW = 8  # TLS connections sending a body a byte at a time
ATTACK_S = 13.0  # beyond HAProxy's whole-request deadline (timeout http-request 10s)

#: ``n`` TLS connections from 127.0.0.4, each sending an offer's head and then its body a byte
#: every 0.25 s for ``seconds``; prints each connection's answer: [seconds after start, status]
SLOW_BODIES = textwrap.dedent(
    """
    import json, socket, ssl, sys, time
    host, port, n, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    start, conns, answers = time.monotonic(), [], []
    for _ in range(n):
        raw = socket.socket()
        raw.bind(("127.0.0.4", 0))
        raw.settimeout(5)
        raw.connect((host, port))
        s = ctx.wrap_socket(raw, server_hostname=host)
        s.sendall(b"POST /v1/offer HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\n"
                  b"Content-Length: 1000\\r\\n\\r\\n")
        conns.append(s)
    for s in conns:
        s.setblocking(False)
    while conns and time.monotonic() - start < seconds:
        for s in list(conns):
            try:
                head = s.recv(4096)
            except ssl.SSLWantReadError:  # nothing answered yet (or only a session ticket)
                try:
                    s.sendall(b"x")
                except OSError:  # closed as it sent: its answer is read on the next round
                    pass
                continue
            except OSError:
                head = b""
            answers.append([round(time.monotonic() - start, 1), head[9:12].decode() or "closed"])
            conns.remove(s)
            s.close()
        time.sleep(0.25)
    answers += [[None, "open"] for _ in conns]
    print(json.dumps(answers))
    """
)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("holder-proxies")
    w = World(tmp=tmp, gpu=SimulatedGpu.create(now=dt.datetime.now(dt.UTC)), roots=tmp / "roots")
    w.write_roots()
    w.holders["h"] = _start(w, "h", [SIZE], "--trusted-proxy", "127.0.0.1")
    try:
        _wait_healthy(w.holders["h"])
        yield w
    finally:
        for holder in w.holders.values():
            _stop(holder)


@pytest.fixture(scope="module")
def tls(world: World) -> tuple[Path, Path]:
    """The proxies' certificate (its own CA, for 127.0.0.1) and the PEM they read."""
    cert, key = _self_signed(world.tmp)
    return cert, tls_pem(cert, key, world.tmp)


def _port(holder: Holder) -> int:
    return int(holder.url.rsplit(":", 1)[1])


def _journey(world: World, holder: Holder, port: int, cert: Path) -> None:
    """An honest journey through the proxy on ``port``: challenge, offer, staging."""
    via = dataclasses.replace(holder, url=f"https://127.0.0.1:{port}")
    result = run_plan(_plan(via, cert), collect=world.collect, collect_cvm=world.collect_cvm)
    assert result.visits[0].bytes_staged == SIZE


def _claiming(port: int, cert: Path, source: str) -> bytes:
    """A request over TLS from ``source`` that claims to be forwarded for 10.9.9.9."""
    ctx = ssl.create_default_context(cafile=str(cert))
    raw = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
        conn.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 10.9.9.9\r\n"
            b"Connection: close\r\n\r\n"
        )
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    return reply


def _seen_as(holder: Holder, port: int, cert: Path, source: str) -> str:
    """The client address the holder logged for a request from ``source``."""
    assert _claiming(port, cert, source).startswith(b"HTTP/1.1 200")
    time.sleep(0.2)
    client: str = _access(holder)[-1]["client"]
    return client


def _no_metrics(port: int, cert: Path) -> None:
    """The metrics are for the operator's scraper: the proxy refuses them to the public."""
    reply = requests.get(f"https://127.0.0.1:{port}/metrics", timeout=10, verify=str(cert))
    assert reply.status_code == 403


def _structured(holder: Holder) -> list[dict[str, object]]:
    """The holder's log lines, each JSON but the simulation's warning."""
    lines = holder.log.read_text().splitlines()
    assert "Traceback" not in "\n".join(lines)
    docs = [json.loads(x) for x in lines if x.startswith("{")]
    assert len(docs) >= len(lines) - 1, lines[:5]
    return docs


def test_behind_haproxy_under_stalled_handshakes_and_slow_bodies(
    world: World, tls: tuple[Path, Path], tmp_path: Path
) -> None:
    h = world.holders["h"]
    cert, pem = tls
    with haproxy(pem, _port(h), tmp_path) as (port, _log):
        _journey(world, h, port, cert)
        assert _access(h)[-1]["client"] == "127.0.0.1"
        # HAProxy replaces what the client claims with the address it came from
        assert _seen_as(h, port, cert, "127.0.0.5") == "127.0.0.5"
        _no_metrics(port, cert)
        before = _fds(h.proc.pid)
        staller, slow = tmp_path / "staller.py", tmp_path / "slow.py"
        staller.write_text(STALLER)
        slow.write_text(SLOW_BODIES)
        attackers = [
            subprocess.Popen(
                [sys.executable, str(script), "127.0.0.1", str(port), str(n), str(ATTACK_S)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for script, n in ((staller, STALLED), (slow, SLOW))
        ]
        fds: list[int] = []
        try:
            time.sleep(2.0)  # the attackers hold what they can
            for _ in range(2):  # an honest journey completes meanwhile, twice
                fds.append(_fds(h.proc.pid))
                _journey(world, h, port, cert)
            while any(a.poll() is None for a in attackers):
                fds.append(_fds(h.proc.pid))
                time.sleep(0.25)
            opened = int(attackers[0].communicate(timeout=30)[0])
            answers = json.loads(attackers[1].communicate(timeout=30)[0])
        finally:
            for attacker in attackers:
                if attacker.poll() is None:
                    attacker.kill()
                    attacker.wait()
        assert _access(h)[-1]["client"] == "127.0.0.1"  # the honest journeys
    # beyond 16 per source, HAProxy closed the staller's connections at accept: it reopened
    # them again and again (held, all 400 would have stayed open for the whole attack)
    assert opened > 3 * STALLED, opened
    # each slow body was cut off by the whole-request deadline (10 s), though it kept sending
    assert len(answers) == SLOW and all(s == "408" and 9 <= t < 12.5 for t, s in answers), answers
    # the holder held about what it held before: the proxy kept the attack to itself
    assert max(fds) <= before + 8 and max(fds) < 64, (before, fds)
    docs = _structured(h)
    clients = {d["client"] for d in docs if d["event"] == "access"}
    assert not clients & {"127.0.0.3", "127.0.0.4", "10.9.9.9"}, clients


def test_behind_nginx(world: World, tls: tuple[Path, Path], tmp_path: Path) -> None:
    h = world.holders["h"]
    cert, pem = tls
    with nginx(pem, _port(h), tmp_path) as port:
        _journey(world, h, port, cert)
        assert _access(h)[-1]["client"] == "127.0.0.1"
        # nginx sets X-Forwarded-For to the address the client came from
        assert _seen_as(h, port, cert, "127.0.0.6") == "127.0.0.6"
        _no_metrics(port, cert)
    _structured(h)
