"""The holder service against hostile clients: real `gpucc holder serve` processes on
loopback with short deadlines, raw sockets, and an attacker process holding its whole
allowance of idle, slow-header and trickling connections while an honest orchestrator
completes a visit."""

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
import requests

from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.travel.log import verify_log
from gpucc.travel.orchestrator import run_plan
from gpucc.travel.plan import parse_plan
from gpucc.travel.receipt import Receipt
from gpucc.travel.signing import generate_signing_key, public_pem
from tests.e2e.test_travel_e2e import Holder, World, _self_signed, _start, _stop, _wait_healthy
from tests.support.cli import run_cli
from tests.support.netfixtures import Reply, Seen, serve

pytestmark = pytest.mark.slow

ORCHESTRATOR = generate_signing_key()

PER_CLIENT = 6
DEADLINES = (
    "--idle-timeout-s",
    "1",
    "--header-timeout-s",
    "1",
    "--body-timeout-s",
    "1.5",
    "--max-connections-per-client",
    str(PER_CLIENT),
    "--max-connections",
    "64",
    "--max-request-kib",
    "64",
)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("holder-service")
    w = World(tmp=tmp, gpu=SimulatedGpu.create(now=dt.datetime.now(dt.UTC)), roots=tmp / "roots")
    w.write_roots()
    w.holders["h"] = _start(w, "h", [20_000], *DEADLINES)
    orchestrator = tmp / "orchestrator.pub.pem"
    orchestrator.write_bytes(public_pem(ORCHESTRATOR))
    w.holders["proxied"] = _start(
        w,
        "proxied",
        [1_000],
        *DEADLINES,
        "--trusted-proxy",
        "127.0.0.1",
        "--orchestrator-pub",
        str(orchestrator),
    )
    try:
        for holder in w.holders.values():
            _wait_healthy(holder)
        yield w
    finally:
        for holder in w.holders.values():
            _stop(holder)


def _addr(holder: Holder) -> tuple[str, int]:
    host, port = holder.url.removeprefix("http://").split(":")
    return host, int(port)


def _exchange(holder: Holder, *parts: bytes, pause: float = 0.0, wait: float = 5.0) -> bytes:
    """Send ``parts`` (with ``pause`` between them); everything until the server closes."""
    with socket.create_connection(_addr(holder), timeout=wait) as conn:
        for part in parts:
            try:
                conn.sendall(part)
            except OSError:
                break
            time.sleep(pause)
        data = b""
        while True:
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                raise AssertionError(f"the connection was left open: {data[:200]!r}") from None
            except ConnectionResetError:
                return data
            if not chunk:
                return data  # closed by the server
            data += chunk


def _refusal(reply: bytes, status: int, kind: str) -> dict[str, Any]:
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d" % status), reply[:200]
    assert b"content-type: application/json" in head.lower()
    doc: dict[str, Any] = json.loads(body)
    assert set(doc) == {"error", "message"} and doc["error"] == kind, doc
    return doc


def _access(holder: Holder) -> list[dict[str, Any]]:
    lines = holder.log.read_text().splitlines()
    return [
        d for d in (json.loads(x) for x in lines if x.startswith("{")) if d["event"] == "access"
    ]


