"""``gpucc stage`` from a store against the same file staged locally and a plain download.

Run by hand (not a test)::

    .venv/bin/python benchmarks/bench_remote_stage.py [--size-mib 256] [--repeat 3] [--smoke]

It seals ``--size-mib`` MiB (4 MiB chunks), starts moto's S3 server and nginx (HTTPS, a CA
made for the run) on 127.0.0.1, puts the dataset in both, and times, each in a fresh
process (best of ``--repeat``, interleaved round by round so a noisy neighbour hits every
row alike):

* ``local``: :func:`staging.plan_stage` + :meth:`StagePlan.verify` of the local file (what
  ``gpucc stage FILE`` does; every chunk authenticated, none kept);
* ``plain download``: one GET of the whole object read into memory (urllib3 ``readinto``
  into a buffer of the object's size; S3 through a presigned URL; ``boto3 get_object``
  too, for reference): no verification at all, the bar to meet;
* ``remote P=.. part=..``: the same staging call on the ``s3://`` or ``https://`` URL, with
  that many requests in flight and that many bytes per request (``whole``: one request).

Each row gives MB/s (10^6 bytes of object per second, opening included), its ratio to the
plain download from the same server and to the local staging, the prefetch window, and
how much the process's peak resident memory grew during the timed work. ``--smoke`` runs the flow on
8 MiB once.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _peak() -> int:
    """This process's peak resident memory since the last reset, KiB (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _reset_peak() -> int:
    """Reset the peak to the memory resident now (Linux: clear_refs 5); returns it, KiB."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _peak()


def _child(args: list[str]) -> None:
    """``--child KIND URL ...``: one measurement; prints a JSON line."""
    kind, target = args[0], args[1]
    # Everything imported before the clock starts: start-up is not what is measured.
    import boto3
    import urllib3

    from gpucc.staging.api import plan_stage
    from gpucc.staging.sources import SourceSettings, http, s3, sealed  # noqa: F401

    rss0 = _reset_peak()
    started = time.perf_counter()
    extra: dict[str, object] = {}
    if kind == "stage":
        parallelism, part = int(args[3]), int(args[4])
        plan = plan_stage(
            target,
            key_file=args[2],
            source_settings=SourceSettings(parallelism=parallelism, part_size=part),
        )
        verified = plan.verify()
        extra["window"] = getattr(verified, "window_bytes", 0)
        size = plan.header.file_size
    elif kind == "boto3":
        bucket, _, key = target[len("s3://") :].partition("/")
        size = len(boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read())
    else:  # urllib3 GET of the whole object into memory
        url = target
        if target.startswith("s3://"):
            bucket, _, key = target[len("s3://") :].partition("/")
            url = boto3.client("s3").generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": key}
            )
        ca = os.environ.get("REQUESTS_CA_BUNDLE")
        pool = urllib3.PoolManager(ca_certs=ca) if ca else urllib3.PoolManager()
        resp = pool.request("GET", url, preload_content=False)
        size = int(resp.headers["Content-Length"])
        buf = memoryview(bytearray(size))
        done = 0
        while done < size:
            n = resp.readinto(buf[done : done + (1 << 20)])
            if not n:
                raise SystemExit("short download")
            done += n
    seconds = time.perf_counter() - started
    rss = _peak()
    print(json.dumps({"seconds": seconds, "bytes": size, "rss_kib": rss - rss0, **extra}))


def _measure(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *cmd],
        capture_output=True, text=True, env=env, check=True, timeout=600,
    )  # fmt: skip
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    opts = parser.parse_args()
    size = (8 if opts.smoke else opts.size_mib) << 20
    repeat = 1 if opts.smoke else opts.repeat
    mib = 1 << 20
    variants = [(1, size * 2), (1, 16 * mib), (2, 16 * mib), (4, 16 * mib), (4, 4 * mib)]
    if opts.smoke:
        variants = [(1, size * 2), (2, 4 * mib)]

    from tests.support.stores import NGINX, bucket, make_tls, moto_server, nginx_https

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        (work / "d.bin").write_bytes(os.urandom(size))
        subprocess.run(
            [sys.executable, "-m", "gpucc", "seal", "d.bin", "-o", "d.gcc", "--data-key",
             "k.key", "--chunk-size", "4MiB"],
            cwd=work, check=True, capture_output=True,
        )  # fmt: skip
        (work / "d.bin").unlink()
        s3 = stack.enter_context(moto_server(work))
        env = {**os.environ, **s3, "PYTHONPATH": str(ROOT)}
        client = bucket(s3, "bench")
        client.upload_file(str(work / "d.gcc"), "bench", "d.gcc")
        sources = {"s3": "s3://bench/d.gcc"}
        if NGINX is not None:
            tls = make_tls(work / "tls")
            base = stack.enter_context(nginx_https(work, tls, work / "nginx"))
            sources["nginx"] = f"{base}/d.gcc"
            env["REQUESTS_CA_BUNDLE"] = str(tls.ca)
        key = str(work / "k.key")
        rows: dict[str, list[dict[str, float]]] = {}

        def run(label: str, cmd: list[str]) -> None:
            rows.setdefault(label, []).append(_measure(cmd, env))

        for _ in range(repeat):
            run("local", ["stage", str(work / "d.gcc"), key, "1", str(16 * mib)])
            for name, url in sources.items():
                run(f"{name}: plain download", ["get", url])
                if name == "s3":
                    run("s3: boto3 get_object", ["boto3", url])
                for p, part in variants:
                    shown = "whole" if part >= size else f"{part // mib}MiB"
                    run(
                        f"{name}: remote P={p} part={shown}", ["stage", url, key, str(p), str(part)]
                    )

    def best(label: str) -> dict[str, float]:
        return min(rows[label], key=lambda r: r["seconds"])

    local = best("local")
    rate = {
        label: best(label)["bytes"] / best(label)["seconds"] / 1e6
        for label in rows
        if label != "idle"
    }
    cpus = os.cpu_count()
    print(f"object: {size / mib:.0f} MiB sealed in 4 MiB chunks; {cpus} CPUs; best of {repeat}")
    head = f"{'row':38} {'MB/s':>8} {'/plain':>7} {'/local':>7}"
    print(f"{head} {'window MiB':>10} {'RSS growth MiB':>14}")
    for label in rows:
        r = best(label)
        server = label.split(":")[0]
        plain = rate.get(f"{server}: plain download")
        ratio = f"{rate[label] / plain:7.2f}" if plain and label != "local" else f"{'':7}"
        window = r.get("window", 0) / mib
        print(
            f"{label:38} {rate[label]:8.0f} {ratio} {rate[label] / rate['local']:7.2f} "
            f"{window:10.1f} {r['rss_kib'] / 1024:14.0f}"
        )
    del local


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
    else:
        main()
