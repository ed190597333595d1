"""Encrypted DDP in real multi-process gloo groups (2 and 3 ranks, forked processes).

Each world size runs once (a module fixture): every rank establishes attested group keys
from simulated H100 evidence verified by the real verifier, trains small models with plain
DDP and with the encrypted hook, and runs each tamper case through the transport's
test-only tamper callback. The ranks write what they saw to JSON; the tests assert on it.
"""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing as mp
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gpucc.core.errors import UsageError
from gpucc.ddp import (
    EncryptedAllReduce,
    GradientAuthenticationError,
    GroupKeys,
    MessageId,
    PeerAuthenticationError,
    PeerNotTrustedError,
    Phase,
    UsageLimits,
    encrypted_allreduce_hook,
)
from gpucc.gpuattest.collateral import NoOcsp, rim_sources_from_mapping
from gpucc.gpuattest.cvm.appraise import CvmResult, verify_cvm_evidence
from gpucc.gpuattest.cvm.policy import parse_cvm_policy
from gpucc.gpuattest.cvm.tdx_sim import SIMULATED_MRTD, simulated_tdx
from gpucc.gpuattest.evidence import EvidenceSet
from gpucc.gpuattest.policy import parse_policy
from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.gpuattest.verifier import AttestationResult, verify
from gpucc.keyrelease.protocol import CollectedCvmEvidence, CollectedEvidence

NOW = dt.datetime.now(dt.UTC)
POLICY = parse_policy({"ocsp": {"require": False}})
# Made before the ranks fork, so every rank knows the same trusted simulator.
GOOD = SimulatedGpu.create(now=NOW)
OTHER = SimulatedGpu.create(now=NOW)  # roots the policy does not trust
# The CVM every rank runs in (a simulated TDX platform), also made before the fork.
TDX = simulated_tdx(NOW)
TDX_COLLATERAL = TDX.collateral(issued=NOW - dt.timedelta(minutes=5)).to_json()
CVM_POLICY = parse_cvm_policy({"measurements": {"tdx": {"mrtd": SIMULATED_MRTD.hex()}}})
STEPS = 3
GROUP_TIMEOUT = dt.timedelta(seconds=60)


def attest(evidence: EvidenceSet, nonce: bytes) -> AttestationResult:
    return verify(
        evidence,
        expected_nonce=nonce,
        roots=GOOD.roots,
        now=NOW,
        rims=rim_sources_from_mapping(GOOD.rims),
        ocsp=NoOcsp(),
        policy=POLICY,
    )


def collector(gpu: SimulatedGpu) -> Callable[[bytes], CollectedEvidence]:
    return lambda nonce: CollectedEvidence.from_evidence_set(gpu.evidence(nonce))


def collect_cvm(report_data: bytes) -> CollectedCvmEvidence:
    return CollectedCvmEvidence(TDX.quote(report_data), TDX_COLLATERAL)


def attest_cvm(
    evidence: bytes, collateral: bytes | None, expected: bytes, log: bytes | None
) -> CvmResult:
    return verify_cvm_evidence(
        evidence,
        collateral,
        now=NOW,
        policy=CVM_POLICY,
        expected_report_data=expected,
        tdx_root=TDX.root,
        require_pins=True,
    )


def establish(gpu: SimulatedGpu = GOOD, **kwargs: Any) -> GroupKeys:
    # Groups without a CVM verifier bind to GPU evidence only: the named relaxation.
    kwargs.setdefault("allow_gpu_only", "attest_cvm" not in kwargs)
    return GroupKeys.establish(
        collect=collector(gpu), attest=attest, timeout=GROUP_TIMEOUT, **kwargs
    )


# --- training --------------------------------------------------------------------------


def make_model() -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(24, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 6),
    )


def make_ddp(state: EncryptedAllReduce | None) -> tuple[DDP, torch.optim.Optimizer]:
    ddp = DDP(make_model(), bucket_cap_mb=0.002)  # ~500 floats: several buckets
    if state is not None:
        ddp.register_comm_hook(state, encrypted_allreduce_hook)
    return ddp, torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    return torch.randn(16, 24, generator=g), torch.randn(16, 6, generator=g)


def train_step(ddp: DDP, opt: torch.optim.Optimizer, step: int) -> None:
    x, y = batch(step)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()


