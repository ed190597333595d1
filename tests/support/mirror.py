"""``gpucc collateral serve`` as a real process on 127.0.0.1, for the mirror's tests and benchmark."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.cli import ENV


@dataclass
class RunningMirror:
    """A mirror process: its base URL, store and the log it wrote so far."""

    url: str
    store: Path
    process: subprocess.Popen[bytes]
    log: Path

    def logged(self) -> str:
        """What the process wrote on stderr so far."""
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM, then wait (bounded) for it to go."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


@contextlib.contextmanager
def mirror(
    tmp: Path,
    *args: str,
    store: Path | None = None,
    scheme: str = "http",
    env: dict[str, str] | None = None,
) -> Iterator[RunningMirror]:
    """Run ``gpucc collateral serve ARGS`` on a free loopback port until the block ends
    (``scheme``: ``https`` when ARGS give it a TLS certificate)."""
    tmp.mkdir(parents=True, exist_ok=True)
    n = len(list(tmp.glob("address-*")))
    address = tmp / f"address-{n}"
    log = tmp / f"mirror-{n}.log"
    store = store or tmp / "store"
    with log.open("wb") as err:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpucc",
                "collateral",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--address-file",
                str(address),
                "--store",
                str(store),
                *args,
            ],  # fmt: skip
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**ENV, "NO_PROXY": "127.0.0.1,localhost", **_pythonpath(), **(env or {})},
        )
    running = RunningMirror("", store, process, log)
    try:
        for _ in range(300):  # about 30 s at most
            if address.exists() and address.read_text().endswith("\n"):
                break
            if process.poll() is not None:
                raise RuntimeError(f"the mirror exited {process.returncode}: {running.logged()}")
            time.sleep(0.1)
        else:
            raise RuntimeError(f"the mirror did not start: {running.logged()}")
        running.url = f"{scheme}://{address.read_text().strip()}"
        yield running
    finally:
        running.stop()


def _pythonpath() -> dict[str, str]:
    value = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": value} if value else {}
