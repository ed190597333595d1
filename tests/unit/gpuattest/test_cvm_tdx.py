"""Intel TDX quotes: the real Intel-signed sample at its time, and every way it can go wrong."""

from __future__ import annotations

import datetime as dt
import json
import struct

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpucc.core.errors import MalformedEvidenceError
from gpucc.gpuattest.cvm.findings import CvmKind
from gpucc.gpuattest.cvm.tdx import (
    INTEL_SGX_ROOT_SHA256,
    MAX_QUOTE_BYTES,
    TdxCollateral,
    intel_sgx_root,
    looks_like_tdx_quote,
    verify_tdx_quote,
)
from gpucc.gpuattest.result import CheckStatus
from gpucc.gpuattest.trust import cert_sha256
from tests.support.paths import DATA

TDX = DATA / "cpu-tee" / "tdx"
QUOTE = (TDX / "quote.bin").read_bytes()
COLLATERAL_JSON = (TDX / "collateral.json").read_bytes()
AT = dt.datetime(2025, 6, 19, 11, 16, 3, tzinfo=dt.UTC)
# Offsets in the v4 quote: header 48, body 584, signature length 4, then the signature data.
SIG = 48 + 584 + 4
QE_REPORT = SIG + 64 + 64 + 6
QE_SIGNATURE = QE_REPORT + 384
AUTH_DATA = QE_SIGNATURE + 64 + 2


def collateral(**changes: str) -> TdxCollateral:
    doc = json.loads(COLLATERAL_JSON)
    doc.update(changes)
    return TdxCollateral.from_json(json.dumps(doc).encode())


def flipped(data: bytes, offset: int) -> bytes:
    out = bytearray(data)
    out[offset] ^= 0x01
    return bytes(out)


def statuses(findings_checks: tuple[object, ...]) -> dict[str, str]:
    return {c.id: str(c.status) for c in findings_checks}  # type: ignore[attr-defined]


def test_the_intel_signed_sample_verifies_at_its_time() -> None:
    f = verify_tdx_quote(QUOTE, collateral(), now=AT)
    assert f.evidence_ok, f.checks
    assert f.kind is CvmKind.TDX
    assert [c.id for c in f.checks] == ["cvm-format", "cvm-root", "cvm-collateral", "cvm-quote"]
    assert f.claims["tcb_status"] == "UpToDate"
    assert f.claims["advisory_ids"] == []
    assert f.claims["quote_version"] == 4 and f.claims["td_report_version"] == "1.0"
    assert f.claims["mrtd"].startswith("91eb2b44d141d4ec")
    assert f.claims["rtmr0"].startswith("44c0197b39157fdd")
    assert f.claims["mrseam"].startswith("5b38e33a6487958b")
    assert f.claims["td_attributes"] == "0000001000000000"
    assert f.claims["debug"] is False
    assert f.claims["xfam"] == "e702060000000000"
    assert f.report_data.hex() == f.claims["report_data"]
    assert f.report_data.hex().startswith("9a9d48e7f6799642")
    assert f.evidence_sha256.hex().startswith("c42f9164325024bc")


def test_the_packaged_root_is_intels_pinned_root() -> None:
    root = intel_sgx_root()
    assert cert_sha256(root) == INTEL_SGX_ROOT_SHA256
    assert root.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "Intel SGX Root CA"


@pytest.mark.parametrize(
    ("when", "words"),
    [
        (AT - dt.timedelta(hours=2), "TCB info not valid until 2025-06-19T10:16:03Z"),
        (AT + dt.timedelta(days=40), "TCB info expired at 2025-07-19T10:16:03Z"),
    ],
)
def test_collateral_outside_its_window_is_a_collateral_problem_not_tampering(
    when: dt.datetime, words: str
) -> None:
    f = verify_tdx_quote(QUOTE, collateral(), now=when)
    current = next(c for c in f.checks if c.id == "cvm-collateral")
    assert current.status is CheckStatus.NOT_CHECKED and current.collateral_missing
    assert words in current.reason
    # The quote's own cryptography is still checked, inside the collateral's window.
    assert statuses(f.checks)["cvm-quote"] == "pass"


