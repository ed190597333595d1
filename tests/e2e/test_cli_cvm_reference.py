"""`gpucc cvm reference-snp` and `reference-tdx` as real processes: the SEV-SNP launch
measurement of a synthetic image equals sev-snp-measure's own command line's and its policy
pins a simulated report end to end; a TDX policy written from a recorded boot admits that
boot, and a kernel update changes one line of it; bad images and logs are one-line errors."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpucc.gpuattest.cvm.appraise import verify_cvm_evidence
from gpucc.gpuattest.cvm.eventlog_build import boot_events, build_event_log
from gpucc.gpuattest.cvm.snp_simulate import simulate_snp_report
from gpucc.gpuattest.cvm.tdx_sim import simulated_tdx
from gpucc.gpuattest.policy import load_policy
from gpucc.gpuattest.result import Verdict
from tests.support.cli import run_cli
from tests.support.ovmf import synthetic_ovmf

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
RD = bytes(range(64))


@pytest.fixture
def image(tmp_path: Path) -> dict[str, Path]:
    kernel = tmp_path / "vmlinuz"
    kernel.write_bytes(b"MZ synthetic kernel " * 300)
    initrd = tmp_path / "initrd.img"
    initrd.write_bytes(b"synthetic initrd " * 200)
    return {"ovmf": synthetic_ovmf(tmp_path / "OVMF.fd"), "kernel": kernel, "initrd": initrd}


def snp_args(image: dict[str, Path], append: str = "console=ttyS0") -> list[str | Path]:
    return [
        "--ovmf", image["ovmf"], "--kernel", image["kernel"], "--initrd", image["initrd"],
        "--append", append, "--vcpus", "4", "--vcpu-type", "EPYC-v4",
    ]  # fmt: skip


def upstream(image: dict[str, Path], append: str = "console=ttyS0") -> str:
    """sev-snp-measure's own command line."""
    proc = subprocess.run(
        [sys.executable, "-m", "sevsnpmeasure.cli", "--mode", "snp", *map(str, snp_args(image, append))],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return proc.stdout.strip()


def test_the_snp_reference_equals_sev_snp_measure_and_pins_a_report(
    image: dict[str, Path], tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    proc = run_cli("cvm", "reference-snp", *snp_args(image), "-o", policy)
    assert proc.returncode == 0, proc.stderr
    pol = load_policy(policy)
    measurement = pol.cvm.pins("snp")["measurement"]
    assert measurement == upstream(image)
    for append, verdict in (
        ("console=ttyS0", Verdict.TRUSTED),
        ("init=/bin/sh", Verdict.NOT_TRUSTED),
    ):
        launched = bytes.fromhex(upstream(image, append))
        report, vcek, roots = simulate_snp_report(report_data=RD, measurement=launched)
        result = verify_cvm_evidence(
            report, vcek, now=NOW, policy=pol.cvm, expected_report_data=RD, snp_roots=roots,
            require_pins=True,
        )  # fmt: skip
        assert result.verdict is verdict, result.reasons
    assert "differs from the policy: measurement" in result.reasons[0]
    again = run_cli("cvm", "reference-snp", *snp_args(image), "-o", policy)
    assert again.returncode != 0 and "--force" in again.stderr
    # the same values as a JSON document, valid against the schema the package ships
    from jsonschema import Draft202012Validator

    from gpucc.cli.schemas import load_schema

    shown = run_cli("cvm", "reference-snp", *snp_args(image), "-f", "json")
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    Draft202012Validator(load_schema("gpucc.cvm.reference/v1")).validate(doc)
    assert doc["kind"] == "snp" and doc["output"] is None
    assert doc["policy"]["cvm"]["measurements"]["snp"]["measurement"] == measurement


def test_the_base_policy_keeps_its_other_settings(image: dict[str, Path], tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text("ocsp:\n  require: false\ncvm:\n  allow_debug: true\n")
    proc = run_cli("cvm", "reference-snp", *snp_args(image), "--base", base)
    assert proc.returncode == 0, proc.stderr
    assert "allow_debug: true" in proc.stdout and "require: false" in proc.stdout
    assert f"measurement: {upstream(image)}" in proc.stdout


def test_bad_images_are_one_line_errors(image: dict[str, Path], tmp_path: Path) -> None:
    truncated = tmp_path / "short.fd"
    truncated.write_bytes(image["ovmf"].read_bytes()[:30000])
    tampered = tmp_path / "tampered.fd"
    data = bytearray(image["ovmf"].read_bytes())
    data[0x1000:0x1004] = b"XSEV"  # the SEV metadata's signature
    tampered.write_bytes(bytes(data))
    oversized = tmp_path / "huge.fd"
    with oversized.open("wb") as f:
        f.truncate(5 * 1024**3)  # sparse: refused by its size before it is read
    for bad, words in ((truncated, "SEV-SNP metadata"), (tampered, "SEV-SNP metadata"),
                       (oversized, "larger than")):  # fmt: skip
        proc = run_cli(
            "cvm", "reference-snp", "--ovmf", bad, "--vcpus", "1", "--vcpu-type", "EPYC-v4"
        )
        assert proc.returncode == 4, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr
    proc = run_cli(
        "cvm", "reference-snp", "--ovmf", image["ovmf"], "--vcpus", "1", "--vcpu-type", "x"
    )
    assert proc.returncode == 2 and "unknown vCPU type" in proc.stderr


def test_a_tdx_policy_from_a_recorded_boot_survives_a_kernel_update(tmp_path: Path) -> None:
    sim = simulated_tdx(NOW)
    collateral = sim.collateral(issued=NOW - dt.timedelta(hours=1)).to_json()
    texts = {}
    for version in ("1", "2"):
        kernel = hashlib.sha384(f"vmlinuz-{version}".encode()).digest()
        events = boot_events(kernel_digest=kernel, initrd=b"initrd", cmdline="ro quiet")
        log = tmp_path / f"ccel-{version}"
        log.write_bytes(build_event_log(events))
        quote = tmp_path / f"quote-{version}"
        quote.write_bytes(sim.quote(RD, event_log=log.read_bytes()))
        policy = tmp_path / f"policy-{version}.yaml"
        proc = run_cli("cvm", "reference-tdx", "--event-log", log, "--quote", quote, "-o", policy)
        assert proc.returncode == 0, proc.stderr
        texts[version] = [t for t in policy.read_text().splitlines() if not t.startswith("#")]
        result = verify_cvm_evidence(
            quote.read_bytes(), collateral, now=NOW, policy=load_policy(policy).cvm,
            expected_report_data=RD, tdx_root=sim.root, event_log=log.read_bytes(),
            require_pins=True,
        )  # fmt: skip
        assert result.trusted, result.reasons
    changed = [(a, b) for a, b in zip(texts["1"], texts["2"], strict=True) if a != b]
    assert len(changed) == 1 and "digest:" in changed[0][0]
    old = load_policy(tmp_path / "policy-1.yaml").cvm
    refused = verify_cvm_evidence(
        (tmp_path / "quote-2").read_bytes(), collateral, now=NOW, policy=old,
        expected_report_data=RD, tdx_root=sim.root, event_log=(tmp_path / "ccel-2").read_bytes(),
        require_pins=True,
    )  # fmt: skip
    assert refused.verdict is Verdict.NOT_TRUSTED and "boot-application" in refused.reasons[0]
    mismatched = run_cli(
        "cvm", "reference-tdx", "--event-log", tmp_path / "ccel-1", "--quote", tmp_path / "quote-2"
    )
    assert mismatched.returncode == 1 and "RTMR1 differ" in mismatched.stderr
    bad = tmp_path / "bad"
    bad.write_bytes((tmp_path / "ccel-1").read_bytes()[:200])
    proc = run_cli("cvm", "reference-tdx", "--event-log", bad)
    assert proc.returncode == 4 and "truncated" in proc.stderr
    short = tmp_path / "short-quote"
    short.write_bytes((tmp_path / "quote-1").read_bytes()[:300])
    proc = run_cli("cvm", "reference-tdx", "--event-log", tmp_path / "ccel-1", "--quote", short)
    assert proc.returncode == 4 and "truncated" in proc.stderr


OVMF_LOG = Path(__file__).parents[1] / "data" / "cloud-cvm" / "tdx-ccel-ovmf" / "CCEL_data_ovmf"


def test_a_tdx_policy_from_a_real_ovmf_log_pins_the_boot_it_records(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    proc = run_cli("cvm", "reference-tdx", "--event-log", OVMF_LOG, "-o", policy)
    assert proc.returncode == 0, proc.stderr
    pins = load_policy(policy).cvm
    sim = simulated_tdx(NOW)
    collateral = sim.collateral(issued=NOW - dt.timedelta(hours=1)).to_json()
    raw = OVMF_LOG.read_bytes()
    quote = tmp_path / "quote"
    quote.write_bytes(sim.quote(RD, event_log=raw))  # a TD that booted what the log says

    def judged(log: bytes) -> tuple[Verdict, list[str]]:
        result = verify_cvm_evidence(
            quote.read_bytes(), collateral, now=NOW, policy=pins, expected_report_data=RD,
            tdx_root=sim.root, event_log=log, require_pins=True,
        )  # fmt: skip
        return result.verdict, list(result.reasons)

    assert judged(raw) == (Verdict.TRUSTED, [])
    # reference-tdx checks the log against the quote: OVMF's log matches its TD's quote
    checked = run_cli("cvm", "reference-tdx", "--event-log", OVMF_LOG, "--quote", quote)
    assert checked.returncode == 0, checked.stderr
    assert "name: efi-SecureBoot" in checked.stdout and "name: cmdline" in checked.stdout
    # and refuses it against a quote whose RTMRs it does not replay to
    other = tmp_path / "other-quote"
    other.write_bytes(sim.quote(RD))
    mismatched = run_cli("cvm", "reference-tdx", "--event-log", OVMF_LOG, "--quote", other)
    assert mismatched.returncode == 1 and "RTMR0, RTMR1, RTMR2 differ" in mismatched.stderr
    # an OVMF-convention log of another boot is refused by the pins, naming the event
    events = boot_events(kernel_digest=b"\x42" * 48, initrd=b"initrd", cmdline="ro quiet")
    alien = build_event_log(events, ovmf=True)
    quote.write_bytes(sim.quote(RD, event_log=alien))
    verdict, reasons = judged(alien)
    assert verdict is Verdict.NOT_TRUSTED and "efi-PK" in reasons[0], reasons
