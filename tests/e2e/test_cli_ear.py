"""``gpucc token verify-ear``: exit codes, the JSON document's schema, hostile names."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import jsonschema
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.cli.schemas import load_schema
from gpucc.gpuattest.ear import EarSubmodule, Outcome, sign_ear
from tests.e2e.test_cli_terminal import HOSTILE, raw_controls
from tests.support.cli import run_cli

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
AT = "2026-12-01T12:01:00Z"


def _files(tmp_path: Path, *outcomes: Outcome) -> ec.EllipticCurvePrivateKey:
    key = ec.generate_private_key(ec.SECP384R1())
    part_list = [EarSubmodule(f"GPU-{i}{HOSTILE}", o) for i, o in enumerate(outcomes)]
    token = sign_ear(part_list, private_key=key, nonce=b"\xab" * 32, now=NOW, kid=HOSTILE)
    (tmp_path / "r.ear").write_text(token + "\n")
    (tmp_path / "p.pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return key


def test_verify_ear_affirming_and_not(tmp_path: Path) -> None:
    _files(tmp_path, Outcome.TRUSTED, Outcome.TRUSTED)
    args = ("token", "verify-ear", "r.ear", "--signer-pub", "p.pub", "--at", AT)
    ok = run_cli(*args, "--nonce", "ab" * 32, "-f", "json", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    jsonschema.validate(doc, load_schema("gpucc.token.verify-ear/v1"))
    assert doc["trusted"] is True and doc["status"] == "affirming"
    assert len(doc["submods"]) == 2 and doc["freshness"] == "nonce-checked"
    text = run_cli(*args, "--no-nonce", cwd=tmp_path)
    assert text.returncode == 0 and "FRESHNESS NOT CHECKED" in text.stdout
    assert not raw_controls(text.stdout + text.stderr)
    stale = run_cli(*args, "--nonce", "cd" * 32, cwd=tmp_path)
    assert stale.returncode == 1

    _files(tmp_path, Outcome.TRUSTED, Outcome.UNDECIDED)
    undecided = run_cli(*args, "--no-nonce", "-f", "json", cwd=tmp_path)
    assert undecided.returncode == 1
    doc = json.loads(undecided.stdout)
    jsonschema.validate(doc, load_schema("gpucc.token.verify-ear/v1"))
    assert doc["status"] == "none" and doc["trusted"] is False
