"""``gpucc attest --verifier remote`` against a loopback NRAS, and ``--sign-eat``, as processes."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from jsonschema import Draft202012Validator

from gpucc.cli.schemas import load_schema
from gpucc.gpuattest.nras import JWKS_PATH
from tests.support.cli import run_cli
from tests.support.netfixtures import NOW, LocalServer, Reply, Seen, make_node, serve
from tests.support.nras import KID, FakeNras, NrasPki, jwk_for

SAMPLE_NONCE = "4cff7f5380ead8fad8ec2c531c110aca4302a88f603792801a8ca29ee151af2e"
AT = NOW.isoformat().replace("+00:00", "Z")


def gpucc(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, module=True)


@pytest.fixture(scope="module")
def pki() -> NrasPki:
    root = make_node("Remote Test Root", None, ca=True)
    ca = make_node("Remote Test CA", root, ca=True, path_length=0)
    other = make_node("Remote Other Root", None, ca=True)
    return NrasPki(
        root,
        ca,
        make_node("Remote NRAS signer", ca, ca=False),
        other,
        make_node("Remote other signer", other, ca=False),
    )


@pytest.fixture
def nras(pki: NrasPki) -> Iterator[FakeNras]:
    fake = FakeNras(pki)
    with serve(fake) as server:
        fake.url = server.url
        yield fake


def remote(nras: FakeNras, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return gpucc(
        "attest", "--sample", "--verifier", "remote", "--nras-url", nras.url,
        "--at", AT, *extra, cwd=tmp_path,
    )  # fmt: skip


def test_a_good_remote_answer_is_trusted_in_the_attest_document(
    nras: FakeNras, tmp_path: Path
) -> None:
    result = remote(nras, tmp_path, "--format", "json")
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    Draft202012Validator(load_schema("gpucc.attest/v1")).validate(doc)
    assert doc["schema"] == "gpucc.attest/v1" and doc["verifier"] == "remote"
    assert doc["trusted"] is True and doc["exit_code"] == 0
    assert doc["nonce"] == SAMPLE_NONCE
    assert doc["gpus"][0]["claims"]["measres"] == "success"
    assert doc["remote"]["key_anchor"] == "tls"  # no NRAS root is pinned: said, not hidden
    assert doc["remote"]["key_origin"] == nras.url


def test_a_remote_not_trusted_answer_exits_1(nras: FakeNras, tmp_path: Path) -> None:
    nras.device_extra = {"measres": "fail"}
    nras.overall_extra = {"x-nvidia-overall-att-result": False}
    result = remote(nras, tmp_path)
    assert result.returncode == 1
    assert "REFUSED: " in result.stdout


def test_a_forged_answer_is_not_trusted_and_names_the_check(nras: FakeNras, tmp_path: Path) -> None:
    nras.signing_key = ec.generate_private_key(ec.SECP384R1())
    result = remote(nras, tmp_path, "--format", "json")
    assert result.returncode == 1
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "not-trusted" and "signature check failed" in error["message"]


def test_a_failing_service_is_collateral_unavailable_never_a_verdict(tmp_path: Path) -> None:
    result = gpucc(
        "attest", "--sample", "--verifier", "remote", "--nras-url", "http://127.0.0.1:9",
        "--at", AT, "--timeout", "1", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr


def test_sign_eat_writes_a_result_that_token_verify_accepts(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP384R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(tmp_path / "eat.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, pem)
    os.close(fd)
    (tmp_path / "eat.pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    args = ("attest", "--sample", "--offline", "--at", "2024-01-01T00:00:00Z")
    signed = gpucc(*args, "--sign-eat", "eat.key", "-o", "result.eat.json", cwd=tmp_path)
    assert signed.returncode == 0, signed.stderr
    assert "signed result" in signed.stderr
    again = gpucc(*args, "--sign-eat", "eat.key", "-o", "result.eat.json", cwd=tmp_path)
    assert again.returncode == 8  # an existing output is not replaced without --force
    checked = gpucc(
        "token", "verify", "result.eat.json", "--signer-pub", "eat.pub", "--nonce", SAMPLE_NONCE,
        "--at", "2024-01-01T00:10:00Z", cwd=tmp_path,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    lonely = gpucc(*args, "--sign-eat", "eat.key", cwd=tmp_path)
    assert lonely.returncode == 2


# --- hostile services: the key set's origin, and the whole-answer deadline ------------------


def remote_json(
    nras: FakeNras, *extra: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    result = run_cli(
        "attest", "--sample", "--verifier", "remote", "--nras-url", nras.url, "--at", AT,
        "--format", "json", "--no-cache", *extra, env=env, timeout=60,
    )  # fmt: skip
    doc: dict[str, Any] = json.loads(result.stdout)
    Draft202012Validator(load_schema(doc["schema"])).validate(doc)
    return result, doc


@pytest.fixture
def rogue(pki: NrasPki) -> Iterator[LocalServer]:
    """Another origin (another port) whose key set holds another key under NRAS's kid."""
    keys = json.dumps({"keys": [jwk_for(pki.other_signer, KID, None)]}).encode()
    with serve(lambda seen: Reply(200, keys)) as server:
        yield server


