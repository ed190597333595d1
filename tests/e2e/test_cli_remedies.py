"""A failure's hint names the remedy for what failed, as real processes print it: a CVM's
collateral is never in a collateral bundle, and NRAS (``--verifier remote``) is not replaced
by one."""

from __future__ import annotations

import pytest

from tests.support import netfixtures as nf
from tests.support.cli import gpucc
from tests.support.paths import DATA

TDX_QUOTE = DATA / "cloud-cvm" / "tdx-ccel" / "tdx_quote_4.dat"
AT = "2025-01-01T00:00:00Z"
DEAD = f"http://127.0.0.1:{nf.free_port()}"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--offline",), "a CVM's collateral is not in collateral bundles"),
        (("--cvm-pccs-url", DEAD, "--timeout", "1"), "your PCCS (--cvm-pccs-url)"),
    ],
    ids=["offline", "unreachable"],
)
def test_tdx_collateral_failure_names_cvm_collateral(args: tuple[str, ...], says: str) -> None:
    proc = gpucc("attest", "--cvm-only", "--cvm-evidence", str(TDX_QUOTE), "--at", AT, *args)
    assert proc.returncode == 3, proc.stderr
    assert says in proc.stderr and "--cvm-collateral FILE" in proc.stderr, proc.stderr
    assert "--collateral BUNDLE" not in proc.stderr and "collateral fetch" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--offline",), "drop --offline"),
        (("--nras-url", DEAD, "--timeout", "1"), "NVIDIA's attestation service, --nras-url"),
    ],
    ids=["offline", "unreachable"],
)
def test_remote_verifier_failure_names_the_remote_remedy(args: tuple[str, ...], says: str) -> None:
    proc = gpucc("attest", "--sample", "--verifier", "remote", *args)
    assert proc.returncode == 3, proc.stderr
    assert says in proc.stderr, proc.stderr
    assert "--collateral BUNDLE --offline" not in proc.stderr
    assert "collateral fetch" not in proc.stderr
