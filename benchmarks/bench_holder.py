"""Load on one holder service: concurrent offers on loopback, latency, errors, memory.

Starts ``gpucc holder serve`` as a real process on 127.0.0.1 (a simulated GPU's anchors),
fetches COUNT challenges, builds COUNT offers with fresh session keys and simulated
evidence, then sends all offers at once from COUNT threads. Reports requests/s, p50/p99
latency, errors (expected 0), the server's peak RSS, and how much of the server's CPU time
the evidence verification alone accounts for (the CPU time of ``verify()``, timed in this
process on the same kind of evidence, times COUNT).

    python benchmarks/bench_holder.py --count 200
    python benchmarks/bench_holder.py --smoke      # 3 offers: a quick check (CI runs it)
    python benchmarks/bench_holder.py --baseline OLD --rounds 3

``--baseline OLD`` compares with another source tree of gpucc (e.g. ``git worktree add OLD
REV``): the two are run in turn, ROUNDS times each, in new processes on the same machine,
and their medians are printed side by side with the ratios.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
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
from gpucc.staging import seal_file
from gpucc.staging.format import write_key_file
from gpucc.staging.release import CollectedCvmEvidence, CollectedEvidence, create_offer
from gpucc.travel.client import HolderClient
from gpucc.travel.signing import generate_signing_key, write_signing_key


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=200, help="concurrent offers (1-1000)")
    ap.add_argument("--timeout", type=float, default=120.0, help="per request, s")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--smoke", action="store_true", help="3 offers: a quick check")
    ap.add_argument("--baseline", type=Path, help="another gpucc source tree to compare with")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each tree (--baseline)")
    args = ap.parse_args()
    if args.smoke:
        args.count = 3
    count = max(1, min(args.count, 1000))
    if args.baseline is not None:
        return _compare(args.baseline, max(1, args.rounds), count, args.timeout)

    gpu = SimulatedGpu.create(now=dt.datetime.now(dt.UTC))
    with tempfile.TemporaryDirectory(prefix="gpucc-bench-holder-") as tmp_name:
        tmp = Path(tmp_name)
        roots = tmp / "roots"
        (roots / "rims").mkdir(parents=True)
        (roots / "device_root.pem").write_bytes(gpu.roots.device_root.public_bytes(Encoding.PEM))
        (roots / "rim_root.pem").write_bytes(gpu.roots.rim_root.public_bytes(Encoding.PEM))
        for rim_id, rim in gpu.rims.items():
            (roots / "rims" / f"{rim_id}.xml").write_bytes(rim)
        tdx = simulated_tdx(dt.datetime.now(dt.UTC))  # the CVM the GPU sits in
        (roots / "tdx_root.pem").write_bytes(tdx.root.public_bytes(Encoding.PEM))
        tdx_collateral = tdx.collateral(issued=dt.datetime.now(dt.UTC)).to_json()
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
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            [
                sys.executable, "-m", "gpucc.cli.holder", "serve",
                "--datasets", str(tmp / "data"), "--data-key", str(tmp / "data.key"),
                "--holder-key", str(tmp / "holder.key"), "--listen", f"127.0.0.1:{port}",
                "--simulate", str(roots), "--policy", str(tmp / "policy.yaml"),
                "--rate", "100000", "--burst", "100000",
                # every client thread shares 127.0.0.1: lift the per-client caps
                "--max-connections-per-client", "2048", "--max-challenges-per-client", "2048",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp / "server.log").open("wb"),
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if requests.get(url + "/healthz", timeout=1).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the holder service did not start")
                time.sleep(0.05)

            def collect(nonce: bytes) -> CollectedEvidence:
                return CollectedEvidence.from_evidence_set(gpu.evidence(nonce))

            client = HolderClient(url)

            def collect_cvm(report_data: bytes) -> CollectedCvmEvidence:
                return CollectedCvmEvidence(tdx.quote(report_data), tdx_collateral)

            offers = [
                create_offer(client.challenge(), collect, collect_cvm=collect_cvm)[0].to_json()
                for _ in range(count)
            ]

            barrier = threading.Barrier(count)
            latencies: list[float] = []
            errors: list[str] = []
            lock = threading.Lock()

            def send(body: bytes) -> None:
                session = requests.Session()
                barrier.wait()
                t0 = time.perf_counter()
                try:
                    r = session.post(url + "/v1/offer", data=body, timeout=args.timeout)
                    ok = r.status_code == 200
                    why = f"HTTP {r.status_code}"
                except requests.RequestException as exc:
                    ok, why = False, type(exc).__name__
                dt_s = time.perf_counter() - t0
                with lock:
                    latencies.append(dt_s)
                    if not ok:
                        errors.append(why)

            cpu0 = _proc_cpu_s(server.pid)
            t_start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=count) as pool:
                list(pool.map(send, offers))
            wall = time.perf_counter() - t_start
            server_cpu = _proc_cpu_s(server.pid) - cpu0
            peak_rss = _peak_rss_mib(server.pid)
        finally:
            server.terminate()
            server.wait(timeout=30)

        # verify() alone, on the same kind of evidence, in this process
        policy = parse_policy({"ocsp": {"require": False}}, source="bench")
        rims = rim_sources_from_mapping(gpu.rims)
        samples = []
        for i in range(min(count, 50) + 3):
            nonce = os.urandom(32)
            evidence = load_evidence_json(collect(nonce).evidence_json)
            t0 = time.thread_time()
            result = verify(
                evidence, expected_nonce=nonce, roots=gpu.roots, now=dt.datetime.now(dt.UTC),
                rims=rims, ocsp=NoOcsp("bench"), policy=policy,
            )  # fmt: skip
            if i >= 3:  # after warm-up (schemas and certificates parsed once)
                samples.append(time.thread_time() - t0)
            assert result.trusted
    verify_ms = statistics.median(samples) * 1000
    lat = sorted(latencies)
    report: dict[str, Any] = {
        "offers": count,
        "errors": len(errors),
        "error_kinds": sorted(set(errors)),
        "wall_s": round(wall, 3),
        "requests_per_s": round(count / wall, 1),
        "p50_ms": round(lat[len(lat) // 2] * 1000, 1),
        "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 1),
        "server_peak_rss_mib": round(peak_rss, 1),
        "server_cpu_s": round(server_cpu, 2),
        "verify_cpu_ms_median": round(verify_ms, 2),
        "verify_share_of_server_cpu": round(count * verify_ms / 1000 / server_cpu, 2)
        if server_cpu
        else None,
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            print(f"{key:28s} {value}")
    return 0 if not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
