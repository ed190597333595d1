"""``import gpucc``: a small, typed public API that resolves, stays cheap, and works."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpucc


@pytest.mark.parametrize("name", gpucc.__all__)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(gpucc, name) is not None


def test_unknown_names_are_attribute_errors() -> None:
    with pytest.raises(AttributeError):
        _ = gpucc.no_such_thing


def test_import_gpucc_loads_no_library_module() -> None:
    code = (
        "import sys, gpucc; "
        "print(sorted(m for m in sys.modules if m.startswith(('gpucc.', 'cryptography', 'lxml'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_docstring_example_verifies_the_bundled_sample() -> None:
    sample = gpucc.nvidia_h100_sample()
    result = gpucc.verify(
        sample.evidence,
        expected_nonce=sample.nonce,
        roots=gpucc.TrustRoots.nvidia(),
        now=gpucc.SAMPLE_VALID_AT,
        rims=sample.rims,
        ocsp=gpucc.NoOcsp("no stored OCSP answers exist for the sample"),
        policy=gpucc.sample_policy(),
    )
    assert result.trusted and result.verdict is gpucc.Verdict.TRUSTED
    today = gpucc.verify(
        sample.evidence,
        expected_nonce=sample.nonce,
        roots=gpucc.TrustRoots.nvidia(),
        now=dt.datetime(2026, 11, 1, tzinfo=dt.UTC),
        rims=sample.rims,
        ocsp=gpucc.NoOcsp("no stored OCSP answers exist for the sample"),
        policy=gpucc.sample_policy(),
    )
    assert not today.trusted  # its RIM signing certificates have expired


def test_seal_release_and_stage_through_the_public_api(tmp_path: Path) -> None:
    data = os.urandom(100_000)
    (tmp_path / "d.bin").write_bytes(data)
    key = os.urandom(32)
    gpucc.seal_file(tmp_path / "d.bin", tmp_path / "d.gcc", kek=key, chunk_size=4096)
    with gpucc.stage(tmp_path / "d.gcc", kek=key, device="cpu") as buf:
        assert buf.tobytes() == data
    assert not buf.any()  # scrubbed on exit
    with pytest.raises(gpucc.WrongKeyError), gpucc.stage(tmp_path / "d.gcc", kek=os.urandom(32)):
        pass
