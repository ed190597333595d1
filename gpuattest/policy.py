"""Appraisal policy: which results are acceptable.

The built-in default is strict: every check must pass, a nonce is required,
OCSP must answer ``good`` for every checked certificate, and evidence collected
from NVML needs CC on and DevTools off. A YAML policy file may relax named
items only; unknown keys, wrong types and unparseable YAML are malformed input.

Schema (every key optional; shown with its default)::

    version: 1
    nonce:
      require: true              # false: accept evidence without an expected nonce
    ocsp:
      require: true              # false: accept "not checked" OCSP results
      allow_unknown: false       # accept OCSP status "unknown"
      allow_hold: []             # chains where certificate_hold is accepted:
                                 # device, driver-rim, vbios-rim
      allow_nonce_mismatch: false  # accept responses without the nonce (caching proxies)
    rim:
      expired_signer_grace_days: 0  # accept a RIM whose L4 signer expired at most N days ago
      allow_unsigned_corim: false   # accept unsigned CoRIMs (a relaxation every output shows)
      corim_purpose: null           # the purpose a CoRIM-appraised device must name
                                    # ("CC MPT", "CC SPT", ...); null: the one it names
    measurements:
      allow_mismatch: []         # RIM indices whose mismatch is tolerated
    versions:
      min_driver: null           # e.g. "550.0"
      allowed_drivers: null      # list of exact driver versions
      allowed_vbios: null        # list of exact VBIOS versions (case-insensitive)
      min_svn: {}                # opaque type: lowest SVN, e.g. {37: 2}; the report's
                                 # entry must be an SVN (versioned opaque data) and reach it
    cc:
      require_cc_on: true        # NVML evidence only: CC feature must be on
      forbid_devtools: true      # NVML evidence only: DevTools mode must be off
    devices:
      allowed: null              # the GPUs and NVSwitches accepted, by the serial number of
                                 # their device leaf certificate (the ``ueid`` claim; decimal,
                                 # or hex with 0x); null: any device that verifies
    cvm: {}                      # confidential-VM evidence: see gpuattest.cvm.policy
    topology:
      ppcie: false               # true: GPUs and NVSwitches must form one Protected PCIe
                                 # machine (see gpuattest.topology for the checks)
      gpus: 8                    # GPUs on the board (8 on HGX H100/H200)
      switches: 4                # NVSwitches on the board (4 on HGX H100/H200)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucc.core.errors import MalformedPolicyError

from .cvm.policy import CvmPolicy, parse_cvm_policy
from .topology_policy import TopologyPolicy

__all__ = ["Policy", "load_policy", "parse_policy", "version_tuple"]

MAX_POLICY_BYTES = 64 * 1024
_CHAINS = frozenset({"device", "driver-rim", "vbios-rim"})


def version_tuple(text: str) -> tuple[int, ...]:
    """``"550.90.07"`` → ``(550, 90, 7)``.

    Raises:
        ValueError: a component is not a decimal number.
    """
    return tuple(int(part) for part in text.strip().split("."))


@dataclass(frozen=True)
class Policy:
    """A parsed appraisal policy (see the module docstring for the keys)."""

    require_nonce: bool = True
    require_ocsp: bool = True
    allow_ocsp_unknown: bool = False
    allow_hold: frozenset[str] = frozenset()
    allow_ocsp_nonce_mismatch: bool = False
    rim_expired_signer_grace: dt.timedelta = dt.timedelta(0)
    allow_unsigned_corim: bool = False
    corim_purpose: str | None = None
    allow_mismatch: frozenset[int] = frozenset()
    min_driver: str | None = None
    allowed_drivers: frozenset[str] | None = None
    allowed_vbios: frozenset[str] | None = None
    min_svn: Mapping[int, int] = field(default_factory=dict)
    require_cc_on: bool = True
    forbid_devtools: bool = True
    #: The devices accepted, by their leaf certificate's serial (decimal); None: any.
    allowed_devices: frozenset[str] | None = None
    cvm: CvmPolicy = field(default_factory=CvmPolicy)
    topology: TopologyPolicy = field(default_factory=TopologyPolicy)
    source: str = field(default="built-in strict default", compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The effective policy, as shown in JSON output."""
        return {
            "source": self.source,
            "nonce": {"require": self.require_nonce},
            "ocsp": {
                "require": self.require_ocsp,
                "allow_unknown": self.allow_ocsp_unknown,
                "allow_hold": sorted(self.allow_hold),
                "allow_nonce_mismatch": self.allow_ocsp_nonce_mismatch,
            },
            "rim": {
                "expired_signer_grace_days": self.rim_expired_signer_grace.days,
                **({"allow_unsigned_corim": True} if self.allow_unsigned_corim else {}),
                **({"corim_purpose": self.corim_purpose} if self.corim_purpose else {}),
            },
            "measurements": {"allow_mismatch": sorted(self.allow_mismatch)},
            "versions": {
                "min_driver": self.min_driver,
                "allowed_drivers": sorted(self.allowed_drivers)
                if self.allowed_drivers is not None
                else None,
                "allowed_vbios": sorted(self.allowed_vbios)
                if self.allowed_vbios is not None
                else None,
                **(
                    {"min_svn": {str(k): v for k, v in sorted(self.min_svn.items())}}
                    if self.min_svn
                    else {}
                ),
            },
            "cc": {"require_cc_on": self.require_cc_on, "forbid_devtools": self.forbid_devtools},
            "devices": {
                "allowed": sorted(self.allowed_devices)
                if self.allowed_devices is not None
                else None
            },
            "cvm": self.cvm.to_dict(),
            "topology": self.topology.to_dict(),
        }


