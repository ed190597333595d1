"""Platform parts: every kind of attestable part is one value, registered once.

A platform presents evidence of several parts: GPUs and NVSwitches (entries of the devices'
evidence set), and its confidential VM (a TDX quote, an SEV-SNP report, or a paravisor's
vTPM evidence wrapping either). Each kind of part is a :class:`PartKind`: it recognises its
evidence, binds report data its way, fetches its collateral, names its simulated roots,
verifies its evidence into a result of the one result family, and says how that result
reads (its reasons, its checks per reported unit, its place in the ``gpucc.attest/v1``
document, the devices key release names).

A :class:`PartRegistry` holds the kinds a verifier knows. The kind of each piece of evidence
is decided once, where the evidence enters (:meth:`PartRegistry.pieces`, :meth:`classify`),
and returned as a value (:class:`Piece`); everything after reads it. The registry is a
value too: :meth:`PartRegistry.register` returns a new one, and a verifier takes it from
its :class:`~gpucc.assembly.settings.Settings` (``parts=``)::

    registry = default_parts().register(MyPart())
    verifier = PlatformVerifier(Settings(parts=registry, ...))

Only a part kind tests evidence bytes for what they are.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from gpucc.gpuattest.result import Judged, Verdict

if TYPE_CHECKING:
    from cryptography import x509

    from gpucc.gpuattest.collateral import OcspChecker, RimSource
    from gpucc.gpuattest.cvm.snp_roots import SnpRoots
    from gpucc.gpuattest.evidence import EvidenceSet, GpuEvidence
    from gpucc.gpuattest.netconfig import NetworkSettings
    from gpucc.gpuattest.policy import Policy
    from gpucc.gpuattest.result import Check
    from gpucc.gpuattest.trust import TrustRoots

__all__ = [
    "Channel",
    "Checked",
    "CheckedDevices",
    "CvmPartKind",
    "DevicePartKind",
    "Part",
    "PartContext",
    "PartKind",
    "PartRegistry",
    "PartResult",
    "Piece",
    "Section",
    "default_parts",
    "split_devices",
]


class Channel(enum.Enum):
    """Where a part's evidence enters a platform's evidence.

    The members' order is the order parts are reported in (reasons, failed checks, the
    relaxations of the trust record): the CVM, then the devices, then what is judged over
    the devices (the topology).
    """

    CVM = "cvm"  #: ``PlatformEvidence.cvm``: raw bytes, one piece
    DEVICE = "device"  #: entries of ``PlatformEvidence.gpus`` (and ``switches``)
    DERIVED = "derived"  #: no evidence of its own: judged over the other parts' results


#: The order kinds of each channel are verified in (a derived part reads the devices').
VERIFY_ORDER = (Channel.DEVICE, Channel.DERIVED, Channel.CVM)


class PartResult(Protocol):
    """What every part's result is (the one result family): a verdict with its
    ``trusted``/``undecided`` (:class:`gpucc.gpuattest.result.Judged`) and its reasons; its
    JSON is what its kind's :meth:`PartKind.document` makes of it."""

    @property
    def verdict(self) -> Verdict:
        """The part's verdict."""
        ...

    @property
    def trusted(self) -> bool:
        """True only when every check was accepted."""
        ...

    @property
    def undecided(self) -> bool:
        """Nothing was refused, but something could not be decided."""
        ...

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why not trusted."""
        ...


@dataclass(frozen=True)
class Section:
    """One reported unit of a part (one GPU, one switch, the CVM, the topology): the label
    its failed checks and relaxations carry, and its checks."""

    label: str
    checks: tuple[Check, ...]


@dataclass(frozen=True)
class PartContext:
    """What a part kind verifies with: the verifier's settings a part reads, the time, the
    freshness values, and what the platform verifier shares between parts.

    Attributes:
        policy: the appraisal policy.
        now: the verification time.
        nonce: the nonce every device report must carry (None: not established).
        report_data: the CVM's expected report data, already bound by its kind (None: none
            expected).
        release: a key-release decision (CVM measurements must be pinned unless relaxed).
        collateral: collateral that came with the evidence (CVM).
        event_log: the event log that came with the evidence (CVM).
        network: where collateral is fetched from (through the cache).
        pccs_url: where TDX collateral comes from (None: Intel's PCS).
        fetch_collateral: fetch collateral the evidence came without.
        replacing_collateral: CVM collateral the settings give instead of the evidence's.
        simulation: a simulation's directory, whose roots are trusted (None: the vendors').
        tdx_root: a TDX anchor the settings give (None: Intel's, or the simulation's).
        device_trust: the GPU and switch roots and collateral sources (built once).
        pieces: every piece of the platform's evidence, classified.
        parts: the parts verified so far (a derived part reads them).
    """

    policy: Policy
    now: dt.datetime
    nonce: bytes | None = None
    report_data: bytes | None = None
    release: bool = False
    collateral: bytes | None = dataclasses.field(default=None, repr=False)
    event_log: bytes | None = dataclasses.field(default=None, repr=False)
    network: NetworkSettings | None = None
    pccs_url: str | None = None
    fetch_collateral: bool = True
    replacing_collateral: bytes | None = dataclasses.field(default=None, repr=False)
    simulation: Path | None = None
    tdx_root: x509.Certificate | None = None
    device_trust: Callable[[], tuple[TrustRoots, RimSource, OcspChecker]] | None = None
    pieces: tuple[Piece, ...] = ()
    parts: tuple[Part, ...] = ()

    def part(self, name: str) -> Part | None:
        """The verified part of the kind named ``name``, if any."""
        return next((p for p in self.parts if p.kind.name == name), None)

    def piece(self, name: str) -> Piece | None:
        """The piece of evidence of the kind named ``name``, if any."""
        return next((p for p in self.pieces if p.kind.name == name), None)


class PartKind:
    """A kind of attestable part. Subclass it, set the class attributes, override what
    differs, and register an instance (:meth:`PartRegistry.register`).

    Attributes:
        name: the kind's name (``gpu``, ``tdx``, ...); unique in a registry.
        channel: where its evidence enters.
        slot: its key in the ``gpucc.attest/v1`` document.
        many: the slot holds a list (one entry per device, :meth:`document`) or one object.
        label: what its reasons and sections are prefixed with (``CVM``, ``GPU``); a
            device's name for one.
        plural: a device's name for several (``GPUs``).
        claims_rest: it takes the channel's evidence no other kind recognises (the GPU).
    """

    name: ClassVar[str]
    channel: ClassVar[Channel]
    slot: ClassVar[str]
    many: ClassVar[bool] = False
    label: ClassVar[str] = ""
    plural: ClassVar[str] = ""
    claims_rest: ClassVar[bool] = False

    def recognises(self, evidence: Any) -> bool:
        """Whether ``evidence`` (CVM bytes, or one device's ``GpuEvidence``) is this kind's.
        Cheap: it decides the kind, it proves nothing."""
        return False

    def wanted(self, context: PartContext) -> bool:
        """A derived part: whether it is judged at all (the policy asks for it)."""
        return False

    def bind_report_data(self, report_data: bytes) -> bytes:
        """What this kind's evidence carries for 64 bytes of CVM report data."""
        return report_data

    def fetch_collateral(self, evidence: Any, context: PartContext) -> bytes | None:
        """The collateral ``evidence`` came without, fetched through the context's network
        (None: it needs none, or carries its own).

        Raises:
            CollateralUnavailableError: it cannot be had.
        """
        return None

    def simulated_roots(self, directory: Path) -> Any:
        """The trust anchors a simulation in ``directory`` made for this kind (None: none).

        Raises:
            CollateralUnavailableError: the simulation has none (yet).
        """
        return None

    def verify(self, evidence: Any, context: PartContext) -> PartResult:
        """Verify and judge ``evidence`` (None for a derived part)."""
        raise NotImplementedError(f"the {self.name} part kind verifies nothing")

    def reasons(self, result: Any) -> tuple[str, ...]:
        """The result's reasons as the platform reports them."""
        return tuple(f"{self.label}: {r}" for r in result.reasons)

    def sections(self, result: Any) -> tuple[Section, ...]:
        """The result's reported units with their checks (failed checks, relaxations)."""
        return (Section(self.label, tuple(result.checks)),)

    def document(self, result: Any) -> Any:
        """The result in its slot of the ``gpucc.attest/v1`` document (a list when ``many``)."""
        return [result.to_dict()] if self.many else result.to_dict()

    def devices(self, result: Any) -> Sequence[Any]:
        """The devices key release names (each with its ``report_digest``), in any order."""
        return ()

    def evidence_source(self, result: Any) -> str | None:
        """Where the result says its evidence came from (None: it does not say)."""
        return None


@dataclass(frozen=True)
class Piece:
    """Evidence whose kind is decided: the kind, and the evidence (CVM bytes, or the
    devices' ``EvidenceSet`` holding this kind's entries)."""

    kind: PartKind
    evidence: Any = dataclasses.field(repr=False)


@dataclass(frozen=True)
class Part:
    """One verified part of a platform: its kind and its result."""

    kind: PartKind
    result: Any

    @property
    def verdict(self) -> Verdict:
        """The part's verdict."""
        verdict: Verdict = self.result.verdict
        return verdict

    @property
    def reasons(self) -> tuple[str, ...]:
        """The part's reasons, as the platform reports them."""
        return self.kind.reasons(self.result)

    @property
    def sections(self) -> tuple[Section, ...]:
        """The part's reported units."""
        return self.kind.sections(self.result)


@dataclass(frozen=True)
class PartRegistry:
    """The part kinds a verifier knows, in document order (the ``gpucc.attest/v1`` slots
    follow it; within a channel, kinds recognise evidence in this order)."""

    kinds: tuple[PartKind, ...]

    def register(self, kind: PartKind) -> PartRegistry:
        """A registry that also knows ``kind`` (this one is unchanged).

        Raises:
            UsageError: a kind of that name is registered already.
        """
        if any(k.name == kind.name for k in self.kinds):
            from gpucc.core.errors import UsageError

            raise UsageError(f"a part kind named {kind.name!r} is registered already")
        return PartRegistry((*self.kinds, kind))

    def kind(self, name: str) -> PartKind:
        """The kind named ``name``.

        Raises:
            KeyError: none is.
        """
        for kind in self.kinds:
            if kind.name == name:
                return kind
        raise KeyError(name)

    def of(self, channel: Channel) -> tuple[PartKind, ...]:
        """The kinds whose evidence enters through ``channel``."""
        return tuple(k for k in self.kinds if k.channel is channel)

    @property
    def slots(self) -> tuple[tuple[str, bool], ...]:
        """The document's slots, in order: each key, and whether it holds a list."""
        seen: dict[str, bool] = {}
        for kind in self.kinds:
            seen.setdefault(kind.slot, kind.many)
        return tuple(seen.items())

    def classify(self, channel: Channel, evidence: Any) -> PartKind:
        """The kind of one piece of evidence: the first kind of ``channel`` that recognises
        it, else the channel's ``claims_rest`` kind.

        Raises:
            MalformedEvidenceError: no kind of the channel takes it.
        """
        kinds = self.of(channel)
        for kind in kinds:
            if not kind.claims_rest and kind.recognises(evidence):
                return kind
        for kind in kinds:
            if kind.claims_rest:
                return kind
        from gpucc.core.errors import MalformedEvidenceError

        if channel is Channel.CVM:
            from gpucc.gpuattest.cvm.appraise import UNKNOWN_CVM_EVIDENCE

            raise MalformedEvidenceError(UNKNOWN_CVM_EVIDENCE)
        arch = getattr(evidence, "arch", "?")
        raise MalformedEvidenceError(f"no part kind takes device evidence of arch {arch}")

    def pieces(
        self, devices: EvidenceSet | None, cvm: bytes | None, switches: EvidenceSet | None = None
    ) -> tuple[Piece, ...]:
        """A platform's evidence, each piece's kind decided: the devices' entries grouped by
        kind (in evidence order within each kind; ``switches`` entries come first), and the
        CVM's evidence.

        Raises:
            MalformedEvidenceError: evidence no kind takes (oversized CVM evidence included),
                or an evidence set without entries.
        """
        from gpucc.core.errors import MalformedEvidenceError

        found: list[Piece] = []
        sets = [s for s in (switches, devices) if s is not None]
        if any(not s.gpus for s in sets):
            raise MalformedEvidenceError("the evidence holds no GPU")  # nothing is not trusted
        if sets:
            grouped: dict[str, list[GpuEvidence]] = {}
            for entry in (e for s in sets for e in s.gpus):
                grouped.setdefault(self.classify(Channel.DEVICE, entry).name, []).append(entry)
            for kind in self.of(Channel.DEVICE):
                entries = grouped.get(kind.name)
                if entries:
                    found.append(Piece(kind, _evidence_set(sets, tuple(entries))))
        if cvm is not None:
            from gpucc.gpuattest.cvm.appraise import check_evidence_size

            check_evidence_size(cvm)
            found.append(Piece(self.classify(Channel.CVM, cvm), cvm))
        return tuple(found)

    def classify_cvm(self, evidence: bytes) -> PartKind:
        """The kind of CVM evidence (:meth:`classify` on the CVM channel)."""
        return self.classify(Channel.CVM, evidence)


def _evidence_set(sets: list[EvidenceSet], entries: tuple[GpuEvidence, ...]) -> EvidenceSet:
    """A kind's entries as an evidence set: the set they all came from when it holds
    exactly them, else the last contributing set's metadata with these entries."""
    for s in sets:
        if s.gpus == entries:
            return s
    base = next(s for s in reversed(sets) if any(e in s.gpus for e in entries))
    return dataclasses.replace(base, gpus=entries)


# --- generic results, for a part whose checks alone decide ---------------------------


@dataclass(frozen=True)
class Checked(Judged):
    """A part's result (or one device's) that its checks alone decide: accepted checks
    trust it, a refused one does not, anything else leaves it undecided. Build it with
    :meth:`of`."""

    verdict: Verdict
    checks: tuple[Check, ...]
    index: int = 0
    report_digest: bytes = dataclasses.field(default=b"", repr=False)
    claims: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def of(
        cls,
        checks: Sequence[Check],
        *,
        index: int = 0,
        report: bytes = b"",
        claims: dict[str, Any] | None = None,
    ) -> Checked:
        """The result of ``checks`` (``report``: the raw report key release names by its
        SHA-256).

        Raises:
            ValueError: no checks (a verdict over nothing would read as trusted).
        """
        import hashlib

        from gpucc.gpuattest.result import Decision, combine_verdicts

        if not checks:
            raise ValueError("a result is decided by at least one check")

        verdicts = [
            {Decision.ACCEPT: Verdict.TRUSTED, Decision.REFUSE: Verdict.NOT_TRUSTED}.get(
                c.decision, Verdict.UNDECIDED
            )
            for c in checks
        ]
        digest = hashlib.sha256(report).digest() if report else b""
        return cls(combine_verdicts(verdicts), tuple(checks), index, digest, dict(claims or {}))

    @property
    def reasons(self) -> tuple[str, ...]:
        """``title: reason`` of every refused check, then of every undecided one."""
        from gpucc.gpuattest.result import check_reasons

        return check_reasons(self.checks)

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "index": self.index,
            "verdict": str(self.verdict),
            "evidence_sha256": self.report_digest.hex(),
            "claims": self.claims,
            "checks": [c.to_dict() for c in self.checks],
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True)
class CheckedDevices(Judged):
    """A device part's result made of :class:`Checked` devices (``label``: what each
    device's reasons are prefixed with). Build it with :meth:`of`."""

    verdict: Verdict
    devices: tuple[Checked, ...]
    label: str

    @classmethod
    def of(cls, label: str, devices: Sequence[Checked]) -> CheckedDevices:
        """Every device's result, and the verdict over them.

        Raises:
            ValueError: no devices (a verdict over nothing would read as trusted).
        """
        from gpucc.gpuattest.result import combine_verdicts

        if not devices:
            raise ValueError("a device part's result holds at least one device")

        return cls(combine_verdicts([d.verdict for d in devices]), tuple(devices), label)

    @property
    def reasons(self) -> tuple[str, ...]:
        """Per-device reasons, prefixed with the label and the device's index."""
        return tuple(f"{self.label} {d.index}: {r}" for d in self.devices for r in d.reasons)


