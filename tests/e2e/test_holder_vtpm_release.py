"""Key release to an Azure-shaped CVM: a real `gpucc holder serve` (simulated roots, a policy
pinning the simulated chip's launch measurement and a PCR) and a host whose CVM evidence is
collected through a swtpm provisioned as the paravisor's vTPM (the AK at 0x81000003, a
simulated HCL report naming it at NV index 0x01400001). The session's binding value must be
the TPM quote's qualifying data: a quote relayed from another session, or a quote by another
VM's AK beside this VM's HCL report, gets no key."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding

from gpucc.assembly.sources import LocalSource
from gpucc.gpuattest.cvm.snp_simulate import DEFAULT_MEASUREMENT, SimulatedSnp
from gpucc.gpuattest.cvm.vtpm_simulate import simulated_hcl_report
from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.keyrelease.protocol import (
    Answer,
    CollectedCvmEvidence,
    CollectedEvidence,
    create_offer,
    open_answer,
)
from gpucc.travel.client import HolderClient
from gpucc.travel.errors import HolderRefusedError
from tests.e2e.test_travel_e2e import Holder, World, _start, _stop, _wait_healthy
from tests.support.swtpm import Vtpm, azure_vtpm, needs_swtpm

pytestmark = [needs_swtpm, pytest.mark.slow]
PCR7 = hashlib.sha256(b"secure boot policy").digest()


@pytest.fixture(scope="module")
def chip() -> SimulatedSnp:
    return SimulatedSnp.create(seed=b"azure key release")


@pytest.fixture(scope="module")
def vm(tmp_path_factory: pytest.TempPathFactory, chip: SimulatedSnp) -> Iterator[Vtpm]:
    def hcl(ak: rsa.RSAPublicKey) -> bytes:
        return simulated_hcl_report(chip, ak)

    with azure_vtpm(tmp_path_factory.mktemp("vm"), hcl) as tpm:
        tpm.extend(7, PCR7)
        yield tpm


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, chip: SimulatedSnp) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("azure-release")
    w = World(tmp=tmp, gpu=SimulatedGpu.create(now=dt.datetime.now(dt.UTC)), roots=tmp / "roots")
    w.write_roots()
    pki = chip.pki
    ark_ask = pki.ark.public_bytes(Encoding.PEM) + pki.ask.public_bytes(Encoding.PEM)
    (w.roots / "snp_milan.pem").write_bytes(ark_ask)
    pcr7 = hashlib.sha256(bytes(32) + PCR7).hexdigest()
    policy = tmp / "azure.yaml"
    policy.write_text(
        "version: 1\nocsp:\n  require: false\ncvm:\n"
        f"  measurements:\n    snp:\n      measurement: '{DEFAULT_MEASUREMENT.hex()}'\n"
        f"  pcrs:\n    '7': '{pcr7}'\n"
    )
    w.holders["azure"] = _start(w, "azure", [4096], "--policy", str(policy))
    try:
        _wait_healthy(w.holders["azure"])
        yield w
    finally:
        for holder in w.holders.values():
            _stop(holder)


def _gpu(world: World) -> Callable[[bytes], CollectedEvidence]:
    def collect(nonce: bytes) -> CollectedEvidence:
        return CollectedEvidence.from_evidence_set(world.gpu.evidence(nonce))

    return collect


def _vtpm_source(
    vm: Vtpm, chip: SimulatedSnp, tmp: Path
) -> Callable[[bytes], CollectedCvmEvidence]:
    source = LocalSource(tsm_root=tmp / "no-tsm", tpm_tcti=vm.tcti, cvm_collateral=chip.vcek)

    def collect(report_data: bytes) -> CollectedCvmEvidence:
        found = source.cvm_evidence(report_data)
        assert found is not None
        return found

    return collect


def _release(
    holder: Holder, world: World, collect_cvm: Callable[[bytes], CollectedCvmEvidence]
) -> list[bytes]:
    """The dataset keys the host unwraps from the holder's answer."""
    client = HolderClient(holder.url)
    offer, host_key = create_offer(client.challenge(), _gpu(world), collect_cvm=collect_cvm)
    session = open_answer(Answer.from_json(client.offer(offer).answer), host_key)
    return [session.dataset_key(digest) for _, _, digest, _ in holder.datasets]


def test_an_azure_shaped_cvm_gets_its_keys(
    world: World, vm: Vtpm, chip: SimulatedSnp, tmp_path: Path
) -> None:
    holder = world.holders["azure"]
    keys = _release(holder, world, _vtpm_source(vm, chip, tmp_path))
    assert keys == holder.dataset_keys


def test_a_quote_relayed_from_another_session_gets_no_key(
    world: World, vm: Vtpm, chip: SimulatedSnp, tmp_path: Path
) -> None:
    holder = world.holders["azure"]
    earlier = _vtpm_source(vm, chip, tmp_path)(hashlib.sha512(b"another session").digest())

    def relay(report_data: bytes) -> CollectedCvmEvidence:
        return earlier

    with pytest.raises(HolderRefusedError, match="qualifying data|commit to this session"):
        _release(holder, world, relay)


def test_another_vms_ak_beside_this_vms_hcl_report_gets_no_key(
    world: World, vm: Vtpm, chip: SimulatedSnp, tmp_path: Path
) -> None:
    """The other VM quotes this session's binding value with its own AK, but only this VM's
    HCL report (naming this VM's AK) verifies under the chip: the quote is refused."""
    holder = world.holders["azure"]
    assert vm.ak is not None
    this_vm_report = simulated_hcl_report(chip, vm.ak)
    with azure_vtpm(tmp_path / "other", lambda ak: this_vm_report) as other:
        with pytest.raises(HolderRefusedError, match="attestation key|AK"):
            _release(holder, world, _vtpm_source(other, chip, tmp_path))