def params(ddp: DDP) -> list[torch.Tensor]:
    return [p.detach().clone() for p in ddp.parameters()]


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def parity(keys: GroupKeys, algorithm: str) -> dict[str, Any]:
    plain, plain_opt = make_ddp(None)
    state = EncryptedAllReduce(keys, algorithm=algorithm)  # type: ignore[arg-type]
    enc, enc_opt = make_ddp(state)
    for step in range(STEPS):
        train_step(plain, plain_opt, step)
        train_step(enc, enc_opt, step)
    moved = max_diff(params(enc), [p.detach() for p in make_model().parameters()])
    return {
        "diff": max_diff(params(plain), params(enc)),
        "moved": moved,
        "buckets": state.stats.buckets,
        "steps": state.stats.steps,
        "epoch": keys.epoch,
    }


# --- tamper cases ------------------------------------------------------------------------

Frames = dict[int, bytes]
TamperFn = Callable[[MessageId, bytes, Frames], bytes]


def tamperer(kind: str, victim: int, sender: int = 1) -> TamperFn:
    """A receive-side fault on rank ``victim``, in messages from ``sender``, in the second
    step it sees."""
    seen: dict[tuple[int, int, int, int, int], bytes] = {}
    steps: list[int] = []

    def tamper(msg: MessageId, frame: bytes, round_frames: Frames) -> bytes:
        if msg.step not in steps:
            steps.append(msg.step)
        seen[(msg.step, msg.bucket, msg.phase, msg.hop, msg.sender)] = frame
        target = STEPS if kind == "verdict" else 2  # a verdict: the last step
        if dist.get_rank() != victim or len(steps) != target or msg.sender != sender:
            return frame
        if kind == "verdict" and msg.phase == Phase.VERDICT:
            return bytes([frame[0] ^ 1]) + frame[1:]
        first = msg.bucket == 0 and msg.hop == 0
        scatter = msg.phase in (Phase.A2A_SCATTER, Phase.RING_SCATTER)
        if kind == "flip" and first and scatter:
            out = bytearray(frame)
            out[3] ^= 0x20
            return bytes(out)
        if kind == "replay" and first and scatter:
            return seen[(steps[0], msg.bucket, msg.phase, msg.hop, msg.sender)]
        if kind == "swap-buckets" and msg.bucket == 1 and scatter:
            return seen[(msg.step, 0, msg.phase, msg.hop, msg.sender)]
        if kind == "reorder-phases" and msg.bucket == 0 and msg.phase == Phase.A2A_GATHER:
            return seen[(msg.step, 0, Phase.A2A_SCATTER, 0, msg.sender)]
        if kind == "drop" and first and scatter:
            return bytes(len(frame))
        if kind == "wrong-sender" and first and scatter:
            return round_frames[2]
        return frame

    return tamper


def describe(exc: BaseException) -> dict[str, Any]:
    out: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, GradientAuthenticationError):
        out.update(
            sender=exc.sender,
            receiver=exc.receiver,
            step=exc.step,
            bucket=exc.bucket,
            phase=exc.phase,
        )
    if isinstance(exc, PeerAuthenticationError | PeerNotTrustedError):
        out["ranks"] = list(exc.ranks)
    return out


def run_attack(
    keys: GroupKeys,
    algorithm: str,
    tamper: TamperFn | None,
    start: int | None = None,
    **options: Any,
) -> dict[str, Any]:
    state = EncryptedAllReduce(
        keys,
        algorithm=algorithm,  # type: ignore[arg-type]
        tamper=tamper,
        **options,
    )
    ddp, opt = make_ddp(state)
    first_step = keys._next_step if start is None else start
    for step in range(STEPS):
        before = params(ddp)
        try:
            train_step(ddp, opt, step)
        except (GradientAuthenticationError, PeerAuthenticationError) as exc:
            result = describe(exc)
            result.update(
                at=step,
                unchanged=max_diff(before, params(ddp)) == 0.0,
                step_offset=result.get("step", first_step + step) - first_step,
            )
            return result
    return {"error": None}


# --- the ranks ---------------------------------------------------------------------------


