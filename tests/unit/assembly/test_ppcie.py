"""Protected PCIe through the platform verifier: a simulated HGX board (8 GPUs, 4 NVSwitches)
is one verdict; each broken topology rule is refused by name; key release accepts the
machine as one party."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from gpucc.assembly import PlatformEvidence, PlatformResult, PlatformVerifier, Settings
from gpucc.core.errors import MalformedPolicyError
from gpucc.gpuattest.evidence import EvidenceSet, GpuEvidence
from gpucc.gpuattest.policy import Policy, parse_policy
from gpucc.gpuattest.result import CheckStatus, Verdict
from gpucc.gpuattest.simulate_board import SimulatedBoard
from gpucc.keyrelease.protocol import CollectedEvidence, accept_offer, create_offer, new_challenge
from gpucc.staging.errors import ProtocolError

NOW = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)
PPCIE = parse_policy({"ocsp": {"require": False}, "topology": {"ppcie": True}})


def write_board(board: SimulatedBoard, directory: Path) -> Path:
    """The board's roots and RIMs where ``Settings(simulation=...)`` reads them."""
    (directory / "rims").mkdir(parents=True, exist_ok=True)
    for rim_id, rim in board.rims.items():
        (directory / "rims" / f"{rim_id}.xml").write_bytes(rim)
    roots = board.roots
    (directory / "device_root.pem").write_bytes(roots.device_root.public_bytes(Encoding.PEM))
    (directory / "rim_root.pem").write_bytes(roots.rim_root.public_bytes(Encoding.PEM))
    return directory


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> tuple[SimulatedBoard, Path]:
    made = SimulatedBoard.create(now=NOW)
    return made, write_board(made, tmp_path_factory.mktemp("board"))


def _verify(
    board: tuple[SimulatedBoard, Path], evidence: EvidenceSet, nonce: bytes, policy: Policy = PPCIE
) -> PlatformResult:
    verifier = PlatformVerifier(Settings(policy=policy, simulation=board[1], at=NOW))
    return verifier.verify(PlatformEvidence(gpus=evidence), nonce=nonce)


def _failed(result: PlatformResult) -> list[str]:
    assert result.topology is not None
    return [c.id for c in result.topology.checks if c.status is CheckStatus.FAIL]


def test_the_board_is_trusted_as_one_machine(board: tuple[SimulatedBoard, Path]) -> None:
    nonce = os.urandom(32)
    result = _verify(board, board[0].evidence(nonce), nonce)
    assert result.verdict is Verdict.TRUSTED, result.reasons
    assert len(result.gpus) == 8 and result.switch is not None
    assert len(result.switch.switches) == 4 and result.topology is not None
    assert len(result.topology.switch_pdis) == 4 and len(result.topology.gpu_pdis) == 8
    doc = result.to_dict()
    assert len(doc["switches"]) == 4 and doc["topology"]["verdict"] == "trusted"
    assert doc["policy"]["topology"] == {"ppcie": True, "gpus": 8, "switches": 4}


def test_switches_given_apart_are_the_same(board: tuple[SimulatedBoard, Path]) -> None:
    nonce = os.urandom(32)
    made, directory = board
    verifier = PlatformVerifier(Settings(policy=PPCIE, simulation=directory, at=NOW))
    result = verifier.verify(
        PlatformEvidence(
            gpus=EvidenceSet(gpus=tuple(made.gpu_entries(nonce))),
            switches=EvidenceSet(gpus=tuple(made.switch_entries(nonce))),
        ),
        nonce=nonce,
    )
    assert result.verdict is Verdict.TRUSTED, result.reasons


def test_without_ppcie_the_switches_are_verified_but_no_topology(
    board: tuple[SimulatedBoard, Path],
) -> None:
    nonce = os.urandom(32)
    evidence = EvidenceSet(gpus=tuple(board[0].gpu_entries(nonce)[:1]))
    result = _verify(board, evidence, nonce, Policy(require_ocsp=False))
    assert result.verdict is Verdict.TRUSTED and result.topology is None


def test_a_missing_switch_is_refused_by_name(board: tuple[SimulatedBoard, Path]) -> None:
    nonce = os.urandom(32)
    entries = board[0].evidence(nonce).gpus
    result = _verify(board, EvidenceSet(gpus=entries[:-1]), nonce)
    assert result.verdict is Verdict.NOT_TRUSTED
    assert _failed(result) == ["switch-count", "switch-pdis-known"]
    assert any("3 switches presented, 4 expected" in r for r in result.reasons)


def test_a_repeated_device_is_refused_by_name(board: tuple[SimulatedBoard, Path]) -> None:
    nonce = os.urandom(32)
    entries = board[0].evidence(nonce).gpus
    repeated = (*entries[:1], *entries[:1], *entries[2:])  # GPU 0 twice, GPU 1 absent
    result = _verify(board, EvidenceSet(gpus=repeated), nonce)
    assert result.verdict is Verdict.NOT_TRUSTED
    assert "unique-devices" in _failed(result)
    assert any("GPU 1 repeats GPU 0" in r for r in result.reasons)


def _gpu_with(board: SimulatedBoard, n: int, nonce: bytes, **change: bytes) -> GpuEvidence:
    gpu = board.gpus[n]
    fields = dict(board.gpu_opaque(gpu))
    fields.update({int(k[1:]): v for k, v in change.items()})
    entry = board.gpu_entries(nonce)[n]
    return dataclasses.replace(entry, report=gpu.report(nonce, opaque=list(fields.items())))


