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

import datetime as dt
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpucc.gpuattest.result import AttestationResult, combine_verdicts

from .devices import (
    PlatformOutcome,
    in_offer_order,
    split_devices,
    verify_switches,
    verify_topology,
)
from .record import Roots, TrustRecord
from .result import PlatformEvidence, PlatformResult, relaxations_in
from .settings import Settings

if TYPE_CHECKING:
    from cryptography import x509

    from gpucc.gpuattest.collateral import OcspChecker, RimSource
    from gpucc.gpuattest.cvm.appraise import CvmResult
    from gpucc.gpuattest.cvm.snp_roots import SnpRoots
    from gpucc.gpuattest.evidence import EvidenceSet
    from gpucc.gpuattest.trust import TrustRoots
    from gpucc.staging.release import AttestationOutcome, Attester, CvmAttester, GpuOutcome

__all__ = ["PlatformEvidence", "PlatformResult", "PlatformVerifier"]


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
        release: bool = False,
    ) -> PlatformResult:
        """Verify every device's evidence and the CVM's, apply the policy, combine.

        Args:
            evidence: what the platform presented.
            nonce: the 32-byte nonce every GPU report must carry (None: freshness cannot be
                established; the default policy refuses it).
            cvm_report_data: the 64 bytes the CVM evidence must sign. By default, with GPU
                evidence and a nonce, ``SHA-512('gpucc/attest/v1/cvm-report-data' || nonce)``
                (what ``gpucc evidence collect --cvm`` asks for).
            release: a key-release decision: CVM measurements must be pinned unless the
                policy names the relaxation ``cvm.allow_unpinned``.

        Raises:
            UsageError: no evidence at all.
            MalformedEvidenceError: malformed or oversized evidence or collateral.
            CollateralUnavailableError: collateral that could not be had (the simulation's
                roots; missing CVM collateral makes the CVM's result undecided instead).
        """
        settings = self.settings
        gpus, switches = split_devices(evidence.gpus, evidence.switches)
        ppcie = settings.policy.topology.ppcie
        if gpus is None and evidence.cvm is None and switches is None and not ppcie:
            from gpucc.core.errors import UsageError

            raise UsageError("no evidence to verify")
        now = settings.now()
        gpu = None
        if gpus is not None:
            gpu = self._verify_gpus(gpus, nonce, now)
        switch = None
        if switches is not None:
            switch = verify_switches(switches, nonce, now, self._gpu_trust(), settings.policy)
        topology = verify_topology(gpus, gpu, switch, settings.policy) if ppcie else None
        cvm = None
        if evidence.cvm is not None:
            expected = cvm_report_data
            if expected is None and nonce is not None and gpus is not None:
                from gpucc.gpuattest.cvm.appraise import attest_report_data
                from gpucc.gpuattest.cvm.vtpm_evidence import (
                    looks_like_vtpm_evidence,
                    vtpm_qualifying_data,
                )

                expected = attest_report_data(nonce)
                if looks_like_vtpm_evidence(evidence.cvm):
                    expected = vtpm_qualifying_data(expected)
            cvm = self._verify_cvm(
                evidence.cvm,
                evidence.cvm_collateral,
                expected,
                now,
                release=release,
                event_log=evidence.cvm_event_log,
            )
        verdicts = [r.verdict for r in (gpu, cvm, switch, topology) if r is not None]
        record = TrustRecord(
            relaxations=relaxations_in(gpu, cvm, switch),
            verified_at=now,
            time_source=str(settings.time_source),
            time_origin=settings.at_origin or ("the caller" if settings.at is not None else ""),
            roots=self.roots,
        )
        return PlatformResult(
            verdict=combine_verdicts(verdicts),
            gpu=gpu,
            cvm=cvm,
            policy=settings.policy,
            verified_at=now,
            time_source=settings.time_source,
            simulated=settings.simulated,
            expected_nonce=nonce if gpus is not None or switches is not None else None,
            source=gpu.source if gpu is not None else evidence.source,
            record=record,
            switch=switch,
            topology=topology,
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
            if result.switch is not None or result.topology is not None:
                # A PPCIe machine is one party: one verdict, every device's report.
                devices: list[GpuOutcome] = [*result.gpus]
                devices += result.switch.switches if result.switch is not None else ()
                return PlatformOutcome(
                    result.trusted, result.reasons, in_offer_order(gpus, devices)
                )
            assert result.gpu is not None  # GPU evidence was given
            return result.gpu

        return attest

    def cvm_attester(
        self, on_result: Callable[[PlatformResult], None] | None = None
    ) -> CvmAttester:
        """The protocol's ``attest_cvm(evidence, collateral, expected, event_log)``:
        :meth:`verify` on the CVM evidence (and its event log), measurements pinned unless
        ``cvm.allow_unpinned``.

        Raises:
            UsageError: the settings fix the verification time (key release is decided now).
        """
        self._release_time_is_now()

        def attest(
            evidence: bytes, collateral: bytes | None, expected: bytes, event_log: bytes | None
        ) -> CvmResult:
            result = self.verify(
                PlatformEvidence(
                    cvm=evidence,
                    cvm_collateral=collateral,
                    cvm_event_log=event_log,
                    source="offer",
                ),
                cvm_report_data=expected,
                release=True,
            )
            if on_result is not None:
                on_result(result)
            assert result.cvm is not None  # CVM evidence was given
            return result.cvm

        return attest

    # --- the parts ---------------------------------------------------------------------

    def _verify_gpus(
        self, evidence: EvidenceSet, nonce: bytes | None, now: dt.datetime
    ) -> AttestationResult:
        from gpucc.gpuattest.verifier import verify

        roots, rims, ocsp = self._gpu_trust()
        return verify(
            evidence,
            expected_nonce=nonce,
            roots=roots,
            now=now,
            rims=rims,
            ocsp=ocsp,
            policy=self.settings.policy,
        )

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
            roots = settings.roots or _simulated_gpu_roots(settings.simulation)
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

    def _verify_cvm(
        self,
        evidence: bytes,
        offered: bytes | None,
        expected: bytes | None,
        now: dt.datetime,
        *,
        release: bool,
        event_log: bytes | None = None,
    ) -> CvmResult:
        from gpucc.core.errors import CollateralUnavailableError
        from gpucc.gpuattest.cvm.appraise import verify_cvm_evidence

        settings = self.settings
        collateral = settings.cvm_collateral if settings.cvm_collateral is not None else offered
        problem = ""
        if collateral is None and settings.fetch_cvm_collateral and settings.simulation is None:
            from .collateral import fetch_cvm_collateral

            try:
                collateral = fetch_cvm_collateral(
                    evidence, settings.network, now=now, pccs_url=settings.pccs_url
                )
            except CollateralUnavailableError as exc:
                # The evidence is still judged: a check that ran and failed (report data,
                # debug, measurements, a signature, an event log) is a decided refusal,
                # whatever the collateral would have said; the rest stays undecided.
                problem = str(exc)
        tdx_root = settings.tdx_root
        snp_roots = None
        rootless: CollateralUnavailableError | None = None
        if settings.simulation is not None:
            from gpucc.gpuattest.cvm.appraise import detect_kind
            from gpucc.gpuattest.cvm.findings import CvmKind
            from gpucc.gpuattest.cvm.snp_roots import SnpRoots

            if detect_kind(evidence) is CvmKind.SNP:
                try:
                    snp_roots = _simulated_snp_roots(settings.simulation)
                except CollateralUnavailableError as exc:
                    # still read the evidence first: what does not parse is malformed input
                    # (400 at a holder), whatever roots the simulation lacks
                    rootless, snp_roots = exc, SnpRoots(())
            elif tdx_root is None:
                tdx_root = _simulated_tdx_root(settings.simulation)
        policy = settings.policy
        try:
            result = verify_cvm_evidence(
                evidence,
                collateral,
                now=now,
                policy=policy.cvm,
                expected_report_data=expected,
                tdx_root=tdx_root,
                snp_roots=snp_roots,
                require_pins=release and not policy.cvm.allow_unpinned,
                event_log=event_log,
                collateral_problem=problem,
            )
            if rootless is not None:
                raise rootless
            return result
        except CollateralUnavailableError as exc:
            exc.subject = exc.subject or "cvm"  # the hint names the CVM's remedies
            raise


def _simulated_gpu_roots(directory: Any) -> TrustRoots:
    """The simulated GPU's roots, read now (the simulation may have been replaced).

    Raises:
        CollateralUnavailableError: they cannot be read.
    """
    from gpucc.core.errors import CollateralUnavailableError
    from gpucc.gpuattest.trust import TrustRoots

    try:
        return TrustRoots.from_pem(
            (directory / "device_root.pem").read_bytes(), (directory / "rim_root.pem").read_bytes()
        )
    except OSError as exc:
        raise CollateralUnavailableError(
            f"the simulated GPU's roots cannot be read: {exc.strerror or exc}"
        ) from None


#: A simulation's SEV-SNP anchors: per product line, a file with its ARK then its ASK (PEM).
SIMULATED_SNP_ROOTS = "snp_{product}.pem"


def _simulated_snp_roots(directory: Any) -> SnpRoots:
    """The simulated SEV-SNP product lines' ARK and ASK, read now. As with TDX, a simulation
    is never judged against AMD's roots.

    Raises:
        CollateralUnavailableError: the simulation wrote no SEV-SNP roots.
        MalformedCertificateError: a file is not an ARK and an ASK.
    """
    from gpucc.core.errors import CollateralUnavailableError
    from gpucc.core.files import read_capped
    from gpucc.gpuattest.cvm.snp_report import SnpProduct
    from gpucc.gpuattest.cvm.snp_roots import SnpRoots

    pems: dict[SnpProduct, tuple[bytes, ...]] = {}
    for product in SnpProduct:
        path = directory / SIMULATED_SNP_ROOTS.format(product=product.value.lower())
        if path.exists():
            data = read_capped(path, 64 * 1024, what="simulated SEV-SNP roots")
            marker = b"-----BEGIN CERTIFICATE-----"
            pems[product] = tuple(marker + part for part in data.split(marker)[1:])
    if not pems:
        raise CollateralUnavailableError(
            f"the simulation in {directory} has no SEV-SNP roots (snp_milan.pem, ...): its "
            "CVM evidence cannot be judged"
        )
    return SnpRoots.from_pem(pems)


def _simulated_tdx_root(directory: Any) -> x509.Certificate:
    """The simulated TDX platform's root, read now. A simulation is never judged against
    Intel's root (which would report a simulated quote as foreign, not as simulated).

    Raises:
        CollateralUnavailableError: the simulation wrote no TDX root (yet).
        MalformedEvidenceError: the file is not a certificate.
    """
    from gpucc.core.errors import CollateralUnavailableError, MalformedEvidenceError
    from gpucc.core.files import read_capped
    from gpucc.gpuattest.x509chain import load_certificate

    path = directory / "tdx_root.pem"
    if not path.exists():
        raise CollateralUnavailableError(
            f"the simulation in {directory} has no TDX root (tdx_root.pem): its CVM evidence "
            "cannot be judged"
        )
    return load_certificate(
        read_capped(path, 64 * 1024, what="simulated TDX root"),
        what=f"{path}",
        error=MalformedEvidenceError,
    )
