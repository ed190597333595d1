"""Where evidence comes from: the local GPUs and CVM, files, or a simulation, behind one interface.

An :class:`EvidenceSource` answers two questions for a front end that must *produce*
evidence (``gpucc attest`` without files, ``session offer``/``local``, ``travel run``,
DDP setup): the GPUs' evidence for a nonce, and the CVM's evidence for 64 bytes of report
data (None when the source has no CVM, or GPU-only evidence was asked for).

* :class:`LocalSource`: NVML for the GPUs, configfs-tsm for the CVM, or, under a paravisor
  (no configfs-tsm report, the HCL report's NV index in the TPM), the vTPM.
* :class:`SimulatedSource`: a simulated GPU and a simulated TDX platform under the
  self-made roots of a directory (shared by every source given it), which it writes there
  for the verifying side to read. It attests nothing real.
* :class:`FileSource`: evidence already collected (files, or an ``EvidenceSet``).
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from .settings import utc_now

if TYPE_CHECKING:
    from gpucc.gpuattest.cvm.tdx_sim import SimulatedTdx
    from gpucc.gpuattest.evidence import EvidenceSet
    from gpucc.keyrelease.protocol import CollectedCvmEvidence, CollectedEvidence

__all__ = [
    "SIMULATED_FILES",
    "EvidenceSource",
    "FileSource",
    "LocalSource",
    "SimulatedSource",
    "missing_simulation_files",
    "open_source",
    "switch_evidence",
]

#: Where Linux exposes the TDX CC event log (the ACPI CCEL table's log area).
CCEL_PATH = Path("/sys/firmware/acpi/tables/data/CCEL")
#: RTMR3's runtime events (:mod:`gpucc.gpuattest.cvm.gpu_event`), sent after the CCEL's.
RUNTIME_LOG_PATH = Path("/run/gpucc/rtmr3-events")


def read_event_log(path: Path) -> bytes | None:
    """The CC event log at ``path`` up to its end (the region's zero or ``0xFF`` fill left
    out), or None when there is none. A log that does not parse is sent whole: the verifier, not
    the collector, refuses it.

    Raises:
        FileAccessError: it exists but cannot be read.
    """
    from gpucc.core.errors import MalformedEvidenceError
    from gpucc.core.files import read_capped
    from gpucc.gpuattest.cvm.eventlog import MAX_EVENT_LOG_BYTES, parse_event_log

    if not path.exists():
        return None
    data = read_capped(path, MAX_EVENT_LOG_BYTES, what="CC event log")
    try:
        return data[: parse_event_log(data).end]
    except MalformedEvidenceError:
        return data


#: What a simulation directory holds for the verifying side: the GPU's roots and RIMs, and
#: the TDX platform's root.
SIMULATED_FILES = ("device_root.pem", "rim_root.pem", "rims", "tdx_root.pem")
_GPU_FILES = SIMULATED_FILES[:3]


def missing_simulation_files(directory: Path, *, cvm: bool = False) -> list[str]:
    """The files a simulation directory lacks for verifying (the TDX root only with ``cvm``)."""
    wanted = SIMULATED_FILES if cvm else _GPU_FILES
    # os.path.exists: a name the system refuses (too long, a NUL) is missing, not an OSError
    return [name for name in wanted if not os.path.exists(directory / name)]


class EvidenceSource(Protocol):
    """Produces evidence bound to the freshness values it is given."""

    @property
    def simulated(self) -> bool:
        """True when the evidence comes from a simulation (never trust it in production)."""
        ...

    def gpu_evidence(self, nonce: bytes) -> EvidenceSet:
        """Every GPU's evidence over ``nonce``."""
        ...

    def cvm_evidence(self, report_data: bytes) -> CollectedCvmEvidence | None:
        """The CVM's evidence over ``report_data`` (64 bytes), or None: no CVM evidence."""
        ...