def test_gpus_that_disagree_on_the_switches_are_refused_by_name(
    board: tuple[SimulatedBoard, Path],
) -> None:
    made = board[0]
    nonce = os.urandom(32)
    entries = list(made.evidence(nonce).gpus)
    other = b"".join([s.pdi for s in made.switches[:3]] * 4 + [os.urandom(8)] * 6)
    entries[2] = _gpu_with(made, 2, nonce, t22=other)
    result = _verify(board, EvidenceSet(gpus=tuple(entries)), nonce)
    assert result.verdict is Verdict.NOT_TRUSTED
    assert "gpu-switch-pdis" in _failed(result)
    assert result.gpus[2].verdict is Verdict.TRUSTED  # the device itself verifies


def test_switches_that_disagree_on_the_gpus_are_refused_by_name(
    board: tuple[SimulatedBoard, Path],
) -> None:
    made = board[0]
    nonce = os.urandom(32)
    entries = list(made.evidence(nonce).gpus)
    odd = made.switches[1]
    pdis = (*made.gpu_pdis[:7], os.urandom(8))
    entries[9] = dataclasses.replace(entries[9], report=odd.report(nonce, pdis))
    result = _verify(board, EvidenceSet(gpus=tuple(entries)), nonce)
    assert _failed(result) == ["switch-gpu-pdis"]


def test_a_gpu_not_in_ppcie_mode_is_refused_by_name(board: tuple[SimulatedBoard, Path]) -> None:
    made = board[0]
    nonce = os.urandom(32)
    entries = list(made.evidence(nonce).gpus)
    entries[5] = _gpu_with(made, 5, nonce, t21=b"\x55", t36=b"\x01\x00")
    result = _verify(board, EvidenceSet(gpus=tuple(entries)), nonce)
    assert _failed(result) == ["gpu-ppcie-mode"]
    assert any("GPU 5 reports mpt" in r for r in result.reasons)


def test_every_failed_check_is_reported_not_only_the_first(
    board: tuple[SimulatedBoard, Path],
) -> None:
    nonce = os.urandom(32)
    made = board[0]
    entries = list(made.evidence(nonce).gpus)
    entries[0] = _gpu_with(made, 0, nonce, t21=b"\x55", t36=b"\x00\x00")
    result = _verify(board, EvidenceSet(gpus=(*entries[:7], *entries[8:11])), nonce)
    assert _failed(result) == [
        "gpu-count",
        "switch-count",
        "gpu-ppcie-mode",
        "switch-pdis-known",
        "switch-gpu-pdis",
    ]


def test_other_boards_set_their_counts_in_the_policy(tmp_path: Path) -> None:
    made = SimulatedBoard.create(now=NOW, gpus=4, switches=2)
    directory = write_board(made, tmp_path)
    nonce = os.urandom(32)
    policy = parse_policy(
        {"ocsp": {"require": False}, "topology": {"ppcie": True, "gpus": 4, "switches": 2}}
    )
    result = _verify((made, directory), made.evidence(nonce), nonce, policy)
    assert result.verdict is Verdict.TRUSTED, result.reasons
    hgx = _verify((made, directory), made.evidence(nonce), nonce)
    assert "gpu-count" in _failed(hgx) and "switch-count" in _failed(hgx)


@pytest.mark.parametrize(
    "section",
    [{"ppcie": "yes"}, {"gpus": 0}, {"switches": 65}, {"gpus": True}, {"nodes": 2}, []],
)
def test_a_malformed_topology_section_is_refused(section: object) -> None:
    with pytest.raises(MalformedPolicyError):
        parse_policy({"topology": section})


def test_key_release_accepts_a_ppcie_machine_as_one_party(
    board: tuple[SimulatedBoard, Path],
) -> None:
    made, directory = board
    verifier = PlatformVerifier(
        Settings(policy=PPCIE, simulation=directory, clock=lambda: NOW)
    )  # release: the clock, never a fixed time

    def collect(nonce: bytes) -> CollectedEvidence:
        return CollectedEvidence.from_evidence_set(made.evidence(nonce))

    challenge = new_challenge()
    offer, host_key = create_offer(challenge, collect)
    assert len(host_key.report_digests) == 12
    session = accept_offer(
        offer, challenge=challenge, attest=verifier.gpu_attester(), allow_gpu_only=True
    )
    assert session.report_digests == host_key.report_digests


def test_key_release_refuses_a_ppcie_machine_missing_a_switch(
    board: tuple[SimulatedBoard, Path],
) -> None:
    made, directory = board
    verifier = PlatformVerifier(
        Settings(policy=PPCIE, simulation=directory, clock=lambda: NOW)
    )  # release: the clock, never a fixed time

    def collect(nonce: bytes) -> CollectedEvidence:
        return CollectedEvidence.from_evidence_set(EvidenceSet(gpus=made.evidence(nonce).gpus[:-1]))

    challenge = new_challenge()
    offer, _ = create_offer(challenge, collect)
    with pytest.raises(ProtocolError, match="NVSwitch count"):
        accept_offer(
            offer, challenge=challenge, attest=verifier.gpu_attester(), allow_gpu_only=True
        )
