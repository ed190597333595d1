"""Protected PCIe timing: one verdict over 8 GPUs and 4 NVSwitches, read from files.

Run by hand: ``python benchmarks/bench_ppcie.py [--repeat N] [--smoke]`` (``--smoke``: two
runs, a quick check that CI runs). A simulated HGX board (its own test roots and RIMs,
written to a directory) stands in for the hardware; each run reads its evidence file and
verifies every device, every RIM and the topology through the platform verifier, as
``gpucc attest --ppcie`` does. Beside it, in the same run: one GPU alone, and NVIDIA's real
LS10 switch report with its real RIM, so the ratios can be read side by side.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpucc.assembly import PlatformEvidence, PlatformVerifier, Settings  # noqa: E402
from gpucc.gpuattest.collateral import DirectoryRimSource, NoOcsp  # noqa: E402
from gpucc.gpuattest.evidence import (  # noqa: E402
    EvidenceSet,
    dump_evidence_json,
    load_evidence_file,
)
from gpucc.gpuattest.policy import Policy, parse_policy  # noqa: E402
from gpucc.gpuattest.simulate_board import SimulatedBoard  # noqa: E402
from gpucc.gpuattest.switch_verifier import verify_switches  # noqa: E402
from gpucc.gpuattest.trust import TrustRoots  # noqa: E402
from tests.unit.assembly.test_ppcie import write_board  # noqa: E402

NOW = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)
SWITCH = ROOT / "tests" / "data" / "nvidia-samples" / "ls10-switch-96.10.55.00.01"
SWITCH_NONCE = bytes.fromhex("931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb")


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
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="two runs: a quick check")
    args = parser.parse_args()
    if args.smoke:
        args.repeat = 2
    board = SimulatedBoard.create(now=NOW)
    nonce = os.urandom(32)
    policy = parse_policy({"ocsp": {"require": False}, "topology": {"ppcie": True}})
    with tempfile.TemporaryDirectory() as tmp:
        directory = write_board(board, Path(tmp) / "sim")
        path = Path(tmp) / "board.json"
        path.write_bytes(dump_evidence_json(board.evidence(nonce)))
        verifier = PlatformVerifier(Settings(policy=policy, simulation=directory, at=NOW))
        one = PlatformVerifier(
            Settings(policy=Policy(require_ocsp=False), simulation=directory, at=NOW)
        )

        def whole() -> None:
            result = verifier.verify(PlatformEvidence(gpus=load_evidence_file(path)), nonce=nonce)
            assert result.trusted, result.reasons

        def single() -> None:
            gpu = EvidenceSet(gpus=load_evidence_file(path).gpus[:1])
            assert one.verify(PlatformEvidence(gpus=gpu), nonce=nonce).trusted

        real = load_evidence_file(SWITCH / "switch_evidence_ls10.json")

        def real_switch() -> None:
            result = verify_switches(
                real,
                expected_nonce=SWITCH_NONCE,
                roots=TrustRoots.nvidia(),
                now=dt.datetime(2026, 12, 1, tzinfo=dt.UTC),
                rims=DirectoryRimSource(SWITCH),
                ocsp=NoOcsp("offline"),
                policy=Policy(require_ocsp=False),
            )
            assert result.trusted, result.reasons

        board_ms = median_ms(whole, args.repeat)
        gpu_ms = median_ms(single, args.repeat)
        switch_ms = median_ms(real_switch, args.repeat)
    print(f"median of {args.repeat} runs, one process, after warm-up")
    print(f"  8 GPUs + 4 NVSwitches + topology (PPCIe, from files): {board_ms:8.1f} ms")
    print(f"  1 GPU alone (from the same file):                      {gpu_ms:8.1f} ms")
    print(f"  NVIDIA's real LS10 switch with its real RIM:           {switch_ms:8.1f} ms")
    print(f"  board / single GPU: {board_ms / gpu_ms:.1f}x for 12 devices")


if __name__ == "__main__":
    main()