def scenario(rank: int, size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    keys = establish()
    out["parity_a2a"] = parity(keys, "a2a")
    out["parity_ring"] = parity(keys, "ring")
    rotating = establish(limits=UsageLimits(rotate_invocations=2, rotate_bytes=1 << 20))
    out["parity_rotating"] = parity(rotating, "auto")
    cases = ["flip", "replay", "swap-buckets", "reorder-phases", "drop"]
    if size >= 3:
        cases.append("wrong-sender")
    for kind in cases:
        out[f"a2a/{kind}"] = run_attack(keys, "a2a", tamperer(kind, victim=0))
    out["a2a/verdict"] = run_attack(keys, "a2a", tamperer("verdict", victim=0))
    for kind in ("flip", "replay", "drop"):
        # in the ring, rank 0 receives from the last rank only
        out[f"ring/{kind}"] = run_attack(keys, "ring", tamperer(kind, 0, sender=size - 1))
    # fresh ephemeral keys make a different group; rank 1 uses the keys of another one
    mine, foreign = establish(), establish()
    out["wrong-key"] = run_attack(foreign if rank == 1 else mine, "a2a", None, start=0)
    out["after"] = parity(keys, "a2a")  # the group still works after the failures
    # The key-release binding between ranks: every offer carries its CVM's evidence.
    out["parity_cvm"] = parity(establish(collect_cvm=collect_cvm, attest_cvm=attest_cvm), "a2a")
    try:
        last = rank == size - 1  # offers GPU evidence only
        establish(collect_cvm=None if last else collect_cvm, attest_cvm=attest_cvm)
        out["gpu_only_peer"] = {"error": None}
    except PeerNotTrustedError as exc:
        out["gpu_only_peer"] = describe(exc)
    # Without the relaxation a group that cannot check CVM evidence is refused before setup.
    try:
        GroupKeys.establish(collect=collector(GOOD), attest=attest, timeout=GROUP_TIMEOUT)
        out["gpu_only_default"] = {"error": None}
    except UsageError as exc:
        out["gpu_only_default"] = {"error": "UsageError", "message": str(exc)}
    out["relaxations"] = {
        "gpu_only": list(keys.relaxations),
        "cvm": list(establish(collect_cvm=collect_cvm, attest_cvm=attest_cvm).relaxations),
    }
    if size >= 3:
        try:
            establish(OTHER if rank == size - 1 else GOOD)
            out["untrusted"] = {"error": None}
        except PeerNotTrustedError as exc:
            out["untrusted"] = describe(exc)
    return out


def vanishing_peer(rank: int, size: int) -> dict[str, Any]:
    """Rank 1 leaves after one good step; rank 0 must fail, not wait without end."""
    keys = establish()
    ddp, opt = make_ddp(EncryptedAllReduce(keys))
    train_step(ddp, opt, 0)
    if rank == 1:
        return {"left": True}
    before = params(ddp)
    try:
        train_step(ddp, opt, 1)
    except Exception as exc:  # gloo reports the lost peer or the timeout
        return {"error": type(exc).__name__, "unchanged": max_diff(before, params(ddp)) == 0.0}
    return {"error": None}


Scenario = Callable[[int, int], dict[str, Any]]


def worker(
    rank: int, size: int, rendezvous: str, outdir: str, run: Scenario, timeout: float
) -> None:
    torch.set_num_threads(1)
    result: dict[str, Any]
    try:
        # The ranks meet through a file, not a TCP port picked beforehand (which another
        # process may take before rank 0 binds it); gloo's own connections bind port 0.
        dist.init_process_group(
            "gloo",
            init_method=f"file://{rendezvous}",
            rank=rank,
            world_size=size,
            timeout=dt.timedelta(seconds=timeout),
        )
        result = run(rank, size)
        if rank == 1 and result.get("left"):
            Path(outdir, f"rank{rank}.json").write_text(json.dumps(result))
            os._exit(0)  # vanish without a goodbye to the group
        dist.destroy_process_group()
    except BaseException:
        result = {"crash": traceback.format_exc()}
    Path(outdir, f"rank{rank}.json").write_text(json.dumps(result))


def run_group(
    size: int, outdir: Path, run: Scenario = scenario, timeout: float = 60.0
) -> list[dict[str, Any]]:
    ctx = mp.get_context("fork")
    rendezvous = outdir / "rendezvous"
    assert not rendezvous.exists(), "a fresh directory per group"
    procs = [
        ctx.Process(target=worker, args=(r, size, str(rendezvous), str(outdir), run, timeout))
        for r in range(size)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    results = []
    for r in range(size):
        path = outdir / f"rank{r}.json"
        assert path.exists(), f"rank {r} wrote no result"
        doc = json.loads(path.read_text())
        assert "crash" not in doc, f"rank {r} crashed:\n{doc['crash']}"
        results.append(doc)
    return results


@pytest.fixture(scope="module")
def group2(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return 2, run_group(2, tmp_path_factory.mktemp("ddp2"))


@pytest.fixture(scope="module")
def group3(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return 3, run_group(3, tmp_path_factory.mktemp("ddp3"))


@pytest.fixture(params=["group2", "group3"], ids=["2ranks", "3ranks"])
def group(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(str(request.param))


# --- assertions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case", ["parity_a2a", "parity_ring", "parity_rotating", "after", "parity_cvm"]
)
def test_parameters_equal_plain_ddp(group: Any, case: str) -> None:
    size, results = group
    for r in results:
        got = r[case]
        assert got["steps"] == STEPS
        assert got["buckets"] >= 3 * STEPS - 2  # several buckets per step once DDP rebuilt them
        assert got["moved"] > 0.0
        if size == 2:
            assert got["diff"] == 0.0
        else:
            assert got["diff"] <= 1e-6


def test_keys_rotate_inside_usage_limits(group: Any) -> None:
    _, results = group
    for r in results:
        assert r["parity_rotating"]["epoch"] >= 2
        assert r["parity_a2a"]["epoch"] == 0


EXPECTED = {
    "a2a/flip": (0, "a2a-scatter"),
    "a2a/replay": (0, "a2a-scatter"),
    "a2a/swap-buckets": (1, "a2a-scatter"),
    "a2a/reorder-phases": (0, "a2a-gather"),
    "a2a/drop": (0, "a2a-scatter"),
    "ring/flip": (0, "ring-scatter"),
    "ring/replay": (0, "ring-scatter"),
    "ring/drop": (0, "ring-scatter"),
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_tampering_is_detected_on_the_receiver_and_nothing_is_applied(
    group: Any, case: str
) -> None:
    size, results = group
    check_detected(size, results, case, *EXPECTED[case])


def test_a_message_from_another_sender_is_detected(group3: Any) -> None:
    size, results = group3
    check_detected(size, results, "a2a/wrong-sender", 0, "a2a-scatter")


def check_detected(size: int, results: list[Any], case: str, bucket: int, phase: str) -> None:
    victim = results[0][case]
    assert victim["error"] == "GradientAuthenticationError", victim
    sender = size - 1 if case.startswith("ring/") else 1
    assert (victim["sender"], victim["receiver"]) == (sender, 0)
    assert (victim["bucket"], victim["phase"]) == (bucket, phase)
    assert victim["at"] == 1 and victim["step_offset"] == 1
    assert victim["unchanged"]
    for other in results[1:]:
        got = other[case]
        assert got["error"] == "PeerAuthenticationError", got
        assert got["ranks"] == [0] and got["at"] == 1 and got["unchanged"]


def test_a_tampered_verdict_stops_its_receiver(group: Any) -> None:
    size, results = group
    victim = results[0]["a2a/verdict"]
    assert victim["error"] == "GradientAuthenticationError", victim
    assert (victim["sender"], victim["phase"], victim["at"]) == (1, "verdict", STEPS - 1)
    assert victim["unchanged"]
    for other in results[1:]:
        assert other["a2a/verdict"] == {"error": None}  # their messages were all authentic


def test_a_sender_with_another_key_is_rejected(group: Any) -> None:
    size, results = group
    victim = results[0]["wrong-key"]
    assert victim["error"] == "GradientAuthenticationError"
    assert victim["sender"] == 1 and victim["at"] == 0 and victim["unchanged"]
    for r in results:
        assert r["wrong-key"]["error"] in ("GradientAuthenticationError", "PeerAuthenticationError")
        assert r["wrong-key"]["unchanged"]


def test_group_setup_refuses_an_untrusted_peer_on_every_rank(group3: Any) -> None:
    size, results = group3
    for r in results:
        got = r["untrusted"]
        assert got["error"] == "PeerNotTrustedError"
        assert got["ranks"] == [size - 1]
        assert f"rank {size - 1}" in got["message"]


def test_a_rank_fails_rather_than_waits_when_its_peer_vanishes(
    tmp_path: Path,
) -> None:
    results = run_group(2, tmp_path, vanishing_peer, timeout=5.0)
    assert results[1] == {"left": True}
    assert results[0]["error"] is not None
    assert results[0]["unchanged"]


def test_ranks_requiring_cvm_evidence_refuse_a_gpu_only_peer(group: Any) -> None:
    size, results = group
    for r in results:
        got = r["gpu_only_peer"]
        assert got["error"] == "PeerNotTrustedError" and got["ranks"] == [size - 1], got
        assert "GPU-only" in got["message"]


def test_a_group_without_cvm_evidence_is_refused_unless_the_relaxation_is_named(
    group: Any,
) -> None:
    _, results = group
    for r in results:
        assert r["gpu_only_default"]["error"] == "UsageError"
        assert "allow_gpu_only" in r["gpu_only_default"]["message"]
        # the relaxation shows where it was used, and only there
        assert r["relaxations"] == {"gpu_only": ["cvm.allow_gpu_only: true"], "cvm": []}
