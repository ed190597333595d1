"""``gpucc attest``'s confidential-VM options: the CVM's evidence beside the GPUs', one verdict."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from gpucc.gpuattest.cvm.appraise import CvmResult
    from gpucc.gpuattest.netconfig import NetworkSettings
    from gpucc.gpuattest.policy import Policy
    from gpucc.gpuattest.result import AttestationResult

_PANEL = "Confidential VM"

CvmEvidenceOption = Annotated[
    Path | None,
    typer.Option(
        "--cvm-evidence",
        exists=True,
        dir_okay=False,
        rich_help_panel=_PANEL,
        help="The CVM's evidence: an Intel TDX quote or an AMD SEV-SNP report (raw, as "
        "configfs-tsm's outblob gives it); the kind is detected from the content. The verdict "
        "is trusted only if the CVM and every GPU are.",
    ),
]
CvmCollateralOption = Annotated[
    Path | None,
    typer.Option(
        "--cvm-collateral",
        exists=True,
        dir_okay=False,
        rich_help_panel=_PANEL,
        help="Collateral for --cvm-evidence: for TDX Intel's collateral as JSON in the shape a "
        "PCCS serves; for SEV-SNP the VCEK certificate.",
    ),
]
CvmReportDataOption = Annotated[
    str | None,
    typer.Option(
        "--cvm-report-data",
        rich_help_panel=_PANEL,
        help="The 64 bytes (128 hex) the CVM evidence must sign. Default with GPU evidence: "
        "SHA-512('gpucc/attest/v1/cvm-report-data' || nonce), what 'gpucc evidence collect "
        "--cvm' asks for; required otherwise by the default policy (cvm.require_report_data).",
    ),
]
CvmPccsOption = Annotated[
    str | None,
    typer.Option(
        "--cvm-pccs-url",
        envvar="GPUCC_PCCS_URL",
        rich_help_panel=_PANEL,
        help="Where TDX collateral comes from without --cvm-collateral: a PCCS base URL "
        "(default Intel's PCS; an SEV-SNP VCEK comes from AMD's KDS). Fetched through the "
        "cache; --offline uses the cache only.",
    ),
]
CvmOnlyOption = Annotated[
    bool,
    typer.Option(
        "--cvm-only",
        rich_help_panel=_PANEL,
        help="Verify --cvm-evidence alone (a host without GPUs, or a quote by itself).",
    ),
]


def _report_data(text: str | None) -> bytes | None:
    from gpucc.gpuattest.errors import UsageError

    if text is None:
        return None
    try:
        value = bytes.fromhex(text.strip())
    except ValueError:
        raise UsageError("--cvm-report-data must be hex") from None
    if len(value) != 64:
        raise UsageError("--cvm-report-data must be 64 bytes (128 hex digits)")
    return value


def verify_cvm(
    evidence: Path,
    collateral: Path | None,
    report_data: str | None,
    *,
    policy: Policy,
    now: dt.datetime,
    nonce: bytes | None = None,
    network: NetworkSettings | None = None,
    pccs_url: str | None = None,
) -> CvmResult:
    """Read, verify and judge the CVM evidence the options name; without --cvm-report-data
    the report data expected is the one bound to the GPU ``nonce`` (when there is one).

    Raises:
        MalformedEvidenceError: unknown kind, malformed or oversized evidence or collateral.
        CollateralUnavailableError: TDX evidence without --cvm-collateral.
        FileAccessError: a file cannot be read.
        UsageError: --cvm-report-data is not 64 bytes of hex.
    """
    from gpucc.gpuattest.cvm.appraise import (
        MAX_EVIDENCE_BYTES,
        attest_report_data,
        detect_kind,
        verify_cvm_evidence,
    )
    from gpucc.gpuattest.cvm.findings import CvmKind
    from gpucc.gpuattest.cvm.tdx import MAX_COLLATERAL_BYTES, check_layout
    from gpucc.gpuattest.errors import CollateralUnavailableError, MalformedEvidenceError
    from gpucc.gpuattest.files import read_capped

    expected = _report_data(report_data)
    if expected is None and nonce is not None:
        expected = attest_report_data(nonce)
    data = read_capped(evidence, MAX_EVIDENCE_BYTES, what="CVM evidence")
    if len(data) > MAX_EVIDENCE_BYTES:
        raise MalformedEvidenceError(f"the CVM evidence is larger than {MAX_EVIDENCE_BYTES} bytes")
    extra = None
    if collateral is not None:
        extra = read_capped(collateral, MAX_COLLATERAL_BYTES, what="CVM collateral")
    elif network is not None and detect_kind(data) is CvmKind.TDX:
        from gpucc.gpuattest.cvm.pcs import INTEL_PCS_URL, tdx_collateral_for
        from gpucc.gpuattest.netconfig import build_fetcher

        check_layout(data)  # a malformed quote is told as such, before any network use
        try:
            with build_fetcher(network) as fetcher:
                extra = tdx_collateral_for(
                    data,
                    fetcher,
                    now=now,
                    cache=network.cache(),
                    base_url=pccs_url or INTEL_PCS_URL,
                ).to_json()
        except CollateralUnavailableError as exc:
            exc.hint = "or give Intel's collateral with --cvm-collateral FILE"
            raise
    elif network is not None and detect_kind(data) is CvmKind.SNP:
        from gpucc.gpuattest.cvm.snp_kds import fetch_vcek
        from gpucc.gpuattest.netconfig import build_fetcher

        try:
            with build_fetcher(network) as fetcher:
                extra = fetch_vcek(data, fetcher=fetcher, cache=network.cache())
        except CollateralUnavailableError as exc:
            exc.hint = "or give the chip's VCEK certificate with --cvm-collateral FILE"
            raise
    try:
        return verify_cvm_evidence(
            data, extra, now=now, policy=policy.cvm, expected_report_data=expected
        )
    except CollateralUnavailableError as exc:
        if collateral is None:
            exc.hint = "give it with --cvm-collateral FILE"
        raise


def with_cvm(result: AttestationResult, cvm: CvmResult) -> AttestationResult:
    """The GPUs' result with the CVM's joined in: trusted only if all are."""
    from gpucc.gpuattest.result import combine_verdicts

    verdict = combine_verdicts([result.verdict, cvm.verdict])
    return dataclasses.replace(result, verdict=verdict, cvm=cvm)


def cvm_only(cvm: CvmResult, *, policy: Policy, now: dt.datetime) -> AttestationResult:
    """A result with the CVM alone (no GPU)."""
    from gpucc.gpuattest.result import AttestationResult

    return AttestationResult(
        verdict=cvm.verdict,
        gpus=(),
        policy=policy,
        verified_at=now,
        expected_nonce=None,
        source="file",
        cvm=cvm,
    )
