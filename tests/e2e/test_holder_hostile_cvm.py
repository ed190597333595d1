"""A holder never answers 500 for what a client sends: every CVM evidence of the crash corpus
(TDX quotes whose PCK certificates fail late, vTPM evidence around them), in an otherwise
honest offer, with and without collateral, to a real `gpucc holder serve` process under
--simulate and under the production roots, fetching collateral and offline. Each is a 4xx
with the documented kind (docs/TRAVEL.md): the CVM evidence is parsed before any trust
decision, so this path is open to anyone who can fetch a challenge. Under the production roots
the simulated GPU is refused (403) before its CVM evidence is judged: those modes show that
the refusal holds whatever the evidence, the simulation's that the evidence itself is."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from collections.abc import Iterator

import pytest
import requests

from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.keyrelease.protocol import CollectedCvmEvidence, create_offer
from gpucc.travel.client import HolderClient
from tests.e2e.test_travel_e2e import Holder, World, _holder_files, _stop, _wait_healthy
from tests.support.netfixtures import free_port
from tests.support.paths import DATA

pytestmark = pytest.mark.slow

CORPUS = DATA / "crash-corpus"
EVIDENCE = sorted(
    p
    for p in CORPUS.iterdir()
    if p.name.startswith(("holder-http--", "tdx-quote-", "tdx-quote--", "vtpm-json--"))
)
#: the documented answers to an offer (docs/TRAVEL.md), by status
DOCUMENTED = {400: {"malformed"}, 403: {"not-trusted", "refused"}}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    tmp = tmp_path_factory.mktemp("hostile-cvm")
    w = World(tmp=tmp, gpu=SimulatedGpu.create(now=dt.datetime.now(dt.UTC)), roots=tmp / "roots")
    w.write_roots()
    return w


MODES = {
    # a simulation's roots; collateral from the offer only, or fetched (from nowhere)
    "simulate-offline": ("--simulate", "{roots}", "--offline"),
    "simulate-fetching": ("--simulate", "{roots}", "--pccs-url", "{dead}"),
    # the production roots (Intel's, AMD's, NVIDIA's), offline and fetching (from nowhere)
    "production-offline": ("--offline",),
    "production-fetching": (
        "--pccs-url", "{dead}", "--rim-url", "{dead}", "--ocsp-url", "{dead}",
    ),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(MODES))
def holder(request: pytest.FixtureRequest, world: World) -> Iterator[tuple[str, Holder]]:
    mode = str(request.param)
    data, kek, key_path, datasets, keys, key = _holder_files(world.tmp, mode, [1_000])
    port, dead = free_port(), f"http://127.0.0.1:{free_port()}"
    log = world.tmp / f"{mode}.log"
    extra = [a.format(roots=world.roots, dead=dead) for a in MODES[mode]]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucc.cli.holder", "serve", "--datasets", str(data),
         "--data-key", str(kek), "--holder-key", str(key_path), "--listen", f"127.0.0.1:{port}",
         "--state", "memory", "--rate", "1000", "--burst", "1000", *extra],
        stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )  # fmt: skip
    holder = Holder(mode, f"http://127.0.0.1:{port}", key, datasets, keys, log, proc)
    _wait_healthy(holder)
    yield mode, holder
    _stop(holder)


@pytest.mark.parametrize("with_collateral", [False, True], ids=["no-collateral", "collateral"])
def test_hostile_cvm_evidence_is_a_documented_refusal(
    world: World, holder: tuple[str, Holder], with_collateral: bool
) -> None:
    mode, service = holder
    collateral = world.tdx.collateral(issued=dt.datetime.now(dt.UTC)).to_json()
    answers = {}
    # fetching under the production roots, the simulated GPU's RIMs are asked of a service
    # that is not there (seconds per offer): the holder-http inputs stand for the rest there
    given = [p for p in EVIDENCE if p.name.startswith("holder-http--")]
    for path in given if mode == "production-fetching" else EVIDENCE:
        evidence = path.read_bytes()

        def collect_cvm(_: bytes, evidence: bytes = evidence) -> CollectedCvmEvidence:
            return CollectedCvmEvidence(evidence, collateral if with_collateral else None)

        offer, _ = create_offer(
            HolderClient(service.url).challenge(), world.collect, collect_cvm=collect_cvm
        )
        answer = requests.post(service.url + "/v1/offer", data=offer.to_json(), timeout=60)
        answers[path.name] = (answer.status_code, answer.json().get("error"), answer.text[:300])
    assert service.proc.poll() is None
    for name, (status, kind, text) in answers.items():
        assert kind in DOCUMENTED.get(status, set()), (mode, name, text)
