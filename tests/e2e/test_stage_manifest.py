"""``gpucc stage --manifest``: a sealed model verified against its manifest where it was staged.

Real processes throughout: the model is sealed with ``gpucc seal``, described with
``gpucc model digest`` (or signed with ``gpucc model sign``), and staged with
``gpucc stage``. The library call is checked on the host buffer it would be given.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.core.errors import UsageError
from gpucc.staging.model.api import load_manifest, require_verified, verify_staged
from gpucc.staging.model.manifest import ModelMismatchError
from tests.support.cli import run_cli

SCHEMA = Path(__file__).parents[2] / "cli" / "schemas" / "gpucc.stage.v1.json"
MODEL_SIZE = 300_000
SHARD = 65_536


def gpucc(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, module=True)


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (result.returncode, result.stderr)
    return result


def error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("gpucc: error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0]


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A model file, the same model sealed, and a second model of the same size."""
    rng = np.random.default_rng(15)
    (tmp_path / "model.bin").write_bytes(rng.bytes(MODEL_SIZE))
    (tmp_path / "other.bin").write_bytes(rng.bytes(MODEL_SIZE))
    ok(gpucc("seal", "model.bin", "-o", "model.sealed", "--data-key", "k.key", cwd=tmp_path))
    return tmp_path


def digest(work: Path, model: str, out: str, *extra: str) -> Path:
    ok(gpucc("model", "digest", model, "-o", out, *extra, cwd=work))
    return work / out


def stage(work: Path, *extra: str | Path) -> subprocess.CompletedProcess[str]:
    return gpucc("stage", "model.sealed", "--data-key", "k.key", *extra, cwd=work)


@pytest.mark.parametrize("variant", [(), ("--shard-size", str(SHARD)), ("--hash", "blake3")])
def test_matching_manifest_stages(work: Path, variant: tuple[str, ...]) -> None:
    if variant[-1:] == ("blake3",):
        pytest.importorskip("blake3")
    digest(work, "model.bin", "m.json", *variant)
    result = ok(stage(work, "--manifest", "m.json", "--format", "json"))
    doc: dict[str, Any] = json.loads(result.stdout)
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    model = doc["model"]
    assert model["verified"] is True and model["problems"] == []
    assert model["model_name"] == "model.bin"
    shards = -(-MODEL_SIZE // SHARD) if "--shard-size" in variant else 1
    assert model["resources_checked"] == shards
    assert model["subject_sha256"] == load_manifest(work / "m.json").subject_digest.hex()
    assert doc["verified"] is True and doc["scrubbed"] is True
    assert "verified in the staged buffer" in result.stderr


def test_text_output_and_resource_by_name(work: Path) -> None:
    digest(work, "model.bin", "m.json")
    result = ok(stage(work, "--manifest", "m.json", "--resource", "."))
    assert "all 1 resources verified" in result.stderr
    assert result.stdout == ""


def test_stage_without_manifest_has_no_model_field(work: Path) -> None:
    doc = json.loads(ok(stage(work, "--format", "json")).stdout)
    assert "model" not in doc
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))


@pytest.mark.parametrize("variant", [(), ("--shard-size", str(SHARD))])
def test_manifest_of_other_bytes_is_refused_and_scrubbed(
    work: Path, variant: tuple[str, ...]
) -> None:
    digest(work, "other.bin", "bad.json", *variant)
    result = stage(work, "--manifest", "bad.json", "--format", "json")
    line = error_line(result, 6)
    assert "does not match its manifest" in line
    assert ".:0:" in line if variant else "digest mismatch: ." in line
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    assert doc["model"]["verified"] is False
    assert {p["problem"] for p in doc["model"]["problems"]} == {"mismatch"}
    assert doc["scrubbed"] is True
    assert "buffer scrubbed; nothing staged is kept" in result.stderr
    assert "model mismatch: ." in result.stderr


def test_shorter_model_names_missing_and_extra_shards(work: Path) -> None:
    (work / "short.bin").write_bytes((work / "model.bin").read_bytes()[:200_000])
    digest(work, "short.bin", "short.json", "--shard-size", str(SHARD))
    line = error_line(stage(work, "--manifest", "short.json"), 6)
    assert "missing: .:196608:200000" in line
    assert "not in the manifest: .:196608:262144, .:262144:300000" in line


