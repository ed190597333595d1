"""A decided failure outranks missing CVM collateral: Intel's real TDX quote without its
collateral and AMD's real SEV-SNP report without its VCEK are undecided when every check that
could run passed, and not trusted, naming the check, when one of them failed."""

from __future__ import annotations

import datetime as dt

from gpucc.gpuattest.cvm.appraise import CvmResult, verify_cvm_evidence
from gpucc.gpuattest.cvm.policy import CvmPolicy, parse_cvm_policy
from gpucc.gpuattest.cvm.tdx import unverified_tdx_quote
from gpucc.gpuattest.result import CheckStatus, Decision, Verdict
from tests.support.paths import DATA

QUOTE = (DATA / "cpu-tee" / "tdx" / "quote.bin").read_bytes()
TDX_AT = dt.datetime(2025, 6, 19, 11, 16, 3, tzinfo=dt.UTC)
TDX_RD = QUOTE[48 + 520 : 48 + 584]  # the v4 TD report's report data
SNP = (DATA / "cpu-tee" / "snp" / "report.bin").read_bytes()
SNP_AT = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
SNP_RD = SNP[0x50:0x90]


def test_the_tdx_quote_without_collateral_is_undecided_when_nothing_failed() -> None:
    result = verify_cvm_evidence(
        QUOTE, None, now=TDX_AT, policy=CvmPolicy(), expected_report_data=TDX_RD,
        collateral_problem="offline and not cached",
    )  # fmt: skip
    assert result.verdict is Verdict.UNDECIDED
    by_id = {c.id: c for c in result.checks}
    # Its own cryptography was checked without Intel's collateral, and passed.
    for cid in ("tdx-pck-chain", "tdx-qe-report", "tdx-quote-signature", "cvm-report-data"):
        assert by_id[cid].decision is Decision.ACCEPT, cid
    missing = by_id["cvm-collateral"]
    assert missing.decision is Decision.UNDECIDED and missing.collateral_missing
    assert missing.reason.endswith("(offline and not cached)")
    assert by_id["cvm-tcb"].decision is Decision.UNDECIDED


def test_wrong_report_data_without_collateral_is_not_trusted() -> None:
    result = verify_cvm_evidence(
        QUOTE, None, now=TDX_AT, policy=CvmPolicy(), expected_report_data=bytes(64)
    )
    assert result.verdict is Verdict.NOT_TRUSTED
    assert result.reasons[0].startswith("Report data: the evidence does not commit")


def test_a_measurement_the_policy_refuses_without_collateral_is_not_trusted() -> None:
    policy = parse_cvm_policy({"measurements": {"tdx": {"mrtd": "00" * 48}}})
    result = verify_cvm_evidence(
        QUOTE, None, now=TDX_AT, policy=policy, expected_report_data=TDX_RD
    )
    assert result.verdict is Verdict.NOT_TRUSTED
    assert result.reasons[0] == "Measurements: differs from the policy: mrtd"


def test_a_tampered_tdx_quote_without_collateral_is_not_trusted() -> None:
    tampered = bytearray(QUOTE)
    tampered[48 + 136] ^= 1  # the MRTD, under the quote signature
    findings = unverified_tdx_quote(bytes(tampered), "", now=TDX_AT)
    signature = next(c for c in findings.checks if c.id == "tdx-quote-signature")
    assert signature.status is CheckStatus.FAIL
    result = verify_cvm_evidence(
        bytes(tampered), None, now=TDX_AT, policy=CvmPolicy(), expected_report_data=TDX_RD
    )
    assert result.verdict is Verdict.NOT_TRUSTED
    assert "Quote signature (attestation key, ECDSA P-256): the quote signature does not " \
        "verify with its attestation key" in result.reasons  # fmt: skip


def test_the_snp_report_without_its_vcek_undecided_or_refused() -> None:
    def run(report: bytes, expected: bytes) -> CvmResult:
        return verify_cvm_evidence(
            report, None, now=SNP_AT, policy=CvmPolicy(), expected_report_data=expected,
            collateral_problem="offline and not cached",
        )  # fmt: skip

    undecided = run(SNP, SNP_RD)
    assert undecided.verdict is Verdict.UNDECIDED
    assert any("(offline and not cached)" in r for r in undecided.reasons)
    wrong = run(SNP, bytes(64))
    assert wrong.verdict is Verdict.NOT_TRUSTED
    assert wrong.reasons[0].startswith("Report data: ")
    debuggable = bytearray(SNP)
    debuggable[0x08 + 2] |= 0x08  # guest policy bit 19: debugging allowed
    refused = run(bytes(debuggable), SNP_RD)
    assert refused.verdict is Verdict.NOT_TRUSTED
    assert refused.reasons[0] == "Not debuggable: the guest is debuggable"
