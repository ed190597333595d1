"""The policy file's ``cvm:`` section: which confidential-VM findings are acceptable.

Schema (every key optional; shown with its default)::

    cvm:
      accept_tcb_status: [UpToDate]  # any other status is a named relaxation
      accept_advisories: []          # advisory IDs accepted (every reported one must be listed)
      allow_debug: false             # a debuggable guest is refused (dcap-qvl refuses
                                     # debug TDs itself, so this relaxes SEV-SNP only)
      require_report_data: true      # false: accept evidence without an expected report data
      allow_gpu_only: false          # key release: accept GPU-only (protocol version 1) offers
      allow_unpinned: false          # key release: accept unpinned measurements
      measurements:                  # expected values (hex) per kind; none pinned by default
        tdx: {mrtd: ..., rtmr0: ..., rtmr1: ..., rtmr2: ..., rtmr3: ..., mrseam: ...}
        snp: {measurement: ..., host_data: ...}
      pcrs: {0: ..., 7: ...}         # vTPM evidence (Azure): expected SHA-256 PCR values by index
      allow_console: true            # vTPM evidence: false refuses a VM whose paravisor reports
                                     # its serial console enabled (vm-configuration)
      events:                        # events the event log must hold (none by default)
        tdx:                         # the TDX CC event log
          - {name: kernel, register: rtmr1, type: EV_EFI_BOOT_SERVICES_APPLICATION,
             digest: <96 hex: SHA-384>}
        vtpm:                        # a vTPM's measured-boot log (TPM 2.0, SHA-256 bank)
          - {name: kernel, register: pcr4, type: EV_EFI_BOOT_SERVICES_APPLICATION,
             digest: <64 hex: SHA-256>}

Measurements are the user's own image, so nothing is pinned by default: the values are
reported and the check is shown as "not pinned", a visible relaxation. A key-releasing holder
must pin them (or name the relaxation ``allow_unpinned``). On a paravisor CVM the
hardware measurement (``snp.measurement``, ``tdx.mrtd``) is the paravisor's launch
measurement; the guest's firmware, boot loader and kernel are measured into the vTPM's PCRs,
pinned by index under ``pcrs``. A key-releasing holder must pin both for vTPM evidence.

Events (``cvm.events.tdx``) pin what the RTMRs were extended with instead of the RTMRs
themselves: the evidence must come with the CC event log, the log must replay to the
quote's RTMRs, and then every listed event must be in the log (same register, type and
SHA-384 digest). For every register and type the policy names, the log may hold no other
event of that type in that register: a policy naming the kernel's boot application admits
no second kernel. Events the policy does not name are shown, not judged. A kernel update
changes one line (that event's digest); events count as pins for key release.

``cvm.events.vtpm`` does the same for vTPM evidence with its TPM measured-boot log: the log
is replayed into the SHA-256 bank and every PCR it extends must equal the quoted value; a
listed event counts only in a PCR that the log extends and the quote covers. Events stand in
for ``pcrs`` as the pins key release needs; the paravisor's hardware measurement must still
be pinned.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpucc.core.errors import MalformedPolicyError

__all__ = ["TCB_STATUSES", "CvmPolicy", "EventPin", "parse_cvm_policy"]

TCB_STATUSES = frozenset(
    {
        "UpToDate",
        "SWHardeningNeeded",
        "ConfigurationNeeded",
        "ConfigurationAndSWHardeningNeeded",
        "OutOfDate",
        "OutOfDateConfigurationNeeded",
        "Revoked",
    }
)
# Claim name -> length in bytes of the value a policy may pin.
PINNABLE: dict[str, dict[str, int]] = {
    "tdx": {
        "mrtd": 48,
        "rtmr0": 48,
        "rtmr1": 48,
        "rtmr2": 48,
        "rtmr3": 48,
        "mrseam": 48,
        "mrconfigid": 48,
        "mrowner": 48,
        "mrownerconfig": 48,
    },
    "snp": {"measurement": 48, "host_data": 32},
}
_EVENT_KINDS = frozenset({"tdx", "vtpm"})
_EVENT_KEYS = {"name", "register", "type", "digest"}
#: per kind: the registers events may name, how a reason names them, the digest's size
_EVENT_REGISTERS = {
    "tdx": (("rtmr0", "rtmr1", "rtmr2", "rtmr3"), "rtmr0..rtmr3", 48, "SHA-384"),
    "vtpm": (tuple(f"pcr{n}" for n in range(24)), "pcr0..pcr23", 32, "SHA-256"),
}
_KEYS = {
    "events",
    "accept_tcb_status",
    "accept_advisories",
    "allow_debug",
    "require_report_data",
    "measurements",
    "allow_gpu_only",
    "allow_unpinned",
    "pcrs",
    "allow_console",
}


@dataclass(frozen=True)
class EventPin:
    """One event the log must hold: register, type, digest (SHA-384 for an RTMR, SHA-256 for
    a PCR), and a label."""

    register: str
    event_type: int
    digest: str
    name: str = ""

    @property
    def label(self) -> str:
        """How checks name it: its name, or its type and register."""
        from .eventlog_decode import type_name

        return self.name or f"{type_name(self.event_type)} in {self.register.upper()}"

    def to_dict(self) -> dict[str, str]:
        """The policy file's form."""
        from .eventlog_decode import type_name

        doc = {"register": self.register, "type": type_name(self.event_type)}
        doc["digest"] = self.digest
        return {"name": self.name, **doc} if self.name else doc


