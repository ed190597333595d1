"""Errors about a file name the file, and standard input is called that."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.cli import ENV, gpucc


def test_seal_from_standard_input_says_so(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpucc", "seal", "-", "-o", str(tmp_path / "x.gcc"),
         "--data-key", str(tmp_path / "k.key")],
        input=b"data", capture_output=True, env=ENV, check=False, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert b"standard input (-) cannot be read here" in proc.stderr
    assert b"does not exist" not in proc.stderr


def test_stage_from_standard_input_calls_it_that(tmp_path: Path) -> None:
    (tmp_path / "d.bin").write_bytes(b"y" * 10_000)
    key = str(tmp_path / "k.key")
    sealed = gpucc("seal", str(tmp_path / "d.bin"), "-o", str(tmp_path / "d.gcc"),
                   "--data-key", key, "-q")  # fmt: skip
    assert sealed.returncode == 0, sealed.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "gpucc", "stage", "-", "--data-key", key],
        input=(tmp_path / "d.gcc").read_bytes(), capture_output=True, env=ENV, check=False,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert b"of sealed dataset standard input on cpu" in proc.stderr


def test_malformed_evidence_names_its_file(tmp_path: Path) -> None:
    bad = tmp_path / "trunc.json"
    bad.write_text('{"a":\n')
    proc = gpucc("attest", "--evidence", str(bad), "--nonce", "00" * 32)
    assert proc.returncode == 4, proc.stderr
    assert f"error: {bad}: the evidence is not JSON" in proc.stderr
    seen = gpucc("inspect", str(bad))
    assert seen.returncode == 4 and f"the file {bad} is not JSON" in seen.stderr


def test_messages_show_no_parser_or_framework_internals(tmp_path: Path) -> None:
    """A YAML error says where, not the parser's name for its input; a missing file among
    several is named with the argument's name, without the ``...`` of the usage line."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("ocsp: [\n")
    proc = gpucc("attest", "--sample", "--offline", "--policy", str(bad))
    assert proc.returncode == 4, proc.stderr
    assert "at line 2, column 1" in proc.stderr and "the end of the file" in proc.stderr
    missing = tmp_path / "nope.json"
    imported = gpucc("collateral", "import", str(missing), "--store", str(tmp_path / "s"))
    assert imported.returncode == 8 and f"FILE {missing} does not exist" in imported.stderr
    for text in (proc.stderr, imported.stderr):
        for leak in ("<unicode string>", "...", "['", "None"):
            assert leak not in text, (leak, text)