def _cvm_collected(
    evidence: bytes, collateral: bytes | None = None, event_log: bytes | None = None
) -> CollectedCvmEvidence:
    """The key-release protocol's form of CVM evidence (imported when first needed: the
    protocol's modules are not part of every command's start-up)."""
    from gpucc.keyrelease.protocol import CollectedCvmEvidence

    return CollectedCvmEvidence(evidence, collateral, event_log)


def collected(source: EvidenceSource, nonce: bytes) -> CollectedEvidence:
    """The source's GPU evidence in the key-release protocol's form."""
    from gpucc.keyrelease.protocol import CollectedEvidence

    return CollectedEvidence.from_evidence_set(source.gpu_evidence(nonce))


@dataclass(frozen=True)
class LocalSource:
    """This machine: the GPUs through NVML, the CVM through configfs-tsm or its vTPM.

    Attributes:
        gpu_only: produce no CVM evidence.
        cvm_collateral: collateral sent with the CVM evidence (TDX: Intel's; SNP: the VCEK);
            by default an SEV-SNP host's own certificate table supplies the VCEK. Under a
            paravisor it is the VCEK the vTPM evidence carries (required there).
        tsm_root: configfs-tsm's mount point (None: the standard one).
        tpm_tcti: the TPM's TCTI for paravisor collection (None: ``device:/dev/tpmrm0``).
        runtime_log_path: RTMR3's runtime event records, appended to the CC event log sent.
        td_quote_url: a TDX paravisor's quote endpoint (None: Azure's,
            :data:`~gpucc.gpuattest.cvm.azure_tdquote.AZURE_TD_QUOTE_URL`).
        nscq_library: NVIDIA's NSCQ library for switch evidence (a path or name; None: the
            system's ``libnvidia-nscq``).
    """

    gpu_only: bool = False
    cvm_collateral: bytes | None = field(default=None, repr=False)
    tsm_root: Path | None = None
    tpm_tcti: str | None = None
    td_quote_url: str | None = None
    event_log_path: Path = CCEL_PATH
    runtime_log_path: Path = RUNTIME_LOG_PATH
    nscq_library: str | None = None
    simulated: bool = field(default=False, init=False)

    def switch_evidence(self, nonce: bytes) -> EvidenceSet:
        """NSCQ evidence of every local NVSwitch (LS10), nvattest's way.

        Raises:
            EnvironmentProblemError: NSCQ is not installed (``NscqUnavailableError``), finds no
                switch, or fails.
        """
        from gpucc.gpuattest.nscq import collect_switch_evidence

        return collect_switch_evidence(nonce, library=self.nscq_library)

    def gpu_evidence(self, nonce: bytes) -> EvidenceSet:
        """NVML evidence of every local GPU.

        Raises:
            EnvironmentProblemError: no NVML, no GPU, or CC mode off.
        """
        from gpucc.gpuattest.nvml import collect_evidence

        return collect_evidence(nonce)

    def cvm_evidence(self, report_data: bytes) -> CollectedCvmEvidence | None:
        """This CVM's TDX quote or SNP report through configfs-tsm; without configfs-tsm,
        under a paravisor, its vTPM evidence (``gpucc.vtpm/v1``) whose TPM quote carries
        :meth:`~gpucc.assembly.parts.VtpmPart.bind_report_data` of ``report_data``.

        Raises:
            EnvironmentProblemError: neither a configfs-tsm report interface nor a paravisor's
                vTPM, or the vTPM could not quote.
        """
        if self.gpu_only:
            return None
        from gpucc.core.errors import EnvironmentProblemError
        from gpucc.gpuattest.cvm.findings import CvmKind
        from gpucc.gpuattest.cvm.tsm import DEFAULT_TSM_ROOT, collect_tsm_report

        try:
            report = collect_tsm_report(report_data, root=self.tsm_root or DEFAULT_TSM_ROOT)
        except EnvironmentProblemError as exc:
            vtpm = self._vtpm_evidence(report_data)
            if vtpm is not None:
                return vtpm
            exc.hint = exc.hint or (
                "--gpu-only offers GPU evidence alone; holders accept it only under the "
                "relaxation cvm.allow_gpu_only"
            )
            raise
        if self.cvm_collateral is None and report.kind is CvmKind.SNP and report.auxblob:
            from gpucc.gpuattest.cvm.snp_certs import endorsement_from_auxblob

            # The host's certificate table (the VCEK, or a cloud's VLEK): AMD-signed, checked
            # by the verifier like its own.
            endorsement = endorsement_from_auxblob(report.auxblob, report.outblob)
            return _cvm_collected(report.outblob, endorsement)
        log = read_event_log(self.event_log_path) if report.kind is CvmKind.TDX else None
        if log is not None and self.runtime_log_path.exists():
            from gpucc.core.errors import MalformedEvidenceError
            from gpucc.core.files import read_capped
            from gpucc.gpuattest.cvm.gpu_event import MAX_RUNTIME_LOG, with_runtime_events

            # RTMR3's runtime events (a recorded GPU verdict) after the firmware's.
            records = read_capped(self.runtime_log_path, MAX_RUNTIME_LOG, what="runtime log")
            try:
                log = with_runtime_events(log, records)
            except MalformedEvidenceError:
                log += records  # sent as it is: the verifier, not the collector, refuses it
        return _cvm_collected(report.outblob, self.cvm_collateral, log)

    def _vtpm_evidence(self, report_data: bytes) -> CollectedCvmEvidence | None:
        """The vTPM evidence when a paravisor's vTPM is there, else None."""
        from gpucc.gpuattest.cvm.azure_tdquote import AZURE_TD_QUOTE_URL
        from gpucc.gpuattest.cvm.vtpm_collect import (
            DEFAULT_TCTI,
            collect_vtpm_evidence,
            paravisor_present,
        )
        from gpucc.gpuattest.cvm.vtpm_evidence import parse_vtpm_evidence

        from .parts import VtpmPart

        tcti = self.tpm_tcti or DEFAULT_TCTI
        if not paravisor_present(tcti):
            return None
        evidence = collect_vtpm_evidence(
            VtpmPart().bind_report_data(report_data),
            tcti=tcti,
            vcek=self.cvm_collateral,
            td_quote_url=self.td_quote_url or AZURE_TD_QUOTE_URL,
        )
        if parse_vtpm_evidence(evidence).td_quote is not None:
            # TDX: the TD quote is in the document; Intel's collateral, if given, beside it.
            return _cvm_collected(evidence, self.cvm_collateral)
        # SEV-SNP: the VCEK travels inside the evidence document; nothing else to send.
        return _cvm_collected(evidence)