_SCHEMA: dict[str, dict[str, type | tuple[type, ...]]] = {
    "nonce": {"require": bool},
    "ocsp": {
        "require": bool,
        "allow_unknown": bool,
        "allow_hold": list,
        "allow_nonce_mismatch": bool,
    },
    "rim": {
        "expired_signer_grace_days": int,
        "allow_unsigned_corim": bool,
        "corim_purpose": (str, type(None)),
    },
    "measurements": {"allow_mismatch": list},
    "versions": {
        "min_driver": (str, type(None)),
        "allowed_drivers": (list, type(None)),
        "allowed_vbios": (list, type(None)),
        "min_svn": dict,
    },
    "cc": {"require_cc_on": bool, "forbid_devtools": bool},
    "devices": {"allowed": (list, type(None))},
    "topology": {"ppcie": bool, "gpus": int, "switches": int},
}


def _section(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = doc.get(name, {})
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MalformedPolicyError(f"policy key '{name}' must be a mapping")
    allowed = _SCHEMA[name]
    for key, item in value.items():
        if key not in allowed:
            raise MalformedPolicyError(f"unknown policy key '{name}.{key}'")
        expected = allowed[key]
        # bool is an int subclass: refuse true/false where a number is expected.
        if isinstance(item, bool) and expected is int:
            raise MalformedPolicyError(f"policy key '{name}.{key}' must be a number")
        if not isinstance(item, expected):
            raise MalformedPolicyError(f"policy key '{name}.{key}' has the wrong type")
    return value


def _str_list(items: list[Any], where: str) -> frozenset[str]:
    if not all(isinstance(i, str) and i for i in items):
        raise MalformedPolicyError(f"policy key '{where}' must be a list of strings")
    return frozenset(items)


def _device_ids(items: list[Any]) -> frozenset[str]:
    """``devices.allowed``: serial numbers as decimal strings (hex with ``0x`` accepted)."""
    out: set[str] = set()
    for item in items:
        text = item.strip().lower() if isinstance(item, str) else ""
        try:
            value = int(text, 16) if text.startswith("0x") else int(text, 10)
        except ValueError:
            value = -1
        if not text or value < 0 or (not text.startswith("0x") and not text.isdigit()):
            raise MalformedPolicyError(
                "devices.allowed must list certificate serial numbers (decimal, or hex with 0x)"
            )
        out.add(str(value))
    return frozenset(out)


def parse_policy(doc: Any, *, source: str = "policy") -> Policy:
    """Build a :class:`Policy` from a decoded YAML document.

    Raises:
        MalformedPolicyError: unknown keys, wrong types or out-of-range values.
    """
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise MalformedPolicyError("a policy must be a YAML mapping")
    for key in doc:
        if key not in ("version", "cvm") and key not in _SCHEMA:
            raise MalformedPolicyError(f"unknown policy key '{key}'")
    version = doc.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version != 1:
        raise MalformedPolicyError("unsupported policy version (expected the integer 1)")
    nonce, ocsp, rim = _section(doc, "nonce"), _section(doc, "ocsp"), _section(doc, "rim")
    meas, ver, cc = _section(doc, "measurements"), _section(doc, "versions"), _section(doc, "cc")
    hold = _str_list(ocsp.get("allow_hold", []), "ocsp.allow_hold")
    if not hold <= _CHAINS:
        raise MalformedPolicyError(
            f"ocsp.allow_hold names unknown chains: {', '.join(sorted(hold - _CHAINS))}"
        )
    mismatch = meas.get("allow_mismatch", [])
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 256 for i in mismatch):
        raise MalformedPolicyError("measurements.allow_mismatch must list indices 0..255")
    grace = rim.get("expired_signer_grace_days", 0)
    if not 0 <= grace <= 3650:
        raise MalformedPolicyError("rim.expired_signer_grace_days must be 0..3650")
    purpose = rim.get("corim_purpose")
    if purpose is not None and not 0 < len(purpose) <= 64:
        raise MalformedPolicyError("rim.corim_purpose must be a purpose name such as 'CC MPT'")
    min_driver = ver.get("min_driver")
    if min_driver is not None:
        try:
            version_tuple(min_driver)
        except ValueError:
            raise MalformedPolicyError(
                f"versions.min_driver {min_driver!r} is not a version"
            ) from None
    topo = _section(doc, "topology")
    for key in ("gpus", "switches"):
        if not 1 <= topo.get(key, 1) <= 64:
            raise MalformedPolicyError(f"topology.{key} must be 1..64")
    drivers = ver.get("allowed_drivers")
    vbios = ver.get("allowed_vbios")
    min_svn = ver.get("min_svn", {})
    for key, floor in min_svn.items():
        if (
            isinstance(key, bool)
            or not isinstance(key, int)
            or not 1 <= key <= 254
            or isinstance(floor, bool)
            or not isinstance(floor, int)
            or not 0 <= floor < 2**64
        ):
            raise MalformedPolicyError(
                "versions.min_svn must map opaque types 1..254 to SVNs 0..2^64-1"
            )
    devices = _section(doc, "devices").get("allowed")
    return Policy(
        require_nonce=nonce.get("require", True),
        require_ocsp=ocsp.get("require", True),
        allow_ocsp_unknown=ocsp.get("allow_unknown", False),
        allow_hold=hold,
        allow_ocsp_nonce_mismatch=ocsp.get("allow_nonce_mismatch", False),
        rim_expired_signer_grace=dt.timedelta(days=grace),
        allow_unsigned_corim=rim.get("allow_unsigned_corim", False),
        corim_purpose=purpose,
        allow_mismatch=frozenset(mismatch),
        min_driver=min_driver,
        allowed_drivers=_str_list(drivers, "versions.allowed_drivers")
        if drivers is not None
        else None,
        allowed_vbios=frozenset(v.upper() for v in _str_list(vbios, "versions.allowed_vbios"))
        if vbios is not None
        else None,
        min_svn=dict(min_svn),
        require_cc_on=cc.get("require_cc_on", True),
        forbid_devtools=cc.get("forbid_devtools", True),
        allowed_devices=_device_ids(devices) if devices is not None else None,
        cvm=parse_cvm_policy(doc.get("cvm")),
        topology=TopologyPolicy(
            ppcie=topo.get("ppcie", False),
            gpus=topo.get("gpus", 8),
            switches=topo.get("switches", 4),
        ),
        source=source,
    )


def load_policy(path: Path) -> Policy:
    """Read and parse a YAML policy file.

    Raises:
        MalformedPolicyError: unreadable, oversized, not YAML, or invalid.
    """
    from gpucc.core.files import read_capped
    from gpucc.core.jsonio import load_yaml_untrusted

    data = read_capped(path, MAX_POLICY_BYTES, what="policy")
    if len(data) > MAX_POLICY_BYTES:
        raise MalformedPolicyError(f"policy {path} is larger than {MAX_POLICY_BYTES} bytes")
    doc = load_yaml_untrusted(data, what=f"policy {path}", error=MalformedPolicyError)
    return parse_policy(doc, source=str(path))
