"""A platform as front ends use it: one evidence source and one verifier, assembled once.

:func:`assemble` is where a front end's settings become the system: the command line,
the holder service, travel and DDP setup each call it (or build a
:class:`~gpucc.assembly.verifier.PlatformVerifier` alone when they only verify) and then
only call the result. The key-release protocol's callables (``collect``, ``collect_cvm``,
``attest``, ``attest_cvm``) come from here, never from a front end.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import sources
from .settings import Settings
from .verifier import PlatformEvidence, PlatformResult, PlatformVerifier

if TYPE_CHECKING:
    from pathlib import Path

    from gpucc.keyrelease.protocol import CollectedCvmEvidence, CollectedEvidence

    from .sources import EvidenceSource

__all__ = ["Platform", "assemble"]


@dataclass(frozen=True)
class Platform:
    """This machine's evidence source and the verifier that judges platforms."""

    source: EvidenceSource
    verifier: PlatformVerifier

    @property
    def simulated(self) -> bool:
        """True when the evidence or the trusted roots come from a simulation."""
        return self.source.simulated or self.verifier.settings.simulated

    def collect(self) -> Callable[[bytes], CollectedEvidence]:
        """The protocol's ``collect(nonce)``: this source's GPU evidence."""
        return lambda nonce: sources.collected(self.source, nonce)

    def collect_cvm(self) -> Callable[[bytes], CollectedCvmEvidence] | None:
        """The protocol's ``collect_cvm(report_data)``, or None for GPU-only offers."""
        if getattr(self.source, "gpu_only", False):
            return None
        source = self.source

        def collect(report_data: bytes) -> CollectedCvmEvidence:
            found = source.cvm_evidence(report_data)
            if found is None:
                from gpucc.core.errors import EnvironmentProblemError

                raise EnvironmentProblemError("this machine produced no CVM evidence")
            return found

        return collect

    def attest_self(self, *, nonce: bytes | None = None, with_cvm: bool = False) -> PlatformResult:
        """Collect this machine's evidence over a fresh (or given) nonce and verify it.

        With ``with_cvm`` the CVM's evidence is collected over the report data bound to the
        nonce and verified beside the GPUs'.
        """
        fresh = nonce if nonce is not None else os.urandom(32)
        gpus = self.source.gpu_evidence(fresh)
        cvm = None
        if with_cvm:
            from gpucc.gpuattest.cvm.appraise import attest_report_data

            cvm = self.source.cvm_evidence(attest_report_data(fresh))
        evidence = PlatformEvidence(
            gpus=gpus,
            cvm=cvm.evidence if cvm is not None else None,
            cvm_collateral=cvm.collateral if cvm is not None else None,
            source="simulated" if self.source.simulated else "nvml",
        )
        return self.verifier.verify(evidence, nonce=fresh)


def assemble(
    settings: Settings,
    *,
    gpu_only: bool = False,
    cvm_collateral: bytes | None = None,
    tsm_root: Path | None = None,
) -> Platform:
    """The platform for ``settings``: the evidence source (the simulation's when the
    settings name one, else this machine's) and the verifier."""
    source = sources.open_source(
        simulation=settings.simulation,
        gpu_only=gpu_only,
        cvm_collateral=cvm_collateral,
        tsm_root=tsm_root,
    )
    return Platform(source=source, verifier=PlatformVerifier(settings))
