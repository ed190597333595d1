"""The deployment files shipped in deploy/ are accepted by the tools that run them: HAProxy's
configuration check and systemd's unit verifier (each skipped, saying so, where absent)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_travel_e2e import _self_signed

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_haproxy_accepts_the_shipped_configuration(tmp_path: Path) -> None:
    if shutil.which("haproxy") is None:
        if os.environ.get("GPUCC_REQUIRE_HAPROXY"):
            pytest.fail("GPUCC_REQUIRE_HAPROXY is set but haproxy is not installed")
        pytest.skip("haproxy is absent (Debian: apt-get install haproxy)")
    cert, key = _self_signed(tmp_path)
    pem = tmp_path / "holder-tls.pem"
    pem.write_bytes(cert.read_bytes() + key.read_bytes())
    text = (DEPLOY / "haproxy.cfg").read_text().replace("/etc/gpucc/holder-tls.pem", str(pem))
    conf = tmp_path / "haproxy.cfg"
    conf.write_text(text)
    run = subprocess.run(["haproxy", "-c", "-f", str(conf)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    broken = tmp_path / "broken.cfg"
    broken.write_text(text.replace("track-sc0 src", "track-sc9 nowhere"))
    assert subprocess.run(["haproxy", "-c", "-f", str(broken)], capture_output=True).returncode


def test_systemd_verifies_the_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is absent")
    gpucc = tmp_path / "gpucc"
    gpucc.write_text("#!/bin/sh\n")
    gpucc.chmod(0o755)
    unit = tmp_path / "gpucc-holder.service"
    unit.write_text(
        (DEPLOY / "gpucc-holder.service").read_text().replace("/usr/bin/gpucc", str(gpucc))
    )
    run = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert run.returncode == 0 and "gpucc-holder.service" not in run.stderr, run.stderr
