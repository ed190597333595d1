"""``gpucc stage`` on every kind of input, with AES-GCM that refuses to work in place.

cryptography 51 refuses ``encrypt_into``/``decrypt_into`` whose input and output overlap;
staging once decrypted each chunk in place, so on 51 every ``gpucc stage FILE`` (sealed,
plaintext, a session answer) ended in an internal error, and a tampered file too. Every
process here runs with the suite's guard (``tests/support/childhooks``), which refuses
overlapping buffers on any cryptography version, so a return to working in place fails
these tests wherever they run.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.support import aead_guard
from tests.support.cli import run_cli
from tests.support.paths import ROOT

CS = 64 * 1024


@pytest.fixture
def work(tmp_path: Path) -> Path:
    data = np.random.default_rng(46).integers(0, 256, 5 * CS + 123, dtype=np.uint8)
    (tmp_path / "data.bin").write_bytes(data.tobytes())
    sealed = run_cli(
        "seal", "data.bin", "-o", "data.gcc", "--data-key", "data.key", "--chunk-size", "64KiB",
        cwd=tmp_path,
    )  # fmt: skip
    assert sealed.returncode == 0, sealed.stderr
    return tmp_path


def _staged(result: subprocess.CompletedProcess[str], kind: str) -> dict[str, object]:
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "gpucc.stage/v1", document
    assert document["bytes"] == 5 * CS + 123 and document["chunks"] == 6, document
    assert document["verified"] is True and document["scrubbed"] is True, document
    assert document["input"] == kind, document
    return dict(document)


def test_a_sealed_file_stages(work: Path) -> None:
    result = run_cli("stage", "data.gcc", "--data-key", "data.key", "-f", "json", cwd=work)
    _staged(result, "sealed")


def test_a_plaintext_file_stages_sealed_in_transit(work: Path) -> None:
    result = run_cli("stage", "data.bin", "--chunk-size", "64KiB", "-f", "json", cwd=work)
    _staged(result, "plaintext")


def test_a_session_answer_stages(work: Path) -> None:
    """README's session flow, one step after another, on a simulated GPU."""
    challenge = run_cli("session", "challenge", cwd=work)
    assert challenge.returncode == 0, challenge.stderr
    nonce = challenge.stdout.strip()
    steps = [
        ["session", "offer", "--challenge", nonce, "-o", "offer.json", "--host-key", "host.key",
         "--simulate", "sim"],
        ["session", "answer", "offer.json", "--challenge", nonce, "--dataset", "data.gcc",
         "--data-key", "data.key", "-o", "answer.json", "--simulate", "sim"],
    ]  # fmt: skip
    for step in steps:
        done = run_cli(*step, cwd=work)
        assert done.returncode == 0, (step, done.stderr)
    result = run_cli(
        "stage", "data.gcc", "--session", "answer.json", "--host-key", "host.key", "-f", "json",
        cwd=work,
    )  # fmt: skip
    _staged(result, "sealed")


@pytest.mark.parametrize("threads", ["1", "4"])
def test_a_tampered_file_exits_6_with_json(work: Path, threads: str) -> None:
    sealed = bytearray((work / "data.gcc").read_bytes())
    sealed[len(sealed) - 3 * CS] ^= 0x20  # inside chunk 3 or 4: not the first
    (work / "data.gcc").write_bytes(sealed)
    result = run_cli(
        "stage", "data.gcc", "--data-key", "data.key", "--threads", threads, "-f", "json",
        cwd=work,
    )  # fmt: skip
    assert result.returncode == 6, result.stderr
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "authentication-failed" and error["code"] == 6, error
    assert "failed authentication" in error["message"]


def test_the_guard_refuses_overlap_in_the_processes_the_tests_start(tmp_path: Path) -> None:
    """The guard is on in every child process, on cryptography 50 as on 51."""
    probe = textwrap.dedent(
        """
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        aead = AESGCM(bytes(32))
        buf = bytearray(48)
        aead.encrypt_into(bytes(12), bytes(32), None, memoryview(buf))  # apart: fine
        aead.decrypt_into(bytes(12), bytes(buf), None, bytearray(32))  # apart: fine
        try:
            aead.decrypt_into(bytes(12), memoryview(buf), None, memoryview(buf)[:32])
        except Exception as exc:
            print(type(exc).__name__, exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "OverlapError AESGCM.decrypt_into: data and buf overlap"


def _modules_with_aesgcm() -> list[str]:
    found = []
    for package in ("core", "gpuattest", "staging", "assembly", "travel", "ddp", "cli"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "import AESGCM" in path.read_text(encoding="utf-8"):
                parts = list(path.relative_to(ROOT).with_suffix("").parts)
                found.append(".".join(["gpucc", *parts]))
    return found


def test_every_gpucc_module_that_imports_aesgcm_gets_the_guard() -> None:
    modules = _modules_with_aesgcm()
    assert "gpucc.staging.chunks" in modules and "gpucc.ddp.keys" in modules
    if importlib.util.find_spec("torch") is None and not os.environ.get("GPUCC_REQUIRE_TORCH"):
        modules = [m for m in modules if not m.startswith("gpucc.ddp")]  # needs the torch extra
    for name in modules:
        module = importlib.import_module(name)
        assert module.AESGCM is aead_guard.GuardedAESGCM, name  # the suite's fixture did it


def test_the_guard_sees_overlap_as_the_buffers_lie() -> None:
    buf = bytearray(64)
    view = memoryview(buf)
    assert aead_guard.overlaps(view[:32], view[16:48])
    assert aead_guard.overlaps(view, view[:32])
    assert not aead_guard.overlaps(view[:32], view[32:])
    assert not aead_guard.overlaps(bytes(buf), view)
    assert not aead_guard.overlaps(view[:0], view)
    array = np.zeros(64, dtype=np.uint8)
    assert aead_guard.overlaps(array[8:], array.data)
