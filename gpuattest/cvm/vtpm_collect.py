"""Collect a paravisor CVM's evidence through its vTPM (Azure's SEV-SNP and TDX confidential VMs).

Under a paravisor there is no configfs-tsm report: the hardware report sits in the vTPM's NV
index 0x01400001 as an HCL report (:mod:`.hcl`), and the guest's freshness value can only
ride in a TPM2_Quote signed by the attestation key (AK, persistent handle 0x81000003) that
the HCL report's runtime claims name. Collection is three TPM commands, run with the
``tpm2-tools`` programs (Debian's ``tpm2-tools``): ``tpm2_nvreadpublic`` (is there a
paravisor?), ``tpm2_nvread`` (the HCL report) and ``tpm2_quote`` over the SHA-256 bank's PCRs
0-23 with the qualifying data given. The programs talk to the TPM through the TCTI named in
``tcti`` (``device:/dev/tpmrm0`` by default; ``swtpm:path=SOCKET`` for a simulator).

On a TDX VM the HCL report holds a TDREPORT, which only the platform can turn into a quote:
the collector sends it to the paravisor's quote endpoint (:mod:`.azure_tdquote`,
``http://169.254.169.254/acc/tdquote`` unless told otherwise) and puts the TD quote in the
document beside the HCL report and the TPM quote, as CoCo's attestation agent does.

The result is gpucc's ``gpucc.vtpm/v1`` evidence document (:mod:`.vtpm_evidence`).

An NV index shorter than the HCL report's 2600 bytes (a TPM whose NV indices are capped, as
libtpms's are at 2048 bytes) is padded with zeros to 2600: the layout puts only zeros after
the runtime claims, and the verifier still checks every size and the zero tail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from gpucc.core.errors import EnvironmentProblemError, UsageError

from .azure_tdquote import AZURE_TD_QUOTE_URL, fetch_td_quote
from .hcl import HCL_REPORT_SIZE, parse_hcl_report
from .vtpm_evidence import encode_vtpm_evidence

__all__ = [
    "AZURE_AK_HANDLE",
    "DEFAULT_TCTI",
    "HCL_NV_INDEX",
    "QUOTED_PCRS",
    "collect_vtpm_evidence",
    "paravisor_present",
    "run_tpm2",
]

HCL_NV_INDEX = 0x01400001
AZURE_AK_HANDLE = 0x81000003
DEFAULT_TCTI = "device:/dev/tpmrm0"
QUOTED_PCRS = tuple(range(24))
_TIMEOUT_S = 60
_TOOLS = ("tpm2_nvreadpublic", "tpm2_nvread", "tpm2_quote")


def _env(message: str, hint: str = "") -> EnvironmentProblemError:
    error = EnvironmentProblemError(message)
    error.hint = hint
    return error


def _run(tcti: str, *argv: str) -> subprocess.CompletedProcess[bytes]:
    program = shutil.which(argv[0])
    if program is None:
        raise _env(
            f"{argv[0]} is not installed", "install tpm2-tools (Debian: apt-get install tpm2-tools)"
        )
    env = {**os.environ, "TPM2TOOLS_TCTI": tcti}
    try:
        # A fixed tpm2-tools program and arguments built here, no shell.
        return subprocess.run(  # noqa: S603
            [program, *argv[1:]], env=env, capture_output=True, timeout=_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise EnvironmentProblemError(f"{argv[0]} did not answer in {_TIMEOUT_S} s") from None


def run_tpm2(tcti: str, *argv: str) -> subprocess.CompletedProcess[bytes]:
    """Run one tpm2-tools program (``argv[0]``) against the TPM behind ``tcti``.

    Raises:
        EnvironmentProblemError: the program is not installed or did not answer in time.
    """
    return _run(tcti, *argv)


def _failed(proc: subprocess.CompletedProcess[bytes], what: str) -> EnvironmentProblemError:
    lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    last = lines[-1][:200] if lines else f"exit status {proc.returncode}"
    return EnvironmentProblemError(f"the vTPM could not {what}: {last}")


def _device_of(tcti: str) -> Path | None:
    kind, _, conf = tcti.partition(":")
    return Path(conf or "/dev/tpm0") if kind == "device" else None


def paravisor_present(tcti: str = DEFAULT_TCTI) -> bool:
    """Whether the TPM behind ``tcti`` has the HCL report's NV index (a paravisor's vTPM).

    False when the TCTI names a device that does not exist, or tpm2-tools are not installed
    (nothing to collect through); True only when ``tpm2_nvreadpublic`` finds the index.

    Raises:
        EnvironmentProblemError: the device exists but this user may not open it.
    """
    device = _device_of(tcti)
    if device is not None and not device.exists():
        return False
    if device is not None and not os.access(device, os.R_OK | os.W_OK):
        raise _env(f"{device} cannot be opened", "run as root or as a member of the group tss")
    if any(shutil.which(tool) is None for tool in _TOOLS):
        return False
    return _run(tcti, "tpm2_nvreadpublic", f"0x{HCL_NV_INDEX:08x}").returncode == 0


def collect_vtpm_evidence(
    qualifying_data: bytes,
    *,
    tcti: str = DEFAULT_TCTI,
    vcek: bytes | None,
    ak_handle: int = AZURE_AK_HANDLE,
    td_quote_url: str = AZURE_TD_QUOTE_URL,
) -> bytes:
    """The vTPM evidence document (``gpucc.vtpm/v1`` JSON) for ``qualifying_data``.

    Args:
        qualifying_data: 1 to 64 bytes the TPM quote carries (its ``extraData``).
        tcti: the TPM's TCTI.
        vcek: the SEV-SNP VCEK (DER or PEM) to ship with the evidence; on Azure it comes from
            the instance metadata service (see docs/CVM.md). Not used on a TDX VM.
        ak_handle: the AK's persistent handle.
        td_quote_url: a TDX VM's quote endpoint (Azure's paravisor's by default).

    Raises:
        UsageError: the qualifying data is empty or longer than 64 bytes.
        EnvironmentProblemError: tpm2-tools missing, a TPM command failed, no VCEK for an
            SEV-SNP VM, or a TDX VM's quote endpoint failed.
        MalformedHclReportError: the NV index does not hold an HCL report.
    """
    if not 1 <= len(qualifying_data) <= 64:
        raise UsageError("a TPM quote's qualifying data is 1 to 64 bytes")
    with tempfile.TemporaryDirectory(prefix="gpucc-vtpm-") as tmp:
        work = Path(tmp)  # mkdtemp: mode 0700
        hcl = work / "hcl.bin"
        proc = _run(tcti, "tpm2_nvread", "-C", "o", "-o", str(hcl), f"0x{HCL_NV_INDEX:08x}")
        if proc.returncode != 0:
            raise _failed(proc, f"read the HCL report (NV index 0x{HCL_NV_INDEX:08X})")
        report = hcl.read_bytes()
        if len(report) < HCL_REPORT_SIZE:
            report = report.ljust(HCL_REPORT_SIZE, b"\0")
        parsed = parse_hcl_report(report)
        td_quote = None
        if parsed.tee == "tdx":
            td_quote = fetch_td_quote(parsed.hardware_report, url=td_quote_url)
            vcek = None
        elif vcek is None:
            raise _env(
                "an SEV-SNP paravisor VM's evidence needs the VCEK",
                "fetch it from the instance metadata service and pass --cvm-collateral",
            )
        selection = "sha256:" + ",".join(str(i) for i in QUOTED_PCRS)
        msg, sig, pcrs = work / "quote.msg", work / "quote.sig", work / "quote.pcrs"
        proc = _run(tcti, "tpm2_quote", "-c", f"0x{ak_handle:08x}", "-l", selection,
                    "-q", qualifying_data.hex(), "-g", "sha256", "-m", str(msg),
                    "-s", str(sig), "-f", "plain", "-o", str(pcrs), "-F", "values")  # fmt: skip
        if proc.returncode != 0:
            raise _failed(proc, f"quote with the attestation key 0x{ak_handle:08X}")
        values = pcrs.read_bytes()
        if len(values) != 32 * len(QUOTED_PCRS):
            raise EnvironmentProblemError("tpm2_quote returned PCR values of an unexpected size")
        doc = encode_vtpm_evidence(
            hcl_report=report,
            quote=msg.read_bytes(),
            signature=sig.read_bytes(),
            pcrs=[values[i : i + 32] for i in range(0, len(values), 32)],
            vcek=vcek,
            td_quote=td_quote,
            user_data=False,
        )
    return json.dumps(doc, indent=1).encode() + b"\n"
