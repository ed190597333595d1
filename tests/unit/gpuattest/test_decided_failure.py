"""A decided failure outranks missing collateral, on NVIDIA's real H100 set A."""

from __future__ import annotations

from gpucc.gpuattest.collateral import FileRimSource, NoOcsp
from gpucc.gpuattest.evidence import load_evidence_file
from gpucc.gpuattest.policy import Policy
from gpucc.gpuattest.result import Verdict
from gpucc.gpuattest.trust import TrustRoots
from gpucc.gpuattest.verifier import verify
from tests.support.samples import (
    IN_WINDOW,
    SET_A_CHAIN,
    SET_A_NONCE,
    SET_A_PROD_VBIOS_RIM,
    SET_A_REPORT,
)


def test_a_mismatching_vbios_rim_without_the_driver_rim_is_not_trusted() -> None:
    result = verify(
        load_evidence_file(SET_A_REPORT, SET_A_CHAIN),
        expected_nonce=bytes.fromhex(SET_A_NONCE),
        roots=TrustRoots.nvidia(),
        now=IN_WINDOW,
        rims=FileRimSource(driver=None, vbios=SET_A_PROD_VBIOS_RIM),
        ocsp=NoOcsp("offline"),
        policy=Policy(require_ocsp=False),
    )
    assert result.verdict is Verdict.NOT_TRUSTED  # was undecided: the driver RIM is missing
    reason = result.gpus[0].check("measurements").reason
    assert reason.startswith("mismatch at RIM index ") and "(vbios): golden " in reason
    assert ", runtime " in reason and "(not compared: no driver RIM)" in reason
