"""`gpucc session` protocol version 2 as real processes: keys go only to an attested CVM holding
an attested GPU (simulated H100 and simulated TDX under their own test roots)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest

from gpucc.gpuattest.cvm.tdx_sim import SIMULATED_MRTD
from tests.support.cli import run_cli


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd)


def last_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("gpucc: error: "), result.stderr
    return lines[-1]


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "d.bin").write_bytes(os.urandom(20_000))
    sealed = run(
        "seal", "d.bin", "-o", "d.gcc", "--key-file", "k.key", "--chunk-size", "4KiB", cwd=tmp_path
    )
    assert sealed.returncode == 0, sealed.stderr
    return tmp_path


def offer(work: Path, name: str, *extra: str) -> str:
    challenge = run("session", "challenge", cwd=work).stdout.strip()
    made = run(
        "session", "offer", "--challenge", challenge, "-o", f"{name}.json",
        "--host-key", f"{name}.key", "--simulate", "sim", "--format", "json", *extra, cwd=work,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["protocol_version"] == (1 if "--gpu-only" in extra else 2)
    return challenge


def answer(
    work: Path, name: str, challenge: str, *extra: str | Path
) -> subprocess.CompletedProcess[str]:
    return run(
        "session", "answer", f"{name}.json", "--challenge", challenge, "--dataset", "d.gcc",
        "--key-file", "k.key", "-o", f"{name}-answer.json", "--simulate", "sim",
        "--state-dir", "state", *extra, cwd=work,
    )  # fmt: skip


def policy(work: Path, text: str) -> Path:
    path = work / "policy.yaml"
    path.write_text("ocsp:\n  require: false\n" + text)
    return path


def test_version_2_offer_answer_and_stage(work: Path) -> None:
    challenge = offer(work, "o")
    doc = json.loads((work / "o.json").read_text())
    assert doc["version"] == 2 and base64.b64decode(doc["cvm_evidence"])[:2] == b"\x04\x00"
    made = answer(work, "o", challenge, "--format", "json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["protocol_version"] == 2
    staged = run("stage", "d.gcc", "--session", "o-answer.json", "--host-key", "o.key", cwd=work)
    assert staged.returncode == 0, staged.stderr


def test_a_gpu_only_offer_needs_the_named_relaxation(work: Path) -> None:
    challenge = offer(work, "g", "--gpu-only")
    refused = answer(work, "g", challenge)
    assert refused.returncode == 1
    assert "GPU-only" in last_error(refused) and "allow_gpu_only" in last_error(refused)
    assert not (work / "g-answer.json").exists()
    relaxed = policy(work, "cvm:\n  allow_gpu_only: true\n")
    accepted = answer(work, "g", challenge, "--policy", relaxed)
    assert accepted.returncode == 0, accepted.stderr
    assert "cvm.allow_gpu_only" in accepted.stderr
    staged = run("stage", "d.gcc", "--session", "g-answer.json", "--host-key", "g.key", cwd=work)
    assert staged.returncode == 0, staged.stderr


def test_the_holder_pins_the_cvm_image(work: Path) -> None:
    challenge = offer(work, "p")
    unpinned = answer(work, "p", challenge, "--policy", policy(work, ""))
    assert unpinned.returncode == 1 and "not pinned" in last_error(unpinned)
    wrong = policy(work, f"cvm:\n  measurements:\n    tdx:\n      mrtd: '{'00' * 48}'\n")
    refused = answer(work, "p", challenge, "--policy", wrong)
    assert refused.returncode == 1 and "differs from the policy: mrtd" in last_error(refused)
    right = policy(work, f"cvm:\n  measurements:\n    tdx:\n      mrtd: '{SIMULATED_MRTD.hex()}'\n")
    assert answer(work, "p", challenge, "--policy", right).returncode == 0


def test_tampered_or_missing_cvm_evidence_releases_nothing(work: Path) -> None:
    challenge = offer(work, "t")
    doc = json.loads((work / "t.json").read_text())
    quote = bytearray(base64.b64decode(doc["cvm_evidence"]))
    quote[300] ^= 1
    doc["cvm_evidence"] = base64.b64encode(bytes(quote)).decode()
    (work / "t.json").write_text(json.dumps(doc))
    refused = answer(work, "t", challenge)
    assert refused.returncode == 1 and "CVM attestation is not trusted" in last_error(refused)
    doc["cvm_evidence"] = "not base64!"
    (work / "t.json").write_text(json.dumps(doc))
    malformed = answer(work, "t", challenge)
    assert malformed.returncode == 4 and "base64" in last_error(malformed)
    assert not (work / "t-answer.json").exists()


def test_session_local_runs_version_2(work: Path) -> None:
    local = run(
        "session", "local", "d.gcc", "--key-file", "k.key", "-o", "a.json",
        "--host-key", "h.key", "--simulate", "sim", "--format", "json", cwd=work,
    )  # fmt: skip
    assert local.returncode == 0, local.stderr
    assert json.loads(local.stdout)["protocol_version"] == 2
    gpu_only = run(
        "session", "local", "d.gcc", "--key-file", "k.key", "-o", "b.json",
        "--host-key", "h2.key", "--simulate", "sim", "--gpu-only", cwd=work,
    )  # fmt: skip
    assert gpu_only.returncode == 1 and "GPU-only" in last_error(gpu_only)


def test_stale_cvm_collateral_is_exit_3_and_releases_nothing(work: Path) -> None:
    import datetime as dt

    challenge = offer(work, "s")
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(days=40)).strftime("%Y-%m-%dT%H:%M:%SZ")
    stale = answer(work, "s", challenge, "--at", later)
    assert stale.returncode == 3
    assert "undecided" in last_error(stale) and "expired" in last_error(stale)
    assert not (work / "s-answer.json").exists()
