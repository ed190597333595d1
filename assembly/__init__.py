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

Front ends that produce evidence open it through :func:`gpucc.assembly.sources.open_source`
(by way of :func:`assemble`), the one place an evidence source is chosen.
"""

from __future__ import annotations

from . import sources
from .platform import Platform, assemble
from .settings import Settings, TimeSource, simulation_policy, utc_now
from .sources import EvidenceSource, FileSource, LocalSource, SimulatedSource
from .verifier import PlatformEvidence, PlatformResult, PlatformVerifier

__all__ = [
    "EvidenceSource",
    "FileSource",
    "LocalSource",
    "Platform",
    "PlatformEvidence",
    "PlatformResult",
    "PlatformVerifier",
    "Settings",
    "SimulatedSource",
    "TimeSource",
    "assemble",
    "sources",
    "simulation_policy",
    "utc_now",
]