def test_stale_collateral_does_not_hide_a_tampered_quote() -> None:
    f = verify_tdx_quote(flipped(QUOTE, 100), collateral(), now=AT + dt.timedelta(days=40))
    assert statuses(f.checks)["cvm-quote"] == "fail"


@pytest.mark.parametrize(
    ("offset", "words"),
    [
        (48 + 100, "signature is invalid"),  # TD report body (inside MRTD)
        (48 + 584 - 1, "signature is invalid"),  # report data, last byte
        (12, ""),  # header: QE vendor id
        (SIG + 10, "signature is invalid"),  # quote signature
        (SIG + 64 + 10, "QE report hash mismatch"),  # attestation key (bound by the QE)
        (QE_REPORT + 10, "qe_report"),  # QE report
        (QE_SIGNATURE + 10, "qe_report"),  # QE report signature
        (AUTH_DATA + 5, "QE report hash mismatch"),  # QE authentication data
    ],
)
def test_a_flipped_bit_is_refused(offset: int, words: str) -> None:
    f = verify_tdx_quote(flipped(QUOTE, offset), collateral(), now=AT)
    check = next(c for c in f.checks if c.id == "cvm-quote")
    assert check.status is CheckStatus.FAIL, f.checks
    assert words.lower() in check.reason.lower()


def test_a_flipped_bit_in_the_pck_certificates_signature_is_refused() -> None:
    end = QUOTE.index(b"-----END CERTIFICATE-----")
    f = verify_tdx_quote(flipped(QUOTE, end - 20), collateral(), now=AT)
    assert not f.evidence_ok
    assert statuses(f.checks)["cvm-quote"] == "fail"


def test_a_pck_certificate_whose_issuer_does_not_parse_is_malformed_evidence() -> None:
    start = QUOTE.index(b"-----BEGIN CERTIFICATE-----")
    with pytest.raises(MalformedEvidenceError, match=r"PCK chain: certificate 1 of 3 .*issuer"):
        verify_tdx_quote(flipped(QUOTE, start + 200), collateral(), now=AT)


def _other_root() -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Intel SGX Root CA")])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(AT - dt.timedelta(days=1))
        .not_valid_after(AT + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )


def test_a_chain_to_another_root_is_refused() -> None:
    f = verify_tdx_quote(QUOTE, collateral(), now=AT, root=_other_root())
    root = next(c for c in f.checks if c.id == "cvm-root")
    assert root.status is CheckStatus.FAIL and "pinned" in root.reason
    assert statuses(f.checks)["cvm-quote"] == "not-checked"


def test_broken_tcb_info_and_qe_identity_signatures_are_refused() -> None:
    doc = json.loads(COLLATERAL_JSON)
    for key in ("tcb_info_signature", "qe_identity_signature"):
        sig = doc[key]
        bad = ("0" if sig[0] != "0" else "1") + sig[1:]
        f = verify_tdx_quote(QUOTE, collateral(**{key: bad}), now=AT)
        assert statuses(f.checks)["cvm-quote"] == "fail", key
    tcb = doc["tcb_info"].replace('"tcbEvaluationDataNumber":17', '"tcbEvaluationDataNumber":18')
    assert tcb != doc["tcb_info"]
    f = verify_tdx_quote(QUOTE, collateral(tcb_info=tcb), now=AT)
    assert statuses(f.checks)["cvm-quote"] == "fail"


def _header(version: int, tee: int) -> bytes:
    return struct.pack("<HHI", version, 2, tee) + QUOTE[8:]