# --- devices ---------------------------------------------------------------------------


class DevicePartKind(PartKind):
    """A device whose entries come in the devices' evidence set, verified as a set into a
    result with one sub-result per device (``result.<units>``, each with an ``index``,
    ``checks``, ``report_digest`` and ``to_dict``; :class:`CheckedDevices` by default).

    Attributes:
        units: the result's attribute that holds its devices.
    """

    channel: ClassVar[Channel] = Channel.DEVICE
    many: ClassVar[bool] = True
    units: ClassVar[str] = "devices"

    def reasons(self, result: Any) -> tuple[str, ...]:
        """The set's own per-device reasons."""
        return tuple(result.reasons)

    def sections(self, result: Any) -> tuple[Section, ...]:
        """One section per device: ``<label> <index>``."""
        return tuple(
            Section(f"{self.label} {d.index}", tuple(d.checks)) for d in getattr(result, self.units)
        )

    def document(self, result: Any) -> Any:
        """One entry per device."""
        return [d.to_dict() for d in getattr(result, self.units)]

    def devices(self, result: Any) -> Sequence[Any]:
        """Every device of the set."""
        return tuple(getattr(result, self.units))

    def trust(self, context: PartContext) -> tuple[TrustRoots, RimSource, OcspChecker]:
        """The device roots and collateral sources the platform verifier shares."""
        if context.device_trust is None:
            raise ValueError("a device part is verified with the platform's device trust")
        return context.device_trust()


