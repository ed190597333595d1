"""SEV-SNP verification of AMD's real Milan report: the claims, the chain, and bad input."""

from __future__ import annotations

import datetime as dt
import hashlib
import struct

import pytest
from cryptography import x509
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucc.cli.exitcodes import exit_code_for
from gpucc.core.errors import MalformedCertificateError
from gpucc.gpuattest.cvm.findings import CvmFindings, CvmKind
from gpucc.gpuattest.cvm.snp import SnpRoots, looks_like_snp_report, verify_snp_report
from gpucc.gpuattest.cvm.snp_report import (
    MalformedSnpReportError,
    SnpProduct,
    parse_snp_report,
    product_from_cpuid,
)
from gpucc.gpuattest.cvm.snp_roots import AMD_ROOT_SHA256, load_vcek, vcek_info
from gpucc.gpuattest.result import CheckStatus
from tests.support.paths import DATA

SNP = DATA / "cpu-tee" / "snp"
REPORT = (SNP / "report.bin").read_bytes()
VCEK = (SNP / "vcek.der").read_bytes()
# Inside the VCEK's validity (2023-04-03 to 2030-04-03).
WHEN = dt.datetime(2025, 6, 19, 12, 0, tzinfo=dt.UTC)
CHIP_ID = (
    "d49554ec717f4e5b0fe6b143bcf0405bd7ae304727edf46603f2a76aef6a3abc"
    "15d7af38db757039029f0efacfd08e244324884738c72b082e2f87a44d541eb6"
)
TCB = {"bootloader": 3, "tee": 0, "snp": 8, "microcode": 115}
CHECK_IDS = [
    "snp-report",
    "snp-vcek-chain",
    "snp-vcek-validity",
    "snp-report-signature",
    "snp-chip-id",
    "snp-tcb",
]


def statuses(findings: CvmFindings) -> dict[str, CheckStatus]:
    return {c.id: c.status for c in findings.checks}


def test_the_real_milan_report_verifies_with_its_vcek_and_amds_pinned_roots() -> None:
    f = verify_snp_report(REPORT, vcek=VCEK, now=WHEN)
    assert [c.id for c in f.checks] == CHECK_IDS
    assert all(c.status is CheckStatus.PASS for c in f.checks), f.checks
    assert f.evidence_ok
    assert f.kind is CvmKind.SNP
    assert f.evidence_sha256 == hashlib.sha256(REPORT).digest()
    assert f.report_data == REPORT[0x50:0x90]
    c = f.claims
    assert c["kind"] == "snp"
    assert c["report_version"] == 2
    assert c["report_data"].startswith("d447b55d") and len(c["report_data"]) == 128
    assert c["measurement"].startswith("7a1e5c26") and len(c["measurement"]) == 96
    assert c["host_data"] == "00" * 32
    assert c["policy"] == "0000000000030000"
    assert c["debug"] is False
    assert c["vmpl"] == 0
    assert c["product"] == "Milan"
    assert c["chip_id"] == CHIP_ID
    assert c["tcb_status"] == "UpToDate"
    assert c["advisory_ids"] == []
    assert c["reported_tcb"] == c["committed_tcb"] == c["vcek_tcb"] == TCB
    assert c["signing_key"] == "vcek"
    assert c["firmware"] == "1.52.4"
    assert "cpuid" not in c  # a version 2 report does not carry it


def test_the_parser_reads_every_field_at_its_offset() -> None:
    r = parse_snp_report(REPORT)
    assert (r.version, r.guest_svn, r.policy, r.vmpl, r.signature_algo) == (2, 0, 0x30000, 0, 1)
    assert r.platform_info == 1
    assert (r.author_key_en, r.mask_chip_key, r.signing_key) == (False, False, 0)
    assert r.report_id.hex().startswith("92b3b47d")
    assert r.report_id_ma == b"\xff" * 32
    assert r.chip_id.hex() == CHIP_ID
    assert r.reported_tcb_raw == 0x7308000000000003
    assert r.current_version == r.committed_version == (1, 52, 4)
    assert r.cpuid_family is None and r.cpuid_product is None
    assert r.signature_r.to_bytes(48, "little").hex().startswith("61ab4f11")
    assert len(r.signed_bytes) == 0x2A0


def test_amds_pinned_roots_load_and_match_the_published_certificates() -> None:
    roots = SnpRoots.amd()
    assert [line.product for line in roots.lines] == list(SnpProduct)
    for line in roots.lines:
        name = line.product.value.lower()
        ark = x509.load_pem_x509_certificate((SNP / "roots" / f"{name}-ark.pem").read_bytes())
        ask = x509.load_pem_x509_certificate((SNP / "roots" / f"{name}-ask.pem").read_bytes())
        assert (line.ark, line.ask) == (ark, ask)
        assert AMD_ROOT_SHA256[line.product][0] != AMD_ROOT_SHA256[line.product][1]


