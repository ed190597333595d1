"""A travel plan is checked whole before the journey starts: a plan that cannot be
followed is refused with one line and its documented exit status, and leaves no log (so
the corrected plan runs without --force)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpucc.travel.signing import generate_signing_key, key_id
from tests.support.cli import run_cli
from tests.support.netfixtures import free_port

pytestmark = pytest.mark.slow


def _plan(tmp: Path, holder: dict[str, Any], log: str = "travel-log.jsonl") -> Path:
    made = run_cli(
        "travel",
        "keygen",
        "--orchestrator-key",
        tmp / "o.key",
        "--orchestrator-pub",
        tmp / "o.pub.pem",
    )
    assert made.returncode == 0 or (tmp / "o.key").exists(), made.stderr
    doc = {
        "version": 1,
        "orchestrator": {"key": "o.key", "log": log},
        "holders": [
            {
                "id": "a",
                "url": f"http://127.0.0.1:{free_port()}",
                "public_key": "sha256:" + key_id(generate_signing_key().public_key()),
                "datasets": [{"name": "d", "path": "d.gcc", "header_digest": "ab" * 32}],
                **holder,
            }
        ],
    }
    path = tmp / "plan.yaml"
    path.write_text(json.dumps(doc))
    return path


BAD_URLS = {
    "no host": "http://",
    "no host, a port": "http://:8443",
    "port out of range": "https://a.example:65536",
    "port zero": "https://a.example:0",
    "port not a number": "https://a.example:84x3",
    "credentials": "https://alice:s3cret-pass@a.example:8443",
    "a query": "https://a.example:8443/?x=1",
    "a space": "https://a example:8443",
    "not http": "ftp://a.example",
}


@pytest.mark.parametrize("case", sorted(BAD_URLS))
def test_a_holder_url_that_cannot_be_followed_is_refused_at_load(tmp_path: Path, case: str) -> None:
    plan = _plan(tmp_path, {"url": BAD_URLS[case]})
    run = run_cli("travel", "run", plan, "--simulate", tmp_path / "sim")
    lines = [x for x in run.stderr.splitlines() if not x.startswith("gpucc: SIMULATED")]
    assert run.returncode == 4, run.stderr
    assert len(lines) == 1 and "holders[0].url" in lines[0], lines
    assert "s3cret" not in run.stderr  # a password in a URL is never repeated
    assert not (tmp_path / "travel-log.jsonl").exists()


def test_a_journey_that_cannot_start_leaves_no_log(tmp_path: Path) -> None:
    # the holder is unreachable too: before the plan's files were checked first, the run
    # failed at connect (exit 3) and left a log that made the corrected plan need --force
    cases: dict[str, tuple[dict[str, Any], int, str]] = {
        "missing dataset": ({}, 8, "d.gcc"),
        "missing TLS CA": (
            {"url": f"https://127.0.0.1:{free_port()}", "tls_ca": "ca.pem"},
            8,
            "ca.pem",
        ),
        "TLS CA for http": ({"tls_ca": "ca.pem"}, 4, "tls_ca"),
    }

    for name, (holder, code, said) in cases.items():
        plan = _plan(tmp_path, holder)
        run = run_cli("travel", "run", plan, "--simulate", tmp_path / "sim")
        lines = [x for x in run.stderr.splitlines() if not x.startswith("gpucc: SIMULATED")]
        assert run.returncode == code and len(lines) == 1 and said in lines[0], (name, lines)
        assert not (tmp_path / "travel-log.jsonl").exists(), name
    plan = _plan(tmp_path, {}, log="nowhere/travel-log.jsonl")
    run = run_cli("travel", "run", plan, "--simulate", tmp_path / "sim")
    assert run.returncode == 8 and "nowhere" in run.stderr, run.stderr
    assert not (tmp_path / "nowhere").exists()
