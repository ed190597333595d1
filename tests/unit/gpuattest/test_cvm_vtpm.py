"""Azure paravisor vTPM evidence (real SEV-SNP and TDX samples): the verdicts the issue asks
for, every encoding, and tampered, truncated, oversized and malformed variants."""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from gpucc.core.errors import MalformedEvidenceError, MalformedInputError
from gpucc.gpuattest.cvm.appraise import CvmResult, verify_cvm_evidence
from gpucc.gpuattest.cvm.hcl import MalformedHclReportError
from gpucc.gpuattest.cvm.policy import parse_cvm_policy
from gpucc.gpuattest.cvm.tpm_quote import MalformedTpmQuoteError
from gpucc.gpuattest.result import Verdict
from tests.support.paths import DATA

CLOUD = DATA / "cloud-cvm"
SNP = CLOUD / "azure-snp-vtpm" / "evidence-v1.json"
TDX = CLOUD / "azure-tdx-vtpm" / "evidence-v1.json"
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
NONCE = b"challenge"
Doc = dict[str, Any]


def load(path: Any = SNP) -> Doc:
    doc: Doc = json.loads(path.read_text())
    return doc


def verify(
    doc: Doc | bytes,
    *,
    nonce: bytes | None = NONCE,
    now: dt.datetime = NOW,
    policy: Any = None,
    collateral: bytes | None = None,
) -> CvmResult:
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return verify_cvm_evidence(
        raw,
        collateral,
        now=now,
        policy=parse_cvm_policy(policy),
        expected_report_data=nonce,
    )


def failed(result: CvmResult) -> list[str]:
    return [c.id for c in result.checks if c.decision.value == "refuse"]


def hcl(doc: Doc) -> bytearray:
    return bytearray(base64.urlsafe_b64decode(doc["hcl_report"]))


def set_hcl(doc: Doc, data: bytes | bytearray) -> Doc:
    return {**doc, "hcl_report": base64.urlsafe_b64encode(bytes(data)).decode()}


def edit_claims(doc: Doc, edit: Callable[[bytes], bytes]) -> Doc:
    """Rewrite the runtime claims (same size), leaving the signed hardware report as it is."""
    data = hcl(doc)
    size = int.from_bytes(data[0x4D0:0x4D4], "little")
    new = edit(bytes(data[0x4D4 : 0x4D4 + size]))
    assert len(new) == size
    data[0x4D4 : 0x4D4 + size] = new
    return set_hcl(doc, data)


# --- the verdicts -----------------------------------------------------------------------


def test_the_azure_snp_sample_is_trusted_for_its_nonce() -> None:
    result = verify(load())
    assert result.verdict is Verdict.TRUSTED, result.reasons
    vtpm = result.claims["vtpm"]
    assert vtpm["qualifying_data"] == NONCE.hex()
    assert vtpm["pcrs"]["0"].startswith("e15c4479")
    assert vtpm["vm_configuration"]["secure-boot"] is True and vtpm["console_enabled"] is True
    assert result.claims["product"] == "Milan" and result.claims["vmpl"] == 0
    assert vtpm["runtime_claims_sha256"].startswith("af2910341dd81083")


@pytest.mark.parametrize(
    "when", ["2025-01-28T16:26:55+00:00", "2028-06-01T00:00:00+00:00", "2032-01-28T16:26:55+00:00"]
)
def test_trusted_anywhere_in_the_vcek_window(when: str) -> None:
    assert verify(load(), now=dt.datetime.fromisoformat(when)).verdict is Verdict.TRUSTED


@pytest.mark.parametrize("when", ["2025-01-28T16:26:54+00:00", "2032-01-28T16:26:56+00:00"])
def test_never_trusted_outside_the_vcek_window(when: str) -> None:
    result = verify(load(), now=dt.datetime.fromisoformat(when))
    assert result.verdict is Verdict.UNDECIDED
    assert "snp-vcek-validity" in [c.id for c in result.checks if c.collateral_missing]


def test_another_nonce_is_not_trusted() -> None:
    result = verify(load(), nonce=b"challengf")
    assert result.verdict is Verdict.NOT_TRUSTED and failed(result) == ["cvm-report-data"]


def test_no_expected_value_is_refused_by_the_default_policy() -> None:
    assert verify(load(), nonce=None).verdict is Verdict.NOT_TRUSTED