class GpuPart(DevicePartKind):
    """NVIDIA GPUs (Hopper, Blackwell): :func:`gpucc.gpuattest.verifier.verify`."""

    name = "gpu"
    slot = "gpus"
    label = "GPU"
    plural = "GPUs"
    units = "gpus"
    claims_rest = True  # every device entry no other kind recognises (nvattest's default)

    def verify(self, evidence: Any, context: PartContext) -> PartResult:
        from gpucc.gpuattest.verifier import verify

        roots, rims, ocsp = self.trust(context)
        return verify(
            evidence,
            expected_nonce=context.nonce,
            roots=roots,
            now=context.now,
            rims=rims,
            ocsp=ocsp,
            policy=context.policy,
        )

    def simulated_roots(self, directory: Path) -> TrustRoots:
        """The simulated GPU's roots, read now (the simulation may have been replaced).

        Raises:
            CollateralUnavailableError: they cannot be read.
        """
        from gpucc.core.errors import SimulationRootsMissingError
        from gpucc.gpuattest.trust import TrustRoots

        try:
            device_root = (directory / "device_root.pem").read_bytes()
            return TrustRoots.from_pem(device_root, (directory / "rim_root.pem").read_bytes())
        except OSError as exc:
            raise SimulationRootsMissingError(
                f"the simulated GPU's roots in {directory} cannot be read: {exc.strerror or exc}"
            ) from None

    def evidence_source(self, result: Any) -> str | None:
        return str(result.source)