@dataclass(frozen=True)
class CvmPolicy:
    """The ``cvm:`` section, parsed (see the module docstring)."""

    accept_tcb_status: frozenset[str] = frozenset({"UpToDate"})
    accept_advisories: frozenset[str] = frozenset()
    allow_debug: bool = False
    require_report_data: bool = True
    measurements: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    allow_gpu_only: bool = False
    allow_unpinned: bool = False
    pcrs: Mapping[int, str] = field(default_factory=dict)
    allow_console: bool = True
    events: Mapping[str, tuple[EventPin, ...]] = field(default_factory=dict)

    def event_pins(self, kind: str) -> tuple[EventPin, ...]:
        """The events the log of evidence of ``kind`` must hold."""
        return self.events.get(kind, ())

    def pins(self, kind: str) -> Mapping[str, str]:
        """The pinned values (lower-case hex) for evidence of ``kind``."""
        return self.measurements.get(kind, {})

    def to_dict(self) -> dict[str, Any]:
        """The effective section, as shown in JSON output."""
        return {
            "accept_tcb_status": sorted(self.accept_tcb_status),
            "accept_advisories": sorted(self.accept_advisories),
            "allow_debug": self.allow_debug,
            "require_report_data": self.require_report_data,
            "measurements": {k: dict(v) for k, v in sorted(self.measurements.items())},
            "allow_gpu_only": self.allow_gpu_only,
            "allow_unpinned": self.allow_unpinned,
            "pcrs": {str(i): v for i, v in sorted(self.pcrs.items())},
            "allow_console": self.allow_console,
            "events": {k: [e.to_dict() for e in v] for k, v in sorted(self.events.items())},
        }


