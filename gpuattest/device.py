"""Device profiles: what differs between the device kinds one verification outline serves.

:mod:`gpuattest.verifier` runs one outline for every NVIDIA device report (GPU or
NVSwitch, any generation). Everything that legitimately differs between kinds is a
value here, never a branch in the outline:

* how the report is read and which opaque fields it must have (``parse``: a strict
  GPU report, the SPDM layer alone, or a switch report) and how many measurement blocks
  it has when that is fixed (``expected_blocks``);
* the claim vocabulary (``x-nvidia-gpu-...`` or ``x-nvidia-switch-...``) and device type;
* the reference values: the RIM roles looked up (driver and VBIOS, or a switch's BIOS),
  or, where NVIDIA publishes a device's reference values only in a form gpucc does not
  read yet, the reason the measurements stay undecided;
* which GPU-only steps apply (NVML's self-reported versions, the CC state, the mode);
* whether the report carries a signed table of contents (block 0xFD).

:func:`gpu_profile` picks a GPU's profile once, from its ``arch`` and its leaf
certificate's common name (Blackwell's FSP responder and Rubin are recognised there);
switches have :data:`NVSWITCH`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .report import (
    Architecture,
    AttestationReport,
    EnvelopeReport,
    MeasurementBlock,
    OpaqueData,
)
from .switch_report import SwitchReport
from .x509chain import ChainProfile

__all__ = [
    "BLACKWELL_FSP",
    "DEVICE_CHAIN",
    "DEVICE_CHAIN_LENGTH",
    "GPU_GSP",
    "NVSWITCH",
    "RUBIN",
    "DeviceProfile",
    "DeviceReport",
    "RimRef",
    "RimRole",
    "gpu_profile",
    "leaf_common_name",
    "profile_for",
]

DEVICE_CHAIN_LENGTH = 5  # HopperSettings.MAX_CERT_CHAIN_LENGTH in NVIDIA's verifier
#: The device chain: leaf (FMC) to NVIDIA's Device Identity CA, any verifiable algorithm.
DEVICE_CHAIN = ChainProfile("GPU device", expected_length=DEVICE_CHAIN_LENGTH)
#: A switch's chain: the same root and length.
SWITCH_CHAIN = ChainProfile("NVIDIA", expected_length=DEVICE_CHAIN_LENGTH)


class DeviceReport(Protocol):
    """What the outline reads from any parsed device report."""

    @property
    def raw(self) -> bytes: ...
    @property
    def nonce(self) -> bytes: ...
    @property
    def blocks(self) -> Mapping[int, MeasurementBlock]: ...
    @property
    def opaque_data(self) -> OpaqueData: ...
    @property
    def signed_bytes(self) -> bytes: ...
    @property
    def signature(self) -> bytes: ...
    @property
    def fwid(self) -> bytes | None: ...
    @property
    def nvdec0_disabled(self) -> bool | None: ...
    def runtime_measurements(self) -> dict[int, bytes]: ...


@dataclass(frozen=True)
class RimRole:
    """One reference manifest a device has: its role (mismatch records name it), the
    check title and the claim stem."""

    role: str
    label: str
    claim: str


@dataclass(frozen=True)
class RimRef:
    """The RIM a report names for a role, and the version the RIM must state."""

    role: RimRole
    rim_id: str
    version: str


def _gpu_rims(report: Any, arch: Architecture | None) -> tuple[RimRef, ...]:
    r: AttestationReport = report
    return (
        RimRef(_DRIVER, r.driver_rim_id(arch or Architecture.HOPPER), r.driver_version),
        RimRef(_VBIOS, r.vbios_rim_id(), r.vbios_version),
    )


def _gpu_versions(report: Any) -> dict[str, str]:
    r: AttestationReport = report
    return {"driver-version": r.driver_version, "vbios-version": r.vbios_version}


def _switch_rims(report: Any, arch: Architecture | None) -> tuple[RimRef, ...]:
    r: SwitchReport = report
    return (RimRef(_BIOS, r.bios_rim_id(), r.bios_version),)


def _switch_versions(report: Any) -> dict[str, str]:
    r: SwitchReport = report
    return {"bios-version": r.bios_version}


def _no_rims(report: Any, arch: Architecture | None) -> tuple[RimRef, ...]:
    return ()


def _no_versions(report: Any) -> dict[str, str]:
    return {}


_DRIVER = RimRole("driver", "Driver RIM", "x-nvidia-gpu-driver-rim")
_VBIOS = RimRole("vbios", "VBIOS RIM", "x-nvidia-gpu-vbios-rim")
_BIOS = RimRole("bios", "Switch BIOS RIM", "x-nvidia-switch-bios-rim")


@dataclass(frozen=True)
class DeviceProfile:
    """The rules of one device kind (see the module documentation)."""

    name: str
    device_type: str
    noun: str
    kind_phrase: str
    claim_prefix: str
    architectures: frozenset[str]
    chain: ChainProfile
    parse: Callable[[bytes], DeviceReport]
    rims: Callable[[Any, Architecture | None], tuple[RimRef, ...]]
    versions: Callable[[Any], dict[str, str]]
    no_fwid_reason: str
    #: Reference values exist for this kind only in a form gpucc does not read yet: the
    #: measurements stay undecided with this reason ("" when its RIMs are XML RIMs).
    reference_values_missing: str = ""
    expected_blocks: int | None = None
    #: GPU steps: NVML's self-reported versions, the version policy, the CC state, the
    #: mode claim, the index-conflict claim of two RIMs.
    gpu_steps: bool = True
    #: The measurement block holding a signed table of contents, when the kind has one.
    toc_block: int | None = None

    def claim(self, name: str) -> str:
        """A claim name in this kind's vocabulary."""
        return self.claim_prefix + name

    def check_blocks(self, blocks: Mapping[int, Any]) -> None:
        """Raise UnsupportedFormatError when the block count differs from the fixed one.

        Raises:
            UnsupportedFormatError: a count other than :attr:`expected_blocks`.
        """
        from gpucc.core.errors import UnsupportedFormatError

        if self.expected_blocks is not None and len(blocks) != self.expected_blocks:
            raise UnsupportedFormatError(
                f"a {self.name} report has {self.expected_blocks} measurement blocks; this "
                f"one has {len(blocks)}, a layout gpucc does not read yet"
            )


