"""The GPUs a TD saw, recorded in RTMR3 and required by a holder, under the simulation end to
end: a real `gpucc holder serve` whose policy pins the simulated TD's MRTD and the RTMR3 event
naming its GPU (`cvm.events.tdx`), and a host collecting its CVM evidence as on a TDX guest:
configfs-tsm (a stand-in kernel that quotes on the simulated platform, with RTMR3 as the
writes to its measurement register left it), the firmware's CC event log, and the runtime
records of the GPU verdict (`gpucc attest --record-gpus` in the TD) appended to it. Recorded:
keys; not recorded, recorded for another GPU, or extended without its log: refused by name."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from gpucc.assembly.sources import LocalSource
from gpucc.gpuattest.cvm.eventlog import parse_event_log
from gpucc.gpuattest.cvm.gpu_event import devices_pin, record_gpu_verdict
from gpucc.gpuattest.cvm.tdx_sim import SIMULATED_MRTD, simulated_boot_log
from gpucc.gpuattest.evidence import dump_evidence_json
from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.keyrelease.protocol import Answer, CollectedEvidence, create_offer, open_answer
from gpucc.travel.client import HolderClient
from gpucc.travel.errors import HolderRefusedError
from tests.e2e.test_travel_e2e import Holder, World, _start, _stop, _wait_healthy
from tests.support.cli import run_cli
from tests.support.tsm import FakeTsm

pytestmark = pytest.mark.slow


def _ueid(gpu: SimulatedGpu) -> str:
    chain = gpu.evidence(bytes(32)).gpus[0].cert_chain_pem
    return str(x509.load_pem_x509_certificates(chain)[0].serial_number)


class FakeRtmr3:
    """``measurements/rtmr3:sha384`` as the kernel keeps it: each 48-byte write extends."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "rtmr3:sha384"
        os.mkfifo(self.path)
        self.value = bytes(48)
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            with open(self.path, "rb") as fifo:  # blocks until a writer opens it
                while chunk := fifo.read(48):
                    if len(chunk) == 48 and not self._stop:
                        self.value = hashlib.sha384(self.value + chunk).digest()

    def close(self) -> None:
        self._stop = True
        with open(self.path, "wb"):
            pass
        self._thread.join(timeout=10)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("gpu-rtmr")
    w = World(tmp=tmp, gpu=SimulatedGpu.create(now=dt.datetime.now(dt.UTC)), roots=tmp / "roots")
    w.write_roots()
    pin = devices_pin([_ueid(w.gpu)]).to_dict()
    policy = tmp / "bound.yaml"
    policy.write_text(
        "version: 1\nocsp:\n  require: false\ncvm:\n"
        f"  measurements:\n    tdx:\n      mrtd: '{SIMULATED_MRTD.hex()}'\n"
        "  events:\n    tdx:\n"
        f"    - {{name: {pin['name']}, register: {pin['register']}, type: {pin['type']},"
        f" digest: '{pin['digest']}'}}\n"
    )
    w.holders["bound"] = _start(w, "bound", [4096], "--policy", str(policy))
    try:
        _wait_healthy(w.holders["bound"])
        yield w
    finally:
        for holder in w.holders.values():
            _stop(holder)


@pytest.fixture
def td(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRtmr3]:
    """A simulated TD: its boot log as the firmware left it, RTMR0..2 its replay, RTMR3 what
    was written to the measurement register; quotes through a stand-in configfs-tsm."""
    boot = simulated_boot_log()
    (tmp_path / "CCEL").write_bytes(boot)
    booted = parse_event_log(boot).replay()
    rtmr3 = FakeRtmr3(tmp_path / "measurements")

    def quote(inblob: bytes, _privlevel: int | None) -> bytes:
        rtmrs = (booted["rtmr0"], booted["rtmr1"], booted["rtmr2"], rtmr3.value)
        return world.tdx.quote(inblob, rtmrs=rtmrs)

    fake = FakeTsm(tmp_path / "report", quote, provider="tdx_guest", privlevels=False)
    fake.install(monkeypatch)
    try:
        yield rtmr3
    finally:
        fake.close()
        rtmr3.close()


