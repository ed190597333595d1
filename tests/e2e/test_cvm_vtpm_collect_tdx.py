"""Collecting an Azure-shaped TDX CVM's evidence: a real swtpm provisioned as the paravisor's
vTPM (the AK at 0x81000003, a simulated TDX HCL report at NV index 0x01400001) and a loopback
stand-in for the paravisor's quote endpoint that quotes the TDREPORT on the simulated TDX
platform. `gpucc evidence collect` sends the HCL report's TDREPORT there and writes the TD
quote beside the TPM quote; `gpucc attest` then verifies the file under the simulation's
TDX root with the platform's collateral."""

from __future__ import annotations

import base64
import datetime as dt
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding

from gpucc.assembly.sources import LocalSource
from gpucc.core.errors import EnvironmentProblemError
from gpucc.gpuattest.cvm.appraise import attest_report_data
from gpucc.gpuattest.cvm.tdx_sim import SIMULATED_MRTD, SimulatedTdx, simulated_tdx
from gpucc.gpuattest.cvm.tpm_quote import parse_tpm_quote
from gpucc.gpuattest.cvm.vtpm_evidence import parse_vtpm_evidence
from gpucc.gpuattest.cvm.vtpm_simulate import simulated_tdx_hcl_report
from tests.support.azure_tdquote import TdQuoteService, td_quote_service
from tests.support.cli import run_cli
from tests.support.swtpm import Vtpm, azure_vtpm, needs_swtpm

pytestmark = needs_swtpm
NONCE = bytes(range(32))
NOW = dt.datetime.now(dt.UTC)


@pytest.fixture(scope="module")
def tdx() -> SimulatedTdx:
    return simulated_tdx(NOW)


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory, tdx: SimulatedTdx) -> Path:
    """A simulation directory holding the simulated TDX platform's root, and its collateral."""
    directory = tmp_path_factory.mktemp("roots")
    (directory / "tdx_root.pem").write_bytes(tdx.root.public_bytes(Encoding.PEM))
    collateral = tdx.collateral(issued=NOW - dt.timedelta(hours=1)).to_json()
    (directory.parent / "collateral.json").write_bytes(collateral)
    return directory


@pytest.fixture(scope="module")
def vm(tmp_path_factory: pytest.TempPathFactory, tdx: SimulatedTdx) -> Iterator[Vtpm]:
    def hcl(ak: rsa.RSAPublicKey) -> bytes:
        return simulated_tdx_hcl_report(tdx, ak)

    with azure_vtpm(tmp_path_factory.mktemp("vm"), hcl) as tpm:
        yield tpm


@pytest.fixture
def paravisor(tdx: SimulatedTdx) -> Iterator[TdQuoteService]:
    with td_quote_service(tdx.quote_td_report) as service:
        yield service


def _collect(vm: Vtpm, out: Path, url: str, *extra: str | Path) -> subprocess.CompletedProcess[str]:
    return run_cli("evidence", "collect", "--cvm", out, "--cvm-only", "--nonce", NONCE.hex(),
                   "--tpm-tcti", vm.tcti, "--tsm-root", out.parent / "no-tsm",
                   "--td-quote-url", url, *extra)  # fmt: skip


def _attest(evidence: Path, roots: Path, report_data: str) -> subprocess.CompletedProcess[str]:
    return run_cli("attest", "--cvm-only", "--cvm-evidence", evidence, "--cvm-report-data",
                   report_data, "--simulate", roots, "--cvm-collateral",
                   roots.parent / "collateral.json", "--offline", "-f", "json")  # fmt: skip


def test_collect_through_the_paravisor_then_attest_trusts_it(
    vm: Vtpm, roots: Path, paravisor: TdQuoteService, tmp_path: Path
) -> None:
    out = tmp_path / "cvm.json"
    proc = _collect(vm, out, paravisor.url, "-f", "json")
    assert proc.returncode == 0, proc.stderr
    expected = attest_report_data(NONCE)[:32]
    assert json.loads(proc.stdout)["cvm_report_data"] == expected.hex()
    ev = parse_vtpm_evidence(out.read_bytes())
    assert ev.version == "gpucc.vtpm/v1" and ev.hcl.tee == "tdx" and ev.vcek is None
    assert parse_tpm_quote(ev.quote).extra_data == expected
    # the endpoint got exactly the HCL report's TDREPORT, as Azure's reads it
    (sent,) = paravisor.requests
    encoded = json.loads(sent)["report"]
    assert base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)) == ev.hcl.hardware_report
    trusted = _attest(out, roots, expected.hex())
    assert trusted.returncode == 0, (trusted.stdout, trusted.stderr)
    doc = json.loads(trusted.stdout)
    assert doc["cvm"]["claims"]["mrtd"] == SIMULATED_MRTD.hex()
    assert doc["cvm"]["claims"]["vtpm"]["paravisor"] == "azure-hcl"
    other = _attest(out, roots, attest_report_data(bytes(32))[:32].hex())
    assert other.returncode == 1 and json.loads(other.stdout)["trusted"] is False


def test_the_endpoint_is_taken_from_the_environment_too(
    vm: Vtpm, paravisor: TdQuoteService, tmp_path: Path
) -> None:
    out = tmp_path / "cvm.json"
    proc = run_cli("evidence", "collect", "--cvm", out, "--cvm-only", "--nonce", NONCE.hex(),
                   "--tpm-tcti", vm.tcti, "--tsm-root", tmp_path / "no-tsm",
                   env={"GPUCC_TD_QUOTE_URL": paravisor.url})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(paravisor.requests) == 1 and parse_vtpm_evidence(out.read_bytes()).td_quote


def test_an_endpoint_that_fails_leaves_no_evidence(
    vm: Vtpm, paravisor: TdQuoteService, tmp_path: Path
) -> None:
    out = tmp_path / "cvm.json"
    paravisor.raw = (503, b"{}")
    proc = _collect(vm, out, paravisor.url)
    assert proc.returncode == 5, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"TD quote endpoint {paravisor.url}" in lines[0]
    assert not out.exists()


def test_the_local_source_sends_intel_collateral_beside_the_document(
    vm: Vtpm, roots: Path, paravisor: TdQuoteService, tmp_path: Path
) -> None:
    collateral = (roots.parent / "collateral.json").read_bytes()
    source = LocalSource(
        tsm_root=tmp_path / "none", tpm_tcti=vm.tcti, cvm_collateral=collateral,
        td_quote_url=paravisor.url,
    )  # fmt: skip
    found = source.cvm_evidence(bytes(range(64)))
    assert found is not None and found.collateral == collateral
    assert parse_tpm_quote(parse_vtpm_evidence(found.evidence).quote).extra_data == bytes(range(32))
    down = LocalSource(tsm_root=tmp_path / "none", tpm_tcti=vm.tcti, td_quote_url=paravisor.url)
    paravisor.raw = (200, b"not json")
    with pytest.raises(EnvironmentProblemError, match="did not answer with JSON"):
        down.cvm_evidence(bytes(64))
