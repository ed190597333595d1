"""Load on the holder service: concurrent offers on loopback, latency, errors, memory.

Starts ``gpucc holder serve`` as a real process on 127.0.0.1 (a simulated GPU's anchors, its
state in a SQLite file), fetches COUNT challenges, builds COUNT offers with fresh session keys
and simulated evidence, then sends all offers at once from COUNT threads. Reports requests/s,
p50/p99 latency, errors (expected 0), the server's peak RSS, and how much of the server's CPU
time the evidence verification alone accounts for (the CPU time of ``verify()``, timed in this
process on the same kind of evidence, times COUNT).

    python benchmarks/bench_holder.py --count 200
    python benchmarks/bench_holder.py --backends --count 200 --rounds 3
    python benchmarks/bench_holder.py --smoke      # 3 offers, then --backends (CI runs it)
    python benchmarks/bench_holder.py --baseline OLD --rounds 3

``--backends`` compares the state backends side by side in one run:
one holder with ``--state memory`` (no database), one with SQLite, and two holder processes
sharing one PostgreSQL database (a throw-away server from Debian's binaries; where they are
absent the row is reported as not run, with the reason), COUNT offers at once in each row.

``--baseline OLD`` compares with another source tree of gpucc (e.g. ``git worktree add OLD
REV``): the two are run in turn, ROUNDS times each, in new processes on the same machine,
and their medians are printed side by side with the ratios.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import requests
from cryptography.hazmat.primitives.serialization import Encoding

from gpucc.gpuattest.collateral import NoOcsp, rim_sources_from_mapping
from gpucc.gpuattest.cvm.tdx_sim import SIMULATED_MRTD, simulated_tdx
from gpucc.gpuattest.evidence import load_evidence_json
from gpucc.gpuattest.policy import parse_policy
from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.gpuattest.verifier import verify
from gpucc.keyrelease.protocol import CollectedCvmEvidence, CollectedEvidence, create_offer
from gpucc.staging import seal_file
from gpucc.staging.format import write_key_file
from gpucc.travel.client import HolderClient
from gpucc.travel.signing import generate_signing_key, write_signing_key

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support.postgres


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


_COMPARED = ("requests_per_s", "p50_ms", "p99_ms", "server_cpu_s", "server_peak_rss_mib")


def _compare(baseline: Path, rounds: int, count: int, timeout: float) -> int:
    """Run this benchmark on ``baseline``'s code and on this tree's, in turn, ``rounds``
    times each; print every run and the medians side by side."""
    here = Path(__file__).resolve().parents[1]
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "this tree": []}
    for _ in range(rounds):
        for name, tree in (("baseline", baseline.resolve()), ("this tree", here)):
            done = subprocess.run(
                [sys.executable, __file__, "--count", str(count), "--timeout", str(timeout),
                 "--json"],
                capture_output=True, text=True, check=False, cwd=tree,
                env={**os.environ, "PYTHONPATH": str(tree)},
            )  # fmt: skip
            if done.returncode != 0:
                raise SystemExit(f"{name}: exit {done.returncode}: {done.stderr[-2000:]}")
            report = json.loads(done.stdout)
            runs[name].append(report)
            print(name, {k: report[k] for k in ("errors", *_COMPARED)}, flush=True)
    print(f"\nmedian of {rounds} runs each, {count} concurrent offers, {os.cpu_count()} CPUs")
    print(f"{'':22s} {'baseline':>10s} {'this tree':>10s} {'ratio':>7s}")
    for key in _COMPARED:
        old = statistics.median(r[key] for r in runs["baseline"])
        new = statistics.median(r[key] for r in runs["this tree"])
        print(f"{key:22s} {old:10.1f} {new:10.1f} {new / old if old else float('nan'):7.2f}")
    return 0 if all(r["errors"] == 0 for rs in runs.values() for r in rs) else 1


class Bench:
    """What every holder in a run serves (one identity, one dataset, a simulated GPU in a
    simulated TD), and the offers made for it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.gpu = SimulatedGpu.create(now=dt.datetime.now(dt.UTC))
        self.roots = tmp / "roots"
        (self.roots / "rims").mkdir(parents=True)
        roots = self.gpu.roots
        (self.roots / "device_root.pem").write_bytes(roots.device_root.public_bytes(Encoding.PEM))
        (self.roots / "rim_root.pem").write_bytes(roots.rim_root.public_bytes(Encoding.PEM))
        for rim_id, rim in self.gpu.rims.items():
            (self.roots / "rims" / f"{rim_id}.xml").write_bytes(rim)
        self.tdx = simulated_tdx(dt.datetime.now(dt.UTC))  # the CVM the GPU sits in
        (self.roots / "tdx_root.pem").write_bytes(self.tdx.root.public_bytes(Encoding.PEM))
        self.tdx_collateral = self.tdx.collateral(issued=dt.datetime.now(dt.UTC)).to_json()
        (tmp / "data").mkdir()
        kek = write_key_file(tmp / "data.key")
        (tmp / "plain").write_bytes(os.urandom(1 << 16))
        seal_file(tmp / "plain", tmp / "data" / "d.gcc", kek=kek)
        write_signing_key(tmp / "holder.key", generate_signing_key())
        # The holder's policy: no OCSP responder for a simulation, the simulated TD pinned.
        (tmp / "policy.yaml").write_text(
            "ocsp:\n  require: false\n"
            f"cvm:\n  measurements:\n    tdx:\n      mrtd: '{SIMULATED_MRTD.hex()}'\n",
            encoding="utf-8",
        )
        self._logs = 0

    def collect(self, nonce: bytes) -> CollectedEvidence:
        return CollectedEvidence.from_evidence_set(self.gpu.evidence(nonce))

    def collect_cvm(self, report_data: bytes) -> CollectedCvmEvidence:
        return CollectedCvmEvidence(self.tdx.quote(report_data), self.tdx_collateral)

    def serve(self, state: str) -> tuple[str, subprocess.Popen[bytes]]:
        """A started, healthy ``gpucc holder serve`` with ``state``; its URL and process."""
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        self._logs += 1
        server = subprocess.Popen(
            [
                sys.executable, "-m", "gpucc.cli.holder", "serve",
                "--datasets", str(self.tmp / "data"), "--data-key", str(self.tmp / "data.key"),
                "--holder-key", str(self.tmp / "holder.key"), "--listen", f"127.0.0.1:{port}",
                "--simulate", str(self.roots), "--policy", str(self.tmp / "policy.yaml"),
                "--state", state, "--rate", "100000", "--burst", "100000",
                # every client thread shares 127.0.0.1: lift the per-client caps
                "--max-connections-per-client", "2048", "--max-challenges-per-client", "2048",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(self.tmp / f"server-{self._logs}.log").open("wb"),
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(url + "/healthz", timeout=1).status_code == 200:
                    return url, server
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise SystemExit(f"the holder service ({state}) did not start")
            time.sleep(0.05)

    def offers(self, urls: list[str], count: int) -> list[tuple[str, bytes]]:
        """``count`` offers, each with its challenge from ``urls`` in turn, each to be sent
        to the next of ``urls`` (with several processes, never the one that issued it)."""
        clients = [HolderClient(u) for u in urls]
        made = []
        for i in range(count):
            challenge = clients[i % len(urls)].challenge()
            offer = create_offer(challenge, self.collect, collect_cvm=self.collect_cvm)[0]
            made.append((urls[(i + 1) % len(urls)], offer.to_json()))
        return made


def _fire(offers: list[tuple[str, bytes]], timeout: float) -> tuple[list[float], list[str], float]:
    """Every offer at once, one thread each: latencies (s), errors, wall time (s)."""
    barrier = threading.Barrier(len(offers))
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def send(target: tuple[str, bytes]) -> None:
        url, body = target
        session = requests.Session()
        barrier.wait()
        t0 = time.perf_counter()
        try:
            r = session.post(url + "/v1/offer", data=body, timeout=timeout)
            ok = r.status_code == 200
            why = f"HTTP {r.status_code}"
        except requests.RequestException as exc:
            ok, why = False, type(exc).__name__
        dt_s = time.perf_counter() - t0
        with lock:
            latencies.append(dt_s)
            if not ok:
                errors.append(why)

    t_start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(offers)) as pool:
        list(pool.map(send, offers))
    return latencies, errors, time.perf_counter() - t_start


def _percentiles(latencies: list[float]) -> tuple[float, float]:
    lat = sorted(latencies)
    return (
        round(lat[len(lat) // 2] * 1000, 1),
        round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 1),
    )


def _stop(servers: list[subprocess.Popen[bytes]]) -> None:
    for server in servers:
        server.terminate()
    for server in servers:
        server.wait(timeout=30)


def _postgres_absent() -> str | None:
    """Why the PostgreSQL row cannot run here, or None."""
    from tests.support.postgres import postgres_bin

    if postgres_bin() is None or shutil.which("psql") is None or not shutil.which("pg_isready"):
        return "PostgreSQL server binaries are absent (Debian: apt-get install postgresql)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (the state-postgres extra)"
    return None


#: the rows of --backends: name, and the state of each holder process
_ROWS: list[tuple[str, list[str]]] = [
    ("memory, 1 process", ["memory"]),
    ("SQLite, 1 process", ["sqlite"]),
    ("PostgreSQL, 2 processes", ["postgres", "postgres"]),
]


def _backends(count: int, rounds: int, timeout: float, as_json: bool) -> int:
    """The state backends side by side: each row ``rounds`` times, the rows in turn."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in _ROWS}
    not_run: dict[str, str] = {}
    if (why := _postgres_absent()) is not None:
        not_run["PostgreSQL, 2 processes"] = why
    with (
        tempfile.TemporaryDirectory(prefix="gpucc-bench-holder-") as tmp_name,
        ExitStack() as stack,
    ):
        bench = Bench(Path(tmp_name))
        dsn = None
        if not not_run:
            from tests.support.postgres import postgres_server

            dsn = stack.enter_context(postgres_server(durable=True))
        for round_ in range(rounds):
            for name, states in _ROWS:
                if name in not_run:
                    continue
                servers: list[subprocess.Popen[bytes]] = []
                try:
                    urls = []
                    for state in states:
                        if state == "sqlite":
                            state = str(bench.tmp / f"state-{round_}.sqlite3")
                        elif state == "postgres":
                            state = str(dsn)
                        url, server = bench.serve(state)
                        urls.append(url)
                        servers.append(server)
                    latencies, errors, wall = _fire(bench.offers(urls, count), timeout)
                finally:
                    _stop(servers)
                p50, p99 = _percentiles(latencies)
                run = {
                    "errors": len(errors),
                    "error_kinds": sorted(set(errors)),
                    "releases_per_s": round((count - len(errors)) / wall, 1),
                    "p50_ms": p50,
                    "p99_ms": p99,
                }
                runs[name].append(run)
                if not as_json:
                    print(f"round {round_ + 1}: {name}: {run}", flush=True)
    rows = []
    for name, states in _ROWS:
        row: dict[str, Any] = {"row": name, "processes": len(states)}
        if name in not_run:
            row["not_run"] = not_run[name]
        else:
            for key in ("releases_per_s", "p50_ms", "p99_ms"):
                row[key] = statistics.median(r[key] for r in runs[name])
            row["errors"] = sum(r["errors"] for r in runs[name])
        rows.append(row)
    base = rows[0]
    for row in rows[1:]:
        if "not_run" not in row:
            row["ratios_to_memory"] = {
                k: round(row[k] / base[k], 2) if base[k] else None
                for k in ("releases_per_s", "p50_ms", "p99_ms")
            }
    if as_json:
        print(json.dumps({"offers": count, "rounds": rounds, "rows": rows}, indent=2))
    else:
        print(f"\n{count} concurrent offers per row, median of {rounds} round(s), rows in turn,")
        print(f"{os.cpu_count()} CPUs (client and servers share them); ratios to the first row")
        if "PostgreSQL, 2 processes" not in not_run:
            print("PostgreSQL: a throw-away server with fsync=on (durable commits, as SQLite's)")
        print(f"{'':26s} {'releases/s':>10s} {'p50 ms':>8s} {'p99 ms':>8s} {'errors':>6s}"
              f" {'x rel/s':>7s} {'x p50':>6s} {'x p99':>6s}")  # fmt: skip
        for row in rows:
            if "not_run" in row:
                print(f"{row['row']:26s} not run: {row['not_run']}")
                continue
            r = row.get("ratios_to_memory", {"releases_per_s": 1, "p50_ms": 1, "p99_ms": 1})
            print(
                f"{row['row']:26s} {row['releases_per_s']:10.1f} {row['p50_ms']:8.1f}"
                f" {row['p99_ms']:8.1f} {row['errors']:6d} {r['releases_per_s']:7.2f}"
                f" {r['p50_ms']:6.2f} {r['p99_ms']:6.2f}"
            )
    return 0 if all(r.get("errors", 0) == 0 for r in rows) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=200, help="concurrent offers (1-1000)")
    ap.add_argument("--timeout", type=float, default=120.0, help="per request, s")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--smoke", action="store_true", help="3 offers, then --backends with 3")
    ap.add_argument("--backends", action="store_true", help="the state backends side by side")
    ap.add_argument("--baseline", type=Path, help="another gpucc source tree to compare with")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each tree or backend row")
    args = ap.parse_args()
    if args.smoke:
        args.count = 3
    count = max(1, min(args.count, 1000))
    if args.baseline is not None:
        return _compare(args.baseline, max(1, args.rounds), count, args.timeout)
    if args.backends:
        return _backends(count, max(1, args.rounds), args.timeout, args.json)
    status = _one(count, args.timeout, args.json)
    if args.smoke:
        status |= _backends(count, 1, args.timeout, args.json)
    return status


def _one(count: int, timeout: float, as_json: bool) -> int:
    """One holder process (SQLite state): throughput, latency, memory and verify()'s share."""
    with tempfile.TemporaryDirectory(prefix="gpucc-bench-holder-") as tmp_name:
        bench = Bench(Path(tmp_name))
        url, server = bench.serve(str(bench.tmp / "state.sqlite3"))
        try:
            offers = bench.offers([url], count)
            cpu0 = _proc_cpu_s(server.pid)
            latencies, errors, wall = _fire(offers, timeout)
            server_cpu = _proc_cpu_s(server.pid) - cpu0
            peak_rss = _peak_rss_mib(server.pid)
        finally:
            _stop([server])

        # verify() alone, on the same kind of evidence, in this process
        policy = parse_policy({"ocsp": {"require": False}}, source="bench")
        rims = rim_sources_from_mapping(bench.gpu.rims)
        samples = []
        for i in range(min(count, 50) + 3):
            nonce = os.urandom(32)
            evidence = load_evidence_json(bench.collect(nonce).evidence_json)
            t0 = time.thread_time()
            result = verify(
                evidence, expected_nonce=nonce, roots=bench.gpu.roots,
                now=dt.datetime.now(dt.UTC), rims=rims, ocsp=NoOcsp("bench"), policy=policy,
            )  # fmt: skip
            if i >= 3:  # after warm-up (schemas and certificates parsed once)
                samples.append(time.thread_time() - t0)
            assert result.trusted
    verify_ms = statistics.median(samples) * 1000
    p50, p99 = _percentiles(latencies)
    report: dict[str, Any] = {
        "offers": count,
        "errors": len(errors),
        "error_kinds": sorted(set(errors)),
        "wall_s": round(wall, 3),
        "requests_per_s": round(count / wall, 1),
        "p50_ms": p50,
        "p99_ms": p99,
        "server_peak_rss_mib": round(peak_rss, 1),
        "server_cpu_s": round(server_cpu, 2),
        "verify_cpu_ms_median": round(verify_ms, 2),
        "verify_share_of_server_cpu": round(count * verify_ms / 1000 / server_cpu, 2)
        if server_cpu
        else None,
        "cpus": os.cpu_count(),
    }
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            print(f"{key:28s} {value}")
    return 0 if not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
