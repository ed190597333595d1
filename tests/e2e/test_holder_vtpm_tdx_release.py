"""Key release to an Azure-shaped TDX CVM: a real `gpucc holder serve` (simulated roots, a
policy pinning the simulated TD's MRTD and a PCR) and a host whose CVM evidence is collected
as on Azure: the HCL report from a swtpm provisioned as the paravisor's vTPM, its TDREPORT
quoted by a loopback stand-in for the paravisor's quote endpoint, the TPM quote over the
session's binding value, Intel's (simulated) collateral beside it. A TD quote of another TD
gets no key. A holder that pins the GPU recorded in vTPM PCR 23 (`gpucc attest --record-gpus`
in the VM) releases only once it is recorded."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa

from gpucc.assembly.sources import LocalSource
from gpucc.gpuattest.cvm.gpu_event import GPU_PCR, devices_pcr_value
from gpucc.gpuattest.cvm.tdx_sim import SIMULATED_MRTD
from gpucc.gpuattest.cvm.vtpm_simulate import simulated_tdx_hcl_report
from gpucc.gpuattest.evidence import dump_evidence_json
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
from tests.support.azure_tdquote import td_quote_service
from tests.support.cli import run_cli
from tests.support.swtpm import Vtpm, azure_vtpm, needs_swtpm

pytestmark = [needs_swtpm, pytest.mark.slow]
PCR7 = hashlib.sha256(b"secure boot policy").digest()


def _ueid(gpu: SimulatedGpu) -> str:
    chain = gpu.evidence(bytes(32)).gpus[0].cert_chain_pem
    return str(x509.load_pem_x509_certificates(chain)[0].serial_number)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("azure-tdx-release")
    w = World(tmp=tmp, gpu=SimulatedGpu.create(now=dt.datetime.now(dt.UTC)), roots=tmp / "roots")
    w.write_roots()  # the simulated TDX platform's root among them
    pcr7 = hashlib.sha256(bytes(32) + PCR7).hexdigest()
    policy = tmp / "azure-tdx.yaml"
    policy.write_text(
        "version: 1\nocsp:\n  require: false\ncvm:\n"
        f"  measurements:\n    tdx:\n      mrtd: '{SIMULATED_MRTD.hex()}'\n"
        f"  pcrs:\n    '7': '{pcr7}'\n"
    )
    w.holders["azure"] = _start(w, "azure", [4096], "--policy", str(policy))
    bound = tmp / "azure-tdx-gpus.yaml"  # and the GPU recorded in PCR 23
    pcr23 = devices_pcr_value([_ueid(w.gpu)]).hex()
    bound.write_text(policy.read_text() + f"    '{GPU_PCR}': '{pcr23}'\n")
    w.holders["gpus"] = _start(w, "gpus", [4096], "--policy", str(bound))
    try:
        for holder in w.holders.values():
            _wait_healthy(holder)
        yield w
    finally:
        for holder in w.holders.values():
            _stop(holder)


@pytest.fixture(scope="module")
def vm(tmp_path_factory: pytest.TempPathFactory, world: World) -> Iterator[Vtpm]:
    def hcl(ak: rsa.RSAPublicKey) -> bytes:
        return simulated_tdx_hcl_report(world.tdx, ak)

    with azure_vtpm(tmp_path_factory.mktemp("vm"), hcl) as tpm:
        tpm.extend(7, PCR7)
        yield tpm


def _source(vm: Vtpm, world: World, tmp: Path, url: str) -> Callable[[bytes], CollectedCvmEvidence]:
    issued = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    source = LocalSource(
        tsm_root=tmp / "no-tsm", tpm_tcti=vm.tcti, td_quote_url=url,
        cvm_collateral=world.tdx.collateral(issued=issued).to_json(),
    )  # fmt: skip

    def collect(report_data: bytes) -> CollectedCvmEvidence:
        found = source.cvm_evidence(report_data)
        assert found is not None
        return found

    return collect


def _release(
    holder: Holder, world: World, collect_cvm: Callable[[bytes], CollectedCvmEvidence]
) -> list[bytes]:
    def gpu(nonce: bytes) -> CollectedEvidence:
        return CollectedEvidence.from_evidence_set(world.gpu.evidence(nonce))

    client = HolderClient(holder.url)
    offer, host_key = create_offer(client.challenge(), gpu, collect_cvm=collect_cvm)
    session = open_answer(Answer.from_json(client.offer(offer).answer), host_key)
    return [session.dataset_key(digest) for _, _, digest, _ in holder.datasets]


def test_an_azure_tdx_cvm_gets_its_keys(world: World, vm: Vtpm, tmp_path: Path) -> None:
    holder = world.holders["azure"]
    with td_quote_service(world.tdx.quote_td_report) as paravisor:
        keys = _release(holder, world, _source(vm, world, tmp_path, paravisor.url))
        assert len(paravisor.requests) == 1
    assert keys == holder.dataset_keys


def test_a_quote_of_another_td_gets_no_key(world: World, vm: Vtpm, tmp_path: Path) -> None:
    """The endpoint answers with a quote of another TD's report on the same platform (same
    report data, another MRTD): the TDREPORT in the HCL report no longer matches it."""
    holder = world.holders["azure"]

    def other_td(report: bytes) -> bytes:
        forged = bytearray(report)
        forged[528:576] = b"\x66" * 48  # MRTD
        return world.tdx.quote_td_report(bytes(forged))

    with td_quote_service(other_td) as paravisor:
        with pytest.raises(HolderRefusedError, match="TDREPORT states another MRTD"):
            _release(holder, world, _source(vm, world, tmp_path, paravisor.url))


def test_the_gpu_recorded_in_pcr23_is_required(world: World, vm: Vtpm, tmp_path: Path) -> None:
    holder = world.holders["gpus"]
    with td_quote_service(world.tdx.quote_td_report) as paravisor:
        source = _source(vm, world, tmp_path, paravisor.url)
        with pytest.raises(
            HolderRefusedError, match=f"PCRs: differs from the policy: PCR{GPU_PCR}"
        ):
            _release(holder, world, source)
        nonce = bytes(range(32))
        evidence = tmp_path / "gpu.json"
        evidence.write_bytes(dump_evidence_json(world.gpu.evidence(nonce)))
        proc = run_cli(
            "attest", "--evidence", evidence, "--nonce", nonce.hex(), "--simulate", world.roots,
            "--offline", "--record-gpus", "--record-tpm-tcti", vm.tcti,
            "--tdx-measurements", tmp_path / "no-rtmrs",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert f"recorded in vTPM PCR {GPU_PCR}: GPUs {_ueid(world.gpu)}" in proc.stderr
        assert _release(holder, world, source) == holder.dataset_keys
