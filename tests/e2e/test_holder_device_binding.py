"""GPUs bound to the offer: a real `gpucc holder serve` whose policy pins device identities
(`devices.allowed`, the leaf certificate's serial) releases to the pinned simulated GPU and
refuses any other by name; a GPU report repeated in one offer is refused by name."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator

import pytest
from cryptography import x509

from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.keyrelease.protocol import Answer, CollectedEvidence, create_offer, open_answer
from gpucc.travel.client import HolderClient
from gpucc.travel.errors import HolderProtocolError, HolderRefusedError
from tests.e2e.test_travel_e2e import Holder, World, _start, _stop, _wait_healthy

pytestmark = pytest.mark.slow


def _ueid(gpu: SimulatedGpu) -> str:
    chain = gpu.evidence(bytes(32)).gpus[0].cert_chain_pem
    return str(x509.load_pem_x509_certificates(chain)[0].serial_number)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("device-binding")
    w = World(tmp=tmp, gpu=SimulatedGpu.create(now=dt.datetime.now(dt.UTC)), roots=tmp / "roots")
    w.write_roots()
    for name, allowed in (("pinned", _ueid(w.gpu)), ("other", "12345")):
        policy = tmp / f"{name}.yaml"
        policy.write_text(
            "version: 1\nocsp:\n  require: false\n"
            f"devices:\n  allowed: ['{allowed}']\n"
            "cvm:\n  allow_unpinned: true\n"
        )
        w.holders[name] = _start(w, name, [4096], "--policy", str(policy))
    try:
        for holder in w.holders.values():
            _wait_healthy(holder)
        yield w
    finally:
        for holder in w.holders.values():
            _stop(holder)


def _release(holder: Holder, world: World, repeat: int = 1) -> list[bytes]:
    def gpu(nonce: bytes) -> CollectedEvidence:
        ev = world.gpu.evidence(nonce)
        return CollectedEvidence.from_evidence_set(dataclasses.replace(ev, gpus=ev.gpus * repeat))

    client = HolderClient(holder.url)
    offer, host_key = create_offer(client.challenge(), gpu, collect_cvm=world.collect_cvm)
    session = open_answer(Answer.from_json(client.offer(offer).answer), host_key)
    return [session.dataset_key(digest) for _, _, digest, _ in holder.datasets]


def test_the_pinned_gpu_gets_its_keys_and_another_is_refused_by_name(world: World) -> None:
    holder = world.holders["pinned"]
    assert _release(holder, world) == holder.dataset_keys
    with pytest.raises(HolderRefusedError, match=f"GPU {_ueid(world.gpu)} .*devices.allowed"):
        _release(world.holders["other"], world)


def test_one_gpus_report_twice_in_an_offer_is_refused_by_name(world: World) -> None:
    with pytest.raises(
        (HolderRefusedError, HolderProtocolError),
        match=f"report of device {_ueid(world.gpu)} over nonce .* already accepted",
    ):
        _release(world.holders["pinned"], world, repeat=2)
