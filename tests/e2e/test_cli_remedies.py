"""A failure's hint names the remedy for what failed, as real processes print it: a CVM's
collateral is never in a collateral bundle, and NRAS (``--verifier remote``) is not replaced
by one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import netfixtures as nf
from tests.support.cli import gpucc
from tests.support.paths import DATA

TDX_QUOTE = DATA / "cpu-tee" / "tdx" / "quote.bin"  # a TD that is not debuggable
AT = "2025-01-01T00:00:00Z"
TDX_REPORT_DATA = (
    "9a9d48e7f6799642d3d1b34e1e5e1742d4bb02dd6ddd551862c1211d35c304f9"
    "eca3efdbb481601c163cf52493d6e44aed55d51ec39b7e518fadb92c2b523f20"
)
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
    # The quote is judged without the collateral (its report data is given): undecided, and
    # the remedy named is the CVM's, never a bundle.
    proc = gpucc(
        "attest", "--cvm-only", "--cvm-evidence", str(TDX_QUOTE), "--at", AT,
        "--cvm-report-data", TDX_REPORT_DATA, *args,
    )  # fmt: skip
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


@pytest.mark.parametrize(
    "args",
    [
        ("--sample",),  # the simulated GPU's roots
        (
            "--cvm-only",
            "--cvm-evidence",
            str(DATA / "cpu-tee" / "snp" / "report.bin"),
            "--cvm-collateral",
            str(DATA / "cpu-tee" / "snp" / "vcek.der"),
        ),  # SEV-SNP roots
        (
            "--cvm-only",
            "--cvm-evidence",
            str(TDX_QUOTE),
            "--cvm-report-data",
            TDX_REPORT_DATA,
        ),  # the TDX root
    ],  # fmt: skip
    ids=["gpu", "snp", "tdx"],
)
def test_a_simulation_without_roots_is_told_which_directory_not_connectivity(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    # Nothing is fetched for a simulation: its missing roots are undecided (3), and the remedy
    # is the directory the simulated side used, never the network.
    (tmp_path / "sim").mkdir()
    proc = gpucc("attest", *args, "--simulate", str(tmp_path / "sim"), "--offline", "--at", AT)
    assert proc.returncode == 3, proc.stderr
    assert "--simulate DIR" in proc.stderr and "connectivity" not in proc.stderr, proc.stderr
