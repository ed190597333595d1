"""The confidential-VM side of ``gpucc session``: CVM evidence for offers, its check for answers.

The host collects its TDX quote or SNP report through configfs-tsm over the session's report
data (protocol version 2); ``--gpu-only`` makes a version-1 offer instead, which a holder
accepts only under the named relaxation ``cvm.allow_gpu_only``. With ``--simulate DIR`` a
simulated TDX platform stands in for the CVM: its root is written to DIR beside the simulated
GPU's, and the simulation's default policy pins the simulated TD image.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from gpucc.gpuattest.netconfig import NetworkSettings
    from gpucc.gpuattest.policy import Policy
    from gpucc.staging.release import CollectedCvmEvidence, CvmAttester, CvmOutcome

_PANEL = "Confidential VM"
_SIM_ROOT = "tdx_root.pem"

GpuOnlyOption = Annotated[
    bool,
    typer.Option(
        "--gpu-only",
        rich_help_panel=_PANEL,
        help="Offer GPU evidence alone (protocol version 1): no CVM evidence. A holder accepts "
        "it only under the named relaxation cvm.allow_gpu_only.",
    ),
]
CvmCollateralOption = Annotated[
    Path | None,
    typer.Option(
        "--cvm-collateral",
        exists=True,
        dir_okay=False,
        rich_help_panel=_PANEL,
        help="Collateral for the CVM evidence (TDX: Intel's, as a PCCS serves it; SNP: the "
        "VCEK). offer: sent with the offer; answer: used instead of the offer's.",
    ),
]


def cvm_collector(
    *, simulate: Path | None, collateral: Path | None, gpu_only: bool, tsm_root: Path | None = None
) -> Callable[[bytes], CollectedCvmEvidence] | None:
    """The host's CVM evidence source for :func:`staging.release.create_offer` (None: GPU only).

    Raises:
        MalformedEvidenceError: the collateral file is oversized.
        FileAccessError: it cannot be read.
    """
    from gpucc.gpuattest.cvm.tdx import MAX_COLLATERAL_BYTES
    from gpucc.gpuattest.files import read_capped
    from gpucc.staging.release import CollectedCvmEvidence

    if gpu_only:
        return None
    attached = None
    if collateral is not None:
        attached = read_capped(collateral, MAX_COLLATERAL_BYTES, what="CVM collateral")
    if simulate is not None:
        from cryptography.hazmat.primitives.serialization import Encoding

        from gpucc.gpuattest.cvm.tdx_sim import simulated_tdx

        now = dt.datetime.now(dt.UTC)
        platform = simulated_tdx(now)
        simulate.mkdir(parents=True, exist_ok=True)
        from gpucc.gpuattest.files import write_atomic

        root_pem = platform.root.public_bytes(Encoding.PEM)
        write_atomic(simulate / _SIM_ROOT, root_pem, force=True)  # holders may be reading it
        made = platform.collateral(issued=now - dt.timedelta(minutes=5)).to_json()
        return lambda report_data: CollectedCvmEvidence(platform.quote(report_data), made)

    from gpucc.gpuattest.cvm.findings import CvmKind
    from gpucc.gpuattest.cvm.tsm import DEFAULT_TSM_ROOT, collect_tsm_report

    def collect(report_data: bytes) -> CollectedCvmEvidence:
        from gpucc.gpuattest.errors import EnvironmentProblemError

        try:
            report = collect_tsm_report(report_data, root=tsm_root or DEFAULT_TSM_ROOT)
        except EnvironmentProblemError as exc:
            exc.hint = "--gpu-only offers GPU evidence alone; holders accept it only under the "
            exc.hint += "relaxation cvm.allow_gpu_only"
            raise
        if attached is None and report.kind is CvmKind.SNP and report.auxblob:
            from gpucc.gpuattest.cvm.snp_certs import vcek_from_auxblob

            # The host's certificate table: AMD-signed, checked by the holder like its own.
            return CollectedCvmEvidence(report.outblob, vcek_from_auxblob(report.auxblob))
        return CollectedCvmEvidence(report.outblob, attached)

    return collect


def simulation_policy() -> dict[str, Any]:
    """The simulation's default policy: no OCSP, the simulated TD image pinned."""
    from gpucc.gpuattest.cvm.tdx_sim import SIMULATED_MRTD

    return {
        "ocsp": {"require": False},
        "cvm": {"measurements": {"tdx": {"mrtd": SIMULATED_MRTD.hex()}}},
    }


