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
        "seal", "d.bin", "-o", "d.gcc", "--data-key", "k.key", "--chunk-size", "4KiB", cwd=tmp_path
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
        "--data-key", "k.key", "-o", f"{name}-answer.json", "--simulate", "sim",
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
        "session", "local", "d.gcc", "--data-key", "k.key", "-o", "a.json",
        "--host-key", "h.key", "--simulate", "sim", "--format", "json", cwd=work,
    )  # fmt: skip
    assert local.returncode == 0, local.stderr
    assert json.loads(local.stdout)["protocol_version"] == 2
    gpu_only = run(
        "session", "local", "d.gcc", "--data-key", "k.key", "-o", "b.json",
        "--host-key", "h2.key", "--simulate", "sim", "--gpu-only", cwd=work,
    )  # fmt: skip
    assert gpu_only.returncode == 1 and "GPU-only" in last_error(gpu_only)


def test_stale_cvm_collateral_is_exit_3_and_releases_nothing(work: Path) -> None:
    import datetime as dt

    from gpucc.assembly import Platform, PlatformVerifier, Settings, SimulatedSource
    from gpucc.keyrelease.protocol import create_offer

    # A CVM whose collateral was issued 40 days ago: stale now, when keys are released.
    challenge = run("session", "challenge", cwd=work).stdout.strip()
    old = SimulatedSource(work / "sim", now=dt.datetime.now(dt.UTC) - dt.timedelta(days=40))
    platform = Platform(source=old, verifier=PlatformVerifier(Settings()))
    made, _ = create_offer(
        bytes.fromhex(challenge), platform.collect(), collect_cvm=platform.collect_cvm()
    )
    (work / "s.json").write_bytes(made.to_json())
    stale = answer(work, "s", challenge)
    assert stale.returncode == 3
    assert "undecided" in last_error(stale) and "expired" in last_error(stale)
    assert not (work / "s-answer.json").exists()


@pytest.mark.parametrize("how", ["--at", "GPUCC_AT"])
def test_key_release_refuses_a_verification_time_other_than_now(work: Path, how: str) -> None:
    import datetime as dt

    challenge = offer(work, "t")
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    if how == "--at":
        refused = answer(work, "t", challenge, "--at", past)
    else:
        refused = run_cli(
            "session", "answer", "t.json", "--challenge", challenge, "--dataset", "d.gcc",
            "--data-key", "k.key", "-o", "t-answer.json", "--simulate", "sim",
            "--state-dir", "state", cwd=work, env={"GPUCC_AT": past},
        )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "current time" in last_error(refused)
    assert not (work / "t-answer.json").exists()
    local = run_cli(
        "session", "local", "d.gcc", "--data-key", "k.key", "-o", "l.json", "--host-key", "l.key",
        "--simulate", "sim", cwd=work, env={"GPUCC_AT": past},
    )  # fmt: skip
    assert local.returncode == 2 and not (work / "l.json").exists()


def test_a_release_says_what_it_trusted_also_with_q(work: Path) -> None:
    relaxed = policy(
        work,
        "cvm:\n  allow_unpinned: true\n  accept_tcb_status: [UpToDate, OutOfDate]\n",
    )
    challenge = offer(work, "r")
    made = answer(work, "r", challenge, "--policy", relaxed, "--format", "json", "-q")
    assert made.returncode == 0, made.stderr
    record = json.loads(made.stdout)["trusted_with"]
    items = {r["item"] for r in record["relaxations"]}
    # used, not merely allowed: the simulated TD is UpToDate, so its TCB needed no relaxation
    assert "cvm.allow_unpinned: true" in items and "ocsp.require: false" in items
    assert not any(i.startswith("cvm.accept_tcb_status") for i in items)
    assert record["roots"] == "simulated" and record["simulated"] is True
    assert record["time_source"] == "clock"
    assert "cvm.allow_unpinned: true" in made.stderr and "SIMULATED" in made.stderr


def test_a_cvm_refusal_carries_its_failed_checks_as_data(work: Path) -> None:
    pinned = policy(work, "cvm:\n  measurements:\n    tdx:\n      mrtd: '" + "ab" * 48 + "'\n")
    challenge = offer(work, "x")
    refused = answer(work, "x", challenge, "--policy", pinned, "--format", "json")
    assert refused.returncode == 1
    reasons = json.loads(refused.stdout)["error"]["reasons"]
    assert {"part": "CVM", "check": "cvm-measurements"}.items() <= reasons[0].items()
    assert "mrtd" in reasons[0]["detail"]
