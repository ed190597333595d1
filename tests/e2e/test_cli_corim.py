"""`gpucc attest` with CoRIM reference values: NVIDIA's real Rubin and Blackwell FSP evidence,
appraised against NVIDIA's example CoRIMs signed under the project's test RIM root.

The test root reaches the verifier the way a simulation's roots do (``--simulate DIR``
with NVIDIA's real device root beside the test RIM root), so the device chain is still
judged against NVIDIA's Device Identity CA."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from jsonschema import Draft202012Validator

from gpucc.cli.schemas import load_schema
from tests.support.cli import run_cli
from tests.support.corimpki import (
    NV,
    Edit,
    corim_bytes,
    edit_comids,
    flip_digest,
    fsp_raw_block1,
    layer0_svn,
    sign_corim,
)
from tests.support.paths import ROOT
from tests.support.rimpki import RimPki, make_rim_pki
from tests.support.samples import FSP, FSP_NONCE, RUBIN, RUBIN_NONCE

AT = "2026-12-01T00:00:00Z"
DRIVER_ID = "NV_GPU_DRIVER_GR100_620.54"
VBIOS_ID = "GR100_081D_9900230000"
FSP_ID = "NV_GPU_VBIOS_GB100_065C_0100000001"


@pytest.fixture(scope="module")
def pki() -> RimPki:
    return make_rim_pki()


@pytest.fixture(scope="module")
def roots(pki: RimPki, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """NVIDIA's device root with the test RIM root, as a simulation directory holds them."""
    folder = tmp_path_factory.mktemp("roots")
    shutil.copy(
        ROOT / "gpuattest" / "_roots" / "device_identity_root.pem", folder / "device_root.pem"
    )
    pem = pki.root.public_bytes(serialization.Encoding.PEM)
    (folder / "rim_root.pem").write_bytes(pem)
    (folder / "rims").mkdir()
    return folder


def _write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


def _rubin(
    pki: RimPki, folder: Path, driver: Edit | None = None, vbios: Edit | None = None
) -> tuple[Path, Path]:
    d = corim_bytes("rubin_driver_example")
    v = corim_bytes("rubin_vbios_example")
    d = edit_comids(d, driver) if driver else d
    v = edit_comids(v, vbios) if vbios else v
    return (
        _write(folder, "driver.cbor", sign_corim(d, pki=pki)),
        _write(folder, "vbios.cbor", sign_corim(v, pki=pki)),
    )


def _attest(roots: Path, evidence: Path, nonce: str, *extra: str | Path):  # type: ignore[no-untyped-def]
    return run_cli(
        "attest", "--evidence", evidence, "--nonce", nonce, "--simulate", roots,
        "--at", AT, "-f", "json", *extra,
    )  # fmt: skip


def _policy(folder: Path, rim: str) -> Path:
    return _write(folder, "policy.yaml", f"ocsp:\n  require: false\nrim:\n{rim}".encode())


