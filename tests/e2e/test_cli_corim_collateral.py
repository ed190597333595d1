"""CoRIMs found like RIMs: ``gpucc collateral fetch`` asks a loopback RIM service for the IDs
Rubin's signed table of contents names and puts the CoRIMs in the bundle; ``gpucc attest``
reads them from the bundle or the cache. NVIDIA's RIM service serves a CoRIM in the same
JSON answer as an XML RIM (base64 in ``rim``).

The CoRIMs are signed under the test RIM root, which these runs do not trust (they use
NVIDIA's roots, as a bundle's user does): each run shows the CoRIMs were found and then
refuses their signer, fail closed."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import netfixtures as nf
from tests.support.cli import run_cli
from tests.support.corimpki import corim_bytes, sign_corim
from tests.support.rimpki import make_rim_pki
from tests.support.samples import RUBIN, RUBIN_NONCE

AT = "2026-12-01T00:00:00Z"
IDS = ["GR100_081D_9900230000", "NV_GPU_DRIVER_GR100_620.54"]


def _service() -> nf.RimService:
    pki = make_rim_pki()
    return nf.RimService(
        {
            IDS[0]: sign_corim(corim_bytes("rubin_vbios_example"), pki=pki),
            IDS[1]: sign_corim(corim_bytes("rubin_driver_example"), pki=pki),
        }
    )


def _checks(stdout: str) -> dict[str, dict[str, object]]:
    return {c["id"]: c for c in json.loads(stdout)["gpus"][0]["checks"]}


def test_collateral_fetch_puts_rubins_corims_in_the_bundle(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle.json"
    with nf.serve(_service()) as server:
        proc = run_cli(
            "collateral", "fetch", "--evidence", RUBIN / "evidence.cmw.json", "-o", bundle,
            "--rim-url", server.url, "--ocsp-url", f"http://127.0.0.1:{nf.free_port()}",
            "--no-cache", "--timeout", "2", "-f", "json",
        )  # fmt: skip
        asked = sorted(seen.path for seen in server.seen)
    assert asked == [f"/v1/rim/{i}" for i in IDS]
    doc = json.loads(proc.stdout)
    assert sorted(doc["rims"]) == IDS, proc.stderr
    assert bundle.exists()
    attest = run_cli(
        "attest", "--evidence", RUBIN / "evidence.cmw.json", "--nonce", RUBIN_NONCE,
        "--collateral", bundle, "--offline", "--no-cache", "--at", AT, "-f", "json",
    )  # fmt: skip
    checks = _checks(attest.stdout)
    assert checks["corim-fetched"]["status"] == "pass"
    assert checks["corim-signature"]["status"] == "fail"  # the test root is not NVIDIA's
    assert attest.returncode == 1


def test_corims_fetched_once_are_read_from_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    args = (
        "attest", "--evidence", RUBIN / "evidence.cmw.json", "--nonce", RUBIN_NONCE,
        "--cache-dir", cache, "--at", AT, "-f", "json",
    )  # fmt: skip
    with nf.serve(_service()) as server:
        first = run_cli(*args, "--rim-url", server.url, "--ocsp-url",
                        f"http://127.0.0.1:{nf.free_port()}", "--timeout", "2")  # fmt: skip
        assert server.count == 2
    assert _checks(first.stdout)["corim-fetched"]["status"] == "pass"
    second = run_cli(*args, "--offline")
    assert _checks(second.stdout)["corim-fetched"]["status"] == "pass", second.stdout
    assert second.returncode == 1
