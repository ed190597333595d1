"""A TPM simulator (swtpm) provisioned as an Azure-shaped confidential VM's vTPM.

:func:`azure_vtpm` starts ``swtpm`` on a unix socket in a temporary directory, makes a
restricted RSA-2048 signing key (the AK) persistent at 0x81000003 and writes a simulated HCL
report into NV index 0x01400001, as Azure's paravisor does. libtpms caps an NV index at 2048
bytes, so the index holds the report up to the end of its runtime claims (the rest of the
2600 bytes is zeros, which the collector restores).
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding, load_pem_public_key

from gpucc.gpuattest.cvm.vtpm_collect import AZURE_AK_HANDLE, HCL_NV_INDEX

TOOLS = ("swtpm", "tpm2_createprimary", "tpm2_evictcontrol", "tpm2_readpublic",
         "tpm2_nvdefine", "tpm2_nvwrite", "tpm2_nvread", "tpm2_quote", "tpm2_nvreadpublic")  # fmt: skip
MISSING = [tool for tool in TOOLS if shutil.which(tool) is None]
needs_swtpm = pytest.mark.skipif(
    bool(MISSING), reason=f"swtpm/tpm2-tools not installed ({', '.join(MISSING)})"
)
AK_ATTRIBUTES = "fixedtpm|fixedparent|sensitivedataorigin|userwithauth|restricted|sign|noda"


@dataclass
class Vtpm:
    """A running simulated vTPM: its TCTI and AK."""

    tcti: str
    directory: Path
    ak: rsa.RSAPublicKey | None = None

    def tpm2(self, *argv: str, stdin: bytes | None = None) -> bytes:
        env = {**os.environ, "TPM2TOOLS_TCTI": self.tcti}
        proc = subprocess.run(argv, env=env, input=stdin, capture_output=True, timeout=60)
        assert proc.returncode == 0, (argv, proc.stderr.decode())
        return proc.stdout

    def make_ak(self) -> rsa.RSAPublicKey:
        """A restricted RSA signing key persisted at Azure's AK handle."""
        ctx, pem = self.directory / "ak.ctx", self.directory / "ak.pem"
        self.tpm2("tpm2_createprimary", "-Q", "-C", "o", "-G", "rsa2048:rsassa-sha256:null",
                  "-a", AK_ATTRIBUTES, "-c", str(ctx))  # fmt: skip
        self.tpm2("tpm2_evictcontrol", "-Q", "-C", "o", "-c", str(ctx), f"0x{AZURE_AK_HANDLE:x}")
        self.tpm2("tpm2_readpublic", "-Q", "-c", f"0x{AZURE_AK_HANDLE:x}", "-f", "pem",
                  "-o", str(pem))  # fmt: skip
        key = load_pem_public_key(pem.read_bytes())
        assert isinstance(key, rsa.RSAPublicKey)
        self.ak = key
        return key

    def write_hcl(self, report: bytes) -> None:
        """Define NV index 0x01400001 and write ``report`` up to its runtime claims' end."""
        (size,) = struct.unpack_from("<I", report, 8)
        blob = self.directory / "hcl.bin"
        blob.write_bytes(report[:size])
        index = f"0x{HCL_NV_INDEX:08x}"
        self.tpm2("tpm2_nvdefine", index, "-C", "o", "-s", str(size),
                  "-a", "ownerread|ownerwrite|authread|authwrite")  # fmt: skip
        self.tpm2("tpm2_nvwrite", "-C", "o", "-i", str(blob), index)

    def extend(self, pcr: int, digest: bytes) -> None:
        self.tpm2("tpm2_pcrextend", f"{pcr}:sha256={digest.hex()}")

    def public_pem(self) -> bytes:
        assert self.ak is not None
        from cryptography.hazmat.primitives.serialization import PublicFormat

        return self.ak.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)


@contextmanager
def swtpm(directory: Path) -> Iterator[Vtpm]:
    """A fresh swtpm on a unix socket in ``directory``, stopped (by its own pid) on exit."""
    directory.mkdir(parents=True, exist_ok=True)
    sock = directory / "tpm.sock"
    proc = subprocess.Popen(
        ["swtpm", "socket", "--tpm2", "--tpmstate", f"dir={directory}",
         "--server", f"type=unixio,path={sock}", "--ctrl", f"type=unixio,path={sock}.ctrl",
         "--flags", "not-need-init,startup-clear"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while not (sock.exists() and Path(f"{sock}.ctrl").exists()):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
            assert time.monotonic() < deadline, "swtpm did not start"
            time.sleep(0.02)
        yield Vtpm(tcti=f"swtpm:path={sock}", directory=directory)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


@contextmanager
def azure_vtpm(directory: Path, hcl_for: Callable[[rsa.RSAPublicKey], bytes]) -> Iterator[Vtpm]:
    """An Azure-shaped vTPM: the AK at 0x81000003 and ``hcl_for(ak)`` in the HCL NV index."""
    with swtpm(directory) as tpm:
        tpm.write_hcl(hcl_for(tpm.make_ak()))
        yield tpm
