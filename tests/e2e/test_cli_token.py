"""``gpucc token verify`` as a real process: exit codes, output and one-line errors."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.gpuattest.eat import evidence_digest, sign_result_claims

GPUCC = [sys.executable, "-m", "gpucc"]
NOW = dt.datetime(2026, 1, 15, 12, 0, 0, tzinfo=dt.UTC)
AT = "2026-01-15T12:10:00Z"
NONCE = "4cff7f5380ead8fad8ec2c531c110aca4302a88f603792801a8ca29ee151af2e"


def run(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCC_", "NVAT_"))}
    base["COLUMNS"] = "200"
    return subprocess.run(
        [*GPUCC, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=base | (env or {}),
        check=False,
    )


@pytest.fixture(scope="module")
def key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP384R1())


def write_result(path: Path, key: ec.EllipticCurvePrivateKey, **kw: Any) -> Path:
    args: dict[str, Any] = {
        "private_key": key,
        "nonce": bytes.fromhex(NONCE),
        "now": NOW,
        "overall_result": True,
        "evidence_digests": [evidence_digest(b"r0"), evidence_digest(b"r1")],
    }
    args.update(kw)
    eat = sign_result_claims([{"measres": "success"}, {"measres": "success"}], **args)
    path.write_text(eat.to_json())
    return path


@pytest.fixture
def files(tmp_path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    write_result(tmp_path / "result.eat.json", key)
    (tmp_path / "pub.pem").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return tmp_path


def test_valid_result(files: Path) -> None:
    r = run(
        "token",
        "verify",
        "result.eat.json",
        "--signer-pub",
        "pub.pem",
        "--nonce",
        NONCE,
        "--at",
        AT,
        cwd=files,
    )
    assert r.returncode == 0, r.stderr
    assert "TRUSTED" in r.stdout and "2 GPU token(s)" in r.stdout and NONCE in r.stdout


def test_valid_result_json(files: Path) -> None:
    r = run(
        "token",
        "verify",
        "result.eat.json",
        "--signer-pub",
        "pub.pem",
        "--format",
        "json",
        "--at",
        AT,
        "--no-nonce",
        cwd=files,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["valid"] and doc["trusted"] and doc["freshness"] == "not-checked"
    assert set(doc["devices"]) == {"GPU-0", "GPU-1"}
    assert doc["overall"]["eat_nonce"] == NONCE


def test_signed_not_trusted_result_exits_1(files: Path, key: ec.EllipticCurvePrivateKey) -> None:
    write_result(files / "no.jwt", key, overall_result=False)
    r = run(
        "token", "verify", "no.jwt", "--signer-pub", "pub.pem", "--at", AT, "-f", "json", "--no-nonce",
        cwd=files,
    )  # fmt: skip
    assert r.returncode == 1
    assert json.loads(r.stdout)["valid"] is True and json.loads(r.stdout)["trusted"] is False
    assert r.stderr.count("\n") == 1 and "not trusted" in r.stderr


def test_wrong_nonce_exits_1(files: Path) -> None:
    r = run(
        "token",
        "verify",
        "result.eat.json",
        "--signer-pub",
        "pub.pem",
        "--nonce",
        "00" * 32,
        "--at",
        AT,
        cwd=files,
    )
    assert r.returncode == 1
    assert r.stderr.startswith("gpucc: error: eat_nonce check failed") and r.stderr.count("\n") == 1


def test_wrong_key_exits_1_json(files: Path) -> None:
    other = ec.generate_private_key(ec.SECP384R1()).public_key()
    (files / "other.pem").write_bytes(
        other.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    r = run(
        "token",
        "verify",
        "result.eat.json",
        "--signer-pub",
        "other.pem",
        "--no-nonce",
        "--at",
        AT,
        "--format",
        "json",
        cwd=files,
    )
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpucc.error/v1"
    assert doc["error"]["code"] == 1 and doc["error"]["kind"] == "not-trusted"
    assert doc["error"]["message"].startswith("signature check failed")
    assert "signature" in r.stderr and "Traceback" not in r.stderr


def test_expired_exits_1(files: Path) -> None:
    r = run(
        "token",
        "verify",
        "result.eat.json",
        "--signer-pub",
        "pub.pem",
        "--no-nonce",
        "--at",
        "2026-01-15T14:00:00Z",
        cwd=files,
    )
    assert r.returncode == 1 and "exp check failed" in r.stderr


def test_tampered_file_exits_1(files: Path) -> None:
    doc = json.loads((files / "result.eat.json").read_text())
    doc[1]["GPU-0"], doc[1]["GPU-1"] = doc[1]["GPU-1"], doc[1]["GPU-0"]
    (files / "t.jwt").write_text(json.dumps(doc))
    r = run(
        "token", "verify", "t.jwt", "--signer-pub", "pub.pem", "--at", AT, "--no-nonce", cwd=files
    )
    assert r.returncode == 1 and "submods check failed" in r.stderr


def test_unsigned_token_exits_1(files: Path) -> None:
    (files / "none.jwt").write_text("eyJhbGciOiJub25lIn0.eyJpc3MiOiJncHVjYyJ9.")
    r = run(
        "token",
        "verify",
        "none.jwt",
        "--signer-pub",
        "pub.pem",
        "--at",
        AT,
        "--no-nonce",
        cwd=files,
    )
    assert r.returncode == 1 and "alg check failed" in r.stderr


@pytest.mark.parametrize("content", ["", "hello", '[["JWT", 1], {}]', "a.b.c"])
def test_malformed_token_exits_4(files: Path, content: str) -> None:
    (files / "bad.jwt").write_text(content)
    r = run(
        "token", "verify", "bad.jwt", "--signer-pub", "pub.pem", "--at", AT, "--no-nonce", cwd=files
    )
    assert r.returncode == 4, r.stderr
    assert r.stderr.startswith("gpucc: error:") and r.stderr.count("\n") == 1


def test_malformed_key_exits_4(files: Path) -> None:
    (files / "k.pem").write_text("not a key")
    r = run(
        "token",
        "verify",
        "result.eat.json",
        "--signer-pub",
        "k.pem",
        "--at",
        AT,
        "--no-nonce",
        cwd=files,
    )
    assert r.returncode == 4 and "k.pem" in r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("result.eat.json",),
        ("result.eat.json", "--signer-pub", "pub.pem", "--nonce", "xyz"),
        ("result.eat.json", "--signer-pub", "pub.pem", "--format", "yaml"),
        ("result.eat.json", "--signer-pub", "pub.pem", "--at", "yesterday"),
    ],
)
def test_usage_errors_exit_2(files: Path, args: tuple[str, ...]) -> None:
    r = run("token", "verify", *args, cwd=files)
    assert r.returncode == 2, r.stderr


def test_freshness_is_never_assumed(files: Path) -> None:
    """Without --nonce the caller must say --no-nonce, and the output says what it means."""
    r = run("token", "verify", "result.eat.json", "--signer-pub", "pub.pem", "--at", AT, cwd=files)
    assert r.returncode == 2 and "--no-nonce" in r.stderr and r.stdout == ""
    both = ("--nonce", NONCE, "--no-nonce")
    r = run(
        "token",
        "verify",
        "result.eat.json",
        "--signer-pub",
        "pub.pem",
        "--at",
        AT,
        *both,
        cwd=files,
    )
    assert r.returncode == 2
    r = run(
        "token",
        "verify",
        "result.eat.json",
        "--signer-pub",
        "pub.pem",
        "--at",
        AT,
        "--no-nonce",
        cwd=files,
    )
    assert r.returncode == 0 and "TRUSTED" in r.stdout and "FRESHNESS NOT CHECKED" in r.stdout
    r = run(
        "token", "verify", "result.eat.json", "--signer-pub", "pub.pem", "--at", AT, "--nonce", NONCE,
        "-f", "json", cwd=files,
    )  # fmt: skip
    assert r.returncode == 0 and json.loads(r.stdout)["freshness"] == "nonce-checked"


def test_a_result_without_gpu_tokens_is_not_trusted(
    files: Path, key: ec.EllipticCurvePrivateKey
) -> None:
    """A validly signed overall token with no submods vouches for no GPU: exit 1."""
    from gpucc.gpuattest.jws import sign_es384

    t = int(dt.datetime.fromisoformat(AT.replace("Z", "+00:00")).timestamp())
    claims = {
        "iss": "gpucc", "iat": t - 60, "nbf": t - 60, "exp": t + 600, "eat_nonce": NONCE,
        "x-nvidia-overall-att-result": True,
    }  # fmt: skip
    (files / "empty.jwt").write_text(sign_es384({"alg": "ES384"}, claims, key))
    r = run(
        "token", "verify", "empty.jwt", "--signer-pub", "pub.pem", "--at", AT, "--nonce", NONCE,
        "-f", "json", cwd=files,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["trusted"] is False and doc["exit_code"] == 1 and "no GPU token" in r.stderr


def test_missing_result_is_a_file_error(files: Path) -> None:
    r = run("token", "verify", "absent.jwt", "--signer-pub", "pub.pem", "--no-nonce", cwd=files)
    assert r.returncode == 8 and "absent.jwt does not exist" in r.stderr


def test_help_lists_the_command(tmp_path: Path) -> None:
    r = run("token", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "verify" in r.stdout
    r = run("token", "verify", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "--verbose" in r.stdout and "--nonce" in r.stdout
