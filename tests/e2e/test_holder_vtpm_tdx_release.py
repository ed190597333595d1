"""Key release to an Azure-shaped TDX CVM: a real `gpucc holder serve` (simulated roots, a
policy pinning the simulated TD's MRTD and a PCR) and a host whose CVM evidence is collected
as on Azure: the HCL report from a swtpm provisioned as the paravisor's vTPM, its TDREPORT
quoted by a loopback stand-in for the paravisor's quote endpoint, the TPM quote over the
session's binding value, Intel's (simulated) collateral beside it. A TD quote of another TD
gets no key."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from gpucc.assembly.sources import LocalSource
from gpucc.gpuattest.cvm.tdx_sim import SIMULATED_MRTD
from gpucc.gpuattest.cvm.vtpm_simulate import simulated_tdx_hcl_report
from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.staging.release import (
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
from tests.support.swtpm import Vtpm, azure_vtpm, needs_swtpm

pytestmark = [needs_swtpm, pytest.mark.slow]
PCR7 = hashlib.sha256(b"secure boot policy").digest()


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
    try:
        _wait_healthy(w.holders["azure"])
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
