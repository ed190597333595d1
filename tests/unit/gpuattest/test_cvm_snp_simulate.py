"""SEV-SNP verification against simulated AMD-shaped chains: chosen fields and the bad-input matrix."""

from __future__ import annotations

import datetime as dt

import pytest

from gpucc.gpuattest.cvm.findings import CvmFindings
from gpucc.gpuattest.cvm.snp import SnpRoots, verify_snp_report
from gpucc.gpuattest.cvm.snp_report import SigningKey, SnpProduct, SnpTcb, parse_snp_report
from gpucc.gpuattest.cvm.snp_roots import SnpProductRoots, load_vcek, vcek_info
from gpucc.gpuattest.cvm.snp_simulate import (
    DEFAULT_MEASUREMENT,
    DEFAULT_TCB,
    SimulatedSnp,
    make_vcek,
    simulate_snp_report,
    snp_pki,
)
from gpucc.gpuattest.result import CheckStatus

NOW = dt.datetime(2026, 1, 15, 12, 0, tzinfo=dt.UTC)
SEED = b"gpucc tests"
PASS, FAIL, NOT_CHECKED = CheckStatus.PASS, CheckStatus.FAIL, CheckStatus.NOT_CHECKED


def statuses(findings: CvmFindings) -> dict[str, CheckStatus]:
    return {c.id: c.status for c in findings.checks}


def reason(findings: CvmFindings, check_id: str) -> str:
    return next(c.reason for c in findings.checks if c.id == check_id)


@pytest.fixture(scope="module")
def chip() -> SimulatedSnp:
    return SimulatedSnp.create(seed=SEED)


def test_a_simulated_report_carries_the_chosen_fields_and_verifies() -> None:
    report, vcek, roots = simulate_snp_report(
        report_data=b"\x5a" * 64,
        measurement=b"\x11" * 48,
        host_data=b"\x22" * 32,
        policy=0x30000,
        seed=SEED,
    )
    f = verify_snp_report(report, vcek=vcek, now=NOW, roots=roots)
    assert f.evidence_ok, f.checks
    c = f.claims
    assert (c["report_data"], c["measurement"]) == ("5a" * 64, "11" * 48)
    assert (c["host_data"], c["policy"], c["debug"]) == ("22" * 32, "0000000000030000", False)
    assert (c["report_version"], c["product"], c["tcb_status"]) == (3, "Milan", "UpToDate")
    assert c["cpuid"] == {"family": 0x19, "model": 0x01, "stepping": 0x01}
    assert c["reported_tcb"] == c["vcek_tcb"] == DEFAULT_TCB.to_dict()
    assert f.report_data == b"\x5a" * 64


def test_simulated_reports_do_not_verify_under_amds_roots(chip: SimulatedSnp) -> None:
    f = verify_snp_report(chip.report(), vcek=chip.vcek, now=NOW)
    assert statuses(f)["snp-vcek-chain"] is FAIL
    assert "not issued by 'SEV-Milan'" in reason(f, "snp-vcek-chain")
    assert not f.evidence_ok


def test_a_seed_makes_the_report_reproducible() -> None:
    a = SimulatedSnp.create(seed=SEED).report(report_data=b"\x01" * 64)
    b = SimulatedSnp.create(seed=SEED).report(report_data=b"\x01" * 64)
    c = SimulatedSnp.create(seed=b"another seed").report(report_data=b"\x01" * 64)
    assert a == b != c
    assert parse_snp_report(a).chip_id != parse_snp_report(c).chip_id


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("product", list(SnpProduct))
def test_every_product_line_and_version_verifies(product: SnpProduct, version: int) -> None:
    chip = SimulatedSnp.create(product=product, seed=SEED)
    f = verify_snp_report(chip.report(version=version), vcek=chip.vcek, now=NOW, roots=chip.roots)
    assert f.evidence_ok, f.checks
    assert f.claims["product"] == product.value
    assert f.claims["reported_tcb"] == chip.tcb.to_dict()
    if product is SnpProduct.TURIN:
        assert "fmc" in f.claims["reported_tcb"]