def test_an_altered_runtime_claim_is_not_trusted() -> None:
    doc = edit_claims(load(), lambda b: b.replace(b"26F8BC30", b"26F8BC31"))
    result = verify(doc)
    assert result.verdict is Verdict.NOT_TRUSTED and failed(result) == ["vtpm-binding"]


def test_a_changed_pcr_is_not_trusted() -> None:
    doc = load()
    doc["tpm_quote"]["pcrs"][7] = "00" * 32
    result = verify(doc)
    assert result.verdict is Verdict.NOT_TRUSTED and failed(result) == ["vtpm-pcrs"]


def _other_key() -> tuple[rsa.RSAPrivateKey, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    n = key.public_key().public_numbers().n.to_bytes(256, "big")
    return key, base64.urlsafe_b64encode(n).decode().rstrip("=")


def test_a_swapped_ak_is_not_trusted() -> None:
    """Another AK in the runtime claims, and the quote re-signed with it: the hardware report
    no longer commits to the claims."""
    doc = load()
    key, n = _other_key()
    old = hcl(doc)[0x4D4:].split(b'"n":"')[1].split(b'"')[0]
    doc = edit_claims(doc, lambda b: b.replace(old, n.encode(), 1))
    message = bytes.fromhex(doc["tpm_quote"]["message"])
    doc["tpm_quote"]["signature"] = key.sign(message, padding.PKCS1v15(), hashes.SHA256()).hex()
    result = verify(doc)
    assert result.verdict is Verdict.NOT_TRUSTED and failed(result) == ["vtpm-binding"]


def test_a_quote_signed_by_another_key_is_not_trusted() -> None:
    """A quote for this nonce signed by a key that is not the VM's AK."""
    doc = load()
    key, _ = _other_key()
    message = bytes.fromhex(doc["tpm_quote"]["message"])
    doc["tpm_quote"]["signature"] = key.sign(message, padding.PKCS1v15(), hashes.SHA256()).hex()
    result = verify(doc)
    assert result.verdict is Verdict.NOT_TRUSTED and failed(result) == ["vtpm-quote-signature"]


def test_a_quote_with_other_qualifying_data_fails_its_signature() -> None:
    doc = load()
    doc["tpm_quote"]["message"] = doc["tpm_quote"]["message"].replace(
        NONCE.hex(), b"challengf".hex()
    )
    result = verify(doc, nonce=b"challengf")
    assert result.verdict is Verdict.NOT_TRUSTED and failed(result) == ["vtpm-quote-signature"]


def test_a_tampered_hardware_report_is_not_trusted() -> None:
    data = hcl(load())
    data[0x20 + 0x90] ^= 1  # MEASUREMENT
    result = verify(set_hcl(load(), data))
    assert result.verdict is Verdict.NOT_TRUSTED and failed(result) == ["snp-report-signature"]


# --- encodings ---------------------------------------------------------------------------


def test_version_0_byte_arrays_are_read() -> None:
    doc = load()
    q = doc["tpm_quote"]
    v0 = {
        "quote": {
            "signature": list(bytes.fromhex(q["signature"])),
            "message": list(bytes.fromhex(q["message"])),
            "pcrs": [list(bytes.fromhex(p)) for p in q["pcrs"]],
        },
        "report": list(hcl(doc)),
        "vcek": _pem(base64.urlsafe_b64decode(doc["vcek"])),
    }
    result = verify(v0)
    assert result.verdict is Verdict.TRUSTED and result.claims["vtpm"]["evidence_format"] == "0"


def _pem(der: bytes) -> str:
    body = base64.encodebytes(der).decode()
    return f"-----BEGIN CERTIFICATE-----\n{body}-----END CERTIFICATE-----\n"


def test_version_2_also_requires_the_report_data_in_user_data() -> None:
    """The sample's user-data is zero: as version 2 it commits to no nonce but the zero one."""
    doc = {**load(), "version": 2}
    result = verify(doc)
    assert result.verdict is Verdict.NOT_TRUSTED and failed(result) == ["cvm-report-data"]
    assert "user-data" in result.reasons[0]


def test_gpuccs_collected_form_is_read() -> None:
    doc = load()
    ours = {k: v for k, v in doc.items() if k != "version"}
    ours.update({"format": "gpucc.vtpm/v1", "user_data": False})
    assert verify(ours).verdict is Verdict.TRUSTED


# --- policy ------------------------------------------------------------------------------


def test_pinned_pcrs_and_launch_measurement_are_compared() -> None:
    base = verify(load())
    pcr0, measurement = base.claims["vtpm"]["pcrs"]["0"], base.claims["measurement"]
    pins = {"pcrs": {0: pcr0}, "measurements": {"snp": {"measurement": measurement}}}
    assert verify(load(), policy=pins).verdict is Verdict.TRUSTED
    wrong = verify(load(), policy={"pcrs": {0: "11" * 32, 7: pcr0}})
    assert wrong.verdict is Verdict.NOT_TRUSTED and failed(wrong) == ["cvm-pcrs"]
    assert "PCR0" in wrong.reasons[0] and "PCR7" in wrong.reasons[0]


def test_a_console_enabled_vm_can_be_refused() -> None:
    result = verify(load(), policy={"allow_console": False})
    assert result.verdict is Verdict.NOT_TRUSTED and failed(result) == ["cvm-console"]


def test_pcr_pins_refuse_evidence_without_a_vtpm() -> None:
    report = (DATA / "cpu-tee" / "snp" / "report.bin").read_bytes()
    result = verify_cvm_evidence(
        report,
        None,
        now=NOW,
        policy=parse_cvm_policy({"pcrs": {0: "00" * 32}}),
        expected_report_data=report[0x50:0x90],
    )
    assert "cvm-pcrs" in failed(result)


@pytest.mark.parametrize(
    "pcrs", [{24: "00" * 32}, {"x": "00" * 32}, {0: "00" * 31}, {0: 5}, [0], {True: "00" * 32}]
)
def test_bad_pcr_pins_are_malformed_policy(pcrs: Any) -> None:
    with pytest.raises(MalformedInputError, match="cvm.pcrs"):
        parse_cvm_policy({"pcrs": pcrs})


def test_expected_value_length() -> None:
    with pytest.raises(MalformedEvidenceError, match="1 to 64 bytes"):
        verify(load(), nonce=bytes(65))
    with pytest.raises(MalformedEvidenceError, match="64 bytes"):
        report = (DATA / "cpu-tee" / "snp" / "report.bin").read_bytes()
        verify(report, nonce=NONCE)


# --- TDX ---------------------------------------------------------------------------------


def test_the_azure_tdx_sample_is_undecided_offline_and_names_the_collateral() -> None:
    result = verify(load(TDX))
    assert result.verdict is Verdict.UNDECIDED, result.reasons
    assert not failed(result)
    passed = {c.id for c in result.checks if c.status.value == "pass"}
    assert {"tdx-pck-chain", "tdx-qe-report", "tdx-quote-signature", "vtpm-binding"} <= passed
    assert {"vtpm-quote-signature", "vtpm-pcrs", "cvm-report-data"} <= passed
    assert "FMSPC 00806F050000" in result.reasons[0] and "TCB info" in result.reasons[0]
    assert result.claims["vtpm"]["pcrs"]["0"].startswith("782b20b1")


def test_tdx_wrong_nonce_and_altered_claims_are_decidably_not_trusted() -> None:
    assert verify(load(TDX), nonce=b"other").verdict is Verdict.NOT_TRUSTED
    doc = edit_claims(load(TDX), lambda b: b.replace(b"6332533D", b"6332533E"))
    result = verify(doc)
    assert result.verdict is Verdict.NOT_TRUSTED and failed(result) == ["vtpm-binding"]


def _td_quote(doc: Doc, data: bytes) -> Doc:
    return {**doc, "td_quote": base64.urlsafe_b64encode(data).decode()}


def test_tdx_zero_padding_is_accepted_but_not_other_trailing_bytes() -> None:
    doc = load(TDX)
    quote = base64.urlsafe_b64decode(doc["td_quote"])
    assert quote.endswith(bytes(70))
    assert verify(_td_quote(doc, quote[:-70])).verdict is Verdict.UNDECIDED
    with pytest.raises(MalformedEvidenceError, match="extra bytes"):
        verify(_td_quote(doc, quote[:-1] + b"\x01"))


def test_tdx_tampered_quote_signature_is_not_trusted() -> None:
    doc = load(TDX)
    quote = bytearray(base64.urlsafe_b64decode(doc["td_quote"]))
    quote[48 + 136] ^= 1  # MRTD: the TDREPORT in the HCL report no longer matches either
    result = verify(_td_quote(doc, bytes(quote)))
    assert result.verdict is Verdict.NOT_TRUSTED
    assert {"tdx-quote-signature", "vtpm-binding"} <= set(failed(result))


# --- malformed input ---------------------------------------------------------------------


def _hcl_edit(offset: int, value: bytes) -> Doc:
    data = hcl(load())
    data[offset : offset + len(value)] = value
    return set_hcl(load(), data)


@pytest.mark.parametrize(
    ("doc", "error", "match"),
    [
        (lambda: set_hcl(load(), hcl(load())[:-1]), MalformedHclReportError, "2600 bytes"),
        (lambda: set_hcl(load(), hcl(load()) + b"\0"), MalformedHclReportError, "2600 bytes"),
        (lambda: _hcl_edit(0, b"HCLB"), MalformedHclReportError, "HCLA"),
        (lambda: _hcl_edit(4, b"\x03"), MalformedHclReportError, "version 3"),
        (lambda: _hcl_edit(0x4C8, b"\x03"), MalformedHclReportError, "report type 3"),
        (lambda: _hcl_edit(0x4CC, b"\x02"), MalformedHclReportError, "hash type 2"),
        (lambda: _hcl_edit(0x4D0, b"\x57"), MalformedHclReportError, "sizes"),
        (lambda: _hcl_edit(2599, b"\x01"), MalformedHclReportError, "after its runtime claims"),
        (
            lambda: edit_claims(load(), lambda b: b.replace(b"HCLAkPub", b"HCLAkPuX")),
            MalformedHclReportError,
            "HCLAkPub",
        ),
        (
            lambda: edit_claims(load(), lambda b: b.replace(b"{", b"[", 1)),
            MalformedHclReportError,
            "not JSON",
        ),
        (lambda: {**load(), "extra": 1}, MalformedEvidenceError, "unknown keys"),
        (lambda: {**load(), "version": 3}, MalformedEvidenceError, "version"),
        (lambda: {**load(), "version": True}, MalformedEvidenceError, "version"),
        (lambda: {**load(), "hcl_report": "A" * 5}, MalformedEvidenceError, "base64url"),
        (lambda: {**load(), "hcl_report": "+" * 4}, MalformedEvidenceError, "base64url"),
        (
            lambda: {**load(), "tpm_quote": {**load()["tpm_quote"], "message": "zz"}},
            MalformedEvidenceError,
            "hex",
        ),
        (
            lambda: {**load(), "tpm_quote": {**load()["tpm_quote"], "pcrs": ["00" * 31]}},
            MalformedEvidenceError,
            "32 bytes",
        ),
        (
            lambda: {**load(), "tpm_quote": {**load()["tpm_quote"], "pcrs": []}},
            MalformedEvidenceError,
            "pcrs",
        ),
        (
            lambda: {**load(), "td_quote": load()["vcek"]},
            MalformedEvidenceError,
            "unknown keys",
        ),
        (lambda: b"{" + b" " * 70000 + b"}", MalformedEvidenceError, "larger"),
        (lambda: b'{"version": 1', MalformedEvidenceError, "not JSON"),
        (lambda: b"[]", MalformedEvidenceError, "neither"),
        (lambda: b" {} ", MalformedEvidenceError, "lacks"),
    ],
)
def test_malformed_evidence_is_a_one_line_error(
    doc: Callable[[], Doc | bytes], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match) as caught:
        verify(doc())
    assert "\n" not in str(caught.value)


def _quote_edit(edit: Callable[[bytes], bytes]) -> Doc:
    doc = load()
    doc["tpm_quote"]["message"] = edit(bytes.fromhex(doc["tpm_quote"]["message"])).hex()
    return doc


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda m: m[:-1], "truncated"),
        (lambda m: m + b"\0", "left over"),
        (lambda m: b"\0" + m[1:], "TPM_GENERATED"),
        (lambda m: m[:4] + b"\x80\x17" + m[6:], "not a quote"),
        (lambda m: b"", "1 to 1024"),
        (lambda m: m + bytes(2000), "1 to 1024"),
    ],
)
def test_malformed_tpm_quotes(edit: Callable[[bytes], bytes], match: str) -> None:
    with pytest.raises(MalformedTpmQuoteError, match=match):
        verify(_quote_edit(edit))


def test_a_tdx_hcl_report_with_a_vcek_is_malformed() -> None:
    doc = load(TDX)
    bad = {"version": 1, "tpm_quote": doc["tpm_quote"], "hcl_report": doc["hcl_report"],
           "vcek": load()["vcek"]}  # fmt: skip
    with pytest.raises(MalformedEvidenceError, match="TDX VM but comes with a VCEK"):
        verify(bad)