class SwitchPart(DevicePartKind):
    """NVIDIA NVSwitches (LS10): :func:`gpucc.gpuattest.switch_verifier.verify_switches`,
    under the GPUs' roots and collateral sources."""

    name = "nvswitch"
    slot = "switches"
    label = "NVSwitch"
    plural = "NVSwitches"
    units = "switches"

    def recognises(self, evidence: Any) -> bool:
        from gpucc.gpuattest.evidence import is_switch_arch

        return is_switch_arch(evidence.arch)

    def verify(self, evidence: Any, context: PartContext) -> PartResult:
        from gpucc.gpuattest.switch_verifier import verify_switches

        roots, rims, ocsp = self.trust(context)
        return verify_switches(
            evidence,
            expected_nonce=context.nonce,
            roots=roots,
            now=context.now,
            rims=rims,
            ocsp=ocsp,
            policy=context.policy,
        )


class TopologyPart(PartKind):
    """Protected PCIe: the topology checks over the verified GPUs and switches, when the
    policy asks for them (``topology.ppcie``)."""

    name = "topology"
    channel = Channel.DERIVED
    slot = "topology"
    label = "Topology"

    def wanted(self, context: PartContext) -> bool:
        return context.policy.topology.ppcie

    def verify(self, evidence: Any, context: PartContext) -> PartResult:
        from gpucc.gpuattest.topology import check_topology

        gpu, switch = context.part("gpu"), context.part("nvswitch")
        gpus = context.piece("gpu")
        return check_topology(
            gpu.result.gpus if gpu is not None else (),
            [g.report for g in gpus.evidence.gpus] if gpus is not None else [],
            switch.result.switches if switch is not None else (),
            context.policy.topology,
        )

    def sections(self, result: Any) -> tuple[Section, ...]:
        return (Section("topology", tuple(result.checks)),)


