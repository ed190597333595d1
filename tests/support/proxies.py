"""The proxies shipped in deploy/ (HAProxy, nginx), rendered for a test and run as real
processes from Debian's packages: listening on a free port of 127.0.0.1, TLS with a test
certificate, forwarding to a holder on loopback. Absent binaries skip the test saying why,
unless GPUCC_REQUIRE_HAPROXY / GPUCC_REQUIRE_NGINX is set (CI installs both): then they fail."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.stores import free_port, wait_port

DEPLOY = ROOT / "deploy"


def require(tool: str, env: str, package: str) -> str:
    """The path of ``tool``; absent, the test is skipped (or fails where ``env`` is set)."""
    sbin = Path("/usr/sbin") / tool  # Debian's place, where PATH may lack it
    found = shutil.which(tool) or (str(sbin) if sbin.exists() else None)
    if found is None:
        if os.environ.get(env):
            pytest.fail(f"{env} is set but {tool} is not installed")
        pytest.skip(f"{tool} is absent (Debian: apt-get install {package})")
    return found


def tls_pem(cert: Path, key: Path, work: Path) -> Path:
    """The certificate and its key in one PEM file, mode 0600 (as both proxies read it)."""
    pem = work / "proxy-tls.pem"
    pem.write_bytes(cert.read_bytes() + key.read_bytes())
    pem.chmod(0o600)
    return pem


def render_haproxy(pem: Path, listen: int, holder: int) -> str:
    """deploy/haproxy.cfg with the test's certificate, listening port and holder port."""
    text = (DEPLOY / "haproxy.cfg").read_text()
    for old, new in (
        ("/etc/gpucc/holder-tls.pem", str(pem)),
        ("bind :8443 ", f"bind 127.0.0.1:{listen} "),
        ("server h1 127.0.0.1:8080 ", f"server h1 127.0.0.1:{holder} "),
    ):
        assert old in text, old  # the shipped file still has what the test replaces
        text = text.replace(old, new)
    return text


def render_nginx(pem: Path, listen: int, holder: int, work: Path) -> str:
    """deploy/nginx.conf with the test's certificate, ports, and its pid file, logs and
    temporary files under ``work``."""
    text = (DEPLOY / "nginx.conf").read_text()
    for old, new in (
        ("/etc/gpucc/holder-tls.pem", str(pem)),
        ("listen 8443 ssl;", f"listen 127.0.0.1:{listen} ssl;"),
        ("server 127.0.0.1:8080 ", f"server 127.0.0.1:{holder} "),
        ("/run/nginx-gpucc.pid", str(work / "nginx.pid")),
        ("/var/log/nginx/", f"{work}/"),
        ("/var/lib/nginx/", f"{work}/"),
    ):
        assert old in text, old
        text = text.replace(old, new)
    return text


@contextmanager
def haproxy(pem: Path, holder: int, work: Path) -> Iterator[tuple[int, Path]]:
    """A running HAProxy (foreground) in front of the holder on ``holder``; its port and
    the file its log goes to."""
    binary = require("haproxy", "GPUCC_REQUIRE_HAPROXY", "haproxy")
    port = free_port()
    conf = work / "haproxy.cfg"
    conf.write_text(render_haproxy(pem, port, holder))
    log = work / "haproxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([binary, "-db", "-f", str(conf)], stdout=out, stderr=out)
    try:
        wait_port(port, proc)
        yield port, log
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@contextmanager
def nginx(pem: Path, holder: int, work: Path) -> Iterator[int]:
    """A running nginx (foreground) in front of the holder on ``holder``; its port."""
    binary = require("nginx", "GPUCC_REQUIRE_NGINX", "nginx-light")
    port = free_port()
    conf = work / "nginx.conf"
    conf.write_text(render_nginx(pem, port, holder, work))
    proc = subprocess.Popen(
        [binary, "-p", str(work), "-c", str(conf), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=(work / "nginx.stderr").open("wb"),
    )
    try:
        wait_port(port, proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=15)
