"""Paths and constants for NVIDIA's real sample data (tests/data/nvidia-samples)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia-samples"
SET_A = DATA / "set-a-h100-545.00"
HEAD = DATA / "h100-550.90.07"
PROD = DATA / "vbios-rims-prod"

SET_A_REPORT = SET_A / "attestation-report.hex"
SET_A_CHAIN = SET_A / "cert-chain.pem"
SET_A_DRIVER_RIM = SET_A / "driver-rim-545.00.swidtag"
SET_A_VBIOS_RIM = SET_A / "vbios-rim-1010_0200_882_96005E0001-test.swidtag"
SET_A_PROD_VBIOS_RIM = PROD / "1010_0200_882_96005E0001_PROD.swidtag"
SET_A_NONCE = "4cff7f5380ead8fad8ec2c531c110aca4302a88f603792801a8ca29ee151af2e"
HEAD_REPORT = HEAD / "attestation-report.hex"
HEAD_CHAIN = HEAD / "cert-chain.pem"
HEAD_NONCE = "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb"

# Inside every set-A certificate's validity (attestation.md §14.3).
IN_WINDOW = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def report_bytes(path: Path) -> bytes:
    """The binary report from a hex sample file."""
    return bytes.fromhex(path.read_text().strip())


# NVSwitch LS10 (NVIDIA attestation-sdk): trusted between the RIM signer's notBefore and L3's notAfter.
SWITCH = DATA / "ls10-switch-96.10.55.00.01"
SWITCH_JSON = SWITCH / "switch_evidence_ls10.json"
SWITCH_REPORT = SWITCH / "attestation-report.hex"
SWITCH_CHAIN = SWITCH / "cert-chain.pem"
SWITCH_RIM = SWITCH / "NV_SWITCH_BIOS_5612_0002_890_9610550001.xml"
SWITCH_NONCE = HEAD_NONCE
SWITCH_FROM = dt.datetime(2026, 5, 20, 22, 2, 51, tzinfo=dt.UTC)
SWITCH_UNTIL = dt.datetime(2027, 11, 2, 23, 59, 59, tzinfo=dt.UTC)
SWITCH_AT = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)

# Blackwell B200 (NVIDIA attestation-sdk): no RIM exists for it.
B200 = DATA / "b200-575.32"
B200_REPORT = B200 / "attestation-report.hex"
B200_CHAIN = B200 / "cert-chain.pem"
B200_NONCE = HEAD_NONCE

# NVIDIA's current formats (NVIDIA attestation-sdk 2026.10.02): tests/data/nvidia-current.
CURRENT = DATA.parent / "nvidia-current"
RUBIN = CURRENT / "rubin-gr100-620.54"
RUBIN_NONCE = "0497d7698d84fbd3d06741ae70aa329337501f44d4c227421eb6454aefc654a8"
FSP = CURRENT / "blackwell-gb100-fsp"
FSP_NONCE = "d42a0594c5cd5743ee08fe5ec3cf884b1fac4f106879cda98b7d1c51652b04b7"
NVDAOD_H100 = CURRENT / "h100-nvdaod-620.12" / "transcript.hex"
NVDAOD_H100_NONCE = "50e4490df1dadcc80d42038cfc91c023f55f1cd914e540641bf770d7bdfe6f4e"
# The current vectors' certificates are valid from 2023 on with no end.
CURRENT_AT = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