def test_a_key_set_redirected_to_another_origin_never_makes_a_token_trusted(
    nras: FakeNras, rogue: LocalServer, pki: NrasPki
) -> None:
    nras.signing_key = pki.other_signer.key  # tokens only the rogue key set vouches for
    nras.jwks_reply = Reply(302, headers={"Location": rogue.url + JWKS_PATH})
    refused, doc = remote_json(nras)
    assert refused.returncode == 3, refused.stderr
    assert doc["error"]["kind"] == "collateral-unavailable"
    assert rogue.url in doc["error"]["message"]
    assert rogue.count == 0  # refused before it was asked

    # Named explicitly (option or variable), the other origin anchors the keys, and says so.
    for extra, env in (
        (("--nras-allow-origin", rogue.url), None),
        ((), {"GPUCC_NRAS_ALLOW_ORIGIN": rogue.url}),
    ):
        allowed, doc = remote_json(nras, *extra, env=env)
        assert allowed.returncode == 0, allowed.stderr
        assert doc["verifier"] == "remote" and doc["trusted"] is True
        assert doc["remote"]["key_anchor"] == "tls" and doc["remote"]["key_origin"] == rogue.url


def test_a_same_origin_redirect_of_the_key_set_is_followed(nras: FakeNras) -> None:
    keys = json.dumps(nras.jwks()).encode()
    plain = nras.__call__

    def moved(seen: Seen) -> Reply:
        return Reply(200, keys) if seen.path == "/keys/2026.json" else plain(seen)

    nras.jwks_reply = Reply(301, headers={"Location": "/keys/2026.json"})
    with serve(moved) as server:
        nras.url = server.url
        result, doc = remote_json(nras)
    assert result.returncode == 0, result.stderr
    assert doc["remote"]["key_origin"] == server.url


@pytest.mark.parametrize("what", ["answer", "key set"])
def test_a_dripping_service_ends_in_exit_3_within_the_deadline(nras: FakeNras, what: str) -> None:
    # One byte every 0.2 s: each read is quick, the whole answer would take 80 s.
    if what == "answer":
        nras.reply = Reply(200, b"[" + b" " * 400 + b"]", drip=0.2)
        how: tuple[tuple[str, ...], dict[str, str] | None] = (("--deadline", "1"), None)
    else:
        nras.jwks_reply = Reply(200, json.dumps(nras.jwks()).encode(), drip=0.2)
        how = ((), {"GPUCC_DEADLINE": "1"})
    start = time.monotonic()
    result, doc = remote_json(nras, *how[0], env=how[1])
    elapsed = time.monotonic() - start
    assert result.returncode == 3, result.stderr
    assert doc["error"]["kind"] == "collateral-unavailable"
    assert "within the deadline of 1 s" in doc["error"]["message"]
    assert elapsed < 30  # start-up included; without the deadline it would run 80 s and more
