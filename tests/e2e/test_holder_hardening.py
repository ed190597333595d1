"""The holder under the attacks a single client can mount on its file descriptors and memory:
TCP connections that never start their TLS handshake, and heads that are too large but arrive
in one write. Real `gpucc holder serve` processes on 127.0.0.1 with a low descriptor limit;
descriptors and memory read from /proc."""

from __future__ import annotations

import datetime as dt
import json
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.travel.orchestrator import run_plan
from gpucc.travel.plan import parse_plan
from gpucc.travel.signing import key_id
from tests.e2e.test_travel_e2e import Holder, World, _self_signed, _start, _stop, _wait_healthy

pytestmark = pytest.mark.slow

FD_LIMIT = 256
PER_CLIENT = 16

#: one client address holding far more TCP connections than its allowance, none sending a
#: byte (no ClientHello), reopening those the holder closes; bounded in time
STALLER = textwrap.dedent(
    """
    import socket, sys, time
    host, port, n, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    held, opened, end = [], 0, time.monotonic() + seconds
    while time.monotonic() < end:
        alive = []
        for s in held:
            try:
                s.setblocking(False)
                if s.recv(1) == b"":
                    raise OSError
                alive.append(s)
            except BlockingIOError:
                alive.append(s)
            except OSError:
                s.close()
        held = alive
        while len(held) < n and time.monotonic() < end:
            s = socket.socket()
            s.bind(("127.0.0.3", 0))
            s.settimeout(0.5)
            try:
                s.connect((host, port))
            except OSError:
                s.close()
                break
            held.append(s)
            opened += 1
        time.sleep(0.05)
    print(opened)
    """
)


def _fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("holder-hardening")
    w = World(tmp=tmp, gpu=SimulatedGpu.create(now=dt.datetime.now(dt.UTC)), roots=tmp / "roots")
    w.write_roots()
    try:
        yield w
    finally:
        for holder in w.holders.values():
            _stop(holder)


def _tls_holder(world: World) -> tuple[Holder, Path]:
    cert, key = _self_signed(world.tmp)
    holder = _start(
        world,
        "tls",
        [10_000],
        "--tls-cert", str(cert), "--tls-key", str(key),
        "--header-timeout-s", "2", "--idle-timeout-s", "2",
        "--max-connections-per-client", str(PER_CLIENT), "--max-connections", "128",
        prefix=("prlimit", f"--nofile={FD_LIMIT}", "--"),
    )  # fmt: skip
    holder.url = holder.url.replace("http://", "https://")
    world.holders["tls"] = holder
    deadline = time.monotonic() + 30
    while True:  # healthy over TLS
        import requests

        try:
            requests.get(holder.url + "/healthz", timeout=1, verify=str(cert))
            return holder, cert
        except requests.RequestException:
            assert holder.proc.poll() is None, holder.log.read_text()
            assert time.monotonic() < deadline
            time.sleep(0.05)


def _plan(holder: Holder, cert: Path) -> Any:
    return parse_plan(
        {
            "version": 1,
            "timeout_s": 10,
            "holders": [
                {
                    "id": holder.name,
                    "url": holder.url,
                    "public_key": "sha256:" + key_id(holder.key),
                    "tls_ca": str(cert),
                    "datasets": [
                        {"name": n, "path": str(p), "header_digest": d.hex()}
                        for n, p, d, _ in holder.datasets
                    ],
                }
            ],
        }
    )


def test_stalled_handshakes_from_one_client_exhaust_nothing(world: World, tmp_path: Path) -> None:
    holder, cert = _tls_holder(world)
    pid = holder.proc.pid
    host, port = holder.url.removeprefix("https://").split(":")
    rss_before = _rss_kib(pid)
    script = tmp_path / "staller.py"
    script.write_text(STALLER)
    attacker = subprocess.Popen(
        [sys.executable, str(script), host, port, "600", "8"], stdout=subprocess.PIPE, text=True
    )
    fds: list[int] = []
    rss: list[int] = []
    try:
        time.sleep(2.0)  # the attacker holds what it can
        for _ in range(2):  # an honest journey completes meanwhile, twice
            fds.append(_fds(pid))
            result = run_plan(
                _plan(holder, cert), collect=world.collect, collect_cvm=world.collect_cvm
            )
            assert result.visits[0].bytes_staged == 10_000
            rss.append(_rss_kib(pid))
        while attacker.poll() is None:
            fds.append(_fds(pid))
            rss.append(_rss_kib(pid))
            time.sleep(0.25)
        opened = int(attacker.communicate(timeout=30)[0])
    finally:
        if attacker.poll() is None:
            attacker.kill()
            attacker.wait()
    assert opened > 600  # it reopened what the holder closed or reset
    # its allowance and a little more: never near the descriptor limit
    assert max(fds) < FD_LIMIT // 2, fds
    assert max(rss) - rss_before < 48 * 1024, (rss_before, rss)
    lines = holder.log.read_text().splitlines()
    assert "Traceback" not in "\n".join(lines)
    docs = [json.loads(x) for x in lines if x.startswith("{")]
    assert len(docs) >= len(lines) - 2  # the SIMULATED warning; everything else is JSON
    dropped = [d for d in docs if d["event"] == "connection-dropped"]
    assert dropped and len(dropped) < 60  # said, but rate-limited
    assert all(d["client"] == "127.0.0.3" for d in dropped)


def _raw(holder: Holder, data: bytes) -> bytes:
    host, port = holder.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        try:
            conn.sendall(data)
        except OSError:
            pass
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
        return reply


def test_heads_too_large_in_one_write_are_refused(world: World) -> None:
    holder = _start(world, "plain", [1_000])
    world.holders["plain"] = holder
    _wait_healthy(holder)
    many = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 4) for i in range(3000))
    cases = [
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n", 431),  # 36 KB of headers
        (b"GET /" + b"a" * 40_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (b"GET /" + b"a" * 12_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    ]
    assert len(cases[0][0]) > 36_000
    for data, status in cases:
        reply = _raw(holder, data)
        assert reply.startswith(b"HTTP/1.1 %d " % status), reply[:100]
        body = json.loads(reply.partition(b"\r\n\r\n")[2])
        assert body["error"] == "too-large"
    # a head just within the limits is served
    fine = (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-A: "
        + b"v" * 12_000
        + b"\r\n\r\n"
    )
    assert _raw(holder, fine).startswith(b"HTTP/1.1 200 ")
