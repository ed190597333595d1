"""``gpucc model`` as users run it: the installed console script in a subprocess.

Interop runs against the real ``model_signing`` package; failures must give the documented
exit code, name the resource, and never show a traceback.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.support.cli import run_cli
from tests.unit.staging.test_model_library import make_model, ms_statement

model_signing: Any = importlib.import_module("model_signing")


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("model", *args, cwd=cwd)


def error_line(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpucc: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def work(tmp_path: Path) -> Path:
    make_model(tmp_path / "model")
    key = ec.generate_private_key(ec.SECP384R1())
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    (tmp_path / "key.pem").chmod(0o600)
    (tmp_path / "pub.pem").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return tmp_path


def _manifest(work: Path, *extra: str) -> dict[str, Any]:
    result = run("digest", "model", "-o", "m.json", "--shard-size", "1000", *extra, cwd=work)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and "subject sha256" in result.stderr
    statement: dict[str, Any] = json.loads((work / "m.json").read_text())
    return statement


def _rewrite(work: Path, statement: dict[str, Any]) -> None:
    import hashlib

    digests = b"".join(bytes.fromhex(r["digest"]) for r in statement["predicate"]["resources"])
    statement["subject"][0]["digest"]["sha256"] = hashlib.sha256(digests).hexdigest()
    (work / "m.json").write_text(json.dumps(statement, indent=2))


# --- round trips and interop -----------------------------------------------------------------


def test_digest_matches_model_signing_and_verifies(work: Path) -> None:
    statement = _manifest(work)
    assert statement == ms_statement(work / "model", shard=1000)
    ok = run("verify", "model", "--manifest", "m.json", cwd=work)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("verified: model 'model'") and ok.stderr == ""


def test_digest_to_stdout_and_blake3(work: Path) -> None:
    out = run("digest", "model", "--hash", "blake3", cwd=work)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ms_statement(work / "model", algo="blake3")
    bad = run("digest", "model", "--hash", "blake3", "--shard-size", "1MiB", cwd=work)
    error_line(bad, 2, "BLAKE3")


def test_manifest_inside_the_model_is_ignored(work: Path) -> None:
    result = run("digest", "model", "-o", "model/manifest.json", cwd=work)
    assert result.returncode == 0, result.stderr
    statement = json.loads((work / "model" / "manifest.json").read_text())
    assert "manifest.json" in statement["predicate"]["serialization"]["ignore_paths"]
    ok = run("verify", "model", "--manifest", "model/manifest.json", cwd=work)
    assert ok.returncode == 0, ok.stderr


def test_gpucc_signature_verifies_with_model_signing(work: Path) -> None:
    signed = run("sign", "model", "--signer-key", "key.pem", "--signature", "model.sig", cwd=work)
    assert signed.returncode == 0, signed.stderr
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=work / "pub.pem").verify(
        work / "model", work / "model.sig"
    )
    ours = run("verify", "model", "--signature", "model.sig", "--signer-pub", "pub.pem", cwd=work)
    assert ours.returncode == 0, ours.stderr


def test_model_signing_signature_verifies_with_gpucc(work: Path) -> None:
    sig = work / "model" / "model.sig"  # inside the model: model_signing records it as ignored
    model_signing.signing.Config().use_elliptic_key_signer(private_key=work / "key.pem").sign(
        work / "model", sig
    )
    result = run(
        "verify", "model", "--signature", sig, "--signer-pub", "pub.pem", "--format", "json",
        cwd=work,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["verified"] is True and report["problems"] == []
    assert report["resources_checked"] > 5


def _model_signing_cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("model_signing")
    return subprocess.run(
        [str(exe), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip


def test_model_signing_cli_both_ways(work: Path) -> None:
    """model_signing's CLI signs and verifies per-file SHA-256 (its default), as gpucc does."""
    signed = run("sign", "model", "--signer-key", "key.pem", "--signature", "g.sig", cwd=work)
    assert signed.returncode == 0, signed.stderr
    checked = _model_signing_cli("verify", "key", "model", "--signature", "g.sig",
                                 "--public_key", "pub.pem", cwd=work)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    made = _model_signing_cli("sign", "key", "model", "--signature", "model/model.sig",
                              "--private_key", "key.pem", cwd=work)  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    ours = run(
        "verify", "model", "--signature", "model/model.sig", "--signer-pub", "pub.pem", cwd=work
    )
    assert ours.returncode == 0, ours.stderr
    (work / "model" / "weights.bin").write_bytes(b"swapped")
    ours = run(
        "verify", "model", "--signature", "model/model.sig", "--signer-pub", "pub.pem", cwd=work
    )
    error_line(ours, 6, "weights.bin")


# --- not verified: exit 6, resource named ---------------------------------------------------------


def test_tampered_renamed_missing_extra(work: Path) -> None:
    _manifest(work)
    model = work / "model"
    data = bytearray((model / "weights.bin").read_bytes())
    data[2500] ^= 0x40
    (model / "weights.bin").write_bytes(data)
    (model / "sub" / "ü-config.json").rename(model / "sub" / "config.json")
    (model / "a" / "b").unlink()
    (model / "extra.bin").write_bytes(b"new")
    result = run("verify", "model", "--manifest", "m.json", "--format", "json", cwd=work)
    line = error_line(result, 6, "weights.bin:2000:3000", "does not match")
    report = json.loads(result.stdout)
    assert report["verified"] is False
    problems = {(p["problem"], p["name"]) for p in report["problems"]}
    assert problems == {
        ("mismatch", "weights.bin:2000:3000"),
        ("missing", "sub/ü-config.json:0:13"),
        ("missing", "a/b:0:1000"),
        ("missing", "a/b:1000:1023"),
        ("extra", "sub/config.json:0:13"),
        ("extra", "extra.bin:0:3"),
    }
    assert "extra.bin" in line
    text = run("verify", "model", "--manifest", "m.json", cwd=work)
    assert text.returncode == 6 and "mismatch: weights.bin:2000:3000" in text.stdout


