"""A simulated HGX board: GPUs and NVSwitches in Protected PCIe mode under one test PKI.

Every device has its own leaf and BROM certificate under one simulated device root (as
NVIDIA's GPUs and switches share one root), the GPUs share one pair of RIMs and the
switches one BIOS RIM, all signed by one simulated RIM root. The GPUs report PPCIe mode
and the switches' PDIs; the switches report their own PDI and the GPUs'. Nothing here
verifies under NVIDIA's pinned roots: pass :attr:`SimulatedBoard.roots` explicitly.
"""

from __future__ import annotations

import datetime as dt
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from .evidence import EvidenceSet, GpuEvidence
from .report import OpaqueType
from .simulate import _NOT_AFTER_FOREVER, Pki, SimulatedGpu, _name, _template_rim, build_report
from .simulate import sign_rim as _sign_rim
from .switch_report import LS10_BIOS_IDS, SwitchOpaqueType
from .trust import TrustRoots

__all__ = ["SWITCH_ACTIVE", "SimulatedBoard", "SimulatedSwitch"]

#: The indices an LS10 BIOS RIM has active (0..30: the switch's 31 blocks).
SWITCH_ACTIVE = frozenset(range(31))
_SWITCH_BLOCKS = 31
_PPCIE_FEATURE_FLAG = struct.pack("<H", 2)


def _issue(ca: Pki, names: Sequence[str], now: dt.datetime) -> Pki:
    """A 5-certificate device chain: ``names`` (BROM, then leaf) under ``ca``'s top three."""
    keys = [ec.generate_private_key(ec.SECP384R1()) for _ in names]
    issuer_cert, issuer_key = ca.certs[-3], ca.keys[-3]
    certs: list[x509.Certificate] = []
    for depth, cn in enumerate(names):
        leaf = depth == len(names) - 1
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(issuer_cert.subject)
            .public_key(keys[depth].public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=365))
            .not_valid_after(_NOT_AFTER_FOREVER if leaf else now + dt.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=not leaf, path_length=None), critical=True)
        )
        cert = builder.sign(issuer_key, hashes.SHA384())
        certs.append(cert)
        issuer_cert, issuer_key = cert, keys[depth]
    return Pki(certs=(*reversed(certs), *ca.certs[-3:]), keys=(*reversed(keys), *ca.keys[-3:]))


@dataclass(frozen=True)
class SimulatedSwitch:
    """A simulated NVSwitch (LS10) with its own device chain."""

    device_pki: Pki
    pdi: bytes
    golden: Mapping[int, bytes] = field(repr=False)
    bios_version: str = "96.10.55.00.01"

    def bios_rim_id(self) -> str:
        """The BIOS RIM ID NVIDIA's tools derive for this switch."""
        project, sku, chip = LS10_BIOS_IDS
        return f"NV_SWITCH_BIOS_{project}_{sku}_{chip}_{self.bios_version.replace('.', '')}"

    def report(self, nonce: bytes, gpu_pdis: Sequence[bytes]) -> bytes:
        """A signed 31-block switch report naming ``gpu_pdis``."""
        opaque = [
            (OpaqueType.VBIOS_VERSION, self.bios_version.encode()),
            (SwitchOpaqueType.DEVICE_PDI, self.pdi),
            (OpaqueType.MSRSCNT, bytes(4 * 26)),
            (SwitchOpaqueType.SWITCH_GPU_PDIS, b"".join(gpu_pdis)),
            (SwitchOpaqueType.DISABLED_PORTS, b"\x00\x00"),
            (SwitchOpaqueType.POSITION_ID, b"\x00\x00"),
            (SwitchOpaqueType.LOCK_STATUS, b"\x01\x00"),
        ]
        return build_report(
            nonce=nonce,
            measurements={i + 1: v for i, v in self.golden.items()},
            opaque=opaque,
            key=self.device_pki.keys[0],
            n_blocks=_SWITCH_BLOCKS,
        )


