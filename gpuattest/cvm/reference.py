"""Reference values from an image: the ``cvm:`` policy section that admits exactly it.

* SEV-SNP: the launch measurement of a guest started from OVMF with a kernel, initrd and
  command line on a number of vCPUs of a type, computed by the ``sev-snp-measure`` package
  (virtee, the ``cvm-reference`` extra) exactly as QEMU and the AMD secure processor build it;
  gpucc does not compute it itself. The policy pins ``cvm.measurements.snp.measurement``.
* TDX: the events of a CC event log recorded from a boot of the image (the boot applications
  such as the kernel, the Linux stub's command line and initrd, grub's commands, Secure
  Boot's EFI variables) become ``cvm.events.tdx``, and the MRTD of that boot's quote is
  pinned. MRTD is not computed from TDVF here, and RTMR digests are not computed from the
  kernel file (its PE Authenticode hash): both are taken from a recorded boot.
* vTPM (Azure's paravisor CVMs): the same events of a TPM measured-boot log recorded from a
  boot of the image become ``cvm.events.vtpm`` (their PCRs, SHA-256 digests), and the
  paravisor's launch measurement from that boot's evidence is pinned.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from gpucc.core.errors import EnvironmentProblemError, MalformedEvidenceError

from .eventlog import CcEventLog

__all__ = [
    "MAX_IMAGE_BYTES",
    "REFERENCE_EVENT_TYPES",
    "ReferencePolicy",
    "SnpImage",
    "snp_launch_measurement",
    "snp_reference_policy",
    "tdx_reference_policy",
    "vcpu_types",
    "vtpm_reference_policy",
]

MAX_IMAGE_BYTES = 4 * 1024 * 1024 * 1024  # OVMF, a kernel, an initrd: each at most 4 GiB
_MAX_VCPUS = 512
#: The event types ``tdx_reference_policy`` pins by default: what changes with the image.
REFERENCE_EVENT_TYPES = (
    0x80000001,  # EV_EFI_VARIABLE_DRIVER_CONFIG: SecureBoot, PK, KEK, db, dbx
    0x80000003,  # EV_EFI_BOOT_SERVICES_APPLICATION: shim, grub, the kernel
    0x06,  # EV_EVENT_TAG: the Linux stub's command line and initrd
    0x0D,  # EV_IPL: grub's commands and command line
)
_LINUX_TAGS = {0x8F3B22EC: "cmdline", 0x8F3B22ED: "initrd"}


def _measure() -> Any:
    try:
        from sevsnpmeasure import guest, vcpu_types, vmm_types
        from sevsnpmeasure.sev_mode import SevMode
    except ImportError:
        raise EnvironmentProblemError(
            "computing an SEV-SNP launch measurement needs the sev-snp-measure package: "
            "pip install 'gpucc[cvm-reference]'"
        ) from None
    return guest, vcpu_types, vmm_types, SevMode


def vcpu_types() -> tuple[str, ...]:
    """The vCPU type names sev-snp-measure knows (QEMU's, e.g. ``EPYC-v4``, ``EPYC-Genoa``)."""
    return tuple(_measure()[1].CPU_SIGS)


@dataclass(frozen=True)
class SnpImage:
    """What an SEV-SNP guest is launched from.

    Attributes:
        ovmf: the OVMF firmware (built with SEV-SNP metadata).
        kernel, initrd, append: the direct-boot kernel, initrd and command line (measured
            through OVMF's SEV hashes table), or None.
        vcpus: the number of vCPUs.
        vcpu_type: the QEMU vCPU type (its CPUID signature goes into each VMSA).
        guest_features: the SEV features of the guest (sev-snp-measure's default 0x1).
        vmm: ``QEMU``, ``ec2`` or ``gce``.
    """

    ovmf: Path
    vcpus: int
    vcpu_type: str
    kernel: Path | None = None
    initrd: Path | None = None
    append: str | None = None
    guest_features: int = 0x1
    vmm: str = "QEMU"


def _check_file(path: Path, what: str) -> None:
    try:
        size = path.stat().st_size
    except OSError as exc:
        from gpucc.core.errors import FileAccessError

        raise FileAccessError(f"the {what} {path} cannot be read: {exc.strerror}") from None
    if size > MAX_IMAGE_BYTES:
        raise MalformedEvidenceError(f"the {what} {path} is larger than {MAX_IMAGE_BYTES} bytes")


def _check_ovmf(path: Path, *, with_kernel: bool) -> None:
    """OVMF must carry what an SEV-SNP launch needs (sev-snp-measure's own failures on an
    image without it are not all clear)."""
    from sevsnpmeasure.ovmf import OVMF

    try:
        ovmf = OVMF(str(path))
        ovmf.sev_es_reset_eip()
        items = ovmf.metadata_items()
        hashes = ovmf.is_sev_hashes_table_supported() if with_kernel else True
    except (RuntimeError, ValueError, IndexError):
        items, hashes = [], False
    if not items:
        raise MalformedEvidenceError(
            f"{path} is not an OVMF image with SEV-SNP metadata (its footer table or SEV "
            "metadata is missing or damaged)"
        )
    if not hashes:
        raise MalformedEvidenceError(
            f"{path} has no SEV hashes table: this OVMF cannot measure a direct-boot kernel"
        )


def snp_launch_measurement(image: SnpImage) -> bytes:
    """The 48-byte launch measurement sev-snp-measure computes for ``image``.

    Raises:
        EnvironmentProblemError: sev-snp-measure is not installed.
        UsageError: an unknown vCPU type or VMM, a vCPU count out of range, an initrd or
            command line without a kernel.
        FileAccessError: a file cannot be read.
        MalformedEvidenceError: an image is oversized, or OVMF has no SEV-SNP metadata.
    """
    from gpucc.core.errors import UsageError

    guest, types, vmms, mode = _measure()
    if image.vcpu_type not in types.CPU_SIGS:
        raise UsageError(f"unknown vCPU type {image.vcpu_type!r} (e.g. EPYC-v4, EPYC-Genoa)")
    if image.vmm not in vmms.VMMType.__members__:
        raise UsageError(f"unknown VMM {image.vmm!r} (QEMU, ec2, gce)")
    if not 1 <= image.vcpus <= _MAX_VCPUS:
        raise UsageError(f"the vCPU count must be 1..{_MAX_VCPUS}")
    if image.kernel is None and (image.initrd is not None or image.append is not None):
        raise UsageError("an initrd or a command line is measured with a kernel only")
    for path, what in (
        (image.ovmf, "OVMF image"),
        (image.kernel, "kernel"),
        (image.initrd, "initrd"),
    ):
        if path is not None:
            _check_file(path, what)
    _check_ovmf(image.ovmf, with_kernel=image.kernel is not None)
    try:
        digest: bytes = guest.calc_launch_digest(
            mode.SEV_SNP,
            image.vcpus,
            types.CPU_SIGS[image.vcpu_type],
            str(image.ovmf),
            str(image.kernel) if image.kernel is not None else None,
            str(image.initrd) if image.initrd is not None else None,
            image.append,
            image.guest_features,
            "",
            vmms.VMMType[image.vmm],
        )
    except (RuntimeError, ValueError, AssertionError, IndexError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise MalformedEvidenceError(
            f"the SEV-SNP launch digest cannot be computed: {text}"
        ) from None
    return digest


def snp_reference_policy(measurement: bytes, *, host_data: bytes | None = None) -> dict[str, Any]:
    """The ``cvm:`` section pinning an SEV-SNP launch measurement (and host data)."""
    pins = {"measurement": measurement.hex()}
    if host_data is not None:
        pins["host_data"] = host_data.hex()
    return {"measurements": {"snp": pins}}


def _event_name(event_type: int, data: bytes, register: str, seen: dict[str, int]) -> str:
    from .eventlog_decode import type_name

    base = ""
    if event_type == 0x06 and len(data) >= 4:
        base = _LINUX_TAGS.get(int.from_bytes(data[:4], "little"), "")
    elif event_type == 0x80000003:
        base = "boot-application"
    elif event_type == 0x0D:
        base = "ipl"
    elif event_type == 0x80000001 and len(data) >= 32:
        length = int.from_bytes(data[16:24], "little")
        name = data[32 : 32 + 2 * length].decode("utf-16-le", "replace")
        base = f"efi-{name}" if name.isprintable() and len(name) <= 40 else ""
    base = base or f"{type_name(event_type).lower()}-{register}"
    seen[base] = seen.get(base, 0) + 1
    return base if seen[base] == 1 else f"{base}-{seen[base]}"


def _reference_events(log: CcEventLog, types: Iterable[int]) -> list[dict[str, str]]:
    """The log's extending events of ``types``, as policy entries (register, type, digest)."""
    from .eventlog_decode import type_name

    wanted = set(types)
    seen: dict[str, int] = {}
    events = []
    for e in log.events:
        if e.register is None or e.event_type not in wanted or e.digest is None:
            continue
        events.append(
            {
                "name": _event_name(e.event_type, e.data, e.register, seen),
                "register": e.register,
                "type": type_name(e.event_type),
                "digest": e.digest.hex(),
            }
        )
    return events


def tdx_reference_policy(
    log: CcEventLog, *, mrtd: bytes | None, types: Iterable[int] = REFERENCE_EVENT_TYPES
) -> dict[str, Any]:
    """The ``cvm:`` section admitting the boot ``log`` recorded: its events of ``types`` (in
    their registers, with their SHA-384 digests) and, when given, the MRTD."""
    section: dict[str, Any] = {"events": {"tdx": _reference_events(log, types)}}
    if mrtd is not None:
        section["measurements"] = {"tdx": {"mrtd": mrtd.hex()}}
    return section


def vtpm_reference_policy(
    log: CcEventLog,
    *,
    launch: tuple[str, bytes] | None,
    types: Iterable[int] = REFERENCE_EVENT_TYPES,
) -> dict[str, Any]:
    """The ``cvm:`` section admitting the boot a TPM measured-boot ``log`` recorded: its
    events of ``types`` (in their PCRs, SHA-256 digests) and, when given, the paravisor's
    launch measurement (``("snp", measurement)`` or ``("tdx", mrtd)``).

    Raises:
        MalformedEvidenceError: ``log`` is not a TPM log (parsed with ``pcrs=True``).
    """
    if not log.pcr_log:
        raise MalformedEvidenceError("vTPM reference values come from a TPM measured-boot log")
    section: dict[str, Any] = {"events": {"vtpm": _reference_events(log, types)}}
    if launch is not None:
        kind, value = launch
        name = "measurement" if kind == "snp" else "mrtd"
        section["measurements"] = {kind: {name: value.hex()}}
    return section


@dataclass(frozen=True)
class ReferencePolicy:
    """A policy whose ``cvm:`` section pins a CVM image's reference values
    (``gpucc cvm reference-snp``, ``reference-tdx``, ``reference-vtpm``, ``reference-from``).

    Attributes:
        kind: the CVM kind it pins (``snp``, ``tdx``, ``vtpm``).
        policy: the policy document.
        output: the file it was written to (``None``: printed).
    """

    SCHEMA: ClassVar[str] = "gpucc.cvm.reference/v1"

    kind: str
    policy: dict[str, Any]
    output: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``gpucc.cvm.reference/v1`` document."""
        return {
            "schema": self.SCHEMA,
            "kind": self.kind,
            "policy": self.policy,
            "output": str(self.output) if self.output is not None else None,
        }