_COREF_ONLY = (
    "reference values for {} are published only as CoRIMs, which gpucc does not read "
    "yet: the measurements cannot be judged"
)

GPU_GSP = DeviceProfile(
    name="GPU (GSP)",
    device_type="gpu",
    noun="GPU",
    kind_phrase="a GPU",
    claim_prefix="x-nvidia-gpu-",
    architectures=frozenset({Architecture.HOPPER.value, Architecture.BLACKWELL.value}),
    chain=DEVICE_CHAIN,
    parse=AttestationReport.parse,
    rims=_gpu_rims,
    versions=_gpu_versions,
    no_fwid_reason="the report carries no FWID (older firmware)",
)
BLACKWELL_FSP = DeviceProfile(
    name="Blackwell FSP",
    device_type="gpu",
    noun="GPU",
    kind_phrase="a Blackwell FSP",
    claim_prefix="x-nvidia-gpu-",
    architectures=frozenset({Architecture.BLACKWELL.value}),
    chain=DEVICE_CHAIN,
    parse=EnvelopeReport.parse,
    rims=_no_rims,
    versions=_no_versions,
    no_fwid_reason="the FSP report carries no opaque FWID",
    reference_values_missing=_COREF_ONLY.format("Blackwell FSP"),
    expected_blocks=52,
)
RUBIN = DeviceProfile(
    name="Rubin GPU",
    device_type="gpu",
    noun="GPU",
    kind_phrase="a Rubin GPU",
    claim_prefix="x-nvidia-gpu-",
    architectures=frozenset({Architecture.RUBIN.value}),
    chain=DEVICE_CHAIN,
    parse=AttestationReport.parse,
    rims=_gpu_rims,
    versions=_gpu_versions,
    no_fwid_reason="the report carries no FWID",
    reference_values_missing=_COREF_ONLY.format("Rubin"),
    toc_block=0xFD,
)
NVSWITCH = DeviceProfile(
    name="NVSwitch",
    device_type="nvswitch",
    noun="switch",
    kind_phrase="an NVSwitch",
    claim_prefix="x-nvidia-switch-",
    architectures=frozenset({"LS10"}),
    chain=SWITCH_CHAIN,
    parse=SwitchReport.parse,
    rims=_switch_rims,
    versions=_switch_versions,
    no_fwid_reason="the switch report carries no FWID (opaque type 20)",
    gpu_steps=False,
)

_FSP_LEAF = re.compile(r"^GB1\d\d\b.*\bFSP\b")
_RUBIN_LEAF = re.compile(r"^GR1\d\d\b")


def leaf_common_name(chain_pem: bytes) -> str:
    """The leaf's common name, read only to pick a profile ("" when the chain does not
    parse: the chain step then judges it)."""
    from gpucc.core.errors import GpuccError

    from ._internal.x509names import common_name
    from .chain import load_pem_chain

    try:
        certs = load_pem_chain(chain_pem)
    except GpuccError:
        return ""
    return common_name(certs[0]) if certs else ""


def profile_for(arch: str, chain_pem: bytes) -> DeviceProfile:
    """The profile of a device's evidence: NVSwitch for a switch architecture, else the
    GPU's (:func:`gpu_profile`)."""
    if arch.strip().upper() in NVSWITCH.architectures:
        return NVSWITCH
    return gpu_profile(arch, leaf_common_name(chain_pem))


def gpu_profile(arch: str, leaf_common_name: str) -> DeviceProfile:
    """A GPU's profile, decided once: Blackwell's FSP responder by its leaf (``GB100 A01
    FSP FMC LF``), Rubin by its architecture or leaf (``GR100 ...``), otherwise the GSP
    GPU (Hopper, Blackwell GSP)."""
    if _FSP_LEAF.match(leaf_common_name):
        return BLACKWELL_FSP
    if arch.strip().upper() == Architecture.RUBIN.value or _RUBIN_LEAF.match(leaf_common_name):
        return RUBIN
    return GPU_GSP