class SimulatedSource:
    """A simulated GPU and TDX platform under the authorities of ``directory``.

    For trying the protocols without hardware: it attests nothing real. Sources given the
    same directory, in one process or many (the ranks of a DDP job, a holder's
    orchestrator), share one set of simulated roots, RIMs and TDX platform, made by the
    first of them (:mod:`gpucc.assembly.simulation`), so each verifies the others; each
    source still is a GPU of its own (its own device keys and UUID). The directory receives
    what the verifying side reads: the GPU roots and RIMs when the source is made, the TDX
    root on its first CVM request.
    """

    simulated = True

    def __init__(
        self, directory: Path, *, gpu_only: bool = False, now: dt.datetime | None = None
    ) -> None:
        from cryptography.hazmat.primitives.serialization import Encoding

        from gpucc.core.files import write_atomic
        from gpucc.gpuattest.simulate import SimulatedGpu

        from .simulation import load_or_create

        self.directory = directory
        self.gpu_only = gpu_only
        self._now = now or utc_now()
        authority = load_or_create(directory, self._now)
        self._gpu = SimulatedGpu.create(now=self._now, authority=authority.gpu)
        self._tdx: SimulatedTdx = authority.tdx
        self._tdx_root_written = False
        # Holders may be reading the directory: every file is replaced atomically, and
        # every source of the directory writes the same bytes.
        (directory / "rims").mkdir(parents=True, exist_ok=True)
        for rim_id, rim in authority.rims.items():
            write_atomic(directory / "rims" / f"{rim_id}.xml", rim, force=True)
        roots = self._gpu.roots
        rim_root = roots.rim_root.public_bytes(Encoding.PEM)
        write_atomic(directory / "rim_root.pem", rim_root, force=True)
        device_root = roots.device_root.public_bytes(Encoding.PEM)
        write_atomic(directory / "device_root.pem", device_root, force=True)

    def gpu_evidence(self, nonce: bytes) -> EvidenceSet:
        """The simulated GPU's evidence over ``nonce``."""
        return self._gpu.evidence(nonce)

    def cvm_evidence(self, report_data: bytes) -> CollectedCvmEvidence | None:
        """A simulated TD quote over ``report_data``, with its collateral and the CC event
        log its RTMRs were extended from."""
        if self.gpu_only:
            return None
        from cryptography.hazmat.primitives.serialization import Encoding

        from gpucc.core.files import write_atomic
        from gpucc.gpuattest.cvm.tdx_sim import simulated_boot_log

        platform = self._tdx
        if not self._tdx_root_written:
            root_pem = platform.root.public_bytes(Encoding.PEM)
            write_atomic(self.directory / "tdx_root.pem", root_pem, force=True)
            self._tdx_root_written = True
        made = platform.collateral(issued=self._now - dt.timedelta(minutes=5))
        log = simulated_boot_log()
        quote = platform.quote(report_data, event_log=log)
        return _cvm_collected(quote, made.to_json(), log)


