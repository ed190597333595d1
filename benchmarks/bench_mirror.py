"""Attestation through a warm collateral mirror, beside attestation from files, in one run.

Starts loopback stand-ins for NVIDIA's RIM service and OCSP responder (a test PKI of NVIDIA's
shape, tests/support/netfixtures.py) and ``gpucc collateral serve`` as a real process in front
of them, warms the mirror with one verification, then times full ``verify()`` calls (RIMs,
device and RIM chains, every OCSP answer checked) three ways, side by side:

* from files: the RIMs and OCSP answers in a collateral bundle (``--collateral --offline``);
* through the warm mirror: every RIM and OCSP answer fetched over HTTP from the mirror;
* from the vendors directly (the loopback stand-ins, no mirror).

Prints medians and the ratio of each row to the first. Timings are for comparison in the same
run only.

    python benchmarks/bench_mirror.py --repeat 30
    python benchmarks/bench_mirror.py --smoke       # three runs of each (CI runs it)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives import serialization  # noqa: E402

from gpucc.gpuattest.bundle import collect_collateral, evidence_rim_ids  # noqa: E402
from gpucc.gpuattest.chain import load_pem_chain  # noqa: E402
from gpucc.gpuattest.evidence import EvidenceSet, GpuEvidence  # noqa: E402
from gpucc.gpuattest.netconfig import (  # noqa: E402
    NetworkSettings,
    build_collateral,
    build_fetcher,
    network_sources,
)
from gpucc.gpuattest.report import AttestationReport  # noqa: E402
from gpucc.gpuattest.result import Verdict  # noqa: E402
from gpucc.gpuattest.simulate import build_report  # noqa: E402
from gpucc.gpuattest.verifier import verify  # noqa: E402
from tests.e2e.test_e2e_network import _as_rimpki, _set_a_opaque  # noqa: E402
from tests.support import netfixtures as nf  # noqa: E402
from tests.support.mirror import mirror  # noqa: E402
from tests.support.rimpki import sign_rim  # noqa: E402
from tests.support.samples import (  # noqa: E402
    SET_A_DRIVER_RIM,
    SET_A_REPORT,
    SET_A_VBIOS_RIM,
    report_bytes,
)


def median_ms(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--smoke", action="store_true", help="three runs of each: a quick check")
    args = parser.parse_args()
    n = 3 if args.smoke else args.repeat
    os.environ["NO_PROXY"] = "127.0.0.1,localhost"

    pki = nf.build_pki()
    rim_pki = _as_rimpki(pki)
    rims = nf.RimService(
        {
            nf.DRIVER_RIM_ID: sign_rim(SET_A_DRIVER_RIM.read_bytes(), pki=rim_pki),
            nf.VBIOS_RIM_ID: sign_rim(SET_A_VBIOS_RIM.read_bytes(), pki=rim_pki),
        }
    )
    responder = nf.OcspResponder(pki)
    nonce = os.urandom(32)
    runtime = AttestationReport.parse(report_bytes(SET_A_REPORT)).runtime_measurements()
    raw = build_report(nonce=nonce, measurements=runtime, opaque=_set_a_opaque(), key=pki.leaf.key)
    chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in pki.device_chain)
    evidence = EvidenceSet(gpus=(GpuEvidence(report=raw, cert_chain_pem=chain),))

    def attest(settings: NetworkSettings) -> None:
        rim_source, ocsp = build_collateral(settings)
        result = verify(
            evidence, expected_nonce=nonce, roots=pki.roots, now=nf.NOW, rims=rim_source, ocsp=ocsp
        )
        if result.verdict is not Verdict.TRUSTED:
            raise SystemExit(f"not trusted: {result.reasons}")

    with (
        tempfile.TemporaryDirectory() as tmp,
        nf.serve(rims) as rim_server,
        nf.serve(responder) as ocsp_server,
        mirror(
            Path(tmp), "--rim-upstream", rim_server.url, "--ocsp-upstream", ocsp_server.url,
            "--at", nf.NOW.isoformat(), "--refresh-s", "3600",
        ) as m,
    ):  # fmt: skip
        direct = NetworkSettings(
            rim_url=rim_server.url, ocsp_url=ocsp_server.url, ocsp_nonce=False, use_cache=False
        )
        with build_fetcher(direct) as fetcher:
            rim_source, ocsp = network_sources(direct, fetcher)
            got = collect_collateral(
                device_chains=[load_pem_chain(chain)], rim_ids=evidence_rim_ids(evidence.gpus),
                rim_source=rim_source, ocsp=ocsp, roots=pki.roots, now=nf.NOW,
            )  # fmt: skip
        bundle = Path(tmp) / "bundle.json"
        bundle.write_bytes(got.bundle.to_json())
        files = NetworkSettings(bundle=bundle, offline=True, use_cache=False)
        through = NetworkSettings(
            rim_url=m.url, ocsp_url=f"{m.url}/ocsp", ocsp_nonce=False, use_cache=False
        )
        attest(through)  # warms the mirror
        rows = [
            ("verify() from files (collateral bundle, offline)",
             median_ms(lambda: attest(files), n)),
            ("verify() through a warm mirror (RIMs + OCSP over HTTP)",
             median_ms(lambda: attest(through), n)),
            ("verify() from the vendors' stand-ins directly", median_ms(lambda: attest(direct), n)),
        ]  # fmt: skip
    base = rows[0][1]
    print(f"{'case':<58} {'median ms':>10} {'ratio':>7}")
    for name, ms in rows:
        print(f"{name:<58} {ms:>10.1f} {ms / base:>7.2f}")
    print(f"({n} runs each; ratios to the first row, same run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
