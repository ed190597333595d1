"""NVIDIA's H100 sample evidence, shipped with gpucc so that it can be verified anywhere.

The sample is NVIDIA's published set A (driver 545.00, VBIOS 96.00.5E.00.01): an SPDM report,
its device certificate chain, and the driver and VBIOS RIMs that measure it. Its RIM signing
certificates were valid on 2024-01-01 and have expired since, and NVIDIA publishes no stored
OCSP answers for it, so it verifies as trusted at :data:`SAMPLE_VALID_AT` under a policy that
does not require OCSP (:func:`sample_policy`), and as not trusted today.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from .collateral import FileRimSource
from .evidence import EvidenceSet, load_raw_evidence
from .policy import Policy, parse_policy

__all__ = ["SAMPLE_NONCE", "SAMPLE_VALID_AT", "Sample", "nvidia_h100_sample", "sample_policy"]

SAMPLE_NONCE = bytes.fromhex("4cff7f5380ead8fad8ec2c531c110aca4302a88f603792801a8ca29ee151af2e")
SAMPLE_VALID_AT = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Sample:
    """The bundled sample: evidence, the nonce its report carries, and its RIM files."""

    evidence: EvidenceSet
    nonce: bytes
    report_path: Path
    cert_chain_path: Path
    driver_rim_path: Path
    vbios_rim_path: Path

    @property
    def rims(self) -> FileRimSource:
        """The sample's two RIMs as a RIM source."""
        return FileRimSource(driver=self.driver_rim_path, vbios=self.vbios_rim_path)


def nvidia_h100_sample() -> Sample:
    """Load the bundled sample (files inside the installed package)."""
    base = Path(__file__).parent / "_samples"  # installed as files (see trust.py)

    def path(name: str) -> Path:
        return base / name

    report, chain = path("attestation-report.hex"), path("cert-chain.pem")
    return Sample(
        evidence=load_raw_evidence(report, chain),
        nonce=SAMPLE_NONCE,
        report_path=report,
        cert_chain_path=chain,
        driver_rim_path=path("driver-rim-545.00.swidtag"),
        vbios_rim_path=path("vbios-rim-1010_0200_882_96005E0001-test.swidtag"),
    )


def sample_policy() -> Policy:
    """The strict default policy, less OCSP (no stored answers exist for the sample)."""
    return parse_policy(
        {"ocsp": {"require": False}},
        source="sample default: OCSP not required (NVIDIA publishes no stored responses "
        "for the sample)",
    )
