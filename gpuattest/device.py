"""Device profiles: what differs between the device kinds one verification outline serves.

:mod:`gpuattest.verifier` runs one outline for every NVIDIA device report (GPU or
NVSwitch, any generation). Everything that legitimately differs between kinds is a
value here, never a branch in the outline:

* how the report is read and which opaque fields it must have (``parse``: a strict
  GPU report, the SPDM layer alone, or a switch report) and how many measurement blocks
  it has when that is fixed (``expected_blocks``);
* the claim vocabulary (``x-nvidia-gpu-...`` or ``x-nvidia-switch-...``) and device type;
* the reference values: the XML RIM roles looked up (driver and VBIOS, or a switch's
  BIOS), or, where NVIDIA publishes a device's reference values only as CoRIMs, how
  their IDs are found (``corim_ids``: the signed table of contents' locators for Rubin,
  built from the model, APSKU and firmware-version hint for Blackwell's FSP);
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
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .report import (
    Architecture,
    AttestationReport,
    EnvelopeReport,
    MeasurementBlock,
    OpaqueData,
)
from .x509chain import ChainProfile

if TYPE_CHECKING:  # loaded for switches only (start-up)
    from .switch_report import SwitchReport

__all__ = [
    "BLACKWELL_FSP",
    "CorimIds",
    "CorimInputs",
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


class RimRole(NamedTuple):  # named tuples: made at every start-up, six times faster
    """One reference manifest a device has: its role (mismatch records name it), the
    check title and the claim stem."""

    role: str
    label: str
    claim: str


class RimRef(NamedTuple):
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


def _parse_switch(data: bytes) -> DeviceReport:
    from .switch_report import SwitchReport  # loaded for switches only (start-up)

    return SwitchReport.parse(data)


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
class CorimInputs:
    """What a CoRIM locator may be built from: the signed report (its blocks), the
    table of contents it carries, the leaf's common name and the evidence file's unsigned
    hints (which may only choose what is looked up, never decide)."""

    report: Any
    toc: Any
    leaf_common_name: str
    hints: Mapping[str, str]


@dataclass(frozen=True)
class CorimIds:
    """The IDs of a device's CoRIMs on NVIDIA's RIM service, with the role each has; or,
    when none can be named, why (``missing``)."""

    ids: tuple[tuple[str, str], ...]
    missing: str = ""


def _toc_corims(inputs: CorimInputs) -> CorimIds:
    ids: tuple[str, ...] = inputs.toc.rim_ids if inputs.toc is not None else ()
    if not ids:
        return CorimIds((), "the report's table of contents names no RIM locator")
    return CorimIds(tuple(("driver" if "DRIVER" in i.upper() else "vbios", i) for i in ids))


#: The FSP's device-identifier measurement block, which carries ``APSKU`` and its keyword.
FSP_IDENTIFIER_BLOCK = 52
_APSKU = b"APSKU"
# patterns, compiled on first use (re's cache): only a Blackwell FSP report needs them
_FW_HINT = r"^[0-9A-Fa-f]{2}(\.[0-9A-Fa-f]{2}){4}$"
_GB_MODEL = r"^GB\d{3}$"


def _fsp_corims(inputs: CorimInputs) -> CorimIds:
    """NVIDIA's VBIOS CoRIM ID for a Blackwell FSP: ``NV_GPU_VBIOS_<model>_<APSKU>_<fw>``
    (the model from the leaf, the APSKU keyword from block 52 as big-endian hex, the
    firmware version from the evidence's hint without dots), as NVIDIA's SDK builds it."""
    model = inputs.leaf_common_name.split(" ", 1)[0]
    block = inputs.report.blocks.get(FSP_IDENTIFIER_BLOCK)
    value: bytes = block.value if block is not None else b""
    at = value.find(_APSKU)
    fw = inputs.hints.get("fwversion", "")
    if not re.match(_GB_MODEL, model):
        return CorimIds((), f"the leaf names no Blackwell model ({inputs.leaf_common_name!r})")
    if at < 0 or len(value) < at + len(_APSKU) + 2:
        return CorimIds((), f"block {FSP_IDENTIFIER_BLOCK} carries no APSKU keyword")
    if not re.match(_FW_HINT, fw):
        return CorimIds(
            (),
            "the evidence gives no firmware-version hint (fwversion), which names the "
            "VBIOS CoRIM; give it with --vbios-rim or --rim-dir",
        )
    low, high = value[at + len(_APSKU)], value[at + len(_APSKU) + 1]
    sku = bytes([high, low]).hex().upper()
    return CorimIds((("vbios", f"NV_GPU_VBIOS_{model}_{sku}_{fw.replace('.', '')}"),))


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
    #: The kind's reference values are CoRIMs: how their IDs are found (None: XML RIMs).
    corim_ids: Callable[[CorimInputs], CorimIds] | None = None
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
    corim_ids=_fsp_corims,
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
    corim_ids=_toc_corims,
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
    parse=_parse_switch,
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
