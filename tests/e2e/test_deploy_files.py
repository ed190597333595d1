"""The deployment files shipped in deploy/ are accepted by the tools that run them: HAProxy's
configuration check, nginx's (`nginx -t`) and systemd's unit verifier (each skipped, saying so,
where absent; HAProxy and nginx fail instead where GPUCC_REQUIRE_HAPROXY / GPUCC_REQUIRE_NGINX is
set, as CI sets them)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_travel_e2e import _self_signed
from tests.support.proxies import render_nginx, require, tls_pem

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


def test_nginx_accepts_the_shipped_configuration(tmp_path: Path) -> None:
    binary = require("nginx", "GPUCC_REQUIRE_NGINX", "nginx-light")
    pem = tls_pem(*_self_signed(tmp_path), tmp_path)
    text = render_nginx(pem, 8443, 8080, tmp_path)
    conf = tmp_path / "nginx.conf"
    conf.write_text(text)
    run = subprocess.run(
        [binary, "-t", "-p", str(tmp_path), "-c", str(conf)], capture_output=True, text=True
    )
    assert run.returncode == 0 and "test is successful" in run.stderr, run.stderr
    broken = tmp_path / "broken.conf"
    broken.write_text(text.replace("limit_conn per_source 16", "limit_conn nowhere 16"))
    run = subprocess.run(
        [binary, "-t", "-p", str(tmp_path), "-c", str(broken)], capture_output=True, text=True
    )
    assert run.returncode and "nowhere" in run.stderr, run.stderr


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
