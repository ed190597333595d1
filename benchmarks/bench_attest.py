"""Attestation timing: in-process verification of NVIDIA's set A, and the whole CLI process.

Run by hand: ``python benchmarks/bench_attest.py [--repeat N] [--smoke]`` (``--smoke``:
two runs of each, a quick check that CI runs). Prints the median
in-process time of each stage after warm-up (parse, device chain, report signature,
both RIMs parsed + schema + XML-DSig + chain, measurements, full verify) and the
median wall time of ``gpucc attest --sample`` as a separate process.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpucc.gpuattest.chain import load_pem_chain, validate_chain  # noqa: E402
from gpucc.gpuattest.collateral import FileRimSource, NoOcsp  # noqa: E402
from gpucc.gpuattest.evidence import load_raw_evidence  # noqa: E402
from gpucc.gpuattest.measurements import compare_measurements  # noqa: E402
from gpucc.gpuattest.policy import parse_policy  # noqa: E402
from gpucc.gpuattest.report import AttestationReport  # noqa: E402
from gpucc.gpuattest.rim import ReferenceManifest  # noqa: E402
from gpucc.gpuattest.trust import TrustRoots  # noqa: E402
from gpucc.gpuattest.verifier import verify, verify_report_signature  # noqa: E402

SET_A = ROOT / "tests" / "data" / "nvidia-samples" / "set-a-h100-545.00"
NONCE = bytes.fromhex("4cff7f5380ead8fad8ec2c531c110aca4302a88f603792801a8ca29ee151af2e")
AT = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up (schema compilation, imports)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--smoke", action="store_true", help="two runs of each: a quick check")
    args = parser.parse_args()
    if args.smoke:
        args.repeat = 2
    roots = TrustRoots.nvidia()
    ev = load_raw_evidence(SET_A / "attestation-report.hex", SET_A / "cert-chain.pem")
    raw, pem = ev.gpus[0].report, ev.gpus[0].cert_chain_pem
    drv_xml = (SET_A / "driver-rim-545.00.swidtag").read_bytes()
    vb_xml = (SET_A / "vbios-rim-1010_0200_882_96005E0001-test.swidtag").read_bytes()
    report = AttestationReport.parse(raw)
    chain = load_pem_chain(pem)
    drv, vb = ReferenceManifest.parse(drv_xml), ReferenceManifest.parse(vb_xml)
    rims = FileRimSource(
        SET_A / "driver-rim-545.00.swidtag",
        SET_A / "vbios-rim-1010_0200_882_96005E0001-test.swidtag",
    )
    policy = parse_policy({"ocsp": {"require": False}})

    def rim_full(xml: bytes) -> None:
        m = ReferenceManifest.parse(xml)
        m.validate_schema()
        m.verify_signature(anchor=roots.rim_root, now=AT)

    rows = [
        ("report parse", median_ms(lambda: AttestationReport.parse(raw), args.repeat)),
        ("device chain (parse + validate)", median_ms(
            lambda: validate_chain(load_pem_chain(pem), roots.device_root, AT, expected_length=5),
            args.repeat)),
        ("report signature",
         median_ms(lambda: verify_report_signature(
             report.signed_bytes, report.signature, chain[0]), args.repeat)),
        ("driver RIM parse+XSD+DSig+chain", median_ms(lambda: rim_full(drv_xml), args.repeat)),
        ("VBIOS RIM parse+XSD+DSig+chain", median_ms(lambda: rim_full(vb_xml), args.repeat)),
        ("measurements", median_ms(lambda: compare_measurements(
            driver=drv, vbios=vb, runtime=report.runtime_measurements(), nvdec0_disabled=True),
            args.repeat)),
        ("full verify() of set A", median_ms(lambda: verify(
            ev, expected_nonce=NONCE, roots=roots, now=AT, rims=rims, ocsp=NoOcsp(), policy=policy),
            args.repeat)),
    ]  # fmt: skip
    exe = shutil.which("gpucc", path=str(Path(sys.executable).parent)) or "gpucc"
    cmd = [
        exe,
        "attest",
        "--sample",
        "--offline",
        "--at",
        "2024-01-01T00:00:00Z",
        "--format",
        "json",
    ]
    env = {**os.environ}

    def whole() -> None:
        subprocess.run(cmd, capture_output=True, check=True, env=env)

    rows.append(
        (
            "whole process: gpucc attest --sample",
            median_ms(whole, 1 if args.smoke else max(5, args.repeat // 3)),
        )
    )
    print(f"{'stage':<40} {'median ms':>10}")
    for name, ms in rows:
        print(f"{name:<40} {ms:>10.2f}")
    print("targets: full verify() < 50 ms in-process; whole process < 500 ms")


if __name__ == "__main__":
    main()
