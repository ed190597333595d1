"""What a verification is configured with: frozen settings, read once by a front end.

Every front end (the command line, the holder service, travel, DDP setup, the Python API)
turns its options into one :class:`Settings` and hands it to
:class:`gpucc.assembly.verifier.PlatformVerifier`. Nothing below reads options, the
environment or files on its own account, except the simulation directory, which a
simulation may replace while a service runs.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucc.gpuattest.netconfig import NetworkSettings
from gpucc.gpuattest.policy import Policy

if TYPE_CHECKING:
    from cryptography import x509

    from gpucc.gpuattest.trust import TrustRoots

    from .parts import PartRegistry

__all__ = ["Settings", "TimeSource", "select_policy", "simulation_policy", "utc_now"]


def utc_now() -> dt.datetime:
    """The system clock, timezone-aware (UTC)."""
    return dt.datetime.now(dt.UTC)


class TimeSource(enum.StrEnum):
    """Where a decision's verification time came from."""

    CLOCK = "clock"  # the system clock, read at each decision
    GIVEN = "given"  # a fixed time the caller chose (``--at``, ``GPUCC_AT``, the API's ``at``)


@dataclass(frozen=True)
class Settings:
    """Everything a platform verification is set up with.

    Attributes:
        policy: the appraisal policy (GPU checks and the ``cvm:`` section).
        network: where GPU collateral (RIMs, OCSP) and CVM collateral come from.
        rim_dir: a directory of RIMs consulted before the network.
        driver_rim, vbios_rim: RIM files used before anything else.
        roots: the GPU trust anchors; None: NVIDIA's (or the simulation's).
        tdx_root: the TDX trust anchor; None: Intel's (or the simulation's).
        simulation: a simulation's directory: its self-made GPU and TDX roots and RIMs are
            trusted instead of the vendors', read at each verification. Never a default.
        cvm_collateral: collateral for CVM evidence that replaces what the evidence came with.
        pccs_url: where TDX collateral comes from when fetched (None: Intel's PCS).
        fetch_cvm_collateral: fetch the collateral CVM evidence comes without (through the
            cache; only the cache when ``network.offline``).
        at: a fixed verification time; None: the clock at each decision.
        at_origin: where a fixed time came from, for the record (``--at``, ``GPUCC_AT``).
        clock: the clock read when ``at`` is None.
        parts: the platform part kinds evidence is recognised and verified as (None: the
            default kinds, :func:`gpucc.assembly.parts.default_parts`).
    """

    policy: Policy = field(default_factory=Policy)
    network: NetworkSettings = field(default_factory=NetworkSettings)
    rim_dir: Path | None = None
    driver_rim: Path | None = None
    vbios_rim: Path | None = None
    roots: TrustRoots | None = None
    tdx_root: x509.Certificate | None = None
    simulation: Path | None = None
    cvm_collateral: bytes | None = field(default=None, repr=False)
    pccs_url: str | None = None
    fetch_cvm_collateral: bool = True
    at: dt.datetime | None = None
    at_origin: str = ""
    clock: Callable[[], dt.datetime] = field(default=utc_now, repr=False)
    parts: PartRegistry | None = field(default=None, repr=False)

    def now(self) -> dt.datetime:
        """The verification time of a decision made now."""
        return self.at if self.at is not None else self.clock()

    def part_registry(self) -> PartRegistry:
        """The part kinds to verify with: ``parts``, else the default kinds."""
        if self.parts is not None:
            return self.parts
        from .parts import default_parts

        return default_parts()

    @property
    def time_source(self) -> TimeSource:
        """Whether decisions use the clock or a fixed time."""
        return TimeSource.CLOCK if self.at is None else TimeSource.GIVEN

    @property
    def simulated(self) -> bool:
        """True when a simulation's self-made roots are trusted."""
        return self.simulation is not None


def simulation_cvm_section() -> dict[str, Any]:
    """The ``cvm:`` policy section that pins the simulated TD image: its MRTD and the events
    of its boot (the simulated kernel, command line and initrd), as ``gpucc cvm
    reference-tdx`` writes them."""
    from gpucc.gpuattest.cvm.eventlog import parse_event_log
    from gpucc.gpuattest.cvm.reference import tdx_reference_policy
    from gpucc.gpuattest.cvm.tdx_sim import SIMULATED_MRTD, simulated_boot_log

    return tdx_reference_policy(parse_event_log(simulated_boot_log()), mrtd=SIMULATED_MRTD)


def simulation_policy() -> Policy:
    """The simulation's default policy: no OCSP (a simulation has no responder), the
    simulated TD image pinned (:func:`simulation_cvm_section`)."""
    from gpucc.gpuattest.policy import parse_policy

    document = {"ocsp": {"require": False}, "cvm": simulation_cvm_section()}
    return parse_policy(document, source="simulation default")


def select_policy(
    policy_file: Path | None,
    *,
    simulation: bool = False,
    default: Policy | None = None,
) -> Policy:
    """The policy a verification runs under: the policy file when one is given, else the
    simulation's (:func:`simulation_policy`) when a simulation's roots are trusted, else
    ``default`` (the library's default :class:`Policy` when none is given, as for NVIDIA's
    bundled sample its own). Every front end chooses its policy here.

    Raises:
        MalformedPolicyError, FileAccessError: the policy file cannot be read or parsed.
    """
    if policy_file is not None:
        from gpucc.gpuattest.policy import load_policy

        return load_policy(policy_file)
    if simulation:
        return simulation_policy()
    return default if default is not None else Policy()
