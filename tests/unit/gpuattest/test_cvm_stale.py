"""Stale versus bad, for every order of the dates involved: an authentic quote or report whose
collateral or certificates are outside their windows is undecided (exit 3), a tampered one
not trusted (exit 1). TDX under the simulation's platform (collateral window against the
PCK certificate's), SEV-SNP with simulated VCEKs and the real AWS VLEK (certificate windows
against the verification time)."""

from __future__ import annotations

import datetime as dt

import pytest

from gpucc.gpuattest.cvm.appraise import CvmResult, verify_cvm_evidence
from gpucc.gpuattest.cvm.policy import CvmPolicy
from gpucc.gpuattest.cvm.snp_roots import SnpRoots
from gpucc.gpuattest.cvm.snp_simulate import SimulatedSnp
from gpucc.gpuattest.cvm.tdx_sim import simulated_tdx
from gpucc.gpuattest.result import CheckStatus, Verdict
from tests.support.paths import DATA

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
RD = bytes(range(64))
DAY = dt.timedelta(days=1)
SEC = dt.timedelta(seconds=1)  # a window's end is already outside it


def flipped(data: bytes, offset: int) -> bytes:
    out = bytearray(data)
    out[offset] ^= 0x01
    return bytes(out)


#: name -> (collateral issued, days valid, PCK not before, PCK not after, the sound time or
#: None where none exists). The collateral's window is [issued, issued + days); the sound
#: time is the one closest to NOW inside every window.
ORDERS = {
    "pck older than stale collateral": (NOW - 60 * DAY, 30, NOW - 400 * DAY, NOW + 900 * DAY,
                                        NOW - 30 * DAY - SEC),
    "pck issued inside the stale collateral's window": (NOW - 60 * DAY, 30, NOW - 45 * DAY,
                                                         NOW + 900 * DAY, NOW - 30 * DAY - SEC),
    "pck issued after the collateral expired": (NOW - 60 * DAY, 30, NOW - 20 * DAY,
                                                NOW + 900 * DAY, None),
    "collateral not yet issued": (NOW + DAY, 30, NOW - 400 * DAY, NOW + 900 * DAY, NOW + DAY),
    "pck not yet valid, collateral current": (NOW - 10 * DAY, 30, NOW + 5 * DAY,
                                              NOW + 900 * DAY, NOW + 5 * DAY),
    "pck expired, collateral current": (NOW - 10 * DAY, 30, NOW - 400 * DAY, NOW - 5 * DAY,
                                        NOW - 5 * DAY - SEC),
    "pck expired before the collateral was issued": (NOW - 10 * DAY, 30, NOW - 400 * DAY,
                                                     NOW - 20 * DAY, None),
    "pck expired after stale collateral": (NOW - 60 * DAY, 30, NOW - 400 * DAY, NOW - 40 * DAY,
                                           NOW - 40 * DAY - SEC),
}  # fmt: skip


@pytest.mark.parametrize("order", list(ORDERS))
def test_tdx_stale_is_undecided_and_tampered_is_not_trusted_in_every_order(order: str) -> None:
    issued, days, pck_from, pck_to, sound = ORDERS[order]
    sim = simulated_tdx(NOW, pck_valid=(pck_from, pck_to))
    collateral = sim.collateral(issued=issued, valid_days=days).to_json()
    quote = sim.quote(RD)

    def judged(evidence: bytes) -> tuple[Verdict, dict[str, tuple[CheckStatus, str, str]]]:
        result = verify_cvm_evidence(
            evidence, collateral, now=NOW, policy=CvmPolicy(), expected_report_data=RD,
            tdx_root=sim.root,
        )  # fmt: skip
        return result.verdict, {c.id: (c.status, c.reason, c.note) for c in result.checks}

    verdict, checks = judged(quote)
    assert verdict is Verdict.UNDECIDED, checks  # exit 3
    assert checks["cvm-collateral"][0] is CheckStatus.NOT_CHECKED
    status, reason, note = checks["cvm-quote"]
    if sound is None:
        assert status is CheckStatus.NOT_CHECKED
        assert reason.startswith("no time exists at which the collateral and the quote's PCK")
        # the signatures, which do not depend on time, were checked
        assert checks["tdx-quote-signature"][0] is CheckStatus.PASS
        assert checks["tdx-qe-report"][0] is CheckStatus.PASS
    else:
        assert status is CheckStatus.PASS, checks
        assert f"checked at {sound:%Y-%m-%dT%H:%M:%SZ}, when the collateral" in note
    # a bit flipped in the TD report (MRTD), the quote signature or the QE report
    for offset in (48 + 200, 48 + 584 + 4 + 10, 48 + 584 + 4 + 134 + 10):
        verdict, checks = judged(flipped(quote, offset))
        assert verdict is Verdict.NOT_TRUSTED, (offset, checks)  # exit 1