def cvm_attester(
    *,
    simulate: Path | None,
    policy: Policy,
    collateral: Path | None,
    clock: Callable[[], dt.datetime],
    outcomes: list[CvmOutcome] | None,
    network: NetworkSettings | None = None,
    pccs_url: str | None = None,
) -> CvmAttester:
    """The holder's CVM check: the CVM verifier and the ``cvm:`` policy, measurements pinned
    unless ``cvm.allow_unpinned``; every verdict is appended to ``outcomes``.

    Raises:
        MalformedEvidenceError: the simulated root or the collateral file is malformed.
        FileAccessError: a file cannot be read.
    """
    from cryptography import x509

    from gpucc.gpuattest.cvm.appraise import verify_cvm_evidence
    from gpucc.gpuattest.cvm.tdx import MAX_COLLATERAL_BYTES
    from gpucc.gpuattest.errors import MalformedEvidenceError
    from gpucc.gpuattest.files import read_capped

    def simulated_root() -> x509.Certificate | None:
        # Read at each offer: a simulation may be replaced while a holder service runs.
        if simulate is None:
            return None
        try:
            return x509.load_pem_x509_certificate(
                read_capped(simulate / _SIM_ROOT, 64 * 1024, what="simulated TDX root")
            )
        except ValueError:
            raise MalformedEvidenceError(f"{simulate / _SIM_ROOT} is not a certificate") from None

    override = None
    if collateral is not None:
        override = read_capped(collateral, MAX_COLLATERAL_BYTES, what="CVM collateral")

    def attest(evidence: bytes, offered: bytes | None, expected: bytes) -> CvmOutcome:
        given = override if override is not None else offered
        if given is None and network is not None and simulate is None:
            given = _fetched(evidence, network, clock(), pccs_url)
        result = verify_cvm_evidence(
            evidence,
            given,
            now=clock(),
            policy=policy.cvm,
            expected_report_data=expected,
            tdx_root=simulated_root(),
            require_pins=not policy.cvm.allow_unpinned,
        )
        if outcomes is not None:
            outcomes.append(result)
        return result

    return attest


def _fetched(
    evidence: bytes, network: NetworkSettings, now: dt.datetime, pccs_url: str | None
) -> bytes | None:
    """Collateral the offer came without, through the cache: Intel's for a TDX quote (PCS or
    the PCCS named), the chip's VCEK for an SEV-SNP report (AMD's KDS)."""
    from gpucc.gpuattest.cvm.appraise import detect_kind
    from gpucc.gpuattest.cvm.findings import CvmKind
    from gpucc.gpuattest.cvm.pcs import INTEL_PCS_URL, tdx_collateral_for
    from gpucc.gpuattest.cvm.tdx import check_layout
    from gpucc.gpuattest.netconfig import build_fetcher

    if detect_kind(evidence) is CvmKind.SNP:
        from gpucc.gpuattest.cvm.snp_kds import fetch_vcek

        with build_fetcher(network) as fetcher:
            return fetch_vcek(evidence, fetcher=fetcher, cache=network.cache())
    check_layout(evidence)
    with build_fetcher(network) as fetcher:
        found = tdx_collateral_for(
            evidence, fetcher, now=now, cache=network.cache(), base_url=pccs_url or INTEL_PCS_URL
        )
    return found.to_json()