def test_the_vcek_extensions_read_as_amd_writes_them() -> None:
    info = vcek_info(load_vcek(VCEK))
    assert info.product_name == "Milan-B0"
    tcb = info.tcb()
    assert tcb is not None and tcb.to_dict() == TCB
    assert info.hwid is not None and info.hwid.hex() == CHIP_ID
    assert info.fmc is None and info.problems == ()


def test_a_pem_vcek_is_accepted_like_der() -> None:
    from cryptography.hazmat.primitives import serialization

    pem = load_vcek(VCEK).public_bytes(serialization.Encoding.PEM)
    assert verify_snp_report(REPORT, vcek=pem, now=WHEN).evidence_ok


def test_without_a_vcek_nothing_passes_and_collateral_is_named_missing() -> None:
    f = verify_snp_report(REPORT, vcek=None, now=WHEN)
    assert not f.evidence_ok
    assert f.checks[0].status is CheckStatus.PASS
    for check in f.checks[1:]:
        assert check.status is CheckStatus.NOT_CHECKED
        assert check.collateral_missing and "no VCEK" in check.reason
    assert f.claims["tcb_status"] is None and f.claims["vcek_tcb"] is None
    assert f.claims["measurement"].startswith("7a1e5c26")


@pytest.mark.parametrize(
    ("when", "word"),
    [
        (dt.datetime(2031, 1, 1, tzinfo=dt.UTC), "expired"),
        (dt.datetime(2022, 1, 1, tzinfo=dt.UTC), "not valid yet"),
    ],
)
def test_a_vcek_outside_its_validity_is_a_collateral_problem_not_tampering(
    when: dt.datetime, word: str
) -> None:
    f = verify_snp_report(REPORT, vcek=VCEK, now=when)
    check = f.checks[2]
    assert check.id == "snp-vcek-validity"
    assert check.status is CheckStatus.NOT_CHECKED and check.collateral_missing
    assert word in check.reason and "VCEK" in check.reason
    s = statuses(f)
    # The signatures themselves are still good: nothing was tampered with.
    assert s["snp-vcek-chain"] is s["snp-report-signature"] is CheckStatus.PASS
    assert not f.evidence_ok


def _flip(data: bytes, offset: int, bit: int = 0) -> bytes:
    out = bytearray(data)
    out[offset] ^= 1 << bit
    return bytes(out)


@pytest.mark.parametrize(
    "offset",
    [0x50, 0x90, 0xC0, 0x08, 0x2A0, 0x2A0 + 72],
    ids=["report-data", "measurement", "host-data", "policy", "signature-r", "signature-s"],
)
def test_a_flipped_bit_in_the_body_or_signature_fails_the_signature(offset: int) -> None:
    f = verify_snp_report(_flip(REPORT, offset), vcek=VCEK, now=WHEN)
    s = statuses(f)
    assert s["snp-report-signature"] is CheckStatus.FAIL
    assert s["snp-vcek-chain"] is CheckStatus.PASS
    assert not f.evidence_ok


def test_a_flipped_bit_in_the_chip_id_fails_the_signature_and_the_chip_id() -> None:
    f = verify_snp_report(_flip(REPORT, 0x1A0), vcek=VCEK, now=WHEN)
    s = statuses(f)
    assert s["snp-report-signature"] is s["snp-chip-id"] is CheckStatus.FAIL


def test_a_changed_reported_tcb_fails_the_tcb_check_and_says_out_of_date() -> None:
    f = verify_snp_report(_flip(REPORT, 0x187, 0), vcek=VCEK, now=WHEN)
    tcb = f.checks[-1]
    assert tcb.status is CheckStatus.FAIL and "microcode 114 (VCEK 115)" in tcb.reason
    assert f.claims["tcb_status"] == "OutOfDate"


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (REPORT[:-1], "1184 bytes, this has 1183"),
        (REPORT + b"\x00", "this has 1185"),
        (b"", "this has 0"),
        (struct.pack("<I", 1) + REPORT[4:], "version 1 is not supported"),
        (struct.pack("<I", 5) + REPORT[4:], "version 5 is not supported"),
        (REPORT[:0x34] + struct.pack("<I", 2) + REPORT[0x38:], "signature algorithm 2"),
        (_flip(REPORT, 0x190), "reserved bytes at 0x188"),
        (_flip(REPORT, 0x200), "reserved bytes at 0x1F8"),
        (_flip(REPORT, 0x2A0 + 60), "exceeds 384 bits"),
        (_flip(REPORT, 0x2A0 + 144 + 7), "in the signature"),
    ],
    ids=[
        "truncated",
        "oversized",
        "empty",
        "version-1",
        "version-5",
        "signature-algo",
        "reserved-cpuid",
        "reserved-tail",
        "r-high-bytes",
        "signature-reserved",
    ],
)
def test_malformed_reports_are_refused_with_one_line(data: bytes, words: str) -> None:
    with pytest.raises(MalformedSnpReportError) as info:
        verify_snp_report(data, vcek=VCEK, now=WHEN)
    assert exit_code_for(info.value) == 4  # a MalformedInputError
    assert words in str(info.value) and "\n" not in info.value.diagnostics()