def _release(world: World, tmp: Path) -> list[bytes]:
    holder: Holder = world.holders["bound"]
    issued = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    source = LocalSource(
        tsm_root=tmp / "report", event_log_path=tmp / "CCEL", runtime_log_path=tmp / "rtmr3-events",
        cvm_collateral=world.tdx.collateral(issued=issued).to_json(),
    )  # fmt: skip

    def gpu(nonce: bytes) -> CollectedEvidence:
        return CollectedEvidence.from_evidence_set(world.gpu.evidence(nonce))

    def cvm(report_data: bytes) -> object:
        found = source.cvm_evidence(report_data)
        assert found is not None
        return found

    client = HolderClient(holder.url)
    offer, key = create_offer(client.challenge(), gpu, collect_cvm=cvm)  # type: ignore[arg-type]
    session = open_answer(Answer.from_json(client.offer(offer).answer), key)
    return [session.dataset_key(digest) for _, _, digest, _ in holder.datasets]


def _record(tmp: Path, devices: list[str]) -> None:
    evidence = hashlib.sha256(b"the GPU evidence the verdict was reached on").digest()
    record_gpu_verdict(
        devices, evidence, runtime_log=tmp / "rtmr3-events", measurements=tmp / "measurements"
    )


def _attest_and_record(world: World, tmp: Path, nonce: bytes, expected: bytes) -> int:
    """`gpucc attest --record-gpus` in the TD, on its GPU's evidence over ``nonce``."""
    evidence = tmp / "gpu.json"
    evidence.write_bytes(dump_evidence_json(world.gpu.evidence(nonce)))
    proc = run_cli(
        "attest", "--evidence", evidence, "--nonce", expected.hex(), "--simulate", world.roots,
        "--offline", "--record-gpus", "--tdx-measurements", tmp / "measurements",
        "--runtime-log", tmp / "rtmr3-events",
    )  # fmt: skip
    assert ("recorded in RTMR3 and" in proc.stderr) is (proc.returncode == 0), proc.stderr
    return proc.returncode


def test_a_td_that_recorded_its_gpu_gets_its_keys(
    world: World, td: FakeRtmr3, tmp_path: Path
) -> None:
    nonce = bytes(range(32))
    assert _attest_and_record(world, tmp_path, nonce, bytes(32)) == 1  # wrong nonce
    assert td.value == bytes(48) and not (tmp_path / "rtmr3-events").exists()
    assert _attest_and_record(world, tmp_path, nonce, nonce) == 0
    assert td.value != bytes(48)
    assert f"gpucc gpus: {_ueid(world.gpu)}".encode() in (tmp_path / "rtmr3-events").read_bytes()
    assert _release(world, tmp_path) == world.holders["bound"].dataset_keys


def test_a_td_that_recorded_nothing_is_refused_naming_the_event(
    world: World, td: FakeRtmr3, tmp_path: Path
) -> None:
    with pytest.raises(HolderRefusedError, match="gpus: no RTMR3 event with digest"):
        _release(world, tmp_path)


def test_a_td_that_recorded_another_gpu_is_refused(
    world: World, td: FakeRtmr3, tmp_path: Path
) -> None:
    _record(tmp_path, ["424242"])
    with pytest.raises(
        HolderRefusedError, match=r"no RTMR3 event .*; event \d+ \(EV_EVENT_TAG in RTMR3"
    ):
        _release(world, tmp_path)


def test_an_extension_without_its_log_is_refused_naming_rtmr3(
    world: World, td: FakeRtmr3, tmp_path: Path
) -> None:
    _record(tmp_path, [_ueid(world.gpu)])
    (tmp_path / "rtmr3-events").unlink()
    with pytest.raises(HolderRefusedError, match="RTMR3 differ"):
        _release(world, tmp_path)
