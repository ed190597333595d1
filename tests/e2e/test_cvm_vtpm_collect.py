"""Collecting an Azure-shaped CVM's evidence through its vTPM (a real swtpm provisioned with
the AK at 0x81000003 and a simulated HCL report at NV index 0x01400001), then verifying it
with `gpucc attest --cvm-evidence` under the simulation's SEV-SNP roots."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding
from jsonschema import Draft202012Validator

from gpucc.assembly.sources import LocalSource
from gpucc.cli.schemas import load_schema
from gpucc.core.errors import EnvironmentProblemError
from gpucc.gpuattest.cvm.appraise import attest_report_data
from gpucc.gpuattest.cvm.snp_simulate import DEFAULT_MEASUREMENT, SimulatedSnp
from gpucc.gpuattest.cvm.tpm_quote import parse_tpm_quote
from gpucc.gpuattest.cvm.vtpm_evidence import parse_vtpm_evidence
from gpucc.gpuattest.cvm.vtpm_simulate import simulated_hcl_report
from tests.support.cli import run_cli
from tests.support.swtpm import Vtpm, azure_vtpm, needs_swtpm, swtpm

pytestmark = needs_swtpm
NONCE = bytes(range(32))


@pytest.fixture(scope="module")
def chip() -> SimulatedSnp:
    return SimulatedSnp.create(seed=b"azure vtpm")


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory, chip: SimulatedSnp) -> Path:
    """A simulation directory holding the simulated chip's ARK and ASK."""
    directory = tmp_path_factory.mktemp("roots")
    pki = chip.pki
    pem = pki.ark.public_bytes(Encoding.PEM) + pki.ask.public_bytes(Encoding.PEM)
    (directory / "snp_milan.pem").write_bytes(pem)
    return directory


@pytest.fixture(scope="module")
def vm(tmp_path_factory: pytest.TempPathFactory, chip: SimulatedSnp) -> Iterator[Vtpm]:
    def hcl(ak: rsa.RSAPublicKey) -> bytes:
        return simulated_hcl_report(chip, ak)

    with azure_vtpm(tmp_path_factory.mktemp("vm"), hcl) as tpm:
        tpm.extend(7, hashlib.sha256(b"secure boot policy").digest())
        yield tpm


def _collect(vm: Vtpm, out: Path, *extra: str | Path) -> subprocess.CompletedProcess[str]:
    return run_cli("evidence", "collect", "--cvm", out, "--cvm-only", "--nonce", NONCE.hex(),
                   "--tpm-tcti", vm.tcti, "--tsm-root", out.parent / "no-tsm", *extra)  # fmt: skip


def _attest(evidence: Path, roots: Path, report_data: str) -> subprocess.CompletedProcess[str]:
    return run_cli("attest", "--cvm-only", "--cvm-evidence", evidence, "--cvm-report-data",
                   report_data, "--simulate", roots, "--offline", "-f", "json")  # fmt: skip


def test_collect_through_the_vtpm_then_attest_trusts_it(
    vm: Vtpm, chip: SimulatedSnp, roots: Path, tmp_path: Path
) -> None:
    vcek = tmp_path / "vcek.der"
    vcek.write_bytes(chip.vcek)
    out = tmp_path / "cvm.json"
    proc = _collect(vm, out, "--cvm-collateral", vcek, "-f", "json")
    assert proc.returncode == 0, proc.stderr
    told = json.loads(proc.stdout)
    Draft202012Validator(load_schema(told["schema"])).validate(told)
    expected = attest_report_data(NONCE)[:32]
    assert told["cvm_report_data"] == expected.hex() and told["gpus"] == 0
    ev = parse_vtpm_evidence(out.read_bytes())
    assert ev.version == "gpucc.vtpm/v1" and ev.hcl.tee == "snp" and len(ev.pcrs) == 24
    assert parse_tpm_quote(ev.quote).extra_data == expected
    trusted = _attest(out, roots, expected.hex())
    assert trusted.returncode == 0, (trusted.stdout, trusted.stderr)
    doc = json.loads(trusted.stdout)
    assert doc["trusted"] is True
    pcr7 = doc["cvm"]["claims"]["vtpm"]["pcrs"]["7"]
    assert (
        pcr7
        == hashlib.sha256(bytes(32) + hashlib.sha256(b"secure boot policy").digest()).hexdigest()
    )
    assert doc["cvm"]["claims"]["measurement"] == DEFAULT_MEASUREMENT.hex()
    other = _attest(out, roots, attest_report_data(bytes(32))[:32].hex())
    assert other.returncode == 1 and json.loads(other.stdout)["trusted"] is False


def test_without_the_vcek_collection_says_what_is_missing(vm: Vtpm, tmp_path: Path) -> None:
    proc = _collect(vm, tmp_path / "cvm.json")
    assert proc.returncode == 5, proc.stderr
    assert "VCEK" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "cvm.json").exists()


def test_a_tpm_without_the_hcl_index_is_no_paravisor(tmp_path: Path) -> None:
    with swtpm(tmp_path / "bare") as bare:
        source = LocalSource(tsm_root=tmp_path / "no-tsm", tpm_tcti=bare.tcti)
        with pytest.raises(EnvironmentProblemError, match="configfs-tsm"):
            source.cvm_evidence(bytes(64))
        proc = _collect(bare, tmp_path / "cvm.json")
    assert proc.returncode == 5 and len(proc.stderr.strip().splitlines()) == 1


def test_an_index_that_is_not_an_hcl_report_is_malformed(
    chip: SimulatedSnp, tmp_path: Path
) -> None:
    def odd_report(ak: rsa.RSAPublicKey) -> bytes:
        return b"HCLX" + simulated_hcl_report(chip, ak)[4:]

    with azure_vtpm(tmp_path / "odd", odd_report) as odd:
        proc = _collect(odd, tmp_path / "cvm.json")
    assert proc.returncode == 4, proc.stderr
    assert "HCLA" in proc.stderr


def test_the_local_source_quotes_the_first_32_bytes_of_the_report_data(
    vm: Vtpm, chip: SimulatedSnp, tmp_path: Path
) -> None:
    source = LocalSource(tsm_root=tmp_path / "none", tpm_tcti=vm.tcti, cvm_collateral=chip.vcek)
    report_data = hashlib.sha512(b"session").digest()
    found = source.cvm_evidence(report_data)
    assert found is not None and found.collateral is None
    quote = parse_tpm_quote(parse_vtpm_evidence(found.evidence).quote)
    assert quote.extra_data == report_data[:32]


def test_a_simulation_without_snp_roots_leaves_the_cvm_undecided(
    vm: Vtpm, chip: SimulatedSnp, tmp_path: Path
) -> None:
    """Simulated SEV-SNP evidence is never judged under AMD's roots: without the simulation's
    ARK and ASK the verdict is exit 3, naming what is missing."""
    out = tmp_path / "cvm.json"
    vcek = tmp_path / "vcek.der"
    vcek.write_bytes(chip.vcek)
    assert _collect(vm, out, "--cvm-collateral", vcek).returncode == 0
    empty = tmp_path / "empty-simulation"
    empty.mkdir()
    proc = _attest(out, empty, attest_report_data(NONCE)[:32].hex())
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "snp_milan.pem" in proc.stdout + proc.stderr


def test_cvm_only_takes_cvm_and_no_output(tmp_path: Path) -> None:
    for args in (["--cvm-only", "-o", tmp_path / "gpu.json", "--cvm", tmp_path / "c.json"],
                 ["--cvm-only"], []):  # fmt: skip
        proc = run_cli("evidence", "collect", *args)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
