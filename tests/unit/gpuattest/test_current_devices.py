"""NVIDIA's current device evidence through the one outline: Rubin (GR100, a signed table
of contents in block 0xFD) and Blackwell's FSP responder (52 blocks, no opaque data).

NVIDIA publishes their reference values only as CoRIMs; offline, with none given, the
verdict with the right nonce is undecided for that reason alone, with the chain, the
signature and the nonce verified (tests/e2e/test_cli_corim.py appraises them with CoRIMs).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucc.core.errors import (
    GpuccError,
    MalformedReportError,
    RimNotFoundError,
    UnsupportedFormatError,
)
from gpucc.gpuattest.collateral import NoOcsp
from gpucc.gpuattest.device import BLACKWELL_FSP, GPU_GSP, RUBIN, gpu_profile
from gpucc.gpuattest.evidence import EvidenceSet, GpuEvidence, load_evidence_file
from gpucc.gpuattest.policy import Policy
from gpucc.gpuattest.report import AttestationReport, EnvelopeReport
from gpucc.gpuattest.result import AttestationResult, CheckStatus, Verdict
from gpucc.gpuattest.spdm_toc import TOC_BLOCK_INDEX, parse_toc
from gpucc.gpuattest.trust import TrustRoots
from gpucc.gpuattest.verifier import verify
from tests.support.samples import CURRENT_AT, FSP, FSP_NONCE, RUBIN_NONCE
from tests.support.samples import RUBIN as RUBIN_DIR

CASES = {
    "rubin": (RUBIN_DIR, RUBIN_NONCE, "RUBIN"),
    "fsp": (FSP, FSP_NONCE, "BLACKWELL"),
}


class _NoRims:
    """Offline: nothing is found; only CoRIM IDs may be asked for (no XML RIM)."""

    def get_rim(self, rim_id: str) -> bytes:
        assert rim_id in CORIM_IDS, f"not a CoRIM ID of these devices: {rim_id}"
        raise RimNotFoundError(rim_id, "offline")


CORIM_IDS = {"NV_GPU_DRIVER_GR100_620.54", "GR100_081D_9900230000"}


def _verify(evidence: EvidenceSet, nonce: str) -> AttestationResult:
    return verify(
        evidence,
        expected_nonce=bytes.fromhex(nonce),
        roots=TrustRoots.nvidia(),
        now=CURRENT_AT,
        rims=_NoRims(),
        ocsp=NoOcsp("offline"),
        policy=Policy(require_ocsp=False),
    )


def _raw(folder: Path) -> EvidenceSet:
    return load_evidence_file(folder / "attestation-report.hex", folder / "cert-chain.pem")


def _forms(folder: Path) -> dict[str, EvidenceSet]:
    return {
        "raw": _raw(folder),
        "nvat": load_evidence_file(folder / "nvat-v1-evidence.json"),
    }


@pytest.mark.parametrize("form", ["raw", "nvat"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_right_nonce_is_undecided_for_missing_reference_values(case: str, form: str) -> None:
    folder, nonce, arch = CASES[case]
    evidence = _forms(folder)[form]
    assert evidence.gpus[0].arch == arch
    result = _verify(evidence, nonce)
    assert result.verdict is Verdict.UNDECIDED, result.reasons
    gpu = result.gpus[0]
    for check in ("arch", "report-parsed", "device-chain", "report-signature", "nonce"):
        assert gpu.check(check).status is CheckStatus.PASS, check
    assert gpu.claims["x-nvidia-gpu-attestation-report-signature-verified"] is True
    meas = gpu.check("measurements")
    assert meas.status is CheckStatus.NOT_CHECKED
    assert "published only as CoRIMs" in meas.reason
    assert gpu.claims["measres"] == "not-run"
    assert all("CoRIM" in r for r in result.reasons), result.reasons


@pytest.mark.parametrize("case", sorted(CASES))
def test_wrong_nonce_is_not_trusted(case: str) -> None:
    folder, nonce, _ = CASES[case]
    wrong = bytes(32).hex()
    result = _verify(_raw(folder), wrong)
    assert result.verdict is Verdict.NOT_TRUSTED
    assert result.gpus[0].check("nonce").status is CheckStatus.FAIL


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_flipped_signature_bit_is_not_trusted(case: str) -> None:
    folder, nonce, _ = CASES[case]
    gpu = _raw(folder).gpus[0]
    flipped = bytearray(gpu.report)
    flipped[-1] ^= 0x01
    ev = EvidenceSet(gpus=(GpuEvidence(bytes(flipped), gpu.cert_chain_pem, gpu.arch),))
    result = _verify(ev, nonce)
    assert result.verdict is Verdict.NOT_TRUSTED
    assert result.gpus[0].check("report-signature").status is CheckStatus.FAIL


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("change", ["truncated", "extended"])
def test_truncated_or_extended_is_malformed(case: str, change: str) -> None:
    folder, nonce, _ = CASES[case]
    gpu = _raw(folder).gpus[0]
    report = gpu.report[:-1] if change == "truncated" else gpu.report + b"\x00"
    ev = EvidenceSet(gpus=(GpuEvidence(report, gpu.cert_chain_pem, gpu.arch),))
    with pytest.raises(MalformedReportError) as err:
        _verify(ev, nonce)
    assert not isinstance(err.value, UnsupportedFormatError)


def test_profiles_are_recognised_from_the_leaf() -> None:
    assert gpu_profile("BLACKWELL", "GB100 A01 FSP FMC LF") is BLACKWELL_FSP
    assert gpu_profile("BLACKWELL", "GB100 A01 GSP FMC LF") is GPU_GSP
    assert gpu_profile("HOPPER", "GR100 A01 GSP FMC LF") is RUBIN
    assert gpu_profile("RUBIN", "") is RUBIN
    assert gpu_profile("HOPPER", "GH100 A01 GSP FMC LF") is GPU_GSP


def test_fsp_report_blocks() -> None:
    report = EnvelopeReport.parse(_raw(FSP).gpus[0].report)
    assert len(report.blocks) == 52 and not report.opaque
    raw = [i for i, b in report.blocks.items() if b.is_raw]
    assert raw[:2] == [1, 2] and report.blocks[1].value_type == 0x83
    with pytest.raises(MalformedReportError, match="lacks required field DRIVER_VERSION"):
        AttestationReport.parse(report.raw)


def test_fsp_profile_fixes_the_block_count() -> None:
    BLACKWELL_FSP.check_blocks(dict.fromkeys(range(1, 53)))
    with pytest.raises(UnsupportedFormatError, match="has 52 measurement blocks; this one has 51"):
        BLACKWELL_FSP.check_blocks(dict.fromkeys(range(1, 52)))


def test_fsp_without_opaque_versions_fails_a_pinned_version_policy() -> None:
    result = verify(
        _raw(FSP),
        expected_nonce=bytes.fromhex(FSP_NONCE),
        roots=TrustRoots.nvidia(),
        now=CURRENT_AT,
        rims=_NoRims(),
        ocsp=NoOcsp("offline"),
        policy=Policy(require_ocsp=False, min_driver="570.0"),
    )
    assert result.verdict is Verdict.NOT_TRUSTED
    assert "cannot be met" in result.gpus[0].check("versions-policy").reason


def test_rubin_mode_comes_from_the_signed_table_not_the_feature_flag() -> None:
    result = _verify(_raw(RUBIN_DIR), RUBIN_NONCE)
    gpu = result.gpus[0]
    # The opaque FEATURE_FLAG is 1 here; NVIDIA's SDK does not read Rubin's mode from it.
    assert AttestationReport.parse(_raw(RUBIN_DIR).gpus[0].report).feature_flag == 1
    assert gpu.claims["x-nvidia-gpu-mode"] == "mpt"
    assert "table of contents" in gpu.claim_notes["x-nvidia-gpu-mode"]
    assert gpu.driver_rim_id == "NV_GPU_DRIVER_GR100_620.54"
    assert gpu.vbios_rim_id == "GR100_081D_9900230000"
    assert gpu.claims["x-nvidia-gpu-driver-version"] == "620.54"


TOC_REPORT = AttestationReport.parse(_raw(RUBIN_DIR).gpus[0].report)
TOC = TOC_REPORT.blocks[TOC_BLOCK_INDEX].value


def test_rubin_table_of_contents() -> None:
    toc = parse_toc(TOC, TOC_REPORT.blocks)
    assert toc.purpose == "CC MPT"
    assert toc.profile == "tag:nvidia.com,2026:evidence/spdm/profiles/gpu/1.0.0"
    assert toc.rim_locators == (
        "https://rim.attestation.nvidia.com/v1/rim/GR100_081D_9900230000",
        "https://rim.attestation.nvidia.com/v1/rim/NV_GPU_DRIVER_GR100_620.54",
    )
    assert len(toc.environments) == 28
    assert toc.environments[0].class_id == "1.3.6.1.4.1.5703.1300.1.1.11.1.11.1.2"
    assert toc.values[54] == TOC_REPORT.blocks[54].value
    assert set(toc.values) <= set(TOC_REPORT.blocks)
    svns = [m.values.svn for e in toc.environments for m in e.measurements if m.key == "L0FSVN"]
    assert [s.value for s in svns if s is not None] == [0]
    assert toc.to_dict()["purpose"] == "CC MPT"


def test_toc_naming_a_missing_block_is_malformed() -> None:
    blocks = {i: b for i, b in TOC_REPORT.blocks.items() if i != 54}
    with pytest.raises(MalformedReportError, match="names block 54"):
        parse_toc(TOC, blocks)


def test_toc_of_another_kind_is_unsupported() -> None:
    with pytest.raises(UnsupportedFormatError, match="tag 571"):
        parse_toc(b"\xd9\x02\x3b\xa0", TOC_REPORT.blocks)  # tag 571, {}


@settings(max_examples=300, deadline=None)
@given(
    cut=st.integers(0, len(TOC)),
    pos=st.integers(0, len(TOC) - 1),
    byte=st.integers(0, 255),
    tail=st.binary(max_size=8),
)
def test_fuzz_toc_raises_only_gpucc_errors(cut: int, pos: int, byte: int, tail: bytes) -> None:
    data = bytearray(TOC)
    data[pos] = byte
    try:
        parse_toc(bytes(data[:cut]) + tail, TOC_REPORT.blocks)
    except GpuccError:
        pass


def test_collateral_bundles_look_up_corims_for_corim_only_devices() -> None:
    from gpucc.gpuattest.bundle import evidence_rim_ids

    # Rubin: its table's locators; a raw FSP report has no firmware-version hint, so no ID;
    # its CMW file's hint names the VBIOS CoRIM as NVIDIA's SDK builds it.
    assert evidence_rim_ids(_raw(RUBIN_DIR).gpus + _raw(FSP).gpus) == [
        "GR100_081D_9900230000",
        "NV_GPU_DRIVER_GR100_620.54",
    ]
    cmw = load_evidence_file(FSP / "evidence.cmw.json")
    assert evidence_rim_ids(cmw.gpus) == ["NV_GPU_VBIOS_GB100_065C_0100000001"]


def test_the_fsp_corim_id_is_built_from_model_apsku_and_the_firmware_hint() -> None:
    from gpucc.gpuattest.device import CorimInputs

    report = EnvelopeReport.parse(_raw(FSP).gpus[0].report)
    leaf = "GB100 A01 FSP FMC LF"

    def ids(report: object, leaf: str, hints: dict[str, str]) -> tuple[tuple[str, str], ...]:
        assert BLACKWELL_FSP.corim_ids is not None
        found = BLACKWELL_FSP.corim_ids(CorimInputs(report, None, leaf, hints))
        assert bool(found.ids) != bool(found.missing)
        return found.ids

    hint = {"fwversion": "01.00.00.00.01"}
    assert ids(report, leaf, hint) == (("vbios", "NV_GPU_VBIOS_GB100_065C_0100000001"),)
    assert ids(report, leaf, {}) == ()  # a raw report: no hint, no ID
    assert ids(report, leaf, {"fwversion": "1.0"}) == ()
    assert ids(report, "XX A01 FSP", hint) == ()
    import dataclasses
    from types import SimpleNamespace

    blocks = dict(report.blocks)
    blocks[52] = dataclasses.replace(blocks[52], value=b"no sku")
    assert ids(SimpleNamespace(blocks=blocks), leaf, hint) == ()