# --- the confidential VM -----------------------------------------------------------------


class CvmPartKind(PartKind):
    """A confidential VM's evidence: raw bytes, one piece per platform, judged by the
    policy's ``cvm:`` section into a :class:`~gpucc.gpuattest.cvm.appraise.CvmResult`.

    Attributes:
        report_data_sizes: how many bytes of report data the evidence can be asked to carry.
    """

    channel: ClassVar[Channel] = Channel.CVM
    slot: ClassVar[str] = "cvm"
    label: ClassVar[str] = "CVM"
    report_data_sizes: ClassVar[range] = range(64, 65)


class TdxPart(CvmPartKind):
    """An Intel TDX quote (DCAP v4/v5), with Intel's collateral and the CC event log."""

    name = "tdx"

    def recognises(self, evidence: Any) -> bool:
        from gpucc.gpuattest.cvm.tdx import looks_like_tdx_quote

        return looks_like_tdx_quote(evidence)

    def fetch_collateral(self, evidence: Any, context: PartContext) -> bytes | None:
        from gpucc.gpuattest.cvm.tdx import check_layout

        check_layout(evidence)  # a malformed quote is reported before any network use
        return _intel_collateral(evidence, context)

    def simulated_roots(self, directory: Path) -> x509.Certificate:
        """The simulated TDX platform's root. A simulation is never judged against Intel's
        root (which would report a simulated quote as foreign, not as simulated).

        Raises:
            CollateralUnavailableError: the simulation wrote no TDX root (yet).
            MalformedEvidenceError: the file is not a certificate.
        """
        from gpucc.core.errors import MalformedEvidenceError, SimulationRootsMissingError
        from gpucc.core.files import read_capped
        from gpucc.gpuattest.x509chain import load_certificate

        path = directory / "tdx_root.pem"
        if not path.exists():
            raise SimulationRootsMissingError(
                f"the simulation in {directory} has no TDX root (tdx_root.pem): its CVM "
                "evidence cannot be judged"
            )
        return load_certificate(
            read_capped(path, 64 * 1024, what="simulated TDX root"),
            what=f"{path}",
            error=MalformedEvidenceError,
        )

    def verify(self, evidence: Any, context: PartContext) -> PartResult:
        from gpucc.gpuattest.cvm.appraise import verify_tdx

        collateral, problem = _cvm_collateral(self, evidence, context)
        return verify_tdx(
            evidence,
            collateral,
            now=context.now,
            policy=context.policy.cvm,
            expected_report_data=context.report_data,
            root=_cvm_roots(self, context, context.tdx_root),
            require_pins=_pins_required(context),
            event_log=context.event_log,
            collateral_problem=problem,
        )


