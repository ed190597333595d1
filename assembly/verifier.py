"""The one platform verifier: every device's evidence and the CVM's, one verdict by one rule.

:meth:`PlatformVerifier.verify` is the call every front end makes, directly (``gpucc attest``,
the Python API) or through the key-release adapters :meth:`PlatformVerifier.gpu_attester`
and :meth:`PlatformVerifier.cvm_attester` (``session``, ``holder serve``, ``travel``, DDP
setup). Trust anchors, collateral and the clock come from :class:`Settings`, nowhere else.

The combination rule (:func:`gpucc.gpuattest.result.combine_verdicts`): a decided failure
anywhere makes the platform not trusted; otherwise anything undecided makes it undecided;
it is trusted only when every device and the CVM are.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpucc.gpuattest.result import combine_verdicts

from .parts import VERIFY_ORDER, Channel, GpuPart, Part, PartContext, PartKind
from .record import Roots, TrustRecord
from .result import PlatformEvidence, PlatformResult, relaxations_in
from .settings import Settings

if TYPE_CHECKING:
    from gpucc.gpuattest.collateral import OcspChecker, RimSource
    from gpucc.gpuattest.evidence import EvidenceSet
    from gpucc.gpuattest.trust import TrustRoots
    from gpucc.keyrelease.protocol import (
        AttestationOutcome,
        Attester,
        CvmAttester,
        CvmOutcome,
        GpuOutcome,
    )

__all__ = ["PlatformEvidence", "PlatformOutcome", "PlatformResult", "PlatformVerifier"]


class PlatformVerifier:
    """Verifies platforms under one :class:`Settings`; build it once, call it for each.

    Network collateral sources are built on first use and shared by later calls (a holder
    service verifies many offers); a simulation's roots are read at every call, so the
    simulation may be replaced while a service runs.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._collateral: tuple[RimSource, OcspChecker] | None = None

    # --- the one call ------------------------------------------------------------------

    def verify(
        self,
        evidence: PlatformEvidence,
        *,
        nonce: bytes | None = None,
        cvm_report_data: bytes | None = None,
        bind_report_data: bytes | None = None,
        release: bool = False,
    ) -> PlatformResult:
        """Verify every part's evidence (each device's, the CVM's), apply the policy, combine.

        The kind of each piece of evidence is decided once, here, by the settings' part
        registry (:class:`~gpucc.assembly.parts.PartRegistry`); each part is then verified
        by its kind.

        Args:
            evidence: what the platform presented.
            nonce: the 32-byte nonce every GPU report must carry (None: freshness cannot be
                established; the default policy refuses it).
            cvm_report_data: the bytes the CVM evidence must carry, exactly.
            bind_report_data: the 64 bytes of report data the CVM was asked to commit to;
                its kind binds them its way (a vTPM quote: its qualifying data). By default,
                with device evidence and a nonce,
                ``SHA-512('gpucc/attest/v1/cvm-report-data' || nonce)`` (what
                ``gpucc evidence collect --cvm`` asks for).
            release: a key-release decision: CVM measurements must be pinned unless the
                policy names the relaxation ``cvm.allow_unpinned``.

        Raises:
            UsageError: no evidence at all, or ``bind_report_data`` not 64 bytes.
            MalformedEvidenceError: malformed or oversized evidence or collateral, or
                evidence of no known kind.
            CollateralUnavailableError: collateral that could not be had (the simulation's
                roots; missing CVM collateral makes the CVM's result undecided instead).
        """
        settings = self.settings
        registry = settings.part_registry()
        pieces = registry.pieces(evidence.gpus, evidence.cvm, evidence.switches)
        now = settings.now()
        context = PartContext(
            policy=settings.policy,
            now=now,
            nonce=nonce,
            release=release,
            collateral=evidence.cvm_collateral,
            event_log=evidence.cvm_event_log,
            network=settings.network,
            pccs_url=settings.pccs_url,
            fetch_collateral=settings.fetch_cvm_collateral,
            replacing_collateral=settings.cvm_collateral,
            simulation=settings.simulation,
            tdx_root=settings.tdx_root,
            device_trust=self._gpu_trust,
            pieces=pieces,
        )
        derived = tuple(k for k in registry.of(Channel.DERIVED) if k.wanted(context))
        if not pieces and not derived:
            from gpucc.core.errors import UsageError

            raise UsageError("no evidence to verify")
        devices = any(p.kind.channel is Channel.DEVICE for p in pieces)
        cvm = any(p.kind.channel is Channel.CVM for p in pieces)
        if bind_report_data is not None and len(bind_report_data) != 64:
            from gpucc.core.errors import UsageError

            raise UsageError("the report data a CVM is bound to is 64 bytes")
        if cvm and bind_report_data is None and nonce is not None and devices:
            from gpucc.gpuattest.cvm.appraise import attest_report_data

            bind_report_data = attest_report_data(nonce)
        parts: list[Part] = []
        for channel in VERIFY_ORDER:
            work = [(p.kind, p.evidence) for p in pieces if p.kind.channel is channel]
            work += [(k, None) for k in derived if k.channel is channel]
            for kind, found in work:
                expected = cvm_report_data
                if expected is None and bind_report_data is not None:
                    expected = kind.bind_report_data(bind_report_data)
                at = replace(context, parts=tuple(parts), report_data=expected)
                parts.append(_verified(kind, found, at))
        ordered = tuple(p for channel in Channel for p in parts if p.kind.channel is channel)
        record = TrustRecord(
            relaxations=relaxations_in(ordered),
            verified_at=now,
            time_source=str(settings.time_source),
            time_origin=settings.at_origin or ("the caller" if settings.at is not None else ""),
            roots=self.roots,
        )
        named = (p.kind.evidence_source(p.result) for p in ordered)
        return PlatformResult(
            verdict=combine_verdicts([p.verdict for p in ordered]),
            parts=ordered,
            policy=settings.policy,
            verified_at=now,
            time_source=settings.time_source,
            simulated=settings.simulated,
            expected_nonce=nonce if devices else None,
            source=next((s for s in named if s is not None), evidence.source),
            record=record,
            slots=registry.slots,
        )

    @property
    def roots(self) -> Roots:
        """Whose trust anchors this verifier uses."""
        settings = self.settings
        if settings.simulation is not None:
            return Roots.SIMULATED
        if settings.roots is not None or settings.tdx_root is not None:
            return Roots.GIVEN
        return Roots.VENDOR

    def _release_time_is_now(self) -> None:
        """Key release is decided at the current time: a fixed time is refused.

        Raises:
            UsageError: the settings fix the verification time.
        """
        if self.settings.at is not None:
            from gpucc.core.errors import UsageError

            raise UsageError(
                "keys are released at the current time: a verification time "
                f"({self.settings.at_origin or 'at'}) cannot be used for key release"
            )

    # --- adapters for the key-release protocol -----------------------------------------

    @property
    def allow_gpu_only(self) -> bool:
        """The policy's named relaxation ``cvm.allow_gpu_only``: GPU-only offers accepted."""
        return self.settings.policy.cvm.allow_gpu_only

    def gpu_attester(self, on_result: Callable[[PlatformResult], None] | None = None) -> Attester:
        """The protocol's ``attest(evidence, nonce)``: :meth:`verify` on the GPU evidence.

        The protocol gets the GPUs' part of the result; ``on_result`` the whole of it.

        Raises:
            UsageError: the settings fix the verification time (key release is decided now).
        """
        self._release_time_is_now()

        def attest(gpus: Any, nonce: bytes) -> AttestationOutcome:
            result = self.verify(
                PlatformEvidence(gpus=gpus, source="offer"), nonce=nonce, release=True
            )
            if on_result is not None:
                on_result(result)
            # One verdict over every device part; each device's report as the offer listed it.
            devices = [d for p in result.parts for d in p.kind.devices(p.result)]
            return PlatformOutcome(result.trusted, result.reasons, in_offer_order(gpus, devices))

        return attest

    def cvm_attester(
        self, on_result: Callable[[PlatformResult], None] | None = None
    ) -> CvmAttester:
        """The protocol's ``attest_cvm(evidence, collateral, expected, event_log)``:
        :meth:`verify` on the CVM evidence (and its event log), measurements pinned unless
        ``cvm.allow_unpinned``. ``expected`` is the protocol's 64-byte binding value; the
        evidence's kind binds it its way (a vTPM quote carries it as its qualifying data).

        Raises:
            UsageError: the settings fix the verification time (key release is decided now).
        """
        self._release_time_is_now()

        def attest(
            evidence: bytes, collateral: bytes | None, expected: bytes, event_log: bytes | None
        ) -> CvmOutcome:
            result = self.verify(
                PlatformEvidence(
                    cvm=evidence,
                    cvm_collateral=collateral,
                    cvm_event_log=event_log,
                    source="offer",
                ),
                bind_report_data=expected,
                release=True,
            )
            if on_result is not None:
                on_result(result)
            part = next(p for p in result.parts if p.kind.channel is Channel.CVM)
            outcome: CvmOutcome = part.result
            return outcome

        return attest

    # --- the parts ---------------------------------------------------------------------

    def _gpu_trust(self) -> tuple[TrustRoots, RimSource, OcspChecker]:
        """The GPU roots and collateral sources: the simulation's, read now, or the
        vendor's with local RIM files first, then the network layer."""
        from gpucc.gpuattest.collateral import (
            CompositeRimSource,
            DirectoryRimSource,
            FileRimSource,
            NoOcsp,
        )

        settings = self.settings
        local: list[RimSource] = []
        if settings.driver_rim is not None or settings.vbios_rim is not None:
            local.append(FileRimSource(driver=settings.driver_rim, vbios=settings.vbios_rim))
        if settings.rim_dir is not None:
            local.append(DirectoryRimSource(settings.rim_dir))
        if settings.simulation is not None:
            roots = settings.roots or GpuPart().simulated_roots(settings.simulation)
            rims = CompositeRimSource([*local, DirectoryRimSource(settings.simulation / "rims")])
            return roots, rims, NoOcsp("simulated GPU: no OCSP responder")
        from gpucc.gpuattest.trust import TrustRoots

        roots = settings.roots or TrustRoots.nvidia()
        with self._lock:
            if self._collateral is None:
                from gpucc.gpuattest.netconfig import build_collateral

                self._collateral = build_collateral(settings.network, roots=roots)
            net_rims, ocsp = self._collateral
        return roots, CompositeRimSource([*local, net_rims]), ocsp


def _verified(kind: PartKind, evidence: Any, context: PartContext) -> Part:
    """One part verified by its kind."""
    from gpucc.core.errors import CollateralUnavailableError

    try:
        return Part(kind, kind.verify(evidence, context))
    except CollateralUnavailableError as exc:
        if kind.channel is Channel.CVM:
            exc.subject = exc.subject or "cvm"  # the hint names the CVM's remedies
        raise


@dataclass(frozen=True)
class PlatformOutcome:
    """What the key-release protocol sees of a platform's devices: the platform's one
    verdict and reasons, and every device of every device part (GPUs, NVSwitches, ...) as
    the offer listed its reports."""

    trusted: bool
    reasons: tuple[str, ...]
    gpus: Sequence[GpuOutcome]


def in_offer_order(evidence: EvidenceSet, devices: Sequence[GpuOutcome]) -> tuple[GpuOutcome, ...]:
    """``devices`` in the order the offer listed their reports (the transcript's order)."""
    import hashlib

    by_digest = {bytes(d.report_digest): d for d in devices}
    ordered = (by_digest.get(hashlib.sha256(e.report).digest()) for e in evidence.gpus)
    return tuple(d for d in ordered if d is not None)
