"""``gpucc collateral fetch`` for NVSwitch evidence against a loopback RIM service: the switch's
BIOS RIM goes into the bundle, and ``gpucc attest --device nvswitch --collateral --offline``
verifies the real switch sample from it."""

from __future__ import annotations

import json
from pathlib import Path

from jsonschema import Draft202012Validator

from gpucc.cli.schemas import load_schema
from tests.e2e.test_cli_attest import no_traceback
from tests.support import netfixtures as nf
from tests.support.cli import run_cli
from tests.support.samples import SWITCH_CHAIN, SWITCH_JSON, SWITCH_NONCE, SWITCH_REPORT, SWITCH_RIM

RIM_ID = "NV_SWITCH_BIOS_5612_0002_890_9610550001"
AT = "2026-12-01T00:00:00Z"


def _fetch(url: str, bundle: Path, *evidence: str | Path) -> tuple[int, dict[str, object]]:
    proc = run_cli(
        "collateral", "fetch", "--evidence", *evidence, "-o", bundle, "--rim-url", url,
        "--ocsp-url", f"http://127.0.0.1:{nf.free_port()}", "--no-cache", "--timeout", "2",
        "-f", "json",
    )  # fmt: skip
    no_traceback(proc)
    doc = json.loads(proc.stdout)
    Draft202012Validator(load_schema("gpucc.collateral.fetch/v1")).validate(doc)
    return proc.returncode, doc


def _attest(bundle: Path, policy: Path, *evidence: str | Path) -> int:
    proc = run_cli(
        "attest", "--device", "nvswitch", "--evidence", *evidence, "--nonce", SWITCH_NONCE,
        "--collateral", bundle, "--offline", "--no-cache", "--policy", policy, "--at", AT,
    )  # fmt: skip
    no_traceback(proc)
    return proc.returncode


def test_the_switch_bios_rim_is_fetched_and_verifies_offline(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("ocsp:\n  require: false\n")
    service = nf.RimService({RIM_ID: SWITCH_RIM.read_bytes()})
    with nf.serve(service) as server:
        bundle = tmp_path / "bundle.json"
        code, doc = _fetch(server.url, bundle, SWITCH_JSON)
        raw_bundle = tmp_path / "raw-bundle.json"
        raw_code, raw_doc = _fetch(
            server.url, raw_bundle, SWITCH_REPORT, "--cert-chain", SWITCH_CHAIN
        )
        asked = [seen.path for seen in server.seen]
    assert "/v1/rim/" + RIM_ID in asked
    # NVIDIA's OCSP responder is unreachable here: the bundle holds the RIM, exit 3.
    assert code == 3 and doc["rims"] == [RIM_ID] and doc["switches"] == 1 and doc["gpus"] == 0
    assert raw_code == 3 and raw_doc["rims"] == [RIM_ID]
    assert _attest(bundle, policy, SWITCH_JSON) == 0
    assert _attest(raw_bundle, policy, SWITCH_REPORT, "--cert-chain", SWITCH_CHAIN) == 0


def test_a_service_without_the_switch_rim_writes_no_bundle(tmp_path: Path) -> None:
    with nf.serve(nf.RimService.with_samples()) as server:
        bundle = tmp_path / "bundle.json"
        proc = run_cli(
            "collateral", "fetch", "--evidence", SWITCH_JSON, "-o", bundle, "--rim-url",
            server.url, "--ocsp-url", f"http://127.0.0.1:{nf.free_port()}", "--no-cache",
            "--timeout", "2",
        )  # fmt: skip
    no_traceback(proc)
    assert proc.returncode == 3 and not bundle.exists()
    assert f"RIM {RIM_ID}" in proc.stderr