#: A simulation's SEV-SNP anchors: per product line, a file with its ARK then its ASK (PEM).
SIMULATED_SNP_ROOTS = "snp_{product}.pem"


class SnpPart(CvmPartKind):
    """An AMD SEV-SNP attestation report, with its VCEK (AMD's KDS) or VLEK (the cloud's)."""

    name = "snp"

    def recognises(self, evidence: Any) -> bool:
        from gpucc.gpuattest.cvm.snp_report import looks_like_snp_report

        return looks_like_snp_report(evidence)

    def fetch_collateral(self, evidence: Any, context: PartContext) -> bytes | None:
        from gpucc.gpuattest.cvm.snp_report import parse_snp_report

        if parse_snp_report(evidence).signing_key == 1:
            return None  # a VLEK is the cloud's, not on AMD's KDS: given or from the host
        return _amd_vcek(evidence, context)

    def simulated_roots(self, directory: Path) -> SnpRoots:
        """The simulated SEV-SNP product lines' ARK and ASK, read now. As with TDX, a
        simulation is never judged against AMD's roots.

        Raises:
            CollateralUnavailableError: the simulation wrote no SEV-SNP roots.
            MalformedCertificateError: a file is not an ARK and an ASK.
        """
        from gpucc.core.errors import SimulationRootsMissingError
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
            raise SimulationRootsMissingError(
                f"the simulation in {directory} has no SEV-SNP roots (snp_milan.pem, ...): its "
                "CVM evidence cannot be judged"
            )
        return SnpRoots.from_pem(pems)

    def verify(self, evidence: Any, context: PartContext) -> PartResult:
        from gpucc.core.errors import CollateralUnavailableError
        from gpucc.gpuattest.cvm.appraise import verify_snp
        from gpucc.gpuattest.cvm.snp_roots import SnpRoots

        collateral, problem = _cvm_collateral(self, evidence, context)
        rootless: CollateralUnavailableError | None = None
        try:
            roots = _cvm_roots(self, context, None)
        except CollateralUnavailableError as exc:
            # still read the evidence first: what does not parse is malformed input (400 at
            # a holder), whatever roots the simulation lacks
            rootless, roots = exc, SnpRoots(())
        result = verify_snp(
            evidence,
            collateral,
            now=context.now,
            policy=context.policy.cvm,
            expected_report_data=context.report_data,
            roots=roots,
            require_pins=_pins_required(context),
            event_log=context.event_log,
            collateral_problem=problem,
        )
        if rootless is not None:
            raise rootless
        return result


