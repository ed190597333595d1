"""The deployment files shipped in deploy/ are accepted by the tools that run them: HAProxy's
configuration check, nginx's (`nginx -t`) and systemd's unit verifier (each skipped, saying so,
where absent; HAProxy and nginx fail instead where GPUCC_REQUIRE_HAPROXY / GPUCC_REQUIRE_NGINX is
set, as CI sets them)."""

from __future__ import annotations

import inspect
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


INSTALLED = "/opt/gpucc/bin/gpucc"  # the virtual environment TRAVEL.md installs gpucc into


def _unit(name: str) -> dict[str, str]:
    """The [Service] keys of a shipped unit (the last value of a repeated key)."""
    keys: dict[str, str] = {}
    for line in (DEPLOY / name).read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            keys[key.strip()] = value.strip()
    return keys


def _systemd(tool: str) -> str:
    """A systemd tool; CI (GPUCC_REQUIRE_SYSTEMD) fails without it, elsewhere it skips."""
    return require(tool, "GPUCC_REQUIRE_SYSTEMD", "systemd")


def test_the_documented_install_is_the_layout_the_units_run(tmp_path: Path) -> None:
    """The units run what TRAVEL.md's install makes: gpucc in /opt/gpucc, users from the
    shipped sysusers file, the configuration the install puts in /etc/gpucc."""
    install = (DEPLOY.parent / "docs" / "TRAVEL.md").read_text()
    assert "python3 -m venv /opt/gpucc" in install
    assert "deploy/gpucc.sysusers.conf /etc/sysusers.d/gpucc.conf" in install
    sysusers = _systemd("systemd-sysusers")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    made = subprocess.run(
        [sysusers, f"--root={root}", str(DEPLOY / "gpucc.sysusers.conf")],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    users = {line.split(":")[0] for line in (root / "etc" / "passwd").read_text().splitlines()}
    groups = {line.split(":")[0] for line in (root / "etc" / "group").read_text().splitlines()}
    for name, config in (
        ("gpucc-holder.service", "/etc/gpucc/holder.yaml"),
        ("gpucc-collateral.service", "/etc/gpucc/collateral-mirror.yaml"),
    ):
        unit = _unit(name)
        assert unit["User"] in users and unit["Group"] in groups, name
        assert unit["ExecStart"].split()[0] == INSTALLED, name
        assert unit["ExecStart"].endswith(f"--config {config}"), name
        assert config in install, f"TRAVEL.md's install does not write {config}"


def test_the_holder_listens_where_the_shipped_proxies_forward() -> None:
    from gpucc.cli.holder import serve

    backend = inspect.signature(serve).parameters["listen"].default
    assert f"server h1 {backend} " in (DEPLOY / "haproxy.cfg").read_text()
    assert f"server {backend} " in (DEPLOY / "nginx.conf").read_text()


@pytest.mark.parametrize("name", ["gpucc-holder.service", "gpucc-collateral.service"])
def test_systemd_verifies_the_unit_as_installed(name: str, tmp_path: Path) -> None:
    """``systemd-analyze verify`` on the unit, its ExecStart moved under a copy of the
    installed layout (the executable where the venv puts it)."""
    analyze = _systemd("systemd-analyze")
    gpucc = tmp_path / INSTALLED.lstrip("/")
    gpucc.parent.mkdir(parents=True)
    gpucc.write_text("#!/bin/sh\n")
    gpucc.chmod(0o755)
    unit = tmp_path / name
    unit.write_text((DEPLOY / name).read_text().replace(INSTALLED, str(gpucc)))
    run = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert run.returncode == 0 and name not in run.stderr, run.stderr