@pytest.mark.parametrize("vcek", [b"", b"not a certificate", b"\x30" * 20000])
def test_a_vcek_that_is_not_a_certificate_is_malformed_input(vcek: bytes) -> None:
    with pytest.raises(MalformedCertificateError):
        verify_snp_report(REPORT, vcek=vcek, now=WHEN)


def test_an_amd_root_of_another_product_line_does_not_anchor_a_milan_vcek() -> None:
    amd = SnpRoots.amd()
    genoa = amd.get(SnpProduct.GENOA)
    assert genoa is not None
    from gpucc.gpuattest.cvm.snp_roots import SnpProductRoots

    swapped = SnpRoots((SnpProductRoots(SnpProduct.MILAN, genoa.ark, genoa.ask),))
    f = verify_snp_report(REPORT, vcek=VCEK, now=WHEN, roots=swapped)
    chain = f.checks[1]
    assert chain.status is CheckStatus.FAIL and "not issued by 'SEV-Genoa'" in chain.reason
    no_milan = SnpRoots(tuple(line for line in amd.lines if line.product is not SnpProduct.MILAN))
    chain = verify_snp_report(REPORT, vcek=VCEK, now=WHEN, roots=no_milan).checks[1]
    assert chain.status is CheckStatus.FAIL and "no Milan root" in chain.reason


def test_detection_tells_snp_reports_from_other_evidence() -> None:
    assert looks_like_snp_report(REPORT)
    assert looks_like_snp_report(REPORT[:-100])  # truncated: the parser names the problem
    tdx_header = struct.pack("<HHI", 4, 2, 0x81) + bytes(1200)
    assert not looks_like_snp_report(tdx_header)
    assert not looks_like_snp_report(b"")
    assert not looks_like_snp_report(b'{"evidence": []}' + bytes(1184))


@pytest.mark.parametrize(
    ("family", "model", "product"),
    [
        (0x19, 0x01, SnpProduct.MILAN),
        (0x19, 0x11, SnpProduct.GENOA),
        (0x19, 0xA0, SnpProduct.GENOA),
        (0x1A, 0x02, SnpProduct.TURIN),
        (0x1A, 0x11, SnpProduct.TURIN),
        (0x17, 0x31, None),
        (0x19, 0x21, None),
    ],
)
def test_cpuid_names_the_product_line(family: int, model: int, product: SnpProduct | None) -> None:
    assert product_from_cpuid(family, model) is product


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone"):
        verify_snp_report(REPORT, vcek=VCEK, now=dt.datetime(2025, 1, 1))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, len(REPORT) - 1), st.integers(1, 255)),
        min_size=1,
        max_size=4,
        unique_by=lambda edit: edit[0],
    )
)
def test_any_corruption_is_a_failed_check_or_malformed_never_a_pass_or_a_crash(
    edits: list[tuple[int, int]],
) -> None:
    data = bytearray(REPORT)
    for offset, mask in edits:
        data[offset] ^= mask
    try:
        f = verify_snp_report(bytes(data), vcek=VCEK, now=WHEN)
    except MalformedSnpReportError:
        return
    assert not f.evidence_ok


def test_roots_given_as_pem_work_like_the_packaged_ones() -> None:
    pems = {
        p: (
            (SNP / "roots" / f"{p.value.lower()}-ark.pem").read_bytes(),
            (SNP / "roots" / f"{p.value.lower()}-ask.pem").read_bytes(),
        )
        for p in SnpProduct
    }
    roots = SnpRoots.from_pem(pems)
    assert verify_snp_report(REPORT, vcek=VCEK, now=WHEN, roots=roots).evidence_ok
    ark, ask = pems[SnpProduct.MILAN]
    with pytest.raises(MalformedCertificateError, match="one certificate, not 2"):
        SnpRoots.from_pem({SnpProduct.MILAN: (ark + ask, ask)})
    with pytest.raises(MalformedCertificateError):
        SnpRoots.from_pem({SnpProduct.MILAN: (b"-----BEGIN CERTIFICATE-----\nAA\n", ask)})


def test_a_packaged_root_that_does_not_match_its_pin_is_a_damaged_installation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpucc.gpuattest.cvm import snp_roots
    from gpucc.gpuattest.trust import TrustRootError

    pins = dict(snp_roots.AMD_ROOT_SHA256)
    pins[SnpProduct.GENOA] = (pins[SnpProduct.GENOA][0], "00" * 32)
    monkeypatch.setattr(snp_roots, "AMD_ROOT_SHA256", pins)
    snp_roots._amd_roots.cache_clear()
    try:
        with pytest.raises(TrustRootError, match="genoa-ask.pem does not match"):
            verify_snp_report(REPORT, vcek=VCEK, now=WHEN)
    finally:
        monkeypatch.undo()
        snp_roots._amd_roots.cache_clear()
    assert verify_snp_report(REPORT, vcek=VCEK, now=WHEN).evidence_ok
