"""Every front end reaches evidence and verification through the one assembly.

An evidence source is injected once (``gpucc.assembly.sources.open_source`` replaced by a
counting one) and the platform verifier's one call is counted; then ``gpucc attest``,
``session local``, ``session answer``, ``travel run``, the holder service and DDP setup
each run, and each must have drawn its evidence from the injected source and reached
:meth:`PlatformVerifier.verify`.
"""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing as mp
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpucc.assembly import (
    PlatformResult,
    PlatformVerifier,
    Settings,
    SimulatedSource,
    assemble,
    simulation_policy,
    sources,
)
from gpucc.cli.main import build
from gpucc.gpuattest.evidence import EvidenceSet
from gpucc.keyrelease.protocol import CollectedCvmEvidence, Offer, create_offer, new_challenge


class CountingSource:
    """A simulated source that records every request."""

    def __init__(self, inner: SimulatedSource) -> None:
        self.inner = inner
        self.calls: list[str] = []
        self.simulated = True
        self.gpu_only = False

    def gpu_evidence(self, nonce: bytes) -> EvidenceSet:
        self.calls.append("gpu")
        return self.inner.gpu_evidence(nonce)

    def cvm_evidence(self, report_data: bytes) -> CollectedCvmEvidence | None:
        self.calls.append("cvm")
        return self.inner.cvm_evidence(report_data)


class Wiring:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.source = CountingSource(SimulatedSource(directory))
        self.opened = 0
        self.verified: list[PlatformResult] = []


@pytest.fixture
def wiring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Wiring]:
    state = Wiring(tmp_path / "sim")

    def open_source(**_: Any) -> CountingSource:
        state.opened += 1
        return state.source

    original = PlatformVerifier.verify

    def verify(self: PlatformVerifier, *args: Any, **kwargs: Any) -> PlatformResult:
        result = original(self, *args, **kwargs)
        state.verified.append(result)
        return result

    monkeypatch.setattr(sources, "open_source", open_source)
    monkeypatch.setattr(PlatformVerifier, "verify", verify)
    yield state


def _cli(*args: str) -> Any:
    return CliRunner().invoke(build(args[0]), list(args), catch_exceptions=True)


def _dataset(tmp_path: Path) -> tuple[Path, Path]:
    from gpucc.staging import seal_file, write_key_file

    key_file = tmp_path / "train.key"
    kek = write_key_file(key_file)
    plain = tmp_path / "train.bin"
    plain.write_bytes(b"x" * 10_000)
    sealed = tmp_path / "train.gcc"
    seal_file(plain, sealed, kek=kek)
    return sealed, key_file


def test_attest_collects_from_the_source_and_verifies_once(wiring: Wiring) -> None:
    result = _cli("attest", "--format", "json")
    assert wiring.opened == 1 and wiring.source.calls == ["gpu"]
    assert len(wiring.verified) == 1
    # NVIDIA's roots do not trust a simulated GPU: the one verdict says so.
    assert result.exit_code == 1 and not wiring.verified[0].trusted


def test_session_local_and_answer_use_the_source_and_the_verifier(
    wiring: Wiring, tmp_path: Path
) -> None:
    sealed, key_file = _dataset(tmp_path)
    local = _cli(
        "session", "local", str(sealed), "--data-key", str(key_file),
        "-o", str(tmp_path / "answer.json"), "--host-key", str(tmp_path / "host.key"),
        "--simulate", str(wiring.directory),
    )  # fmt: skip
    assert local.exit_code == 0, local.output
    assert wiring.source.calls == ["gpu", "cvm"]
    assert [r.trusted for r in wiring.verified] == [True, True]  # the GPU, then the CVM
    assert all(r.simulated for r in wiring.verified)
    # The holder side of a two-machine session: an offer made from the same source.
    challenge = new_challenge()
    platform = assemble(Settings(simulation=wiring.directory))
    offer, _ = create_offer(challenge, platform.collect(), collect_cvm=platform.collect_cvm())
    (tmp_path / "offer.json").write_bytes(offer.to_json())
    before = len(wiring.verified)
    answer = _cli(
        "session", "answer", str(tmp_path / "offer.json"), "--challenge", challenge.hex(),
        "--dataset", str(sealed), "--data-key", str(key_file),
        "-o", str(tmp_path / "answer2.json"), "--simulate", str(wiring.directory),
        "--state-dir", str(tmp_path / "state"),
    )  # fmt: skip
    assert answer.exit_code == 0, answer.output
    assert len(wiring.verified) == before + 2


