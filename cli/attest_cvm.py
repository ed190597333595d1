"""``gpucc attest``'s confidential-VM options: the CVM's evidence beside the GPUs', one verdict."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

_PANEL = "Confidential VM"

CvmEvidenceOption = Annotated[
    Path | None,
    typer.Option(
        "--cvm-evidence",
        exists=True,
        dir_okay=False,
        rich_help_panel=_PANEL,
        help="The CVM's evidence: an Intel TDX quote or an AMD SEV-SNP report (raw, as "
        "configfs-tsm's outblob gives it), or a paravisor CVM's vTPM evidence (Azure: CoCo "
        "attestation-agent JSON, versions 0-2, or 'gpucc evidence collect --cvm' output); the "
        "kind is detected from the content. The verdict is trusted only if the CVM and every "
        "GPU are.",
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
        "PCCS serves; for SEV-SNP the VCEK or VLEK certificate (replacing one that came with "
        "the evidence).",
    ),
]
CvmEventLogOption = Annotated[
    Path | None,
    typer.Option(
        "--cvm-event-log",
        exists=True,
        dir_okay=False,
        rich_help_panel=_PANEL,
        help="The TDX CC event log (/sys/firmware/acpi/tables/data/CCEL, raw): replayed with "
        "SHA-384 into RTMR0-3 and compared with the quote's; its events are shown and judged "
        "by the policy's cvm.events. A log that does not match the quote is refused.",
    ),
]
CvmReportDataOption = Annotated[
    str | None,
    typer.Option(
        "--cvm-report-data",
        rich_help_panel=_PANEL,
        help="The value (hex) the CVM evidence must commit to: a TDX quote's or SEV-SNP "
        "report's REPORT_DATA (64 bytes); for vTPM evidence the TPM quote's qualifying data "
        "(1 to 64 bytes; also the runtime claims' user-data where the evidence binds it). "
        "Default with GPU evidence: SHA-512('gpucc/attest/v1/cvm-report-data' || nonce), what "
        "'gpucc evidence collect --cvm' asks for; required otherwise by the default policy "
        "(cvm.require_report_data).",
    ),
]
CvmKdsOption = Annotated[
    str | None,
    typer.Option(
        "--cvm-kds-url",
        envvar="GPUCC_KDS_URL",
        rich_help_panel=_PANEL,
        help="Where an SEV-SNP VCEK is fetched from: AMD's KDS (default) or a collateral "
        "mirror serving its paths (gpucc collateral serve).",
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


class CvmSampleKind(enum.StrEnum):
    """--cvm-sample values: the bundled CVM samples."""

    TDX = "tdx"
    SNP = "snp"


CvmSampleOption = Annotated[
    CvmSampleKind | None,
    typer.Option(
        "--cvm-sample",
        rich_help_panel=_PANEL,
        case_sensitive=False,
        help="Verify a bundled CVM sample offline with its collateral: tdx (an Intel-signed "
        "TDX quote) or snp (an AMD EPYC Milan guest's SEV-SNP report). Alone, the CVM by "
        "itself; with --sample, beside NVIDIA's GPU sample for a composite verdict. Without "
        "--at, as of 2025-06-19T11:16:03Z, when the samples' collateral is valid.",
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


def cvm_report_data_value(text: str | None, evidence: bytes | None = None) -> bytes | None:
    """``--cvm-report-data``: hex, or None: 64 bytes for a TDX quote or an SEV-SNP report, 1 to
    64 bytes (a TPM quote's qualifying data) for vTPM evidence (``evidence`` is JSON).

    Raises:
        UsageError: not hex of the right length.
    """
    if text is None:
        return None
    from gpucc.core.errors import MalformedEvidenceError, UsageError

    try:
        value = bytes.fromhex(text.strip())
    except ValueError:
        raise UsageError("--cvm-report-data must be hex") from None
    if not 1 <= len(value) <= 64:
        raise UsageError("--cvm-report-data must be 1 to 64 bytes (2 to 128 hex digits)")
    sizes = range(64, 65)
    if evidence is not None:
        from gpucc.assembly.parts import CvmPartKind, default_parts

        try:
            kind = default_parts().classify_cvm(evidence)
        except MalformedEvidenceError:
            kind = None  # the verifier names what the evidence is not
        if isinstance(kind, CvmPartKind):
            sizes = kind.report_data_sizes
    if len(value) not in sizes:
        raise UsageError(
            "--cvm-report-data must be 64 bytes (128 hex digits) for a TDX quote or an SEV-SNP "
            "report (1 to 64 bytes only for vTPM evidence)"
        )
    return value


def read_cvm_evidence(evidence: Path, collateral: Path | None) -> tuple[bytes, bytes | None]:
    """The CVM evidence file and its collateral file, read with their size caps.

    Raises:
        MalformedEvidenceError: either is oversized.
        FileAccessError: a file cannot be read.
    """
    from gpucc.core.files import read_capped
    from gpucc.gpuattest.cvm.appraise import MAX_EVIDENCE_BYTES
    from gpucc.gpuattest.cvm.tdx import MAX_COLLATERAL_BYTES

    data = read_capped(evidence, MAX_EVIDENCE_BYTES, what="CVM evidence")
    extra = None
    if collateral is not None:
        extra = read_capped(collateral, MAX_COLLATERAL_BYTES, what="CVM collateral")
    return data, extra


def read_cvm_event_log(path: Path | None) -> bytes | None:
    """``--cvm-event-log``: the file, read with its size cap.

    Raises:
        MalformedEvidenceError: it is oversized.
        FileAccessError: it cannot be read.
    """
    if path is None:
        return None
    from gpucc.core.files import read_capped
    from gpucc.gpuattest.cvm.eventlog import MAX_EVENT_LOG_BYTES

    return read_capped(path, MAX_EVENT_LOG_BYTES, what="CVM event log")


@dataclass(frozen=True)
class CvmInput:
    """The CVM evidence ``attest`` verifies: a file's, or a bundled sample's."""

    evidence: bytes
    collateral: bytes | None
    report_data: bytes | None  # a sample's own; None: from --cvm-report-data or the nonce
    at: str | None  # a sample's time, used when no --at was given


def bundled_cvm(kind: CvmSampleKind, *, given: list[str], gpu_sample: bool) -> CvmInput:
    """``--cvm-sample KIND``: the sample's evidence, collateral, report data and time.

    ``given`` names the ``--cvm-*`` options that were also given (refused: the sample
    brings its own). With NVIDIA's GPU sample, a note says the two are not bound.

    Raises:
        UsageError: another CVM option given.
    """
    from gpucc.core.errors import UsageError
    from gpucc.gpuattest.samples import cvm_sample

    from .output import note

    if given:
        raise UsageError(
            f"--cvm-sample brings its own evidence, collateral and report data: drop {given[0]}"
        )
    sample = cvm_sample(kind.value)
    if gpu_sample:
        note(
            f"the CVM sample ({kind.value}) and NVIDIA's GPU sample come from different "
            "machines: the CVM's report data is its own, not bound to the GPU's nonce"
        )
    at = sample.valid_at.isoformat().replace("+00:00", "Z")
    return CvmInput(sample.evidence, sample.collateral, sample.report_data, at)