def test_longer_model_names_the_missing_shards(work: Path) -> None:
    (work / "long.bin").write_bytes((work / "model.bin").read_bytes() + b"\0" * SHARD)
    digest(work, "long.bin", "long.json", "--shard-size", str(SHARD))
    line = error_line(stage(work, "--manifest", "long.json"), 6)
    assert "missing: .:262144:327680, .:327680:365536" in line
    assert "not in the manifest: .:262144:300000" in line


def test_wrong_resource_name_is_a_usage_error(work: Path) -> None:
    digest(work, "model.bin", "m.json")
    line = error_line(stage(work, "--manifest", "m.json", "--resource", "weights.bin"), 2)
    assert "resource 'weights.bin' is not in the manifest of 'model.bin'" in line
    assert "it lists '.'" in line


def test_model_directory_needs_a_resource(work: Path) -> None:
    model = work / "dir"
    model.mkdir()
    (model / "model.bin").write_bytes((work / "model.bin").read_bytes())
    (model / "config.json").write_bytes(b"{}")
    digest(work, "dir", "d.json")
    line = error_line(stage(work, "--manifest", "d.json"), 2)
    assert "lists 2 files" in line and "--resource" in line
    doc = json.loads(ok(stage(work, "--manifest", "d.json", "--resource", "model.bin",
                              "--format", "json")).stdout)  # fmt: skip
    assert doc["model"]["verified"] is True and doc["model"]["resources_checked"] == 1
    line = error_line(stage(work, "--manifest", "d.json", "--resource", "config.json"), 6)
    assert "digest mismatch: config.json" in line


def test_option_combinations(work: Path) -> None:
    digest(work, "model.bin", "m.json")
    assert "--resource goes with" in error_line(stage(work, "--resource", "."), 2)
    assert "go together" in error_line(stage(work, "--signature", "m.json"), 2)
    line = error_line(stage(work, "--manifest", "m.json", "--signature", "m.json"), 2)
    assert "not both" in line


def test_malformed_manifest_stages_nothing(work: Path) -> None:
    (work / "junk.json").write_text("{}")
    result = stage(work, "--manifest", "junk.json")
    error_line(result, 4)
    assert "staged" not in result.stderr


def _keys(work: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    private = work / "key.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    private.chmod(0o600)
    (work / "pub.pem").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def test_signed_manifest(work: Path) -> None:
    _keys(work)
    ok(gpucc("model", "sign", "model.bin", "--signer-key", "key.pem", "--signature", "m.sig",
             cwd=work))  # fmt: skip
    doc = json.loads(
        ok(
            stage(work, "--signature", "m.sig", "--signer-pub", "pub.pem", "--format", "json")
        ).stdout
    )
    assert doc["model"]["verified"] is True
    # A bundle signed by someone else is refused before anything is staged.
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    (work / "other.pem").write_bytes(
        other.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    result = stage(work, "--signature", "m.sig", "--signer-pub", "other.pem")
    error_line(result, 6)
    assert "staged" not in result.stderr


# --- the library call, on a host buffer ----------------------------------------------------------


def test_verify_staged_library(work: Path) -> None:
    data = (work / "model.bin").read_bytes()
    trusted = load_manifest(digest(work, "model.bin", "m.json", "--shard-size", str(SHARD)))
    buf = np.frombuffer(bytearray(data), dtype=np.uint8)
    result = verify_staged(buf, trusted)
    assert result.ok and result.resources_checked == 5
    require_verified(result)
    buf[SHARD + 1] ^= 1
    result = verify_staged(buf, trusted, ".", threads=1)
    assert [(p.name, p.kind) for p in result.problems] == [(f".:{SHARD}:{2 * SHARD}", "mismatch")]
    with pytest.raises(ModelMismatchError, match=f"digest mismatch: .:{SHARD}:{2 * SHARD}"):
        require_verified(result)
    with pytest.raises(UsageError, match="not in the manifest"):
        verify_staged(buf, trusted, "model.bin")
    with pytest.raises(UsageError, match="not contiguous"):
        verify_staged(buf[::2], trusted)
    with pytest.raises(UsageError, match="not a host buffer"):
        verify_staged(object(), trusted)
