"""The GPU verdict's RTMR3 events: appended to a real firmware log they replay into RTMR3 as
a register extended with them would read, the pin depends on the set of devices only, and
recording fails closed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gpucc.core.errors import EnvironmentProblemError, MalformedEvidenceError
from gpucc.gpuattest.cvm.eventlog import parse_event_log
from gpucc.gpuattest.cvm.gpu_event import (
    devices_pcr_value,
    devices_pin,
    gpu_verdict_records,
    record_gpu_verdict,
    with_runtime_events,
)
from tests.support.paths import DATA

OVMF = (DATA / "cloud-cvm" / "tdx-ccel-ovmf" / "CCEL_data_ovmf").read_bytes()
TD_SHIM = (DATA / "cloud-cvm" / "tdx-ccel" / "CCEL_data").read_bytes()
EVIDENCE = hashlib.sha256(b"evidence").digest()


@pytest.mark.parametrize("boot", [OVMF, TD_SHIM], ids=["ovmf-ff-fill", "td-shim-zero-fill"])
def test_appended_to_a_real_log_the_events_replay_into_rtmr3(boot: bytes) -> None:
    records = gpu_verdict_records(["7", "12"], EVIDENCE)
    log = parse_event_log(with_runtime_events(boot, records))
    before = parse_event_log(boot)
    assert len(log.events) == len(before.events) + 2 and len(with_runtime_events(boot, records))
    rtmr3 = bytes(48)
    for event in log.events[-2:]:
        assert event.register == "rtmr3" and event.sha384 is not None
        rtmr3 = hashlib.sha384(rtmr3 + event.sha384).digest()
    assert log.replay()["rtmr3"] == rtmr3
    assert {k: v for k, v in log.replay().items() if k != "rtmr3"} == {
        k: v for k, v in before.replay().items() if k != "rtmr3"
    }
    tagged, action = log.events[-2:]
    assert tagged.data.endswith(b"gpucc gpus: 12,7") and tagged.sha384 is not None
    assert tagged.sha384.hex() == devices_pin(["12", "7"]).digest
    assert action.data == f"gpucc gpu evidence sha256 {EVIDENCE.hex()}".encode()


def test_the_pin_names_the_set_of_devices_not_the_evidence() -> None:
    a, b = gpu_verdict_records(["7"], EVIDENCE), gpu_verdict_records(["7"], bytes(32))
    assert a != b and devices_pin(["7"]) == devices_pin(["7", "7"])
    assert devices_pin(["7"]).digest != devices_pin(["8"]).digest
    assert devices_pin(["7"]).to_dict()["type"] == "EV_EVENT_TAG"
    for bad in ([], ["GPU-1"], ["-7"]):
        with pytest.raises(ValueError, match="decimal"):
            gpu_verdict_records(bad, EVIDENCE)


def test_records_that_do_not_parse_are_refused() -> None:
    with pytest.raises(MalformedEvidenceError):
        with_runtime_events(OVMF, b"\x04\0\0\0garbage")
    assert with_runtime_events(OVMF, b"") == OVMF


def test_recording_logs_first_then_extends_and_fails_closed(tmp_path: Path) -> None:
    log = tmp_path / "rtmr3-events"
    with pytest.raises(EnvironmentProblemError, match="not a TD whose kernel"):
        record_gpu_verdict(["7"], EVIDENCE, runtime_log=log, measurements=tmp_path / "none")
    assert not log.exists()
    measurements = tmp_path / "measurements"
    measurements.mkdir()
    register = measurements / "rtmr3:sha384"
    register.write_bytes(b"")
    records = record_gpu_verdict(["7"], EVIDENCE, runtime_log=log, measurements=measurements)
    assert log.read_bytes() == records
    # a plain file keeps the last 48-byte write: the evidence event's digest
    assert (
        register.read_bytes()
        == hashlib.sha384(f"gpucc gpu evidence sha256 {EVIDENCE.hex()}".encode()).digest()
    )
    register.write_bytes(b"")
    unwritable = tmp_path / "a-directory"
    unwritable.mkdir()
    with pytest.raises(EnvironmentProblemError, match="cannot record the GPU verdict"):
        record_gpu_verdict(["7"], EVIDENCE, runtime_log=unwritable, measurements=measurements)
    assert register.read_bytes() == b""  # nothing extended without its log


def test_the_pcr_value_is_one_extension_with_the_devices_data() -> None:
    records = gpu_verdict_records(["12", "7"], EVIDENCE)
    log = parse_event_log(with_runtime_events(TD_SHIM, records))
    data = log.events[-2].data  # the devices event, whose SHA-256 the PCR is extended with
    assert (
        devices_pcr_value(["7", "12"])
        == hashlib.sha256(bytes(32) + hashlib.sha256(data).digest()).digest()
    )
    assert devices_pcr_value(["7"]) != devices_pcr_value(["7", "12"])
