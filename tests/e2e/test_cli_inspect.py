"""``gpucc inspect``: what a file is, as a real process says it, never with a secret."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpucc.staging.format import read_key_file
from tests.support.cli import gpucc


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("inspect")
    (work / "d.bin").write_bytes(os.urandom(40_000))
    data, key = str(work / "d.bin"), str(work / "k.key")
    for args in (
        ("seal", data, "-o", str(work / "d.gcc"), "--data-key", key),
        ("seal", data, "-o", str(work / "shards"), "--data-key", key, "--shards", "3",
         "--chunk-size", "4KiB"),
    ):  # fmt: skip
        proc = gpucc(*args, "-q")
        assert proc.returncode == 0, proc.stderr
    return work


def _inspect(work: Path, name: str) -> tuple[int, str, dict[str, Any] | None]:
    text = gpucc("inspect", str(work / name))
    doc = gpucc("inspect", str(work / name), "-f", "json")
    assert text.returncode == doc.returncode
    parsed = json.loads(doc.stdout) if doc.returncode == 0 else None
    return text.returncode, text.stdout + text.stderr + doc.stdout + doc.stderr, parsed


def test_a_key_file_shows_its_id_and_never_the_key(files: Path) -> None:
    key = read_key_file(files / "k.key")
    code, said, doc = _inspect(files, "k.key")
    assert code == 0 and doc is not None
    assert key.hex() not in said.lower() and key.hex().upper() not in said
    assert doc["kind"] == "key-file"
    # the sealed dataset names the same key id: which key opens it, without the key
    _, dataset_said, dataset = _inspect(files, "d.gcc")
    assert dataset is not None and dataset["kind"] == "sealed-dataset"
    details = dataset["details"]
    assert isinstance(details, dict) and doc["details"] == {"key_id": details["key"].split()[-1]}
    assert details["plaintext_bytes"] == 40_000
    assert key.hex() not in dataset_said


def test_a_shard_says_which_of_its_set_it_is(files: Path) -> None:
    code, said, doc = _inspect(files, "shards/d-00002-of-00003.gcc")
    assert code == 0 and doc is not None and doc["kind"] == "shard"
    details = doc["details"]
    assert isinstance(details, dict) and (details["shard"], details["shards"]) == (2, 3)
    assert "shard 3 of 3 of set" in said


def test_a_key_file_others_can_read_is_refused(files: Path, tmp_path: Path) -> None:
    loose = tmp_path / "loose.key"
    loose.write_bytes((files / "k.key").read_bytes())
    loose.chmod(0o644)
    code, said, _ = _inspect(tmp_path, "loose.key")
    assert code == 8 and "chmod 600" in said


def test_an_unknown_file_is_exit_4_in_one_line(files: Path) -> None:
    code, said, _ = _inspect(files, "d.bin")
    assert code == 4 and "not a file gpucc knows" in said and "Traceback" not in said


def test_the_signed_results_and_model_signatures_gpucc_writes_are_known(tmp_path: Path) -> None:
    """An EAT (attest --sign-eat), an EAR (attest --ear-out) and a model signature (model
    sign): each named with its key and validated against the inspect schema."""
    import subprocess

    import jsonschema

    from tests.support.paths import ROOT

    key = tmp_path / "k.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt",
                    "ec_paramgen_curve:P-384", "-out", str(key)], check=True)  # fmt: skip
    key.chmod(0o600)
    made = [
        gpucc("attest", "-q", "--sample", "--offline", "--sign-eat", str(key),
              "-o", str(tmp_path / "r.eat.json")),
        gpucc("attest", "-q", "--sample", "--offline", "--ear-key", str(key),
              "--ear-out", str(tmp_path / "r.ear")),
    ]  # fmt: skip
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "w.bin").write_bytes(b"weights")
    made.append(gpucc("model", "sign", str(tmp_path / "m"), "--signer-key", str(key),
                      "--signature", str(tmp_path / "m.sig"), "-q"))  # fmt: skip
    assert all(p.returncode == 0 for p in made), [p.stderr for p in made]
    schema = json.loads((ROOT / "cli" / "schemas" / "gpucc.inspect.v1.json").read_text())
    for name, kind, words in (
        ("r.eat.json", "eat", "(EAT) of 1 GPU token(s)"),
        ("r.ear", "ear", "EAR), status affirming"),
        ("m.sig", "model-signature", "a model signature of m: 1 resource(s)"),
    ):
        code, text, doc = _inspect(tmp_path, name)
        assert code == 0 and doc is not None, text
        jsonschema.validate(doc, schema)
        assert doc["kind"] == kind and words in doc["summary"] and "not verified" in text


def test_inspect_knows_the_travel_logs_schema() -> None:
    from gpucc.assembly.inspect import TRAVEL_LOG_SCHEMA
    from gpucc.travel.log import LOG_SCHEMA

    assert TRAVEL_LOG_SCHEMA == LOG_SCHEMA
