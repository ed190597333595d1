"""The ``cvm:`` policy applied to CVM findings: statuses, advisories, debug, pins, report data."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from gpucc.core.errors import (
    MalformedEvidenceError,
    MalformedPolicyError,
)
from gpucc.gpuattest.cvm.appraise import appraise, detect_kind, verify_cvm_evidence
from gpucc.gpuattest.cvm.findings import CvmFindings, CvmKind
from gpucc.gpuattest.cvm.policy import CvmPolicy, parse_cvm_policy
from gpucc.gpuattest.policy import parse_policy
from gpucc.gpuattest.result import Check, CheckStatus, Decision, Verdict
from tests.support.paths import DATA

RD = bytes(range(64))
MRTD = "ab" * 48


def findings(
    *, status: str | None = "UpToDate", advisories: tuple[str, ...] = (), debug: bool = False,
    checks: tuple[Check, ...] = (Check("cvm-quote", "Quote", CheckStatus.PASS),),
) -> CvmFindings:  # fmt: skip
    claims: dict[str, Any] = {
        "kind": "tdx",
        "report_data": RD.hex(),
        "debug": debug,
        "tcb_status": status,
        "advisory_ids": list(advisories),
        "mrtd": MRTD,
        "rtmr0": "00" * 48,
    }
    return CvmFindings(CvmKind.TDX, checks, claims, RD, b"\x01" * 32)


def decisions(policy: CvmPolicy, f: CvmFindings, expected: bytes | None = RD) -> dict[str, str]:
    result = appraise(f, policy, expected_report_data=expected)
    return {c.id: str(c.decision) for c in result.checks} | {"verdict": str(result.verdict)}


def test_default_policy_trusts_up_to_date_with_measurements_not_pinned() -> None:
    result = appraise(findings(), CvmPolicy(), expected_report_data=RD)
    assert result.verdict is Verdict.TRUSTED
    pins = next(c for c in result.checks if c.id == "cvm-measurements")
    assert pins.status is CheckStatus.NOT_CHECKED and pins.decision is Decision.ACCEPT
    assert pins.note.startswith("not pinned")
    assert result.to_dict()["kind"] == "tdx"


@pytest.mark.parametrize("status", ["SWHardeningNeeded", "OutOfDate", "Revoked", None])
def test_statuses_other_than_up_to_date_are_refused_by_default(status: str | None) -> None:
    assert decisions(CvmPolicy(), findings(status=status))["cvm-tcb"] == "refuse"


def test_a_named_relaxation_accepts_a_status_with_listed_advisories_only() -> None:
    policy = parse_cvm_policy(
        {
            "accept_tcb_status": ["UpToDate", "SWHardeningNeeded"],
            "accept_advisories": ["intel-sa-00615"],
        }
    )
    f = findings(status="SWHardeningNeeded", advisories=("INTEL-SA-00615",))
    result = appraise(f, policy, expected_report_data=RD)
    assert result.verdict is Verdict.TRUSTED
    tcb = next(c for c in result.checks if c.id == "cvm-tcb")
    assert "accepted by policy" in tcb.note and "INTEL-SA-00615" in tcb.note
    more = findings(status="SWHardeningNeeded", advisories=("INTEL-SA-00615", "INTEL-SA-00999"))
    assert decisions(policy, more)["cvm-tcb"] == "refuse"


def test_debug_is_refused_unless_allowed() -> None:
    assert decisions(CvmPolicy(), findings(debug=True))["cvm-debug"] == "refuse"
    allowed = appraise(findings(debug=True), CvmPolicy(allow_debug=True), expected_report_data=RD)
    debug = next(c for c in allowed.checks if c.id == "cvm-debug")
    assert debug.decision is Decision.ACCEPT and "cvm.allow_debug" in debug.note


def test_pinned_measurements_must_match() -> None:
    good = parse_cvm_policy({"measurements": {"tdx": {"mrtd": MRTD.upper()}}})
    assert decisions(good, findings())["cvm-measurements"] == "accept"
    bad = parse_cvm_policy({"measurements": {"tdx": {"rtmr0": "11" * 48}}})
    assert decisions(bad, findings())["verdict"] == "not-trusted"
    snp_only = parse_cvm_policy({"measurements": {"snp": {"host_data": "22" * 32}}})
    assert decisions(snp_only, findings())["cvm-measurements"] == "accept"  # TDX not pinned


def test_report_data_must_match_and_is_required_by_default() -> None:
    assert decisions(CvmPolicy(), findings(), expected=bytes(64))["cvm-report-data"] == "refuse"
    assert decisions(CvmPolicy(), findings(), expected=None)["cvm-report-data"] == "refuse"
    relaxed = CvmPolicy(require_report_data=False)
    assert decisions(relaxed, findings(), expected=None)["verdict"] == "trusted"
    with pytest.raises(MalformedEvidenceError):
        appraise(findings(), CvmPolicy(), expected_report_data=b"short")


def test_evidence_checks_decide_collateral_missing_as_undecided() -> None:
    stale = Check("cvm-collateral", "Collateral", CheckStatus.NOT_CHECKED, "expired", True)
    f = findings(checks=(stale, Check("cvm-quote", "Quote", CheckStatus.PASS)))
    assert decisions(CvmPolicy(), f)["verdict"] == "undecided"
    # No TCB status because the collateral could not be used: still undecided, not refused.
    assert decisions(CvmPolicy(), findings(status=None, checks=(stale,)))["verdict"] == "undecided"
    bad = Check("cvm-quote", "Quote", CheckStatus.FAIL, "signature")
    assert decisions(CvmPolicy(), findings(checks=(stale, bad)))["verdict"] == "not-trusted"


def test_the_policy_file_carries_the_cvm_section() -> None:
    policy = parse_policy({"cvm": {"allow_debug": True}})
    assert policy.cvm.allow_debug and policy.to_dict()["cvm"]["allow_debug"] is True
    assert parse_policy({}).cvm == CvmPolicy()
    bad: dict[str, Any]
    for bad in (
        {"cvm": []},
        {"cvm": {"accept_tcb_status": "UpToDate"}},
        {"cvm": {"accept_tcb_status": ["Revoked"]}},
        {"cvm": {"measurements": {"tdx": {"mrtd": "zz" * 48}}}},
        {"cvm": {"measurements": {"tdx": {"measurement": "00" * 48}}}},
        {"cvm": {"measurements": {"tdx": []}}},
        {"cvm": {"require_report_data": 1}},
    ):
        with pytest.raises(MalformedPolicyError):
            parse_policy(bad)


def test_kind_detection_and_missing_collateral() -> None:
    quote = (DATA / "cpu-tee" / "tdx" / "quote.bin").read_bytes()
    assert detect_kind(quote) is CvmKind.TDX
    with pytest.raises(MalformedEvidenceError, match="neither"):
        detect_kind(b"[not evidence]")
    with pytest.raises(MalformedEvidenceError, match="vTPM evidence"):  # JSON: a vTPM document
        detect_kind(b"{}")
    now = dt.datetime(2025, 6, 19, 11, 16, 3, tzinfo=dt.UTC)
    # Without collateral it is judged as far as it can be (no expected report data: refused).
    result = verify_cvm_evidence(
        quote, None, now=now, policy=CvmPolicy(), expected_report_data=None
    )
    assert result.verdict is Verdict.NOT_TRUSTED
    assert result.reasons[0] == "Report data: no expected report data was given"
    with pytest.raises(MalformedEvidenceError, match="larger"):
        verify_cvm_evidence(
            quote * 20, None, now=now, policy=CvmPolicy(), expected_report_data=None
        )


def test_the_attest_binding_of_cvm_and_gpu_evidence() -> None:
    import hashlib

    from gpucc.gpuattest.cvm.appraise import attest_report_data

    nonce = bytes(range(32))
    expected = hashlib.sha512(b"gpucc/attest/v1/cvm-report-data" + nonce).digest()
    assert attest_report_data(nonce) == expected
    assert expected.hex() == (
        "fea97bde63aacab78ae3573323e3d6a3702769de9ed7df30948abc930142857c"
        "ab9a6b0b3ab6b4362444a3b2d8f7cafbc3f0fa3a03618230014cd926a9692586"
    )
    with pytest.raises(ValueError, match="32 bytes"):
        attest_report_data(b"short")
