"""`gpucc cvm reference-vtpm` as a real process: a vTPM policy written from a recorded boot (a
TPM measured-boot log built here, and the Azure SEV-SNP sample's quote re-signed over its
replayed PCRs) pins the paravisor's launch measurement and the boot's events, admits that
boot, and a kernel update changes one line of it; a log that is not the evidence's, and bad
inputs, are one-line errors."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from gpucc.gpuattest.cvm.appraise import CvmResult, verify_cvm_evidence
from gpucc.gpuattest.cvm.eventlog_build import build_tpm_log
from gpucc.gpuattest.policy import load_policy
from tests.support.cli import run_cli
from tests.support.paths import DATA
from tests.unit.gpuattest.test_cvm_tpmlog import KERNEL, NEW_KERNEL, boot, resigned_for
from tests.unit.gpuattest.test_cvm_vtpm import NONCE, NOW, SNP, load


def reference(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_cli("cvm", "reference-vtpm", *args)


def one_error_line(proc: subprocess.CompletedProcess[str], code: int, words: str) -> None:
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpucc: error: "), proc.stderr
    assert words in lines[0], proc.stderr


def judged(doc: dict[str, Any], log: bytes, policy: Path) -> CvmResult:
    return verify_cvm_evidence(
        json.dumps(doc).encode(),
        None,
        now=NOW,
        policy=load_policy(policy).cvm,
        expected_report_data=NONCE,
        require_pins=True,
        event_log=log,
    )


def status(result: CvmResult) -> dict[str, str]:
    return {c.id: c.status.value for c in result.checks}


def test_a_vtpm_policy_from_a_recorded_boot_survives_a_kernel_update(tmp_path: Path) -> None:
    events = boot()
    doc = resigned_for(events)
    log = build_tpm_log(events, with_sha1=True)
    (tmp_path / "log").write_bytes(log)
    (tmp_path / "ev.json").write_text(json.dumps(doc))
    policy = tmp_path / "policy.yaml"
    proc = reference(
        "--event-log", tmp_path / "log", "--evidence", tmp_path / "ev.json", "-o", policy
    )
    assert proc.returncode == 0, proc.stderr
    written = yaml.safe_load(policy.read_text())["cvm"]
    pinned = {e["name"]: e for e in written["events"]["vtpm"]}
    assert pinned["boot-application"]["register"] == "pcr4"
    assert pinned["boot-application"]["digest"] == KERNEL.hex()
    assert pinned["efi-SecureBoot"]["register"] == "pcr7"
    sample = verify_cvm_evidence(
        SNP.read_bytes(), None, now=NOW, policy=load_policy(policy).cvm, expected_report_data=NONCE
    )
    assert written["measurements"]["snp"]["measurement"] == sample.claims["measurement"]

    result = judged(doc, log, policy)
    got = status(result)
    assert got["cvm-event-log"] == got["cvm-events"] == got["cvm-measurements"] == "pass"
    refused = [c.id for c in result.checks if c.decision.value == "refuse"]
    assert refused == ["vtpm-binding"]  # the swapped AK of the re-signed quote, nothing else

    # the kernel is updated: the old policy refuses the new boot; one line admits it
    updated = boot(NEW_KERNEL)
    new_doc, new_log = resigned_for(updated), build_tpm_log(updated)
    assert status(judged(new_doc, new_log, policy))["cvm-events"] == "fail"
    text = policy.read_text()
    assert text.count(KERNEL.hex()) == 1
    policy.write_text(text.replace(KERNEL.hex(), NEW_KERNEL.hex()))
    assert status(judged(new_doc, new_log, policy))["cvm-events"] == "pass"
    assert status(judged(doc, log, policy))["cvm-events"] == "fail"  # the old kernel is out


def test_without_evidence_only_the_events_are_written(tmp_path: Path) -> None:
    (tmp_path / "log").write_bytes(build_tpm_log(boot()))
    proc = reference("--event-log", tmp_path / "log")
    assert proc.returncode == 0, proc.stderr
    cvm = yaml.safe_load(proc.stdout)["cvm"]
    assert "measurements" not in cvm and len(cvm["events"]["vtpm"]) == 2


def test_a_log_that_is_not_the_evidences_and_bad_inputs(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(build_tpm_log(boot()))
    out = tmp_path / "p.yaml"
    proc = reference("--event-log", log, "--evidence", SNP, "-o", out)
    one_error_line(proc, 1, "does not replay")
    assert "PCR0" in proc.stderr and not out.exists()
    tdx_quote = DATA / "cloud-cvm" / "tdx-ccel" / "tdx_quote_4.dat"
    one_error_line(reference("--event-log", log, "--evidence", tdx_quote), 4, "not vTPM evidence")
    big = tmp_path / "big.json"
    big.write_text(json.dumps({**load(SNP), "pad": "x" * 70_000}))
    one_error_line(reference("--event-log", log, "--evidence", big), 4, "larger than")
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({**load(SNP), "tpm_quote": {"pcrs": []}}))
    assert reference("--event-log", log, "--evidence", broken).returncode == 4
    log.write_bytes(build_tpm_log(boot())[:-5])
    one_error_line(reference("--event-log", log), 4, "truncated")
    ccel = DATA / "cloud-cvm" / "tdx-ccel" / "CCEL_data"
    one_error_line(reference("--event-log", ccel), 4, "SHA-256")
    one_error_line(reference("--event-log", tmp_path / "missing"), 8, "does not exist")