@dataclass(frozen=True)
class FileSource:
    """Evidence already collected: it is returned whatever the freshness values (the
    verifier then checks that it carries them)."""

    gpus: EvidenceSet | None = None
    cvm: bytes | None = field(default=None, repr=False)
    cvm_collateral: bytes | None = field(default=None, repr=False)
    cvm_event_log: bytes | None = field(default=None, repr=False)
    simulated: bool = False

    def gpu_evidence(self, nonce: bytes) -> EvidenceSet:
        """The stored GPU evidence.

        Raises:
            UsageError: there is none.
        """
        if self.gpus is None:
            from gpucc.core.errors import UsageError

            raise UsageError("no GPU evidence was given")
        return self.gpus

    def cvm_evidence(self, report_data: bytes) -> CollectedCvmEvidence | None:
        """The stored CVM evidence, if any."""
        if self.cvm is None:
            return None
        return _cvm_collected(self.cvm, self.cvm_collateral, self.cvm_event_log)


def open_source(
    *,
    simulation: Path | None = None,
    gpu_only: bool = False,
    cvm_collateral: bytes | None = None,
    tsm_root: Path | None = None,
    tpm_tcti: str | None = None,
    nscq_library: str | None = None,
    td_quote_url: str | None = None,
) -> EvidenceSource:
    """The evidence source a front end produces evidence from: a simulation writing its
    roots to ``simulation``, or this machine (NVML, and configfs-tsm or a paravisor's vTPM
    through ``tpm_tcti``, a TDX paravisor's quote endpoint at ``td_quote_url``).

    Every front end that collects evidence opens its source here, once.
    """
    if simulation is not None:
        return SimulatedSource(simulation, gpu_only=gpu_only)
    return LocalSource(
        gpu_only=gpu_only,
        cvm_collateral=cvm_collateral,
        tsm_root=tsm_root,
        tpm_tcti=tpm_tcti,
        td_quote_url=td_quote_url,
        nscq_library=nscq_library,
    )


def switch_evidence(source: EvidenceSource, nonce: bytes) -> EvidenceSet:
    """Every NVSwitch's evidence over ``nonce`` from ``source``.

    Raises:
        UsageError: the source produces no switch evidence (a simulation, files).
        EnvironmentProblemError: as :meth:`LocalSource.switch_evidence`.
    """
    if not isinstance(source, LocalSource):
        from gpucc.core.errors import UsageError

        raise UsageError("NVSwitch evidence is collected from this machine's switches (NSCQ) only")
    return source.switch_evidence(nonce)