class VtpmPart(CvmPartKind):
    """A paravisor's vTPM evidence (``gpucc.vtpm/v1``: Azure's SEV-SNP and TDX CVMs): a TPM
    quote whose attestation key the hardware report (SEV-SNP, or a TD quote) commits to.

    The TPM quote carries report data as its qualifying data: the first 32 bytes of 64
    (:meth:`bind_report_data`), or 1 to 64 bytes given as they are.
    """

    name = "vtpm"
    report_data_sizes = range(1, 65)

    def recognises(self, evidence: Any) -> bool:
        from gpucc.gpuattest.cvm.vtpm_evidence import looks_like_vtpm_evidence

        return looks_like_vtpm_evidence(evidence)

    def bind_report_data(self, report_data: bytes) -> bytes:
        """The TPM quote's qualifying data standing for ``report_data`` (64 bytes): a
        paravisor's vTPM quote carries the binding value's first 32 bytes; the attestation
        key that signs it is the one the hardware report commits to."""
        from gpucc.gpuattest.cvm.vtpm_evidence import vtpm_qualifying_data

        return vtpm_qualifying_data(report_data)

    def fetch_collateral(self, evidence: Any, context: PartContext) -> bytes | None:
        """SEV-SNP carries its VCEK (or the KDS has it); TDX needs Intel's collateral for its
        TD quote, and without it is verified as far as it can be (undecided)."""
        from gpucc.core.errors import CollateralUnavailableError
        from gpucc.gpuattest.cvm.vtpm_evidence import parse_vtpm_evidence

        document = parse_vtpm_evidence(evidence)
        if document.hcl.tee == "snp":
            if document.vcek is not None:
                return None
            return _amd_vcek(document.hcl.hardware_report, context)
        try:
            return _intel_collateral(document.td_quote or b"", context)
        except CollateralUnavailableError:
            return None  # verified offline; the collateral check says what is missing

    def verify(self, evidence: Any, context: PartContext) -> PartResult:
        from gpucc.core.errors import CollateralUnavailableError
        from gpucc.gpuattest.cvm.appraise import verify_vtpm
        from gpucc.gpuattest.cvm.snp_roots import SnpRoots
        from gpucc.gpuattest.cvm.vtpm_evidence import parse_vtpm_evidence

        document = parse_vtpm_evidence(evidence)
        collateral, _ = _cvm_collateral(self, evidence, context)
        inner = TdxPart() if document.hcl.tee == "tdx" else SnpPart()
        tdx_root = context.tdx_root
        snp_roots = None
        rootless: CollateralUnavailableError | None = None
        if context.simulation is not None:
            if isinstance(inner, SnpPart):
                try:
                    snp_roots = inner.simulated_roots(context.simulation)
                except CollateralUnavailableError as exc:
                    # read the evidence first, as the SEV-SNP part does: what does not parse
                    # is malformed input (400 at a holder), whatever roots are missing
                    rootless, snp_roots = exc, SnpRoots(())
            elif tdx_root is None:
                tdx_root = inner.simulated_roots(context.simulation)
        result = verify_vtpm(
            document,
            evidence,
            collateral,
            now=context.now,
            policy=context.policy.cvm,
            expected_report_data=context.report_data,
            tdx_root=tdx_root,
            snp_roots=snp_roots,
            require_pins=_pins_required(context),
            event_log=context.event_log,
        )
        if rootless is not None:
            raise rootless
        return result