def test_travel_run_offers_evidence_from_the_source(
    wiring: Wiring, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpucc.travel import orchestrator

    seen: dict[str, Any] = {}

    def run_plan(plan: Any, *, collect: Any, collect_cvm: Any, **_: Any) -> Any:
        seen["gpu"] = collect(b"\x01" * 32)
        seen["cvm"] = collect_cvm(b"\x02" * 64)
        raise SystemExit(0)

    monkeypatch.setattr(orchestrator, "run_plan", run_plan)
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "version: 1\nlog: log.jsonl\norchestrator_key: o.key\nholders: []\n", encoding="utf-8"
    )
    monkeypatch.setattr("gpucc.travel.plan.load_plan", lambda path: object())
    _cli("travel", "run", str(plan), "--simulate", str(wiring.directory))
    assert wiring.opened == 1 and wiring.source.calls == ["gpu", "cvm"]
    assert seen["gpu"].reports and seen["cvm"].evidence


def test_the_holder_service_verifies_offers_through_the_platform_verifier(
    wiring: Wiring, tmp_path: Path
) -> None:
    from gpucc.cli.holder_config import platform_verifier
    from gpucc.holder.decide import answer_offer
    from gpucc.holder.service import HolderConfig, load_datasets
    from gpucc.travel.signing import generate_signing_key

    sealed, key_file = _dataset(tmp_path)
    platform = assemble(Settings(simulation=wiring.directory))  # the host's side
    config = HolderConfig(
        datasets=load_datasets(sealed.parent, key_file),
        signing_key=generate_signing_key(),
        verifier=platform_verifier(
            {
                "simulate_roots": wiring.directory,
                "service_key_file": None,
                "collateral": None,
                "offline": True,
                "rim_url": None,
                "ocsp_url": None,
                "cache_dir": None,
                "rim_dir": None,
                "pccs_url": None,
            },
            None,
        ),
    )
    offer, _ = create_offer(new_challenge(), platform.collect(), collect_cvm=platform.collect_cvm())
    # what POST /v1/offer runs for an offer whose challenge it took
    results: list[PlatformResult] = []
    done = answer_offer(config, Offer.from_json(offer.to_json()), results)
    assert done.released and not done.withheld and done.requester is None
    assert done.envelope and len(done.transcript_hash) == 48  # SHA-384
    assert done.record.simulated and results == wiring.verified
    assert [r.trusted for r in wiring.verified] == [True, True]
    assert offer.version == 2


def _rank(rank: int, store_file: str, out: str, wiring: Wiring) -> None:
    try:
        import torch.distributed as dist

        from gpucc.ddp import GroupKeys

        dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=2)
        platform = assemble(Settings(simulation=wiring.directory, policy=simulation_policy()))
        keys = GroupKeys.establish(platform=platform, timeout=dt.timedelta(seconds=60))
        doc = {
            "calls": wiring.source.calls,
            "opened": wiring.opened,
            "verified": [r.trusted for r in wiring.verified],
            "transcript": keys.transcript_hash.hex(),
        }
        dist.destroy_process_group()
    except BaseException:  # report, do not hang the other rank's parent
        doc = {"crash": traceback.format_exc()}
    Path(out).write_text(json.dumps(doc))


@pytest.mark.torch
def test_ddp_setup_takes_evidence_and_verdicts_from_the_platform(
    wiring: Wiring, tmp_path: Path
) -> None:
    # One simulated TDX platform for both ranks (made before the fork, its root written once).
    wiring.source.inner.cvm_evidence(bytes(64))
    ctx = mp.get_context("fork")
    store = tmp_path / "store"
    procs = [
        ctx.Process(target=_rank, args=(r, str(store), str(tmp_path / f"r{r}.json"), wiring))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        if p.is_alive():
            p.kill()
    docs = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    for doc in docs:
        assert "crash" not in doc, doc.get("crash")
        # each rank opened the injected source once, offered GPU and CVM evidence from it,
        # and verified its peer's GPU and CVM evidence through the platform verifier
        assert doc["opened"] == 1 and doc["calls"] == ["gpu", "cvm"]
        assert doc["verified"] == [True, True]
    assert docs[0]["transcript"] == docs[1]["transcript"]