def test_the_debug_policy_bit_is_a_claim_for_the_policy_to_refuse(chip: SimulatedSnp) -> None:
    f = verify_snp_report(
        chip.report(policy=0x30000 | 1 << 19), vcek=chip.vcek, now=NOW, roots=chip.roots
    )
    assert f.evidence_ok  # the evidence is genuine ...
    assert f.claims["debug"] is True  # ... and says the guest is debuggable
    assert f.claims["policy"] == "00000000000b0000"


def test_a_vcek_of_another_chip_fails_signature_and_chip_id(chip: SimulatedSnp) -> None:
    other = SimulatedSnp.create(seed=b"another chip")
    f = verify_snp_report(chip.report(), vcek=other.vcek, now=NOW, roots=chip.roots)
    s = statuses(f)
    assert s["snp-vcek-chain"] is PASS
    assert s["snp-report-signature"] is s["snp-chip-id"] is FAIL


def test_a_vcek_from_another_chain_with_the_same_names_fails_the_chain(chip: SimulatedSnp) -> None:
    # Same seed, so same VCEK key and chip, but issued by an impostor ASK named like the real one.
    impostor = SimulatedSnp.create(seed=SEED, pki=snp_pki(SnpProduct.MILAN, instance=1))
    f = verify_snp_report(chip.report(), vcek=impostor.vcek, now=NOW, roots=chip.roots)
    s = statuses(f)
    assert s["snp-vcek-chain"] is FAIL
    assert "does not verify with the key of 'SEV-Milan'" in reason(f, "snp-vcek-chain")
    assert s["snp-report-signature"] is PASS  # the key is right; its certificate is not
    assert not f.evidence_ok


def test_a_chain_to_another_root_fails(chip: SimulatedSnp) -> None:
    stranger = snp_pki(SnpProduct.MILAN, label="another vendor")
    f = verify_snp_report(chip.report(), vcek=chip.vcek, now=NOW, roots=stranger.roots)
    assert statuses(f)["snp-vcek-chain"] is FAIL
    # An ASK that is not signed by the ARK it is paired with.
    mixed = SnpRoots((SnpProductRoots(SnpProduct.MILAN, stranger.ark, chip.pki.ask),))
    f = verify_snp_report(chip.report(), vcek=chip.vcek, now=NOW, roots=mixed)
    assert "'SEV-Milan' is not issued by 'ARK-Milan'" in reason(f, "snp-vcek-chain")


@pytest.mark.parametrize(
    ("not_before", "not_after", "word"),
    [
        (dt.datetime(2020, 1, 1, tzinfo=dt.UTC), dt.datetime(2025, 1, 1, tzinfo=dt.UTC), "expired"),
        (
            dt.datetime(2027, 1, 1, tzinfo=dt.UTC),
            dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
            "not valid yet",
        ),
    ],
)
def test_a_vcek_outside_its_validity_is_collateral_not_tampering(
    not_before: dt.datetime, not_after: dt.datetime, word: str
) -> None:
    chip = SimulatedSnp.create(seed=SEED, not_before=not_before, not_after=not_after)
    f = verify_snp_report(chip.report(), vcek=chip.vcek, now=NOW, roots=chip.roots)
    validity = next(c for c in f.checks if c.id == "snp-vcek-validity")
    assert validity.status is NOT_CHECKED and validity.collateral_missing
    assert word in validity.reason
    s = statuses(f)
    assert s["snp-vcek-chain"] is s["snp-report-signature"] is s["snp-tcb"] is PASS
    assert not f.evidence_ok


def test_a_vcek_issued_for_another_tcb_is_not_trusted() -> None:
    newer = SnpTcb(bootloader=9, tee=0, snp=24, microcode=72)
    chip = SimulatedSnp.create(seed=SEED, vcek_tcb=newer)
    f = verify_snp_report(chip.report(), vcek=chip.vcek, now=NOW, roots=chip.roots)
    assert statuses(f)["snp-tcb"] is FAIL
    assert "snp 23 (VCEK 24)" in reason(f, "snp-tcb")
    assert f.claims["tcb_status"] == "OutOfDate"
    assert f.claims["vcek_tcb"] == newer.to_dict()
    assert not f.evidence_ok


