"""``gpucc attest --ear-out FILE --ear-key KEY``: the verdict as a signed EAR beside the JSON
result, one submodule per part, read back with joserfc (an independent JOSE library) and
with ``gpucc token verify-ear``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from joserfc import jwt as jose_jwt
from joserfc.jwk import ECKey

from tests.e2e.test_cli_corim import _attest, _rubin, pki, roots  # noqa: F401
from tests.support.cli import run_cli
from tests.support.corimpki import corim_bytes
from tests.support.rimpki import RimPki
from tests.support.samples import RUBIN, RUBIN_NONCE


def _key(folder: Path) -> tuple[ec.EllipticCurvePrivateKey, Path, Path]:
    key = ec.generate_private_key(ec.SECP384R1())
    path = folder / "ear.key"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(path, 0o600)
    pub = folder / "ear.pub"
    pub.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return key, path, pub


def _claims(key: ec.EllipticCurvePrivateKey, token_file: Path) -> dict[str, object]:
    token = jose_jwt.decode(
        token_file.read_text().strip(), ECKey.import_key(key.public_key()), algorithms=["ES384"]
    )
    assert token.header["alg"] == "ES384"
    return dict(token.claims)


def test_the_gpu_sample_and_the_cvm_sample_give_one_submodule_each(tmp_path: Path) -> None:
    key, key_path, pub = _key(tmp_path)
    ear = tmp_path / "result.ear"
    proc = run_cli(
        "attest", "--offline", "--sample", "--cvm-sample", "tdx", "-f", "json",
        "--ear-out", ear, "--ear-key", key_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    claims = _claims(key, ear)
    assert claims["eat_profile"] == "tag:github.com,2023:veraison/ear"
    assert claims["ear.status"] == "affirming"
    assert claims["eat_nonce"] == doc["nonce"]
    submods = claims["submods"]
    assert isinstance(submods, dict) and sorted(submods) == ["CVM", "GPU-0"]
    assert submods["GPU-0"]["ear.gpucc.outcome"] == "trusted"
    assert submods["GPU-0"]["ear.gpucc.claims"]["measres"] == "success"
    assert submods["CVM"]["ear.status"] == "affirming"
    at = doc["verified_at"]
    verified = run_cli(
        "token", "verify-ear", ear, "--signer-pub", pub, "--nonce", doc["nonce"], "--at", at
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_an_ear_shows_the_unsigned_corim_relaxation(
    pki: RimPki,  # noqa: F811
    roots: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    key, key_path, _ = _key(tmp_path)
    d = tmp_path / "d.cbor"
    d.write_bytes(corim_bytes("rubin_driver_example"))
    v = tmp_path / "v.cbor"
    v.write_bytes(corim_bytes("rubin_vbios_example"))
    policy = tmp_path / "policy.yaml"
    policy.write_text("ocsp:\n  require: false\nrim:\n  allow_unsigned_corim: true\n")
    ear = tmp_path / "rubin.ear"
    proc = _attest(
        roots, RUBIN / "evidence.cmw.json", RUBIN_NONCE, "--driver-rim", d, "--vbios-rim", v,
        "--policy", policy, "--ear-out", ear, "--ear-key", key_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gpu = _claims(key, ear)["submods"]["GPU-0"]  # type: ignore[index]
    assert gpu["ear.status"] == "affirming"
    assert "rim.allow_unsigned_corim: true" in gpu["ear.gpucc.relaxations"]
    assert gpu["ear.gpucc.claims"]["x-nvidia-gpu-corim-purpose"] == "CC MPT"


def test_a_signed_corim_mismatch_is_contraindicated(
    pki: RimPki,  # noqa: F811
    roots: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    from tests.support.corimpki import flip_digest

    key, key_path, _ = _key(tmp_path)
    d, v = _rubin(pki, tmp_path, flip_digest("11.1.11.100.2"))
    ear = tmp_path / "rubin.ear"
    proc = _attest(
        roots, RUBIN / "evidence.cmw.json", RUBIN_NONCE, "--driver-rim", d, "--vbios-rim", v,
        "--ear-out", ear, "--ear-key", key_path,
    )  # fmt: skip
    assert proc.returncode == 1
    claims = _claims(key, ear)
    assert claims["ear.status"] == "contraindicated"
    reasons = claims["submods"]["GPU-0"]["ear.gpucc.reasons"]  # type: ignore[index]
    assert any("11.1.11.100.2" in r for r in reasons), reasons


def test_ear_out_and_ear_key_go_together(tmp_path: Path) -> None:
    proc = run_cli("attest", "--offline", "--sample", "--ear-out", tmp_path / "x.ear")
    assert proc.returncode == 2
    assert "--ear-out FILE and --ear-key KEY go together" in proc.stderr
