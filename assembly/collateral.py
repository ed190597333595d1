"""Collateral CVM evidence came without: Intel's for a TDX quote, the chip's VCEK for an SNP report.

Fetched through the collateral cache (only the cache when the network settings say
offline), from Intel's PCS or the PCCS named, and AMD's KDS.
"""

from __future__ import annotations

import datetime as dt

from gpucc.gpuattest.cvm.vtpm_evidence import looks_like_vtpm_evidence
from gpucc.gpuattest.netconfig import NetworkSettings

__all__ = ["fetch_cvm_collateral"]


def _kds(network: NetworkSettings) -> str:
    """AMD's KDS, or the mirror the settings name."""
    from gpucc.gpuattest.cvm.snp_kds import DEFAULT_KDS_URL

    return network.kds_url or DEFAULT_KDS_URL


def fetch_cvm_collateral(
    evidence: bytes, network: NetworkSettings, *, now: dt.datetime, pccs_url: str | None = None
) -> bytes | None:
    """The collateral ``evidence`` needs, fetched: Intel's collateral as PCCS JSON for a TDX
    quote, the VCEK certificate for an SEV-SNP report.

    A malformed quote is reported as such before any network use.

    Raises:
        MalformedEvidenceError: the evidence is of no known kind or malformed.
        CollateralUnavailableError: the collateral cannot be had (offline and not cached,
            the service failed).
    """
    from gpucc.gpuattest.cvm.appraise import detect_kind
    from gpucc.gpuattest.cvm.findings import CvmKind
    from gpucc.gpuattest.netconfig import build_fetcher

    if looks_like_vtpm_evidence(evidence):
        return _vtpm_collateral(evidence, network, now=now, pccs_url=pccs_url)
    if detect_kind(evidence) is CvmKind.SNP:
        from gpucc.gpuattest.cvm.snp_kds import fetch_vcek

        if len(evidence) > 0x48 and (evidence[0x48] >> 2) & 0x7 == 1:
            return None  # a VLEK is the cloud's, not on AMD's KDS: given or from the host

        with build_fetcher(network) as fetcher:
            return fetch_vcek(
                evidence, fetcher=fetcher, cache=network.cache(), base_url=_kds(network)
            )
    from gpucc.gpuattest.cvm.pcs import INTEL_PCS_URL, tdx_collateral_for
    from gpucc.gpuattest.cvm.tdx import check_layout

    check_layout(evidence)
    with build_fetcher(network) as fetcher:
        found = tdx_collateral_for(
            evidence, fetcher, now=now, cache=network.cache(), base_url=pccs_url or INTEL_PCS_URL
        )
    return found.to_json()


def _vtpm_collateral(
    evidence: bytes, network: NetworkSettings, *, now: dt.datetime, pccs_url: str | None
) -> bytes | None:
    """vTPM evidence: SEV-SNP carries its VCEK (or the KDS has it); TDX needs Intel's
    collateral for its TD quote, and without it is verified as far as it can be (undecided)."""
    from gpucc.core.errors import CollateralUnavailableError
    from gpucc.gpuattest.cvm.pcs import INTEL_PCS_URL, tdx_collateral_for
    from gpucc.gpuattest.cvm.vtpm_evidence import parse_vtpm_evidence
    from gpucc.gpuattest.netconfig import build_fetcher

    parsed = parse_vtpm_evidence(evidence)
    if parsed.hcl.tee == "snp":
        if parsed.vcek is not None:
            return None
        from gpucc.gpuattest.cvm.snp_kds import fetch_vcek

        with build_fetcher(network) as fetcher:
            return fetch_vcek(
                parsed.hcl.hardware_report,
                fetcher=fetcher,
                cache=network.cache(),
                base_url=_kds(network),
            )
    quote = parsed.td_quote or b""
    try:
        with build_fetcher(network) as fetcher:
            found = tdx_collateral_for(
                quote, fetcher, now=now, cache=network.cache(), base_url=pccs_url or INTEL_PCS_URL
            )
    except CollateralUnavailableError:
        return None  # verified offline; the collateral check says what is missing
    return found.to_json()