@dataclass(frozen=True)
class SimulatedBoard:
    """An HGX-like board: ``gpus`` in PPCIe mode wired to ``switches``."""

    gpus: tuple[SimulatedGpu, ...]
    switches: tuple[SimulatedSwitch, ...]
    gpu_pdis: tuple[bytes, ...]
    device_ca: Pki = field(repr=False)
    rim_pki: Pki = field(repr=False)

    @classmethod
    def create(cls, *, now: dt.datetime, gpus: int = 8, switches: int = 4) -> SimulatedBoard:
        """A fresh board whose certificates are valid around ``now``."""
        before, after = now - dt.timedelta(days=365), now + dt.timedelta(days=365)
        names = ["Simulated Device Identity CA", "Simulated Identity", "Simulated Provisioner ICA"]
        built = Pki.build([*names, "unused leaf"], not_before=before, not_after=after)
        ca = Pki(certs=built.certs[1:], keys=built.keys[1:])  # the three CAs
        rim = Pki.build(
            [
                "Simulated CoRIM signing Root CA",
                "Simulated Reference Value CA",
                "Simulated Reference Value L3 001",
                "Simulated RIM L4 Signer",
            ],
            not_before=before,
            not_after=after,
        )
        template = SimulatedGpu.create(now=now)
        made = []
        for n in range(gpus):
            fwid = os.urandom(48)
            chain = _issue(ca, ["GH100 A01 GSP BROM", "GH100 A01 GSP FMC LF"], now)
            made.append(
                SimulatedGpu(
                    device_pki=_with_fwid(chain, fwid, now),
                    rim_pki=rim,
                    golden=template.golden,
                    fwid=fwid,
                    project="G520",
                    project_sku="0202",
                    chip_sku="885",
                    uuid=f"GPU-{n:08x}-sim-ppcie",
                )
            )
        switch_golden = {i: os.urandom(48) for i in SWITCH_ACTIVE}
        sws = tuple(
            SimulatedSwitch(
                device_pki=_issue(ca, ["LS_10 A01 FSP BROM", "LS_10 A01 FSP FMC LF"], now),
                pdi=os.urandom(8),
                golden=switch_golden,
            )
            for _ in range(switches)
        )
        return cls(
            gpus=tuple(made),
            switches=sws,
            gpu_pdis=tuple(os.urandom(8) for _ in range(gpus)),
            device_ca=ca,
            rim_pki=rim,
        )

    @property
    def roots(self) -> TrustRoots:
        """The board's anchors, to pass explicitly as ``roots``."""
        return TrustRoots(device_root=self.device_ca.root, rim_root=self.rim_pki.root)

    @property
    def rims(self) -> dict[str, bytes]:
        """The GPUs' driver and VBIOS RIMs and the switches' BIOS RIM, by RIM ID."""
        out = dict(self.gpus[0].rims)
        if self.switches:
            sw = self.switches[0]
            out[sw.bios_rim_id()] = _sign_rim(
                template=_template_rim("vbios-rim-1010_0200_882_96005E0001-test.swidtag"),
                colloquial_version=sw.bios_version,
                golden=sw.golden,
                active=SWITCH_ACTIVE,
                pki=self.rim_pki,
            )
        return out

    def gpu_opaque(self, gpu: SimulatedGpu, *, ppcie: bool = True) -> list[tuple[int, bytes]]:
        """A GPU's opaque fields on this board: PPCIe mode (or not) and 18 switch-PDI
        slots (each switch's PDI on four links, the last two slots disabled)."""
        fields = [f for f in gpu.opaque_fields() if f[0] != OpaqueType.PROTECTED_PCIE_STATUS]
        links = [s.pdi for s in self.switches for _ in range(4)]
        links += [bytes(8)] * max(0, 18 - len(links))
        return [
            *fields,
            (OpaqueType.PROTECTED_PCIE_STATUS, b"\xaa" if ppcie else b"\x55"),
            (OpaqueType.SWITCH_PDI, b"".join(links)),
            (OpaqueType.OPAQUE_DATA_VERSION, b"\x01\x00"),
            (OpaqueType.FEATURE_FLAG, _PPCIE_FEATURE_FLAG if ppcie else b"\x01\x00"),
        ]

    def gpu_entries(self, nonce: bytes) -> list[GpuEvidence]:
        """Every GPU's evidence for ``nonce``."""
        out = []
        for gpu in self.gpus:
            report = gpu.report(nonce, opaque=self.gpu_opaque(gpu))
            out.append(_entry(gpu, report, nonce))
        return out

    def switch_entries(self, nonce: bytes) -> list[GpuEvidence]:
        """Every switch's evidence for ``nonce``."""
        return [
            GpuEvidence(
                report=s.report(nonce, self.gpu_pdis),
                cert_chain_pem=s.device_pki.pem(),
                arch="LS10",
                nonce=nonce,
            )
            for s in self.switches
        ]

    def evidence(self, nonce: bytes) -> EvidenceSet:
        """The whole board's evidence, GPUs then switches, as one evidence file holds it."""
        return EvidenceSet(gpus=(*self.gpu_entries(nonce), *self.switch_entries(nonce)))


def _entry(gpu: SimulatedGpu, report: bytes, nonce: bytes) -> GpuEvidence:
    return GpuEvidence(
        report=report,
        cert_chain_pem=gpu.device_pki.pem(),
        arch="HOPPER",
        nonce=nonce,
        uuid=gpu.uuid,
        driver_version=gpu.driver_version,
        vbios_version=gpu.vbios_version,
    )


def _with_fwid(chain: Pki, fwid: bytes, now: dt.datetime) -> Pki:
    """``chain`` with its leaf re-issued to carry ``fwid`` (Hopper's FWID extension)."""
    from .simulate import _FWID_OID, _fwid_extension

    leaf_key = chain.keys[0]
    brom, brom_key = chain.certs[1], chain.keys[1]
    leaf = (
        x509.CertificateBuilder()
        .subject_name(chain.certs[0].subject)
        .issuer_name(brom.subject)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=365))
        .not_valid_after(_NOT_AFTER_FOREVER)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.UnrecognizedExtension(_FWID_OID, _fwid_extension(leaf_key.public_key(), fwid)),
            critical=False,
        )
        .sign(brom_key, hashes.SHA384())
    )
    return Pki(certs=(leaf, *chain.certs[1:]), keys=chain.keys)
