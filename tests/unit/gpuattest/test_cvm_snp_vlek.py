"""SEV-SNP reports signed with a VLEK (AWS's real sample): chained through AMD's pinned ASVK of
their product line, never through the ASK, and judged in the VLEK's validity window."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from cryptography import x509

from gpucc.gpuattest.cvm.appraise import CvmResult, verify_cvm_evidence
from gpucc.gpuattest.cvm.policy import CvmPolicy
from gpucc.gpuattest.cvm.snp import VCEK_CHAIN, VLEK_CHAIN
from gpucc.gpuattest.cvm.snp_certs import VCEK_GUID, VLEK_GUID, endorsement_from_auxblob
from gpucc.gpuattest.cvm.snp_report import SnpProduct
from gpucc.gpuattest.cvm.snp_roots import SnpRoots, load_vcek
from gpucc.gpuattest.result import Verdict
from gpucc.gpuattest.trust import cert_sha256
from gpucc.gpuattest.x509chain import ChainFault, ChainStatus, validate_chain
from tests.support.paths import DATA

VLEK_DIR = DATA / "cloud-cvm" / "snp-vlek"
REPORT = (VLEK_DIR / "report.bin").read_bytes()
VLEK = (VLEK_DIR / "vlek.der").read_bytes()
VCEK = (DATA / "cpu-tee" / "snp" / "vcek.der").read_bytes()
ROOTS = VLEK_DIR / "roots"
TRUSTED_AT = dt.datetime(2025, 6, 1, tzinfo=dt.UTC)


def verify(
    report: bytes = REPORT,
    cert: bytes | None = VLEK,
    now: dt.datetime = TRUSTED_AT,
    roots: SnpRoots | None = None,
) -> CvmResult:
    return verify_cvm_evidence(
        report,
        cert,
        now=now,
        policy=CvmPolicy(),
        expected_report_data=report[0x50:0x90],
        snp_roots=roots,
    )


def refused(result: CvmResult) -> list[str]:
    return [c.id for c in result.checks if c.decision.value == "refuse"]


def test_the_vlek_sample_is_trusted_on_2025_06_01_and_names_the_cloud() -> None:
    result = verify()
    assert result.verdict is Verdict.TRUSTED, result.reasons
    chain = next(c for c in result.checks if c.id == "snp-vcek-chain")
    assert chain.reason == "Milan: VLEK -> ASVK -> ARK"
    assert result.claims["signing_key"] == "vlek" and result.claims["vmpl"] == 1
    assert result.claims["csp_id"] == "CN=cc-us-east-2.amazonaws.com"


@pytest.mark.parametrize(
    "when",
    [
        dt.datetime(2025, 12, 10, 22, 14, 22, tzinfo=dt.UTC),
        dt.datetime(2026, 11, 1, tzinfo=dt.UTC),
        dt.datetime(2024, 12, 10, 22, 14, 20, tzinfo=dt.UTC),
    ],
)
def test_never_trusted_outside_the_vleks_validity(when: dt.datetime) -> None:
    result = verify(now=when)
    assert result.verdict is Verdict.UNDECIDED
    assert "the VLEK" in result.reasons[0]


def test_the_pinned_asvks_are_amds() -> None:
    for product in SnpProduct:
        line = SnpRoots.amd().get(product)
        assert line is not None and line.asvk is not None
        shipped = x509.load_pem_x509_certificate(
            (ROOTS / f"{product.lower()}-asvk.pem").read_bytes()
        )
        assert cert_sha256(line.asvk) == cert_sha256(shipped)
        assert line.asvk.subject.rfc4514_string().startswith(f"CN=SEV-VLEK-{product}")


def test_a_vlek_checked_against_the_ask_fails() -> None:
    milan = SnpRoots.amd().get(SnpProduct.MILAN)
    assert milan is not None and milan.asvk is not None
    vlek = load_vcek(VLEK)
    wrong = validate_chain((vlek, milan.ask, milan.ark), milan.ark, TRUSTED_AT, VCEK_CHAIN)
    assert wrong.status is ChainStatus.INVALID and wrong.fault is ChainFault.WRONG_ISSUER
    right = validate_chain((vlek, milan.asvk, milan.ark), milan.ark, TRUSTED_AT, VLEK_CHAIN)
    assert right.ok
    # Roots whose "ASVK" is the ASK: the report is refused, not trusted.
    ark, ask = (DATA / "cpu-tee" / "snp" / "roots" / n for n in ("milan-ark.pem", "milan-ask.pem"))
    swapped = SnpRoots.from_pem({SnpProduct.MILAN: (ark.read_bytes(), ask.read_bytes(),
                                                    ask.read_bytes())})  # fmt: skip
    result = verify(roots=swapped)
    assert result.verdict is Verdict.NOT_TRUSTED and refused(result) == ["snp-vcek-chain"]


def test_a_vcek_for_a_vlek_signed_report_is_refused() -> None:
    result = verify(cert=VCEK, now=dt.datetime(2025, 6, 1, tzinfo=dt.UTC))
    assert result.verdict is Verdict.NOT_TRUSTED
    assert "signed with a VLEK, but the certificate given is a VCEK" in result.reasons[0]


def test_a_vlek_for_a_vcek_signed_report_is_refused() -> None:
    report = (DATA / "cpu-tee" / "snp" / "report.bin").read_bytes()
    result = verify(report=report, cert=VLEK)
    assert result.verdict is Verdict.NOT_TRUSTED
    assert "signed with a VCEK, but the certificate given is a VLEK" in result.reasons[0]


def test_without_the_vlek_it_is_undecided_and_says_where_to_get_it() -> None:
    result = verify(cert=None)
    assert result.verdict is Verdict.UNDECIDED
    assert "VLEK" in result.reasons[0] and "certificate table" in result.reasons[0]


def test_a_tampered_vlek_report_is_refused() -> None:
    report = bytearray(REPORT)
    report[0x90] ^= 1
    result = verify(report=bytes(report))
    assert result.verdict is Verdict.NOT_TRUSTED and refused(result) == ["snp-report-signature"]


def _table(entries: list[tuple[uuid.UUID, bytes]]) -> bytes:
    head = 24 * (len(entries) + 1)
    table, body = b"", b""
    for guid, data in entries:
        table += (
            guid.bytes + (head + len(body)).to_bytes(4, "little") + len(data).to_bytes(4, "little")
        )
        body += data
    return table + bytes(24) + body


def test_the_hosts_certificate_table_gives_the_key_the_report_names() -> None:
    table = _table([(VCEK_GUID, VCEK), (VLEK_GUID, VLEK)])
    assert endorsement_from_auxblob(table, REPORT) == VLEK
    vcek_report = (DATA / "cpu-tee" / "snp" / "report.bin").read_bytes()
    assert endorsement_from_auxblob(table, vcek_report) == VCEK
    assert endorsement_from_auxblob(_table([(VCEK_GUID, VCEK)]), REPORT) is None
