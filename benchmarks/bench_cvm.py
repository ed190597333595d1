"""CVM verification timing: the real Intel-signed TDX quote with its collateral in memory.

Run by hand: ``python benchmarks/bench_cvm.py [--repeat N] [--smoke] [--json]``. Prints the
median in-process time, side by side in one run, of:

- ``dcap-qvl``'s verification alone (chain, CRLs, signatures, TCB) on parsed collateral;
- gpucc's ``verify_tdx_quote`` (layout, root pin, collateral windows, then dcap-qvl);
- the whole judged result, ``verify_cvm_evidence`` from raw bytes (collateral JSON parsed,
  kind detected, policy applied, report data compared),

and each one's share of the 20 ms target for a TDX verification with cached collateral.
``--smoke`` runs a few repetitions only (seconds), for CI.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dcap_qvl  # noqa: E402
from cryptography.hazmat.primitives.serialization import Encoding  # noqa: E402

from gpucc.gpuattest.cvm.appraise import verify_cvm_evidence  # noqa: E402
from gpucc.gpuattest.cvm.policy import CvmPolicy  # noqa: E402
from gpucc.gpuattest.cvm.tdx import TdxCollateral, intel_sgx_root, verify_tdx_quote  # noqa: E402

TDX = ROOT / "tests" / "data" / "cpu-tee" / "tdx"
AT = dt.datetime(2025, 6, 19, 11, 16, 3, tzinfo=dt.UTC)
TARGET_MS = 20.0


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up (imports, first use of the native library)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--smoke", action="store_true", help="a few repetitions (seconds)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    repeat = 5 if args.smoke else max(1, args.repeat)

    quote = (TDX / "quote.bin").read_bytes()
    collateral_json = (TDX / "collateral.json").read_bytes()
    collateral = TdxCollateral.from_json(collateral_json)
    root_der = intel_sgx_root().public_bytes(Encoding.DER)
    native = dcap_qvl.QuoteCollateralV3.from_json(collateral_json.decode())
    report_data = verify_tdx_quote(quote, collateral, now=AT).report_data
    policy = CvmPolicy()

    def library() -> object:
        return dcap_qvl.verify_with_root_ca(quote, native, root_der, int(AT.timestamp()))

    def findings() -> object:
        result = verify_tdx_quote(quote, collateral, now=AT)
        assert result.evidence_ok
        return result

    def judged() -> object:
        result = verify_cvm_evidence(
            quote, collateral_json, now=AT, policy=policy, expected_report_data=report_data
        )
        assert result.trusted
        return result

    rows = [
        ("dcap-qvl verify (parsed collateral)", median_ms(library, repeat)),
        ("gpucc verify_tdx_quote", median_ms(findings, repeat)),
        ("gpucc verify_cvm_evidence (raw bytes, judged)", median_ms(judged, repeat)),
    ]
    base = rows[0][1]
    if args.json:
        doc = {
            "repeat": repeat,
            "target_ms": TARGET_MS,
            "results": [
                {"name": n, "median_ms": round(ms, 3), "vs_dcap_qvl": round(ms / base, 2)}
                for n, ms in rows
            ],
        }
        print(json.dumps(doc, indent=2))
    else:
        print(f"TDX quote verification, median of {repeat} (after warm-up), collateral in memory")
        for name, ms in rows:
            print(
                f"  {name:<48} {ms:8.3f} ms  x{ms / base:5.2f} of dcap-qvl  "
                f"{100 * ms / TARGET_MS:5.1f}% of the {TARGET_MS:.0f} ms target"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
