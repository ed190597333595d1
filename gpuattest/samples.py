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

__all__ = [
    "CVM_SAMPLE_KINDS",
    "CVM_SAMPLE_VALID_AT",
    "SAMPLE_NONCE",
    "SAMPLE_VALID_AT",
    "CvmSample",
    "Sample",
    "cvm_sample",
    "nvidia_h100_sample",
    "sample_policy",
]

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


#: When the bundled CVM samples verify: the TDX quote's collateral (TCB info, QE identity,
#: CRLs) is valid then, and so is the SEV-SNP sample's VCEK (2023-04-03 to 2030-04-03) and
#: NVIDIA's H100 sample (its RIM signing certificates), so all three verify together.
CVM_SAMPLE_VALID_AT = dt.datetime(2025, 6, 19, 11, 16, 3, tzinfo=dt.UTC)
CVM_SAMPLE_KINDS = ("tdx", "snp")


@dataclass(frozen=True)
class CvmSample:
    """A bundled CVM sample: its evidence, its collateral and the report data it signs.

    ``tdx``: an Intel-signed TDX quote (version 4) and Intel's collateral for it, from
    dcap-qvl's test data (MIT). ``snp``: an SEV-SNP report from an EPYC Milan guest and its
    chip's VCEK, from virtee/sev (Apache-2.0). Their notices ship beside them.
    """

    kind: str
    evidence: bytes
    collateral: bytes
    report_data: bytes
    valid_at: dt.datetime


def cvm_sample(kind: str) -> CvmSample:
    """Load the bundled CVM sample ``kind`` (``tdx`` or ``snp``).

    Raises:
        ValueError: another kind.
    """
    if kind not in CVM_SAMPLE_KINDS:
        raise ValueError(f"no bundled CVM sample {kind!r} (there are: tdx, snp)")
    base = Path(__file__).parent / "_samples" / kind
    if kind == "tdx":
        quote = base.joinpath("quote.bin").read_bytes()
        # the TD report (1.0) follows the 48-byte header; its REPORTDATA is at 520..584
        return CvmSample(
            kind, quote, base.joinpath("collateral.json").read_bytes(), quote[568:632],
            CVM_SAMPLE_VALID_AT,
        )  # fmt: skip
    report = base.joinpath("report.bin").read_bytes()
    return CvmSample(
        kind, report, base.joinpath("vcek.der").read_bytes(), report[0x50:0x90],
        CVM_SAMPLE_VALID_AT,
    )  # fmt: skip
