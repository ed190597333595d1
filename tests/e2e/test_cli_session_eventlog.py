"""Key release to the image a policy describes, as real processes: the simulated CVM's offer
carries its CC event log, `gpucc cvm reference-tdx` turns a recorded boot into the holder's
policy, and `gpucc session answer` releases the key only to a CVM whose log replays to its
quote and holds the events the policy lists."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest

from gpucc.gpuattest.cvm.tdx_sim import SIMULATED_KERNEL_DIGEST
from tests.support.cli import run_cli


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "d.bin").write_bytes(os.urandom(20_000))
    sealed = run("seal", "d.bin", "-o", "d.gcc", "--data-key", "k.key", cwd=tmp_path)
    assert sealed.returncode == 0, sealed.stderr
    (tmp_path / "base.yaml").write_text("ocsp:\n  require: false\n")
    return tmp_path


def offer(work: Path) -> tuple[str, dict[str, object]]:
    challenge = run("session", "challenge", cwd=work).stdout.strip()
    made = run(
        "session", "offer", "--challenge", challenge, "-o", "o.json", "--host-key", "o.key",
        "--simulate", "sim", cwd=work,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return challenge, json.loads((work / "o.json").read_text())


def answer(work: Path, challenge: str, policy: str) -> subprocess.CompletedProcess[str]:
    return run(
        "session", "answer", "o.json", "--challenge", challenge, "--dataset", "d.gcc",
        "--data-key", "k.key", "-o", "a.json", "--simulate", "sim", "--state-dir", "state",
        "--policy", policy, "--force", cwd=work,
    )  # fmt: skip


def reference(work: Path, doc: dict[str, object]) -> Path:
    """The holder's policy, from the boot the simulated CVM recorded."""
    (work / "ccel").write_bytes(base64.b64decode(str(doc["cvm_event_log"])))
    (work / "quote").write_bytes(base64.b64decode(str(doc["cvm_evidence"])))
    made = run(
        "cvm", "reference-tdx", "--event-log", "ccel", "--quote", "quote", "--base", "base.yaml",
        "-o", "image.yaml", cwd=work,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return work / "image.yaml"


def test_keys_go_only_to_the_image_the_policy_describes(work: Path) -> None:
    challenge, doc = offer(work)
    policy = reference(work, doc)
    released = answer(work, challenge, "image.yaml")
    assert released.returncode == 0, released.stderr
    other = policy.read_text().replace(SIMULATED_KERNEL_DIGEST.hex(), "ab" * 48)
    assert other != policy.read_text()
    (work / "other.yaml").write_text(other)
    refused = answer(work, challenge, "other.yaml")
    assert refused.returncode == 1
    assert "Events required by the policy: boot-application: no RTMR1 event" in refused.stderr


def test_a_missing_or_tampered_log_is_refused(work: Path) -> None:
    challenge, doc = offer(work)
    reference(work, doc)
    log = bytearray(base64.b64decode(str(doc["cvm_event_log"])))
    digest_at = bytes(log).find(SIMULATED_KERNEL_DIGEST)
    log[digest_at] ^= 1  # the kernel event's digest
    cases = {
        "no event log was given": {k: v for k, v in doc.items() if k != "cvm_event_log"},
        "the event log does not match the quote": doc | {
            "cvm_event_log": base64.b64encode(bytes(log)).decode()
        },
    }  # fmt: skip
    for words, changed in cases.items():
        (work / "o.json").write_text(json.dumps(changed))
        refused = answer(work, challenge, "image.yaml")
        assert refused.returncode == 1, refused.stderr
        assert words in refused.stderr
    huge = base64.b64encode(bytes(3 * 1024 * 1024)).decode()
    for bad in ("@@not base64", huge):
        (work / "o.json").write_text(json.dumps(doc | {"cvm_event_log": bad}))
        malformed = answer(work, challenge, "image.yaml")
        assert malformed.returncode == 4 and "CVM event log" in malformed.stderr
