"""Evidence collection from the local GPUs through NVML (nvidia-ml-py).

Only this module touches the driver. Every NVML failure becomes a typed
environment error (:class:`~gpuattest.errors.EnvironmentProblemError`): no
driver, no GPU, CC off, or an NVML call that fails. The collected chain is
returned as the GPU supplied it; the verifier treats its root as untrusted input.
"""

from __future__ import annotations

import ctypes
from typing import Any

from gpucc.core.errors import CcModeError, NvmlUnavailableError

from .evidence import CcState, EvidenceSet, GpuEvidence

__all__ = ["collect_evidence", "read_cc_state"]

_ARCH_NAMES = {9: "HOPPER", 10: "BLACKWELL"}
# nvmlSystemConfComputeSettings_v1: size 20 | version 1 << 24 (nvml.h).
_SETTINGS_V1 = 0x01000014


def _nvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailableError("NVML bindings (pynvml) are not installed") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailableError(f"NVML is not available: {exc}") from None
    return pynvml


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def read_cc_state(nvml: Any) -> CcState:
    """CC feature, DevTools mode and multi-GPU (PPCIe) mode.

    Raises:
        NvmlUnavailableError: the driver does not report CC state.
    """
    try:
        state = nvml.nvmlSystemGetConfComputeState()
        multi = 0
        try:
            settings = nvml.c_nvmlSystemConfComputeSettings_v1_t()
            settings.version = _SETTINGS_V1
            if nvml.nvmlSystemGetConfComputeSettings(ctypes.byref(settings)) == 0:
                multi = int(settings.multiGpuMode)
        except (AttributeError, nvml.NVMLError):
            multi = 0
        return CcState(
            cc_feature=bool(state.ccFeature),
            devtools_mode=bool(state.devToolsMode),
            multi_gpu_mode=multi,
        )
    except nvml.NVMLError as exc:
        raise NvmlUnavailableError(f"NVML cannot report the CC state: {exc}") from None


def collect_evidence(nonce: bytes) -> EvidenceSet:
    """Collect a report for ``nonce`` and the certificate chain from every local GPU.

    Raises:
        NvmlUnavailableError: no NVML, no GPU, or an NVML call failed.
        CcModeError: confidential computing is off.
    """
    if len(nonce) != 32:
        raise ValueError("the nonce must be 32 bytes")
    nvml = _nvml()
    try:
        cc = read_cc_state(nvml)
        if not cc.cc_feature and cc.multi_gpu_mode == 0:
            raise CcModeError("confidential computing is off on this host")
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            raise NvmlUnavailableError("NVML reports no GPU")
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        gpus: list[GpuEvidence] = []
        for i in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            arch_code = int(nvml.nvmlDeviceGetArchitecture(handle))
            cert = nvml.nvmlDeviceGetConfComputeGpuCertificate(handle)
            report = nvml.nvmlDeviceGetConfComputeGpuAttestationReport(handle, nonce)
            chain = bytes(cert.attestationCertChain[: cert.attestationCertChainSize])
            raw = bytes(report.attestationReport[: report.attestationReportSize])
            gpus.append(
                GpuEvidence(
                    report=raw,
                    cert_chain_pem=chain,
                    arch=_ARCH_NAMES.get(arch_code, f"UNKNOWN-{arch_code}"),
                    nonce=nonce,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    driver_version=driver,
                    vbios_version=_text(nvml.nvmlDeviceGetVbiosVersion(handle)),
                )
            )
        return EvidenceSet(gpus=tuple(gpus), source="nvml", cc=cc)
    except nvml.NVMLError as exc:
        raise NvmlUnavailableError(f"NVML call failed: {exc}") from None
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