def test_rubin_with_its_signed_corims_is_trusted_on_cc_mpt(
    pki: RimPki, roots: Path, tmp_path: Path
) -> None:
    driver, vbios = _rubin(pki, tmp_path)
    proc = _attest(
        roots,
        RUBIN / "evidence.cmw.json",
        RUBIN_NONCE,
        "--driver-rim",
        driver,
        "--vbios-rim",
        vbios,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    Draft202012Validator(load_schema(doc["schema"])).validate(doc)
    gpu = doc["gpus"][0]
    assert gpu["claims"]["measres"] == "success"
    assert gpu["claims"]["x-nvidia-gpu-corim-purpose"] == "CC MPT"
    assert gpu["claims"]["x-nvidia-gpu-corim-signature-verified"] is True
    assert gpu["rim_ids"] == {"driver": DRIVER_ID, "vbios": VBIOS_ID}
    checks = {c["id"]: c for c in gpu["checks"]}
    assert checks["corim-signature"]["status"] == "pass"
    assert "gpucc test RIM L4 Signer" in checks["corim-signature"]["reason"]
    # The signers' OCSP is the RIM chains' step; the simulation's policy lets it go unchecked.
    assert checks["corim-ocsp"]["relaxation"] == "ocsp.require: false"


@pytest.mark.parametrize(
    ("driver", "vbios", "named"),
    [
        (flip_digest("11.1.11.100.2"), None, f"oid:{NV}11.1.11.100.2 [-]"),
        (layer0_svn(552, 2), None, "NVIDIA GR100 A01 GSP layer 0 [-]"),
        (layer0_svn(553, 2), None, "NVIDIA GR100 A01 GSP layer 0 [-]"),
        (None, flip_digest("11.1.10.100.4"), f"oid:{NV}11.1.10.100.4 [FFMC]"),
    ],
    ids=["driver-digest", "svn-exact", "svn-minimum", "vbios-digest"],
)
def test_rubin_mutated_reference_is_exit_1_naming_it(
    pki: RimPki, roots: Path, tmp_path: Path, driver: Edit | None, vbios: Edit | None, named: str
) -> None:
    d, v = _rubin(pki, tmp_path, driver, vbios)
    proc = _attest(
        roots, RUBIN / "evidence.cmw.json", RUBIN_NONCE, "--driver-rim", d, "--vbios-rim", v
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    Draft202012Validator(load_schema(doc["schema"])).validate(doc)
    (record,) = doc["gpus"][0]["claims"]["x-nvidia-mismatch-measurement-records"]
    assert f"{record['environment']} [{record['key']}]" == named
    assert record["measurementSource"] == "CoRIM"
    assert record["evidence"] not in ("", "absent")
    assert any(named in r for r in doc["reasons"]), doc["reasons"]


def test_a_policy_requiring_cc_spt_is_exit_1(pki: RimPki, roots: Path, tmp_path: Path) -> None:
    d, v = _rubin(pki, tmp_path)
    policy = _policy(tmp_path, "  corim_purpose: CC SPT\n")
    proc = _attest(
        roots, RUBIN / "evidence.cmw.json", RUBIN_NONCE,
        "--driver-rim", d, "--vbios-rim", v, "--policy", policy,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    records = json.loads(proc.stdout)["gpus"][0]["claims"]["x-nvidia-mismatch-measurement-records"]
    assert [(r["key"], r["reference"], r["evidence"]) for r in records] == [
        ("purpose", "'CC SPT'", "'CC MPT'")
    ]


def test_corims_are_found_in_the_rim_directory_by_their_ids(
    pki: RimPki, roots: Path, tmp_path: Path
) -> None:
    rims = tmp_path / "rims"
    rims.mkdir()
    d, v = _rubin(pki, tmp_path)
    d.rename(rims / f"{DRIVER_ID}.cbor")
    v.rename(rims / VBIOS_ID)
    proc = _attest(roots, RUBIN / "attestation-report.hex", RUBIN_NONCE,
                   "--cert-chain", RUBIN / "cert-chain.pem", "--rim-dir", rims)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_without_corims_the_verdict_is_undecided_naming_them(roots: Path) -> None:
    proc = _attest(roots, RUBIN / "evidence.cmw.json", RUBIN_NONCE)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    reasons = json.loads(proc.stdout)["reasons"]
    assert any("published only as CoRIMs" in r and VBIOS_ID in r for r in reasons), reasons


def test_an_xml_rim_given_for_a_corim_device_is_malformed(roots: Path) -> None:
    from gpucc.gpuattest.samples import nvidia_h100_sample

    sample = nvidia_h100_sample()
    proc = _attest(
        roots, RUBIN / "evidence.cmw.json", RUBIN_NONCE,
        "--driver-rim", sample.driver_rim_path, "--vbios-rim", sample.vbios_rim_path,
    )  # fmt: skip
    assert proc.returncode == 4
    assert "is not a CoRIM" in proc.stderr


def test_blackwell_fsp_with_its_corim_and_tcbinfo_is_trusted(
    pki: RimPki, roots: Path, tmp_path: Path
) -> None:
    corim = _write(tmp_path, "fsp.cbor", sign_corim(corim_bytes("blackwell_fsp_real"), pki=pki))
    # The CMW file's firmware-version hint names the CoRIM (NV_GPU_VBIOS_<model>_<APSKU>_<fw>).
    rims = tmp_path / "rims"
    rims.mkdir()
    shutil.copy(corim, rims / f"{FSP_ID}.cbor")
    proc = _attest(roots, FSP / "evidence.cmw.json", FSP_NONCE, "--rim-dir", rims)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gpu = json.loads(proc.stdout)["gpus"][0]
    assert gpu["rim_ids"]["vbios"] == FSP_ID
    # A raw report has no hint: the CoRIM is given as the VBIOS RIM.
    proc = _attest(
        roots, FSP / "attestation-report.hex", FSP_NONCE,
        "--cert-chain", FSP / "cert-chain.pem", "--vbios-rim", corim,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stdout  # no ID can be named without the hint
    assert "firmware-version hint" in proc.stdout


def test_blackwell_fsp_mutated_raw_value_is_named(pki: RimPki, roots: Path, tmp_path: Path) -> None:
    changed = edit_comids(corim_bytes("blackwell_fsp_real"), fsp_raw_block1(b"\x00\x00\x00\x02"))
    rims = tmp_path / "rims"
    rims.mkdir()
    _write(rims, f"{FSP_ID}.cbor", sign_corim(changed, pki=pki))
    proc = _attest(roots, FSP / "evidence.cmw.json", FSP_NONCE, "--rim-dir", rims)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (record,) = json.loads(proc.stdout)["gpus"][0]["claims"][
        "x-nvidia-mismatch-measurement-records"
    ]
    assert (record["environment"], record["key"]) == ("NVIDIA GB100 A01 FSP layer 1", "1")
    assert record["reference"] == "raw 00000002" and record["evidence"] == "raw 00000001"


def test_unsigned_corims_are_refused_by_default_and_shown_when_relaxed(
    roots: Path, tmp_path: Path
) -> None:
    d = _write(tmp_path, "driver.cbor", corim_bytes("rubin_driver_example"))
    v = _write(tmp_path, "vbios.cbor", corim_bytes("rubin_vbios_example"))
    args = ("--driver-rim", d, "--vbios-rim", v)
    proc = _attest(roots, RUBIN / "evidence.cmw.json", RUBIN_NONCE, *args)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = {c["id"]: c for c in json.loads(proc.stdout)["gpus"][0]["checks"]}
    assert checks["corim-signature"]["status"] == "fail"
    assert "allow_unsigned_corim" in checks["corim-signature"]["reason"]

    policy = _policy(tmp_path, "  allow_unsigned_corim: true\n")
    proc = _attest(roots, RUBIN / "evidence.cmw.json", RUBIN_NONCE, *args, "--policy", policy)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert "rim.allow_unsigned_corim: true" in json.dumps(doc["trusted_with"])
    assert doc["policy"]["rim"]["allow_unsigned_corim"] is True
    text = run_cli(
        "attest", "--evidence", RUBIN / "evidence.cmw.json", "--nonce", RUBIN_NONCE,
        "--simulate", roots, "--at", AT, *args, "--policy", policy,
    )  # fmt: skip
    assert text.returncode == 0
    assert "rim.allow_unsigned_corim: true" in text.stdout + text.stderr
