"""Sources given one simulation directory share its roots, across processes.

The ranks of a DDP job (or any processes started side by side) each make a
``SimulatedSource`` on the same directory at the same moment: they must all end with one set
of roots, so each verifies the others' evidence, while each is still a GPU of its own.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from gpucc.assembly import (
    PlatformEvidence,
    PlatformVerifier,
    Settings,
    SimulatedSource,
    simulation_policy,
)
from gpucc.assembly.simulation import AUTHORITY_FILE
from gpucc.core.errors import UsageError
from gpucc.gpuattest.evidence import dump_evidence_json, load_evidence_json
from gpucc.gpuattest.result import Verdict

NONCE = bytes(range(32))


def _make(directory: str, out: str, go: Any) -> None:
    go.wait()
    source = SimulatedSource(Path(directory))
    Path(out).write_bytes(dump_evidence_json(source.gpu_evidence(NONCE)))


def _verify(directory: Path, evidence: bytes) -> Verdict:
    source = load_evidence_json(evidence)
    verifier = PlatformVerifier(Settings(policy=simulation_policy(), simulation=directory))
    return verifier.verify(PlatformEvidence(gpus=source), nonce=NONCE).verdict


def test_processes_started_together_share_one_set_of_roots(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    go = ctx.Event()
    outs = [tmp_path / f"rank{i}.json" for i in range(4)]
    procs = [ctx.Process(target=_make, args=(str(tmp_path / "sim"), str(out), go)) for out in outs]
    for p in procs:
        p.start()
    go.set()  # all at once: the race the lock settles
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    uuids = set()
    for out in outs:
        evidence = out.read_bytes()
        assert _verify(tmp_path / "sim", evidence) is Verdict.TRUSTED
        uuids.add(load_evidence_json(evidence).gpus[0].uuid)
    assert len(uuids) == 4  # a GPU each
    mode = stat.S_IMODE(os.stat(tmp_path / "sim" / AUTHORITY_FILE).st_mode)
    assert mode == 0o600  # it holds the simulation's private keys


def test_a_later_source_reuses_the_directorys_roots_and_cvm(tmp_path: Path) -> None:
    first = SimulatedSource(tmp_path)

    def roots() -> tuple[bytes, bytes]:
        return (tmp_path / "device_root.pem").read_bytes(), (tmp_path / "rim_root.pem").read_bytes()

    before = roots()
    second = SimulatedSource(tmp_path)
    assert roots() == before
    for source in (first, second):
        assert _verify(tmp_path, dump_evidence_json(source.gpu_evidence(NONCE))) is (
            Verdict.TRUSTED
        )
    # one simulated TDX platform: the second's quote verifies under the root the first wrote
    assert first.cvm_evidence(bytes(64)) is not None
    quote = second.cvm_evidence(bytes(64))
    assert quote is not None
    verifier = PlatformVerifier(Settings(policy=simulation_policy(), simulation=tmp_path))
    result = verifier.verify(
        PlatformEvidence(
            gpus=second.gpu_evidence(NONCE),
            cvm=quote.evidence,
            cvm_collateral=quote.collateral,
            cvm_event_log=quote.event_log,
        ),
        nonce=NONCE,
        cvm_report_data=bytes(64),
    )
    assert result.verdict is Verdict.TRUSTED, result


def test_stale_authorities_are_replaced(tmp_path: Path) -> None:
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=800)
    SimulatedSource(tmp_path, now=long_ago)
    old = (tmp_path / "device_root.pem").read_bytes()
    source = SimulatedSource(tmp_path)  # now: the old CAs expired a year ago
    assert (tmp_path / "device_root.pem").read_bytes() != old
    evidence = dump_evidence_json(source.gpu_evidence(NONCE))
    assert _verify(tmp_path, evidence) is Verdict.TRUSTED


def test_a_file_that_is_not_an_authority_is_refused(tmp_path: Path) -> None:
    (tmp_path / AUTHORITY_FILE).write_text('{"schema": "something else"}')
    with pytest.raises(UsageError, match="not a simulation's authority file"):
        SimulatedSource(tmp_path)