def test_a_reported_tcb_below_the_chips_is_flagged(chip: SimulatedSnp) -> None:
    older = SnpTcb(bootloader=9, tee=0, snp=22, microcode=72)
    f = verify_snp_report(
        chip.report(reported_tcb=older), vcek=chip.vcek, now=NOW, roots=chip.roots
    )
    assert statuses(f)["snp-tcb"] is FAIL
    assert f.claims["reported_tcb"]["snp"] == 22 and f.claims["current_tcb"]["snp"] == 23


def test_a_vcek_for_another_hwid_is_not_trusted() -> None:
    chip = SimulatedSnp.create(seed=SEED, vcek_hwid=b"\x42" * 64)
    f = verify_snp_report(chip.report(), vcek=chip.vcek, now=NOW, roots=chip.roots)
    s = statuses(f)
    assert s["snp-chip-id"] is FAIL and s["snp-report-signature"] is PASS
    assert "4242424242424242" in reason(f, "snp-chip-id")


def test_a_turin_vcek_names_the_first_eight_bytes_of_the_chip_id() -> None:
    chip = SimulatedSnp.create(product=SnpProduct.TURIN, seed=SEED)
    info = vcek_info(load_vcek(chip.vcek))
    assert info.hwid == chip.chip_id[:8] and any(chip.chip_id[:8]) and not any(chip.chip_id[8:])
    assert info.fmc == chip.tcb.fmc


def test_cpuid_and_vcek_of_different_product_lines_are_refused() -> None:
    chip = SimulatedSnp.create(product=SnpProduct.GENOA, seed=SEED)
    f = verify_snp_report(
        chip.report(cpuid=(0x19, 0x01, 0x01)), vcek=chip.vcek, now=NOW, roots=chip.roots
    )
    assert "comes from a Milan CPU but the VCEK is for Genoa" in reason(f, "snp-vcek-chain")
    f = verify_snp_report(
        chip.report(cpuid=(0x17, 0x31, 0x00)), vcek=chip.vcek, now=NOW, roots=chip.roots
    )
    assert "not an AMD SEV-SNP product line" in reason(f, "snp-vcek-chain")


def test_a_vcek_whose_product_name_disagrees_with_its_issuer_is_refused(chip: SimulatedSnp) -> None:
    vcek = make_vcek(
        chip.pki, chip.vcek_key, hwid=chip.chip_id, tcb=chip.tcb, product_name="Genoa-B0"
    )
    f = verify_snp_report(chip.report(), vcek=vcek, now=NOW, roots=chip.roots)
    assert "productName 'Genoa-B0' is not Milan" in reason(f, "snp-vcek-chain")


@pytest.mark.parametrize(
    ("key", "word", "status"),
    [(SigningKey.VLEK, "names a VLEK", FAIL), (SigningKey.NONE, "no key", NOT_CHECKED)],
)
def test_reports_not_signed_by_a_vcek_are_not_passed(
    chip: SimulatedSnp, key: SigningKey, word: str, status: CheckStatus
) -> None:
    """A report naming a VLEK given a VCEK is refused (a VLEK is verified through the ASVK)."""
    f = verify_snp_report(chip.report(signing_key=key), vcek=chip.vcek, now=NOW, roots=chip.roots)
    assert statuses(f)["snp-report-signature"] is status
    assert word in reason(f, "snp-report-signature")
    assert not f.evidence_ok


def test_field_sizes_are_checked_by_the_simulator(chip: SimulatedSnp) -> None:
    with pytest.raises(ValueError, match="report_data must be 64 bytes"):
        chip.report(report_data=b"short")
    assert DEFAULT_MEASUREMENT.hex() == parse_snp_report(chip.report()).measurement.hex()
