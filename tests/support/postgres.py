"""A real PostgreSQL server for tests, from Debian's ``postgresql`` package: initdb in a
temporary directory, listening on a free port of 127.0.0.1 only (trust authentication there),
run as the ``postgres`` user when the tests run as root (the server refuses root)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.netfixtures import free_port


def postgres_bin() -> Path | None:
    """The directory of Debian's PostgreSQL server binaries (the newest), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return Path(found[-1]).parent if found else None


def require_postgres() -> Path:
    """The binaries' directory, or the test is skipped saying why (CI installs them)."""
    found = postgres_bin()
    if found is None or shutil.which("psql") is None:
        if os.environ.get("GPUCC_REQUIRE_POSTGRES"):  # CI installs it: absent is a failure
            pytest.fail("GPUCC_REQUIRE_POSTGRES is set but PostgreSQL is not installed")
        pytest.skip("PostgreSQL server binaries are absent (Debian: apt-get install postgresql)")
    return found


@contextmanager
def postgres_server(*, durable: bool = False) -> Iterator[str]:
    """A running server; its DSN. Stopped (fast) and removed afterwards. Its directory is a
    fresh one under the system's temporary directory (the server's user must reach it).

    Tests run it with ``fsync=off`` (a crash of the machine is not what they test);
    ``durable`` keeps PostgreSQL's default, a flushed write-ahead log at every commit, for
    measurements that compare it with SQLite's durable commits."""
    bindir = require_postgres()
    tmp = Path(tempfile.mkdtemp(prefix="gpucc-pg-"))
    data = tmp / "pgdata"
    as_root = os.geteuid() == 0
    run_as: list[str] = ["runuser", "-u", "postgres", "--"] if as_root else []
    if as_root:
        shutil.chown(tmp, "postgres")
    subprocess.run(
        [*run_as, str(bindir / "initdb"), "-D", str(data), "--auth=trust", "-U", "postgres",
         "--no-sync", "-E", "UTF8"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    port = free_port()
    log = tmp / "postgres.log"
    subprocess.run(
        [*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60",
         "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {tmp} "
         f"-c fsync={'on' if durable else 'off'} -c max_connections=100", "start"],
        check=True, capture_output=True, timeout=90,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        while subprocess.run(
            ["pg_isready", "-h", "127.0.0.1", "-p", str(port)], capture_output=True
        ).returncode:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield dsn
    finally:
        subprocess.run(
            [*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True, timeout=60,
        )  # fmt: skip
        shutil.rmtree(tmp, ignore_errors=True)