def _pins_required(context: PartContext) -> bool:
    """Key release needs pinned measurements unless the policy names ``cvm.allow_unpinned``."""
    return context.release and not context.policy.cvm.allow_unpinned


def _cvm_roots(kind: PartKind, context: PartContext, given: Any) -> Any:
    """The anchors a CVM kind verifies under: the caller's, else the simulation's, else
    None (the vendor's pinned roots)."""
    if given is not None or context.simulation is None:
        return given
    return kind.simulated_roots(context.simulation)


def _cvm_collateral(
    kind: PartKind, evidence: bytes, context: PartContext
) -> tuple[bytes | None, str]:
    """The collateral CVM evidence is verified with: the settings', else what came with it,
    else fetched (not for a simulation); and why there is none when none could be had."""
    from gpucc.core.errors import CollateralUnavailableError

    collateral = context.replacing_collateral
    if collateral is None:
        collateral = context.collateral
    if collateral is None and context.fetch_collateral and context.simulation is None:
        try:
            collateral = kind.fetch_collateral(evidence, context)
        except CollateralUnavailableError as exc:
            # The evidence is still judged: a check that ran and failed (report data,
            # debug, measurements, a signature, an event log) is a decided refusal,
            # whatever the collateral would have said; the rest stays undecided.
            return None, str(exc)
    return collateral, ""


def _network(context: PartContext) -> NetworkSettings:
    from gpucc.gpuattest.netconfig import NetworkSettings

    return context.network if context.network is not None else NetworkSettings()


def _intel_collateral(quote: bytes, context: PartContext) -> bytes:
    """Intel's collateral for a TD quote, as PCCS JSON (through the collateral cache)."""
    from gpucc.gpuattest.cvm.pcs import INTEL_PCS_URL, tdx_collateral_for
    from gpucc.gpuattest.netconfig import build_fetcher

    network = _network(context)
    with build_fetcher(network) as fetcher:
        found = tdx_collateral_for(
            quote,
            fetcher,
            now=context.now,
            cache=network.cache(),
            base_url=context.pccs_url or INTEL_PCS_URL,
        )
    return found.to_json()


def _amd_vcek(report: bytes, context: PartContext) -> bytes | None:
    """The chip's VCEK from AMD's KDS, or the mirror the settings name (through the
    collateral cache)."""
    from gpucc.gpuattest.cvm.snp_kds import DEFAULT_KDS_URL, fetch_vcek
    from gpucc.gpuattest.netconfig import build_fetcher

    network = _network(context)
    with build_fetcher(network) as fetcher:
        return fetch_vcek(
            report,
            fetcher=fetcher,
            cache=network.cache(),
            base_url=network.kds_url or DEFAULT_KDS_URL,
        )


def split_devices(
    evidence: EvidenceSet | None, switches: EvidenceSet | None
) -> tuple[EvidenceSet | None, EvidenceSet | None]:
    """GPU entries and NVSwitch entries: one evidence file (or offer) may hold both, as a
    PPCIe machine's does; entries keep their order within each kind (the kinds decided by
    :class:`~gpucc.assembly.parts.PartRegistry`, as a verification decides them)."""
    found = {p.kind.name: p.evidence for p in default_parts().pieces(evidence, None, switches)}
    return found.get("gpu"), found.get("nvswitch")


def default_parts() -> PartRegistry:
    """The kinds gpucc knows, in the ``gpucc.attest/v1`` document's order: GPUs, the CVM
    (vTPM evidence recognised before a bare TDX quote or SEV-SNP report), NVSwitches, the
    Protected PCIe topology."""
    return PartRegistry((GpuPart(), VtpmPart(), TdxPart(), SnpPart(), SwitchPart(), TopologyPart()))
