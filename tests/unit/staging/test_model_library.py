"""The model-integrity library against the real ``model_signing`` package.

Every test builds a small model directory of random bytes in ``tmp_path`` and compares what
gpucc computes with what ``model_signing`` computes (or verifies) for the same files.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import random
from pathlib import Path
from typing import Any

import blake3
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.cli.exitcodes import exit_code_for
from gpucc.core.errors import KeyFileError
from gpucc.staging.model import (
    Manifest,
    digest_model,
    make_serialization,
    require_verified,
    verify_model,
)
from gpucc.staging.model import signing as gsign
from gpucc.staging.model.errors import (
    MalformedManifestError,
    ModelChangedError,
    ModelTreeError,
    SignatureError,
)
from gpucc.staging.model.manifest import ModelMismatchError

# model_signing and protobuf ship no type information: reach them as Any.
model_signing: Any = importlib.import_module("model_signing")
ms_signing: Any = importlib.import_module("model_signing._signing.signing")
json_format: Any = importlib.import_module("google.protobuf.json_format")


def make_model(root: Path, seed: int = 1) -> Path:
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.b").write_bytes(rng.randbytes(5000))
    (root / "a").mkdir()
    (root / "a" / "b").write_bytes(rng.randbytes(1023))  # "a/b" sorts before "a.b" by parts
    (root / "weights.bin").write_bytes(rng.randbytes(3 * 4096 + 17))
    (root / "sub" / "deeper" / "x.safetensors").write_bytes(rng.randbytes(4096))
    (root / "sub" / "ü-config.json").write_bytes(b'{"layers": 2}')
    (root / ".hidden").write_bytes(b"hidden files are part of the model")
    (root / "empty").write_bytes(b"")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_bytes(b"ref: refs/heads/main\n")
    return root


def ms_statement(root: Path, *, shard: int | None = None, algo: str = "sha256") -> dict[str, Any]:
    config = model_signing.hashing.Config()
    if shard is not None:
        config.use_shard_serialization(hashing_algorithm=algo, shard_size=shard)
    else:
        config.use_file_serialization(hashing_algorithm=algo)
    payload = ms_signing.Payload(config.hash(root))
    statement: dict[str, Any] = json.loads(json_format.MessageToJson(payload.statement.pb))
    statement["predicate"]["serialization"]["ignore_paths"].sort()
    return statement


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return make_model(tmp_path / "my-model")


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    priv, pub = tmp_path / "key.pem", tmp_path / "pub.pem"
    priv.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    priv.chmod(0o600)
    pub.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return priv, pub


# --- digests identical to model_signing ---------------------------------------------------------


@pytest.mark.parametrize("shard", [None, 1000, 4096, 1 << 20])
def test_sha256_statement_equals_model_signing(model: Path, shard: int | None) -> None:
    ours = digest_model(model, make_serialization(model, shard_size=shard))
    assert json.loads(ours.to_bytes()) == ms_statement(model, shard=shard)
    names = [r.name for r in ours.resources]
    first = {n.partition(":")[0]: i for i, n in reversed(list(enumerate(names)))}
    assert first["a/b"] < first["a.b"]
    assert not any(n.startswith(".git/") for n in names)
    assert ("empty" in names) == (shard is None)  # an empty file has no shards


def test_blake3_statement_equals_model_signing(model: Path) -> None:
    ours = digest_model(model, make_serialization(model, hash_type="blake3"))
    assert json.loads(ours.to_bytes()) == ms_statement(model, algo="blake3")
    weights = next(r for r in ours.resources if r.name == "weights.bin")
    assert weights.digest == blake3.blake3((model / "weights.bin").read_bytes()).digest()


def test_threads_do_not_change_the_result(model: Path) -> None:
    ser = make_serialization(model, shard_size=1000)
    one = digest_model(model, ser, threads=1)
    many = digest_model(model, ser, threads=8)
    assert one.to_bytes() == many.to_bytes()


def test_single_file_model(tmp_path: Path) -> None:
    f = tmp_path / "model.bin"
    f.write_bytes(os.urandom(10_000))
    ours = digest_model(f, make_serialization(f, shard_size=4096))
    assert json.loads(ours.to_bytes()) == ms_statement(f, shard=4096)
    assert [r.name for r in ours.resources] == [".:0:4096", ".:4096:8192", ".:8192:10000"]


def test_statement_round_trips(model: Path) -> None:
    ours = digest_model(model, make_serialization(model, shard_size=777))
    assert Manifest.parse(ours.to_bytes()) == ours
    assert Manifest.parse(ours.to_bytes()).to_bytes() == ours.to_bytes()


# --- signatures, both directions -----------------------------------------------------------------


@pytest.mark.parametrize("shard", [None, 2048])
def test_gpucc_signature_verifies_with_model_signing(
    model: Path, keys: tuple[Path, Path], shard: int | None, tmp_path: Path
) -> None:
    priv, pub = keys
    manifest = digest_model(model, make_serialization(model, shard_size=shard))
    sig = tmp_path / "model.sig"
    sig.write_bytes(gsign.sign_manifest(manifest, gsign.load_private_key(priv)))
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=pub).verify(model, sig)
    # and model_signing notices a tampered model under the same signature
    (model / "weights.bin").write_bytes(b"tampered")
    with pytest.raises(ValueError, match="weights.bin"):
        model_signing.verifying.Config().use_elliptic_key_verifier(public_key=pub).verify(
            model, sig
        )


@pytest.mark.parametrize("curve", [ec.SECP256R1(), ec.SECP384R1(), ec.SECP521R1()])
@pytest.mark.parametrize("shard", [None, 1500])
def test_model_signing_signature_verifies_with_gpucc(
    model: Path, tmp_path: Path, curve: ec.EllipticCurve, shard: int | None
) -> None:
    key = ec.generate_private_key(curve)
    priv = tmp_path / "k.pem"
    priv.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    hashing = model_signing.hashing.Config()
    if shard:
        hashing.use_shard_serialization(shard_size=shard)
    sig = tmp_path / "m.sig"
    model_signing.signing.Config().use_elliptic_key_signer(private_key=priv).set_hashing_config(
        hashing
    ).sign(model, sig)
    trusted = gsign.verify_bundle(sig.read_bytes(), key.public_key())
    result = verify_model(model, trusted)
    assert result.ok, result.summary()
    assert result.resources_checked == len(trusted.resources) > 5


def test_wrong_key_and_altered_payload_are_refused(
    model: Path, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    priv, _ = keys
    manifest = digest_model(model, make_serialization(model))
    bundle = json.loads(gsign.sign_manifest(manifest, gsign.load_private_key(priv)))
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    with pytest.raises(SignatureError, match="different key"):
        gsign.verify_bundle(json.dumps(bundle).encode(), other)
    del bundle["verificationMaterial"]["publicKey"]["hint"]  # no hint: the signature decides
    with pytest.raises(SignatureError, match="does not verify"):
        gsign.verify_bundle(json.dumps(bundle).encode(), other)
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    statement["predicate"]["resources"][0]["digest"] = "00" * 32
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    pub = gsign.load_private_key(priv).public_key()
    with pytest.raises(SignatureError) as info:
        gsign.verify_bundle(json.dumps(bundle).encode(), pub)
    assert exit_code_for(info.value) == 6


def test_private_key_must_be_private(keys: tuple[Path, Path]) -> None:
    priv, pub = keys
    priv.chmod(0o640)
    with pytest.raises(KeyFileError, match="chmod 600"):
        gsign.load_private_key(priv)
    priv.chmod(0o600)
    with pytest.raises(KeyFileError, match="not a PEM private key"):
        gsign.load_private_key(_private(pub))


def _private(pub: Path) -> Path:
    copy = pub.with_name("copy.pem")
    copy.write_bytes(pub.read_bytes())
    copy.chmod(0o600)
    return copy


# --- verification results name each resource -------------------------------------------------


def _trusted(model: Path, shard: int | None = 1000) -> Manifest:
    return digest_model(model, make_serialization(model, shard_size=shard))


def test_tampered_renamed_missing_extra_are_each_named(model: Path) -> None:
    trusted = _trusted(model)
    data = bytearray((model / "weights.bin").read_bytes())
    data[4500] ^= 1
    (model / "weights.bin").write_bytes(data)
    (model / "a.b").rename(model / "a.c")
    (model / "sub" / "deeper" / "x.safetensors").unlink()
    (model / "new.bin").write_bytes(b"x")
    result = verify_model(model, trusted)
    assert not result.ok
    kinds = {(p.kind, p.name) for p in result.problems}
    assert ("mismatch", "weights.bin:4000:5000") in kinds
    assert {("missing", f"a.b:{s}:{min(s + 1000, 5000)}") for s in range(0, 5000, 1000)} <= kinds
    assert ("missing", "sub/deeper/x.safetensors:0:1000") in kinds
    assert ("extra", "a.c:0:1000") in kinds and ("extra", "new.bin:0:1") in kinds
    assert len(result.of_kind("mismatch")) == 1
    with pytest.raises(ModelMismatchError) as info:
        require_verified(result)
    assert exit_code_for(info.value) == 6 and "weights.bin:4000:5000" in str(info.value)


def test_wrong_algorithm_in_a_resource_is_named(model: Path) -> None:
    statement = json.loads(_trusted(model, None).to_bytes())
    statement["predicate"]["resources"][2]["algorithm"] = "blake3"
    trusted = Manifest.parse(json.dumps(statement).encode())
    result = verify_model(model, trusted)
    assert [(p.kind, p.name) for p in result.problems] == [
        ("algorithm", statement["predicate"]["resources"][2]["name"])
    ]


def test_changed_shard_size_is_refused_by_name(model: Path) -> None:
    statement = json.loads(_trusted(model).to_bytes())
    statement["predicate"]["serialization"]["shard_size"] = 2000  # subject still matches
    result = verify_model(model, Manifest.parse(json.dumps(statement).encode()))
    assert not result.ok
    assert ("missing", "weights.bin:1000:2000") in {(p.kind, p.name) for p in result.problems}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda b: b[: len(b) // 2], "not JSON"),
        (lambda b: b"\xff" + b, "not UTF-8"),
        (lambda b: b"[]", "not a JSON object"),
        (lambda b: b.replace(b'"_type"', b'"_typo"', 1), "in-toto statement"),
        (lambda b: b.replace(b"signature/v1.0", b"signature/v9.9"), "predicateType"),
        (lambda b: b.replace(b'"method": "shards"', b'"method": "tensors"'), "method"),
        (lambda b: b.replace(b'"hash_type": "sha256"', b'"hash_type": "md5"'), "md5"),
        (lambda b: b.replace(b'"shard_size": 1000', b'"shard_size": 1000.5'), "whole number"),
        (lambda b: b.replace(b'"shard_size": 1000', b'"shard_size": NaN'), "NaN"),
        (lambda b: b.replace(b"weights.bin:0:1000", b"../weights.bin:0:1000"), "inside the model"),
        (lambda b: b.replace(b"weights.bin:0:1000", b"weights.bin:0:1001"), "shard"),
        (lambda b: b.replace(b'"_type"', b'"_type": "x", "_type"', 1), "appears twice"),
        (lambda b: b"[" * 100_000 + b"]" * 100_000, "nests deeper"),
        (lambda b: b.replace(b'"shard_size": 1000', b'"shard_size": ' + b"9" * 100_000), "digits"),
        (lambda b: b.replace(b'"shard_size": 1000', b'"shard_size": 1e300'), "out of range"),
        (lambda b: b + b" " * (64 * 1024 * 1024), "larger than"),
    ],
)
def test_malformed_manifests_are_refused(model: Path, edit: Any, message: str) -> None:
    good = _trusted(model).to_bytes()
    with pytest.raises(MalformedManifestError, match=message) as info:
        Manifest.parse(edit(good))
    assert exit_code_for(info.value) == 4


def test_edited_digest_breaks_the_subject(model: Path) -> None:
    statement = json.loads(_trusted(model).to_bytes())
    statement["predicate"]["resources"][0]["digest"] = "ab" * 32
    with pytest.raises(MalformedManifestError, match="subject digest"):
        Manifest.parse(json.dumps(statement).encode())


# --- bad model trees -----------------------------------------------------------------------------


def test_symlinks(model: Path, tmp_path: Path) -> None:
    (model / "link.bin").symlink_to(model / "weights.bin")
    with pytest.raises(ModelTreeError, match="link.bin is a symbolic link"):
        digest_model(model, make_serialization(model))
    inside = digest_model(model, make_serialization(model, allow_symlinks=True))
    by_name = {r.name: r.digest for r in inside.resources}
    assert by_name["link.bin"] == by_name["weights.bin"]
    outside = tmp_path / "secret"
    outside.write_bytes(b"outside")
    (model / "link.bin").unlink()
    (model / "escape").symlink_to(outside)
    with pytest.raises(ModelTreeError, match="leaves the model directory"):
        digest_model(model, make_serialization(model, allow_symlinks=True))


def test_special_file_is_refused(model: Path) -> None:
    os.mkfifo(model / "sub" / "pipe")
    with pytest.raises(ModelTreeError, match="sub/pipe is a special file"):
        digest_model(model, make_serialization(model))


def test_file_changing_while_hashed_is_refused(model: Path) -> None:
    seen: list[int] = []

    def touch_another(n: int) -> None:
        if not seen:
            with (model / "weights.bin").open("ab") as fh:
                fh.write(b"grown")
        seen.append(n)

    with pytest.raises(ModelChangedError, match="weights.bin changed"):
        digest_model(model, make_serialization(model, shard_size=1000), threads=1,
                     progress=touch_another)  # fmt: skip


def test_file_written_during_its_read_is_refused(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check after reading: a write that lands while a shard is being read is caught."""
    from gpucc.staging.model import digest_cpu

    original = digest_cpu.hash_range
    done: list[str] = []

    def read_then_write(
        fd: int, entry: Any, start: int, end: int, hasher: Any, buf: memoryview
    ) -> None:
        original(fd, entry, start, end, hasher, buf)
        if entry.name == "weights.bin" and not done:
            done.append(entry.name)
            with (model / "weights.bin").open("r+b") as fh:  # same size, new mtime
                fh.write(b"\x00")

    monkeypatch.setattr(digest_cpu, "hash_range", read_then_write)
    os.utime(model / "weights.bin", ns=(10**18, 10**18))  # the write surely moves the mtime
    with pytest.raises(ModelChangedError, match="weights.bin changed while it was hashed"):
        digest_model(model, make_serialization(model, shard_size=100_000), threads=1)