def test_tdx_with_everything_current_is_trusted_at_now() -> None:
    sim = simulated_tdx(NOW, pck_valid=(NOW - DAY, NOW + DAY))
    result = verify_cvm_evidence(
        sim.quote(RD), sim.collateral(issued=NOW - DAY).to_json(), now=NOW, policy=CvmPolicy(),
        expected_report_data=RD, tdx_root=sim.root,
    )  # fmt: skip
    assert result.verdict is Verdict.TRUSTED, result.reasons
    assert next(c for c in result.checks if c.id == "cvm-quote").note == ""


# --- SEV-SNP: the VCEK's (VLEK's) window against the verification time ----------------------
# gpucc reads no AMD CRL, so the dates that decide stale or current are the certificates'
# against the verification time; the report's signature does not depend on time and is
# checked in every order.


@pytest.mark.parametrize(
    ("not_before", "not_after", "verdict"),
    [
        (NOW - 400 * DAY, NOW + 400 * DAY, Verdict.TRUSTED),
        (NOW + DAY, NOW + 400 * DAY, Verdict.UNDECIDED),  # issued after the report's time
        (NOW - 400 * DAY, NOW - DAY, Verdict.UNDECIDED),  # expired
    ],
    ids=["vcek-current", "vcek-not-yet-valid", "vcek-expired"],
)
def test_snp_stale_is_undecided_and_tampered_is_not_trusted_in_every_order(
    not_before: dt.datetime, not_after: dt.datetime, verdict: Verdict
) -> None:
    chip = SimulatedSnp.create(not_before=not_before, not_after=not_after)
    report = chip.report(report_data=RD)

    def judged(evidence: bytes) -> CvmResult:
        return verify_cvm_evidence(
            evidence, chip.vcek, now=NOW, policy=CvmPolicy(), expected_report_data=RD,
            snp_roots=chip.roots,
        )  # fmt: skip

    result = judged(report)
    assert result.verdict is verdict, result.reasons
    if verdict is Verdict.UNDECIDED:
        assert "the VCEK" in result.reasons[0]
    for offset in (0x90 + 1, 0x50, 0x2A0 + 3):  # MEASUREMENT, REPORT_DATA, the signature's R
        assert judged(flipped(report, offset)).verdict is Verdict.NOT_TRUSTED, offset


@pytest.mark.parametrize(
    "when",
    [
        dt.datetime(2025, 6, 1, tzinfo=dt.UTC),  # inside the VLEK's window
        dt.datetime(2024, 12, 1, tzinfo=dt.UTC),  # before it was issued
        dt.datetime(2026, 11, 1, tzinfo=dt.UTC),  # after it expired
    ],
)
def test_the_real_vlek_tampered_is_not_trusted_at_any_time(when: dt.datetime) -> None:
    vlek = DATA / "cloud-cvm" / "snp-vlek"
    report, cert = (vlek / "report.bin").read_bytes(), (vlek / "vlek.der").read_bytes()
    result = verify_cvm_evidence(
        flipped(report, 0x90), cert, now=when, policy=CvmPolicy(),
        expected_report_data=report[0x50:0x90], snp_roots=SnpRoots.amd(),
    )  # fmt: skip
    assert result.verdict is Verdict.NOT_TRUSTED, result.reasons
    assert any("signature" in r for r in result.reasons), result.reasons