@pytest.mark.parametrize(
    ("quote", "words"),
    [
        (QUOTE[:40], "truncated"),
        (QUOTE[:600], "truncated"),
        (QUOTE[:3000], "truncated"),
        (QUOTE + b"\x00" * MAX_QUOTE_BYTES, "larger than"),
        (QUOTE + b"junk", "extra bytes"),
        (_header(4, 0x00), "SGX quote"),
        (_header(4, 0x42), "unknown TEE type"),
        (_header(3, 0x81), "unsupported quote version 3"),
        (_header(6, 0x81), "unsupported quote version 6"),
        (_header(5, 0x81), "unsupported quote body"),
        (b"", "truncated"),
        (flipped(QUOTE, SIG + 128), "certification data type 7"),
        (flipped(QUOTE, SIG - 4), "certification data size is inconsistent"),
        (flipped(QUOTE, AUTH_DATA - 2), "QE authentication data|nested certification data"),
    ],
)
def test_malformed_quotes_are_malformed_input(quote: bytes, words: str) -> None:
    with pytest.raises(MalformedEvidenceError, match=words):
        verify_tdx_quote(quote, collateral(), now=AT)


def test_zero_padding_after_the_quote_is_tolerated() -> None:
    assert verify_tdx_quote(QUOTE + bytes(64), collateral(), now=AT).evidence_ok


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"not json", "not JSON"),
        (b"[]", "JSON object"),
        (json.dumps({"tcb_info": "{}"}).encode(), "missing keys"),
        (json.dumps({**json.loads(COLLATERAL_JSON), "extra": "x"}).encode(), "unknown keys"),
        (json.dumps({**json.loads(COLLATERAL_JSON), "pck_crl": "zz"}).encode(), "not hex"),
        (json.dumps({**json.loads(COLLATERAL_JSON), "pck_crl": 5}).encode(), "strings"),
        (b" " * (5 * 1024 * 1024), "larger than"),
    ],
)
def test_malformed_collateral_is_malformed_input(data: bytes, words: str) -> None:
    with pytest.raises(MalformedEvidenceError, match=words):
        TdxCollateral.from_json(data)


def test_collateral_with_undated_tcb_info_is_malformed() -> None:
    tcb = json.loads(json.loads(COLLATERAL_JSON)["tcb_info"])
    del tcb["nextUpdate"]
    with pytest.raises(MalformedEvidenceError, match="nextUpdate"):
        verify_tdx_quote(QUOTE, collateral(tcb_info=json.dumps(tcb)), now=AT)


def test_kind_detection() -> None:
    assert looks_like_tdx_quote(QUOTE)
    assert not looks_like_tdx_quote(b"\x02\x00\x00\x00" + bytes(1180))
    assert not looks_like_tdx_quote(b"")


def test_naive_time_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone"):
        verify_tdx_quote(QUOTE, collateral(), now=AT.replace(tzinfo=None))


def test_the_benchmark_smoke_run_verifies_the_sample() -> None:
    import subprocess
    import sys

    from tests.support.paths import ROOT

    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_cvm.py"), "--smoke", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["target_ms"] == 20.0 and len(doc["results"]) == 3
    assert all(r["median_ms"] > 0 for r in doc["results"])


def test_collateral_that_names_a_key_twice_is_malformed() -> None:
    """Read strictly: a reviewer and a last-key-wins parser would see different collateral."""
    text = COLLATERAL_JSON.decode().strip()
    assert text.startswith("{")
    doubled = ('{"pck_crl": "00", ' + text[1:]).encode()
    with pytest.raises(MalformedEvidenceError, match="appears twice"):
        TdxCollateral.from_json(doubled)


def test_tcb_info_that_names_its_next_update_twice_is_malformed() -> None:
    tcb_text = json.loads(COLLATERAL_JSON)["tcb_info"]
    assert tcb_text.startswith("{")
    doubled = '{"nextUpdate": "2099-01-01T00:00:00Z", ' + tcb_text[1:]
    with pytest.raises(MalformedEvidenceError, match="TCB info.*appears twice"):
        verify_tdx_quote(QUOTE, collateral(tcb_info=doubled), now=AT)
