"""The simulated TDX platform: its quotes and collateral verify through the same code as Intel's,
only against its own root, and every failure the real data cannot show (revoked PCK, other TCB
statuses, debug TDs, quote v5 and TD report 1.5, chosen report data) shows here."""

from __future__ import annotations

import datetime as dt

import pytest

from gpucc.gpuattest.cvm.appraise import appraise
from gpucc.gpuattest.cvm.policy import parse_cvm_policy
from gpucc.gpuattest.cvm.tdx import verify_tdx_quote
from gpucc.gpuattest.cvm.tdx_sim import SimulatedTdx, simulated_tdx
from gpucc.gpuattest.result import CheckStatus, Verdict

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
RD = bytes(range(64))


@pytest.fixture(scope="module")
def sim() -> SimulatedTdx:
    return simulated_tdx(NOW)


def failing(checks: tuple[object, ...]) -> dict[str, str]:
    return {c.id: c.reason for c in checks if c.status is not CheckStatus.PASS}  # type: ignore[attr-defined]


@pytest.mark.parametrize(("version", "td"), [(4, "1.0"), (5, "1.0"), (5, "1.5")])
def test_simulated_quotes_verify_against_the_simulated_root(
    sim: SimulatedTdx, version: int, td: str
) -> None:
    quote = sim.quote(RD, mrtd=b"\x33" * 48, version=version, td_report=td)
    f = verify_tdx_quote(
        quote, sim.collateral(issued=NOW - dt.timedelta(hours=1)), now=NOW, root=sim.root
    )
    assert f.evidence_ok, failing(f.checks)
    assert f.report_data == RD and f.claims["mrtd"] == "33" * 48
    assert f.claims["quote_version"] == version and f.claims["td_report_version"] == td
    assert f.claims["tcb_status"] == "UpToDate"


def test_simulated_evidence_is_never_trusted_under_intels_root(sim: SimulatedTdx) -> None:
    f = verify_tdx_quote(sim.quote(RD), sim.collateral(issued=NOW), now=NOW + dt.timedelta(hours=1))
    assert "cvm-root" in failing(f.checks)


def test_a_revoked_pck_certificate_is_refused(sim: SimulatedTdx) -> None:
    collateral = sim.collateral(issued=NOW - dt.timedelta(hours=1), revoke_pck=True)
    f = verify_tdx_quote(sim.quote(RD), collateral, now=NOW, root=sim.root)
    assert "revoked" in failing(f.checks)["cvm-quote"].lower()


def test_a_revoked_tcb_is_refused(sim: SimulatedTdx) -> None:
    collateral = sim.collateral(issued=NOW - dt.timedelta(hours=1), tcb_status="Revoked")
    f = verify_tdx_quote(sim.quote(RD), collateral, now=NOW, root=sim.root)
    assert "Revoked" in failing(f.checks)["cvm-quote"] and f.claims["tcb_status"] == "Revoked"


def test_other_statuses_and_advisories_need_a_named_relaxation(sim: SimulatedTdx) -> None:
    collateral = sim.collateral(
        issued=NOW - dt.timedelta(hours=1),
        tcb_status="SWHardeningNeeded",
        advisories=("INTEL-SA-00615",),
    )
    f = verify_tdx_quote(sim.quote(RD), collateral, now=NOW, root=sim.root)
    assert f.evidence_ok and f.claims["advisory_ids"] == ["INTEL-SA-00615"]
    strict = appraise(f, parse_cvm_policy(None), expected_report_data=RD)
    assert strict.verdict is Verdict.NOT_TRUSTED
    assert any("SWHardeningNeeded is not accepted" in r for r in strict.reasons)
    relaxed = parse_cvm_policy(
        {
            "accept_tcb_status": ["UpToDate", "SWHardeningNeeded"],
            "accept_advisories": ["INTEL-SA-00615"],
        }
    )
    assert appraise(f, relaxed, expected_report_data=RD).verdict is Verdict.TRUSTED


def test_a_debug_td_is_refused(sim: SimulatedTdx) -> None:
    quote = sim.quote(RD, debug=True)
    f = verify_tdx_quote(
        quote, sim.collateral(issued=NOW - dt.timedelta(hours=1)), now=NOW, root=sim.root
    )
    assert f.claims["debug"] is True
    result = appraise(f, parse_cvm_policy(None), expected_report_data=RD)
    assert result.verdict is Verdict.NOT_TRUSTED
    assert {c.id for c in result.checks if c.status is CheckStatus.FAIL} >= {"cvm-debug"}


def test_expired_simulated_collateral_is_undecided_not_refused(sim: SimulatedTdx) -> None:
    collateral = sim.collateral(issued=NOW - dt.timedelta(days=40))
    f = verify_tdx_quote(sim.quote(RD), collateral, now=NOW, root=sim.root)
    result = appraise(f, parse_cvm_policy(None), expected_report_data=RD)
    assert result.verdict is Verdict.UNDECIDED


def test_report_data_of_another_session_is_refused(sim: SimulatedTdx) -> None:
    f = verify_tdx_quote(
        sim.quote(bytes(64)),
        sim.collateral(issued=NOW - dt.timedelta(hours=1)),
        now=NOW,
        root=sim.root,
    )
    result = appraise(f, parse_cvm_policy(None), expected_report_data=RD)
    assert result.verdict is Verdict.NOT_TRUSTED
    assert any("does not commit" in r for r in result.reasons)