def _strings(value: Any, where: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise MalformedPolicyError(f"policy key '{where}' must be a list of strings")
    return frozenset(value)


def _bool(doc: Mapping[str, Any], key: str, default: bool) -> bool:
    value = doc.get(key, default)
    if not isinstance(value, bool):
        raise MalformedPolicyError(f"policy key 'cvm.{key}' must be true or false")
    return value


def _measurements(value: Any) -> dict[str, dict[str, str]]:
    if not isinstance(value, dict):
        raise MalformedPolicyError("policy key 'cvm.measurements' must be a mapping")
    out: dict[str, dict[str, str]] = {}
    for kind, pins in value.items():
        if kind not in PINNABLE:
            raise MalformedPolicyError(f"unknown policy key 'cvm.measurements.{kind}'")
        if not isinstance(pins, dict):
            raise MalformedPolicyError(f"policy key 'cvm.measurements.{kind}' must be a mapping")
        out[kind] = {}
        for name, hexval in pins.items():
            where = f"cvm.measurements.{kind}.{name}"
            if name not in PINNABLE[kind]:
                raise MalformedPolicyError(f"unknown policy key '{where}'")
            size = PINNABLE[kind][name]
            try:
                ok = isinstance(hexval, str) and len(bytes.fromhex(hexval)) == size
            except ValueError:
                ok = False
            if not ok:
                raise MalformedPolicyError(f"policy key '{where}' must be {size * 2} hex digits")
            out[kind][name] = hexval.lower()
    return out


def _pcrs(value: Any) -> dict[int, str]:
    if not isinstance(value, dict):
        raise MalformedPolicyError("policy key 'cvm.pcrs' must be a mapping of PCR index to hex")
    out: dict[int, str] = {}
    for index, hexval in value.items():
        where = f"cvm.pcrs.{index}"
        try:
            number = int(str(index), 10)
        except ValueError:
            number = -1
        if isinstance(index, bool) or not 0 <= number <= 23 or number in out:
            raise MalformedPolicyError(f"policy key '{where}' is not a PCR index 0 to 23")
        try:
            ok = isinstance(hexval, str) and len(bytes.fromhex(hexval)) == 32
        except ValueError:
            ok = False
        if not ok:
            raise MalformedPolicyError(f"policy key '{where}' must be 64 hex digits (SHA-256)")
        out[number] = hexval.lower()
    return out


def _event(value: Any, where: str, kind_of_log: str) -> EventPin:
    from .eventlog_decode import type_value

    if not isinstance(value, dict):
        raise MalformedPolicyError(f"policy key '{where}' must be a mapping")
    for key in value:
        if key not in _EVENT_KEYS:
            raise MalformedPolicyError(f"unknown policy key '{where}.{key}'")
    name = value.get("name", "")
    register = value.get("register")
    kind = value.get("type")
    digest = value.get("digest")
    if not isinstance(name, str) or not name.isprintable() or len(name) > 64:
        raise MalformedPolicyError(f"policy key '{where}.name' must be a short printable string")
    registers, named, size, algorithm = _EVENT_REGISTERS[kind_of_log]
    if register not in registers:
        raise MalformedPolicyError(f"policy key '{where}.register' must be one of {named}")
    event_type = type_value(kind) if isinstance(kind, str) else None
    if event_type is None or event_type == 0x03:
        raise MalformedPolicyError(
            f"policy key '{where}.type' must name an event type (EV_IPL, 0x80000003, ...)"
            " that is extended (not EV_NO_ACTION)"
        )
    try:
        ok = isinstance(digest, str) and len(bytes.fromhex(digest)) == size
    except ValueError:
        ok = False
    if not ok:
        raise MalformedPolicyError(
            f"policy key '{where}.digest' must be {2 * size} hex digits ({algorithm})"
        )
    assert isinstance(digest, str)
    return EventPin(str(register), event_type, digest.lower(), name)


def _events(value: Any) -> dict[str, tuple[EventPin, ...]]:
    if not isinstance(value, dict):
        raise MalformedPolicyError("policy key 'cvm.events' must be a mapping")
    out: dict[str, tuple[EventPin, ...]] = {}
    for kind, items in value.items():
        if kind not in _EVENT_KINDS:
            raise MalformedPolicyError(
                f"unknown policy key 'cvm.events.{kind}' (event logs are replayed for tdx and vtpm)"
            )
        if not isinstance(items, list):
            raise MalformedPolicyError(f"policy key 'cvm.events.{kind}' must be a list")
        out[kind] = tuple(_event(v, f"cvm.events.{kind}[{n}]", kind) for n, v in enumerate(items))
    return out


def parse_cvm_policy(doc: Any) -> CvmPolicy:
    """Build a :class:`CvmPolicy` from the decoded ``cvm:`` mapping (None: the default).

    Raises:
        MalformedPolicyError: unknown keys, wrong types, unknown TCB statuses, bad hex.
    """
    if doc is None:
        return CvmPolicy()
    if not isinstance(doc, dict):
        raise MalformedPolicyError("policy key 'cvm' must be a mapping")
    for key in doc:
        if key not in _KEYS:
            raise MalformedPolicyError(f"unknown policy key 'cvm.{key}'")
    statuses = _strings(doc.get("accept_tcb_status", ["UpToDate"]), "cvm.accept_tcb_status")
    if unknown := statuses - TCB_STATUSES:
        names = ", ".join(sorted(unknown))
        raise MalformedPolicyError(f"cvm.accept_tcb_status names unknown statuses: {names}")
    if "Revoked" in statuses:
        raise MalformedPolicyError("cvm.accept_tcb_status cannot accept Revoked")
    return CvmPolicy(
        accept_tcb_status=statuses,
        accept_advisories=frozenset(
            a.upper() for a in _strings(doc.get("accept_advisories", []), "cvm.accept_advisories")
        ),
        allow_debug=_bool(doc, "allow_debug", False),
        require_report_data=_bool(doc, "require_report_data", True),
        measurements=_measurements(doc.get("measurements", {})),
        allow_gpu_only=_bool(doc, "allow_gpu_only", False),
        allow_unpinned=_bool(doc, "allow_unpinned", False),
        pcrs=_pcrs(doc.get("pcrs", {})),
        allow_console=_bool(doc, "allow_console", True),
        events=_events(doc.get("events", {})),
    )
