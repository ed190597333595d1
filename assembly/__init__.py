"""Where the system is assembled: evidence sources, settings, and the one platform verifier.

The layer above the attestation core (:mod:`gpucc.gpuattest`) and staging
(:mod:`gpucc.staging`), below every front end (the command line, the holder service,
travel, DDP setup). A front end turns its options into a :class:`Settings`, builds a
:class:`PlatformVerifier` (or, when it also produces evidence, a :class:`Platform` with
:func:`assemble`), and only calls it::

    from gpucc.assembly import PlatformEvidence, PlatformVerifier, Settings

    verifier = PlatformVerifier(Settings(policy=policy))
    result = verifier.verify(PlatformEvidence(gpus=evidence, cvm=quote), nonce=nonce)
    result.verdict  # one verdict over every GPU and the CVM

What a platform is made of (GPUs, NVSwitches, the CVM's TDX, SEV-SNP or vTPM evidence)
is a registry of part kinds (:mod:`gpucc.assembly.parts`), given as ``Settings(parts=...)``.

Front ends that produce evidence open it through :func:`gpucc.assembly.sources.open_source`
(by way of :func:`assemble`), the one place an evidence source is chosen.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import sources
    from .parts import PartKind, PartRegistry, default_parts
    from .platform import Platform, assemble
    from .result import PlatformEvidence, PlatformResult
    from .settings import Settings, TimeSource, select_policy, simulation_policy, utc_now
    from .sources import EvidenceSource, FileSource, LocalSource, SimulatedSource
    from .verifier import PlatformVerifier

#: Where each public name lives: loaded on first use, so importing the layer (every command
#: does) costs only what the command then uses.
_HOME = {
    **dict.fromkeys(("Platform", "assemble"), "platform"),
    **dict.fromkeys(
        ("Settings", "TimeSource", "select_policy", "simulation_policy", "utc_now"), "settings"
    ),
    **dict.fromkeys(("EvidenceSource", "FileSource", "LocalSource", "SimulatedSource"), "sources"),
    **dict.fromkeys(("PlatformEvidence", "PlatformResult"), "result"),
    **dict.fromkeys(("PartKind", "PartRegistry", "default_parts"), "parts"),
    "PlatformVerifier": "verifier",
}

__all__ = [
    "EvidenceSource",
    "FileSource",
    "LocalSource",
    "PartKind",
    "PartRegistry",
    "Platform",
    "PlatformEvidence",
    "PlatformResult",
    "PlatformVerifier",
    "Settings",
    "SimulatedSource",
    "TimeSource",
    "assemble",
    "default_parts",
    "select_policy",
    "simulation_policy",
    "sources",
    "utc_now",
]


def __getattr__(name: str) -> Any:
    if name == "sources":
        return importlib.import_module(f"{__name__}.sources")
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