HEAD = b"POST /v1/offer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def test_every_refusal_is_json_logged_and_closes(world: World) -> None:
    h = world.holders["h"]
    before = len(_access(h))
    started = time.monotonic()
    cases = [
        (_exchange(h, b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 404),
        (_exchange(h, b"GET /v1/offer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 405),
        (_exchange(h, HEAD + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n"), 400),
        (_exchange(h, HEAD + b"Content-Length: 999999999\r\n\r\n"), 413),
        (
            _exchange(
                h,
                HEAD + b"Transfer-Encoding: chunked\r\n\r\n",
                *[b"8000\r\n" + b"x" * 0x8000 + b"\r\n"] * 3,
            ),
            413,
        ),
        (_exchange(h, b"HELLO\r\n\r\n"), 400),
        (_exchange(h), 408),  # idle: not a byte sent
        (_exchange(h, HEAD, *[b"X-Slow: 1\r\n"] * 8, pause=0.3), 408),  # slow head
        (_exchange(h, HEAD + b"Content-Length: 50\r\n\r\n", *[b"x"] * 20, pause=0.2), 408),
    ]
    kinds = {
        404: "not-found",
        405: "method-not-allowed",
        400: "malformed",
        413: "too-large",
        408: "timeout",
    }
    for reply, status in cases:
        _refusal(reply, status, kinds[status])
    # the deadlines are what closed the slow ones, not the client giving up
    assert time.monotonic() - started < 15
    time.sleep(0.2)
    logged = _access(h)[before:]
    assert sorted(e["status"] for e in logged) == sorted(s for _, s in cases)
    # a holder that trusts a simulation's roots says so on every line
    assert all(
        set(e)
        == {
            "event", "time", "client", "method", "path", "status", "outcome", "bytes_out", "ms",
            "simulated",
        }
        and e["simulated"] is True
        for e in logged
    )  # fmt: skip


def test_keep_alive_pipelining_and_head(world: World) -> None:
    reply = _exchange(
        world.holders["h"],
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    assert reply.count(b"HTTP/1.1 200") == 3
    assert reply.count(b'"status":"ok"') + reply.count(b'"status": "ok"') == 2  # not for HEAD
    # a request that follows in the same packet is parsed, and refused, like any other
    reply = _exchange(world.holders["h"], b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nHELLO\r\n\r\n")
    first, _, rest = reply.partition(b"HTTP/1.1 400")
    assert first.startswith(b"HTTP/1.1 200") and rest


def test_expect_100_continue_is_answered(world: World) -> None:
    with socket.create_connection(_addr(world.holders["h"]), timeout=5) as conn:
        conn.sendall(
            b"POST /v1/challenge HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
            b"Expect: 100-continue\r\nConnection: close\r\n\r\n"
        )
        assert conn.recv(4096).startswith(b"HTTP/1.1 100 ")
        conn.sendall(b"{}")
        assert conn.recv(4096).startswith(b"HTTP/1.1 200 ")


def test_forwarded_for_is_believed_only_from_a_configured_proxy(world: World) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 10.9.9.9\r\nConnection: close\r\n\r\n"
    for name, client in (("h", "127.0.0.1"), ("proxied", "10.9.9.9")):
        holder = world.holders[name]
        assert _exchange(holder, request).startswith(b"HTTP/1.1 200")
        time.sleep(0.1)
        assert _access(holder)[-1]["client"] == client


ATTACKER = textwrap.dedent(
    """
    import select, socket, sys, time
    host, port, n, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    HEAD = b"POST /v1/offer HTTP/1.1\\r\\nHost: x\\r\\n"
    FIRST = {"idle": b"", "slow-head": HEAD, "trickle": HEAD + b"Content-Length: 1000\\r\\n\\r\\n"}
    TICK = {"idle": b"", "slow-head": b"X-Slow: 1\\r\\n", "trickle": b"x"}
    kinds = ["idle", "slow-head", "trickle"]
    held = {}
    opened = refused = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for i in range(n + 2):  # two more than its allowance: those must be refused
            kind = kinds[i % 3]
            if i not in held:
                s = socket.socket()
                s.bind(("127.0.0.2", 0))  # another client address on this host
                try:
                    s.connect((host, port))
                    s.sendall(FIRST[kind])
                except OSError:
                    s.close()
                    continue
                opened += 1
                held[i] = s
            s = held[i]
            try:
                if select.select([s], [], [], 0)[0]:  # an answer or a close: start again
                    if b" 503 " in s.recv(65536)[:16]:
                        refused += 1
                    raise OSError
                s.sendall(TICK[kind])
            except OSError:
                s.close()
                del held[i]
        time.sleep(0.2)
    print(opened, refused)
    """
)


def test_an_attacker_at_its_allowance_cannot_starve_an_honest_orchestrator(
    world: World, tmp_path: Path
) -> None:
    h = world.holders["h"]
    host, port = _addr(h)
    script = tmp_path / "attacker.py"
    script.write_text(ATTACKER)
    attacker = subprocess.Popen(
        [sys.executable, str(script), host, str(port), str(PER_CLIENT), "6"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.5)  # the attacker holds its connections
        plan = parse_plan(
            {
                "version": 1,
                "timeout_s": 10,
                "holders": [
                    {
                        "id": "h",
                        "url": h.url,
                        "public_key": public_pem(h.key).decode(),
                        "datasets": [
                            {"name": n, "path": str(p), "header_digest": d.hex()}
                            for n, p, d, _ in h.datasets
                        ],
                    }
                ],
            }
        )
        for _ in range(2):
            result = run_plan(plan, collect=world.collect, collect_cvm=world.collect_cvm)
            assert result.visits[0].bytes_staged == 20_000
        out, _ = attacker.communicate(timeout=30)
    finally:
        if attacker.poll() is None:
            attacker.kill()
            attacker.wait()
    opened, refused = map(int, out.split())
    assert refused > 0  # it tried beyond its allowance and was told no
    assert opened > PER_CLIENT  # the deadlines closed its connections; it had to come back
    attack = [e for e in _access(h) if e["client"] == "127.0.0.2"]
    assert {e["status"] for e in attack} <= {400, 408, 503}  # 400: cut off as it exited
    assert any(e["status"] == 503 for e in attack) and any(e["status"] == 408 for e in attack)


def _one_holder_plan(holder: Holder) -> Any:
    return parse_plan(
        {
            "version": 1,
            "timeout_s": 10,
            "holders": [
                {
                    "id": holder.name,
                    "url": holder.url,
                    "public_key": public_pem(holder.key).decode(),
                    "datasets": [
                        {"name": n, "path": str(p), "header_digest": d.hex()}
                        for n, p, d, _ in holder.datasets
                    ],
                }
            ],
        }
    )


def test_receipts_are_kept_and_can_be_pinned_to_the_orchestrator(
    world: World, tmp_path: Path
) -> None:
    pinned = world.holders["proxied"]
    kept_dir = world.tmp / "proxied" / "receipts"
    before = set(kept_dir.iterdir())
    log = tmp_path / "log.jsonl"
    plan = _one_holder_plan(pinned)
    result = run_plan(
        plan,
        collect=world.collect,
        collect_cvm=world.collect_cvm,
        signing_key=ORCHESTRATOR,
        log_path=log,
    )
    assert result.visits[0].receipt_kept
    (new,) = set(kept_dir.iterdir()) - before
    receipt = Receipt.from_json(new.read_bytes())
    assert receipt.seq == 0 and receipt.transcript_hash == result.visits[0].transcript_hash
    assert verify_log(log, ORCHESTRATOR.public_key(), receipts=[receipt]).complete
    # another orchestrator key: the pinned holder refuses to keep its receipt
    other = run_plan(
        plan,
        collect=world.collect,
        collect_cvm=world.collect_cvm,
        signing_key=generate_signing_key(),
    )
    assert not other.visits[0].receipt_kept
    assert set(kept_dir.iterdir()) == before | {new}


def test_a_holder_that_cannot_decide_is_exit_3_at_the_orchestrator(
    world: World, tmp_path: Path
) -> None:
    h = world.holders["h"]

    def cannot_decide(seen: Seen) -> Reply:
        if seen.path == "/v1/challenge":
            r = requests.post(h.url + "/v1/challenge", data=seen.body, timeout=10)
            return Reply(r.status_code, r.content, {"content-type": "application/json"})
        body = b'{"error":"collateral-unavailable","message":"the RIM service is down"}'
        return Reply(503, body, {"content-type": "application/json"})

    with serve(cannot_decide) as proxy:
        plan = tmp_path / "plan.yaml"
        doc = {
            "version": 1,
            "holders": [
                {
                    "id": "h",
                    "url": proxy.url,
                    "public_key": "sha256:" + "ab" * 32,
                    "datasets": [
                        {"name": n, "path": str(p), "header_digest": d.hex()}
                        for n, p, d, _ in h.datasets
                    ],
                }
            ],
        }
        plan.write_text(json.dumps(doc))
        result = run_cli("travel", "run", plan, "--simulate", tmp_path / "sim", timeout=120)
    assert result.returncode == 3, result.stderr
    assert "could not decide" in result.stderr and "RIM service is down" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 2  # the SIMULATED note, the error


def test_tls_key_is_checked_like_every_secret_key(world: World, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    h = world.holders["h"]
    exposed_signing = tmp_path / "exposed-signing.key"
    exposed_signing.write_bytes((world.tmp / "h" / "holder.key").read_bytes())
    exposed_signing.chmod(0o644)
    key.chmod(0o644)
    link = tmp_path / "link.key"
    link.symlink_to(key)

    def serve(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "gpucc.cli.holder",
                "serve",
                "--datasets",
                str(world.tmp / "h" / "data"),
                "--data-key",
                str(world.tmp / "h" / "data.key"),
                "--listen",
                "127.0.0.1:1",
                "--simulate",
                str(world.roots),
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    signing_exposed = serve("--holder-key", str(exposed_signing))
    tls_exposed = serve(
        "--holder-key",
        str(world.tmp / "h" / "holder.key"),
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
    )
    tls_link = serve(
        "--holder-key",
        str(world.tmp / "h" / "holder.key"),
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(link),
    )
    assert signing_exposed.returncode not in (0, 70)
    assert tls_exposed.returncode == signing_exposed.returncode
    assert "TLS key" in tls_exposed.stderr and len(tls_exposed.stderr.strip().splitlines()) == 1
    assert tls_link.returncode not in (0, 70) and "link" in tls_link.stderr
    good_key = tmp_path / "good-tls.key"
    good_key.write_bytes(key.read_bytes())
    good_key.chmod(0o600)
    junk_cert = tmp_path / "junk.pem"
    junk_cert.write_text("not a certificate")
    junk = serve(
        "--holder-key",
        str(world.tmp / "h" / "holder.key"),
        "--tls-cert",
        str(junk_cert),
        "--tls-key",
        str(good_key),
    )
    assert junk.returncode == 4 and len(junk.stderr.strip().splitlines()) == 2  # + SIMULATED
    missing = serve(
        "--holder-key", str(world.tmp / "h" / "holder.key"), "--simulate", str(tmp_path)
    )
    assert missing.returncode == 2 and "lacks" in missing.stderr
    assert h.proc.poll() is None