def test_changed_shard_size_and_wrong_algorithm(work: Path) -> None:
    statement = _manifest(work)
    statement["predicate"]["serialization"]["shard_size"] = 2000
    _rewrite(work, statement)
    result = run("verify", "model", "--manifest", "m.json", "--format", "json", cwd=work)
    error_line(result, 6, "does not match")
    problems = {(p["problem"], p["name"]) for p in json.loads(result.stdout)["problems"]}
    assert ("missing", "weights.bin:0:1000") in problems
    assert ("extra", "weights.bin:0:2000") in problems
    statement["predicate"]["serialization"]["shard_size"] = 1000
    statement["predicate"]["resources"][3]["algorithm"] = "sha256-sharded-1024"
    _rewrite(work, statement)
    result = run("verify", "model", "--manifest", "m.json", "--format", "json", cwd=work)
    error_line(result, 6, statement["predicate"]["resources"][3]["name"], "wrong algorithm")
    statement["predicate"]["serialization"]["hash_type"] = "sha512"
    _rewrite(work, statement)
    error_line(run("verify", "model", "--manifest", "m.json", cwd=work), 4, "sha512")


def test_wrong_key_and_edited_bundle(work: Path) -> None:
    run("sign", "model", "--signer-key", "key.pem", "--signature", "s.sig", cwd=work)
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    (work / "other.pem").write_bytes(
        other.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    result = run("verify", "model", "--signature", "s.sig", "--signer-pub", "other.pem", cwd=work)
    error_line(result, 6, "different key")
    bundle = json.loads((work / "s.sig").read_text())
    bundle["dsseEnvelope"]["signatures"][0]["sig"] = "MEUCIQ" + "A" * 90
    (work / "s.sig").write_text(json.dumps(bundle))
    result = run("verify", "model", "--signature", "s.sig", "--signer-pub", "pub.pem", cwd=work)
    error_line(result, 6, "does not verify")


# --- malformed input: exit 4 -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("truncated", "is not JSON"),
        ("oversized", "larger than 64 MiB"),
        ("garbage", "is not JSON"),
        ("not-statement", "in-toto statement"),
    ],
)
def test_malformed_manifest(work: Path, content: str, fragment: str) -> None:
    good = (_manifest(work), (work / "m.json").read_bytes())[1]
    data = {
        "truncated": good[: len(good) - 40],
        "oversized": good + b" " * (64 * 1024 * 1024),
        "garbage": b"\x00model\x01",
        "not-statement": b'{"_type": "x"}',
    }[content]
    (work / "m.json").write_bytes(data)
    error_line(run("verify", "model", "--manifest", "m.json", cwd=work), 4, fragment)


def test_bad_trees_and_keys(work: Path, tmp_path: Path) -> None:
    (tmp_path / "outside").write_bytes(b"secret")
    (work / "model" / "escape").symlink_to(tmp_path / "outside")
    result = run("digest", "model", "--allow-symlinks", cwd=work)
    error_line(result, 4, "escape", "leaves the model directory")
    error_line(run("digest", "model", cwd=work), 4, "escape is a symbolic link")
    (work / "model" / "escape").unlink()
    os.mkfifo(work / "model" / "fifo")
    error_line(run("digest", "model", cwd=work), 4, "fifo is a special file")
    (work / "model" / "fifo").unlink()
    (work / "key.pem").chmod(0o644)
    result = run("sign", "model", "--signer-key", "key.pem", "--signature", "s.sig", cwd=work)
    error_line(result, 8, "chmod 600")  # permissions: file access
    assert not (work / "s.sig").exists()


def test_outputs_are_never_replaced_without_force(work: Path) -> None:
    _manifest(work)
    before = (work / "m.json").read_bytes()
    (work / "model" / "new.bin").write_bytes(b"n")
    again = run("digest", "model", "-o", "m.json", cwd=work)
    error_line(again, 8, "already exists", "--force")
    assert (work / "m.json").read_bytes() == before
    forced = run("digest", "model", "-o", "m.json", "--force", cwd=work)
    assert forced.returncode == 0, forced.stderr
    assert (work / "m.json").read_bytes() != before
    assert [p.name for p in work.iterdir() if ".tmp-" in p.name] == []


def test_usage_errors(work: Path) -> None:
    error_line(run("verify", "model", cwd=work), 2, "--manifest or --signature")
    _manifest(work)
    both = run("verify", "model", "--manifest", "m.json", "--signer-pub", "pub.pem", cwd=work)
    error_line(both, 2, "--signer-pub")
    error_line(run("digest", "model", "--shard-size", "lots", cwd=work), 2, "not a size")


def test_gpu_device_without_a_gpu_fails_cleanly(work: Path) -> None:
    from gpucc.staging.model import digest_gpu

    if digest_gpu.available():
        pytest.skip("a GPU is usable here")
    error_line(run("digest", "model", "--backend", "gpu", cwd=work), 5)
    auto = run("digest", "model", "--backend", "auto", cwd=work)
    assert auto.returncode == 0, auto.stderr
