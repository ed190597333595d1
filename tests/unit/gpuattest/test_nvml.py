"""Evidence collection through NVML, with the driver calls answered by a simulated GPU.

No GPU is available to the test suite, so the NVML *functions* are replaced; the
nvidia-ml-py structures they fill are the real ctypes ones, so sizes, offsets and
truncation are exercised as on a real host.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpucc.cli.exitcodes import exit_code_for
from gpucc.core.errors import CcModeError, NvmlUnavailableError
from gpucc.gpuattest.collateral import NoOcsp, rim_sources_from_mapping
from gpucc.gpuattest.evidence import dump_evidence_json, load_evidence_json
from gpucc.gpuattest.nvml import collect_evidence
from gpucc.gpuattest.policy import parse_policy
from gpucc.gpuattest.result import CheckStatus, Verdict
from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.gpuattest.verifier import verify

pynvml = pytest.importorskip("pynvml")
NOW = dt.datetime.now(dt.UTC)


@dataclass
class FakeDriver:
    gpus: list[SimulatedGpu]
    cc_feature: int = 1
    devtools: int = 0
    multi_gpu: int = 0
    fail_on: str | None = None
    calls: list[str] = field(default_factory=list)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def call(name: str) -> None:
            self.calls.append(name)
            if name == self.fail_on:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

        def state() -> Any:
            call("state")
            s = pynvml.c_nvmlConfComputeSystemState_t()
            s.ccFeature, s.devToolsMode = self.cc_feature, self.devtools
            return s

        def settings(ref: Any) -> int:
            call("settings")
            ref._obj.multiGpuMode = self.multi_gpu
            return 0

        def certificate(handle: int) -> Any:
            call("certificate")
            pem = self.gpus[handle].device_pki.pem()
            c = pynvml.c_nvmlConfComputeGpuCertificate_t()
            c.attestationCertChainSize = len(pem)
            ctypes.memmove(c.attestationCertChain, pem, len(pem))
            return c

        def report(handle: int, nonce: bytes) -> Any:
            call("report")
            raw = self.gpus[handle].report(bytes(nonce))
            r = pynvml.c_nvmlConfComputeGpuAttestationReport_t()
            r.attestationReportSize = len(raw)
            ctypes.memmove(r.attestationReport, raw, len(raw))
            return r

        fns = {
            "nvmlInit": lambda: call("init"),
            "nvmlShutdown": lambda: call("shutdown"),
            "nvmlSystemGetConfComputeState": state,
            "nvmlSystemGetConfComputeSettings": settings,
            "nvmlDeviceGetCount": lambda: len(self.gpus),
            "nvmlSystemGetDriverVersion": lambda: "550.90.07",
            "nvmlDeviceGetHandleByIndex": lambda i: i,
            "nvmlDeviceGetArchitecture": lambda h: pynvml.NVML_DEVICE_ARCH_HOPPER,
            "nvmlDeviceGetConfComputeGpuCertificate": certificate,
            "nvmlDeviceGetConfComputeGpuAttestationReport": report,
            "nvmlDeviceGetUUID": lambda h: self.gpus[h].uuid,
            "nvmlDeviceGetVbiosVersion": lambda h: self.gpus[h].vbios_version,
        }
        for name, fn in fns.items():
            monkeypatch.setattr(pynvml, name, fn)


@pytest.fixture
def gpus() -> Iterator[list[SimulatedGpu]]:
    first = SimulatedGpu.create(now=NOW)
    second = SimulatedGpu(
        device_pki=first.device_pki,
        rim_pki=first.rim_pki,
        golden=first.golden,
        fwid=first.fwid,
        uuid="GPU-second",
    )
    yield [first, second]


def _verify(evidence: Any, nonce: bytes, gpu: SimulatedGpu) -> Any:
    return verify(
        evidence,
        expected_nonce=nonce,
        roots=gpu.roots,
        now=NOW,
        rims=rim_sources_from_mapping(gpu.rims),
        ocsp=NoOcsp(),
        policy=parse_policy({"ocsp": {"require": False}}),
    )


def test_collects_every_gpu_and_verifies(
    monkeypatch: pytest.MonkeyPatch, gpus: list[SimulatedGpu]
) -> None:
    FakeDriver(gpus).install(monkeypatch)
    nonce = os.urandom(32)
    ev = collect_evidence(nonce)
    assert ev.source == "nvml" and ev.cc is not None and ev.cc.cc_feature
    assert [g.uuid for g in ev.gpus] == [gpus[0].uuid, "GPU-second"]
    assert all(g.nonce == nonce and g.driver_version == "550.90.07" for g in ev.gpus)
    result = _verify(ev, nonce, gpus[0])
    assert result.verdict is Verdict.TRUSTED, result.reasons
    assert result.gpus[0].check("driver-version").status is CheckStatus.PASS
    assert result.gpus[0].check("cc-mode").status is CheckStatus.PASS
    # the file written by `gpucc evidence collect` reads back to the same evidence
    again = load_evidence_json(dump_evidence_json(ev))
    assert [g.report for g in again.gpus] == [g.report for g in ev.gpus]
    assert again.cc == ev.cc


def test_cc_off_is_an_environment_error(
    monkeypatch: pytest.MonkeyPatch, gpus: list[SimulatedGpu]
) -> None:
    driver = FakeDriver(gpus, cc_feature=0)
    driver.install(monkeypatch)
    with pytest.raises(CcModeError) as info:
        collect_evidence(os.urandom(32))
    assert exit_code_for(info.value) == 5
    assert driver.calls[-1] == "shutdown"


def test_ppcie_mode_counts_as_cc(monkeypatch: pytest.MonkeyPatch, gpus: list[SimulatedGpu]) -> None:
    FakeDriver(gpus, cc_feature=0, multi_gpu=1).install(monkeypatch)
    ev = collect_evidence(os.urandom(32))
    assert ev.cc is not None and ev.cc.multi_gpu_mode == 1


def test_devtools_mode_is_collected_then_refused(
    monkeypatch: pytest.MonkeyPatch, gpus: list[SimulatedGpu]
) -> None:
    FakeDriver(gpus, devtools=1).install(monkeypatch)
    nonce = os.urandom(32)
    result = _verify(collect_evidence(nonce), nonce, gpus[0])
    assert result.verdict is Verdict.NOT_TRUSTED
    assert result.gpus[0].check("devtools").status is CheckStatus.FAIL


def test_nvml_call_failure_is_an_environment_error(
    monkeypatch: pytest.MonkeyPatch, gpus: list[SimulatedGpu]
) -> None:
    driver = FakeDriver(gpus, fail_on="report")
    driver.install(monkeypatch)
    with pytest.raises(NvmlUnavailableError, match="NVML call failed") as info:
        collect_evidence(os.urandom(32))
    assert exit_code_for(info.value) == 5
    assert driver.calls[-1] == "shutdown"


def test_nvml_version_disagreeing_with_the_signed_report_fails(
    monkeypatch: pytest.MonkeyPatch, gpus: list[SimulatedGpu]
) -> None:
    FakeDriver(gpus).install(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: "999.1")
    nonce = os.urandom(32)
    result = _verify(collect_evidence(nonce), nonce, gpus[0])
    assert result.gpus[0].check("driver-version").status is CheckStatus.FAIL
    assert result.verdict is Verdict.NOT_TRUSTED
