"""Blackwell (B200) verification on NVIDIA's real B200 evidence.

No RIM for this B200 exists offline, so the real verdict is undecided; the trusted case
uses RIMs built from the report's own measurements under a test RIM root, which
exercises the comparison, not NVIDIA's reference values (their index split for Blackwell
is not known here; the test's split is an assumption of the test).
"""

from __future__ import annotations

import datetime as dt
import os

import pytest

from gpucc.core.errors import CollateralUnavailableError
from gpucc.gpuattest.collateral import NoOcsp, RimSource
from gpucc.gpuattest.evidence import load_evidence_file
from gpucc.gpuattest.policy import Policy
from gpucc.gpuattest.report import AttestationReport
from gpucc.gpuattest.result import AttestationResult, CheckStatus, Verdict
from gpucc.gpuattest.simulate import Pki, _template_rim, sign_rim
from gpucc.gpuattest.trust import TrustRoots
from gpucc.gpuattest.verifier import verify
from tests.support.samples import B200_CHAIN, B200_NONCE, B200_REPORT, report_bytes

AT = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)
DRIVER_ID = "NV_GPU_CC_DRIVER_GB100_575.32"
VBIOS_ID = "NV_GPU_VBIOS_G525_0220_886_970088000F"


class _Rims:
    def __init__(self, rims: dict[str, bytes]) -> None:
        self.rims = rims

    def get_rim(self, rim_id: str) -> bytes:
        if rim_id not in self.rims:
            raise CollateralUnavailableError(f"no RIM {rim_id} here")
        return self.rims[rim_id]


def _verify(rims: RimSource, roots: TrustRoots, nonce: str = B200_NONCE) -> AttestationResult:
    return verify(
        load_evidence_file(B200_REPORT, B200_CHAIN),
        expected_nonce=bytes.fromhex(nonce),
        roots=roots,
        now=AT,
        rims=rims,
        ocsp=NoOcsp("offline"),
        policy=Policy(require_ocsp=False),
    )


def test_the_report_reads_as_blackwell() -> None:
    evidence = load_evidence_file(B200_REPORT, B200_CHAIN)
    assert evidence.gpus[0].arch == "BLACKWELL"  # from the leaf GB100 A01 GSP FMC LF
    report = AttestationReport.parse(evidence.gpus[0].report)
    assert len(report.blocks) == 64
    assert report.chip_info is None and report.feature_flag is None
    assert report.vbios_version == "97.00.88.00.0F"
    assert report.fwid is not None


def test_offline_it_is_undecided_and_names_the_missing_rims() -> None:
    result = _verify(_Rims({}), TrustRoots.nvidia())
    assert result.verdict is Verdict.UNDECIDED, result.reasons
    gpu = result.gpus[0]
    assert (gpu.driver_rim_id, gpu.vbios_rim_id) == (DRIVER_ID, VBIOS_ID)
    for check in ("device-chain", "fwid", "report-signature", "nonce"):
        assert gpu.check(check).status is CheckStatus.PASS, check
    assert gpu.claims["x-nvidia-gpu-attestation-report-cert-chain-fwid-match"] is True
    reasons = " ".join(result.reasons)
    assert DRIVER_ID in reasons and VBIOS_ID in reasons
    assert gpu.check("measurements").reason == (
        "reference values unavailable: no driver and no vbios RIM"
    )
    assert "FEATURE_FLAG" in gpu.claim_notes["x-nvidia-gpu-mode"]


def test_the_wrong_nonce_is_not_trusted() -> None:
    result = _verify(_Rims({}), TrustRoots.nvidia(), nonce="11" * 32)
    assert result.verdict is Verdict.NOT_TRUSTED


def _test_rims(
    change: int | None = None, *, drop: str | None = None
) -> tuple[dict[str, bytes], TrustRoots]:
    report = AttestationReport.parse(report_bytes(B200_REPORT))
    golden = {i - 1: b.value for i, b in report.blocks.items()}
    if change is not None:
        golden[change] = os.urandom(48)
    before, after = AT - dt.timedelta(days=30), AT + dt.timedelta(days=30)
    pki = Pki.build(
        ["Test RIM root", "Test CA", "Test L3", "Test L4"], not_before=before, not_after=after
    )
    vbios_active = frozenset(range(0, 16))
    driver_active = frozenset(range(16, 64))
    rims = {
        DRIVER_ID: sign_rim(
            template=_template_rim("driver-rim-545.00.swidtag"),
            colloquial_version="575.32",
            golden=golden,
            active=driver_active,
            pki=pki,
        ),
        VBIOS_ID: sign_rim(
            template=_template_rim("vbios-rim-1010_0200_882_96005E0001-test.swidtag"),
            colloquial_version="97.00.88.00.0F",
            golden=golden,
            active=vbios_active,
            pki=pki,
        ),
    }
    if drop is not None:
        del rims[drop]
    return rims, TrustRoots(device_root=TrustRoots.nvidia().device_root, rim_root=pki.root)


def test_trusted_with_rims_that_match() -> None:
    rims, roots = _test_rims()
    result = _verify(_Rims(rims), roots)
    assert result.verdict is Verdict.TRUSTED, result.reasons
    meas = result.gpus[0].measurements
    # The B200 reports NVDEC0 disabled, so index 35 is skipped as on Hopper (whether
    # Blackwell's RIMs put NVDEC0 at index 35 too is not known from NVIDIA's code).
    assert meas is not None and meas.compared_count == 63 and meas.skipped == (35,)


@pytest.mark.parametrize("index", [3, 52])
def test_a_mismatch_is_reported_exactly(index: int) -> None:
    rims, roots = _test_rims(change=index)
    result = _verify(_Rims(rims), roots)
    assert result.verdict is Verdict.NOT_TRUSTED
    reason = result.gpus[0].check("measurements").reason
    runtime = report_bytes(B200_REPORT)
    block = AttestationReport.parse(runtime).blocks[index + 1].value.hex()
    assert f"index {index} (" in reason and f"runtime {block}" in reason


def test_a_decided_failure_outranks_a_missing_rim() -> None:
    """The driver RIM is missing, the VBIOS RIM mismatches: not trusted, not undecided."""
    rims, roots = _test_rims(change=3, drop=DRIVER_ID)
    result = _verify(_Rims(rims), roots)
    assert result.verdict is Verdict.NOT_TRUSTED
    check = result.gpus[0].check("measurements")
    assert "index 3 (vbios)" in check.reason and "no driver RIM" in check.reason
    assert result.gpus[0].claims["measres"] == "fail"


def test_a_missing_rim_with_the_rest_matching_stays_undecided() -> None:
    rims, roots = _test_rims(drop=DRIVER_ID)
    result = _verify(_Rims(rims), roots)
    assert result.verdict is Verdict.UNDECIDED
    reason = result.gpus[0].check("measurements").reason
    assert "no driver RIM" in reason and "the 16 golden values of the vbios RIM" in reason
