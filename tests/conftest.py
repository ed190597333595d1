"""Fixtures shared across the suite: gpucc as a real process, and NVIDIA's bundled sample.

Two checks hold for every test (``_no_internal_errors``):

* An internal error is a failure. A gpucc process that a test starts and that exits 70 (an
  untyped exception reached the command line's boundary) leaves its traceback behind
  (``tests/support/childhooks``); so does the boundary in this process, and a command run
  through Typer's ``CliRunner`` that raised anything but an exit. The test fails with the
  traceback, whatever it asserted about the exit status, unless it is marked
  ``internal_error`` (it provokes one on purpose).
* No AES-GCM call works in place: every ``AESGCM`` refuses overlapping input and output, in
  this process and in the processes the tests start (:mod:`tests.support.aead_guard`), as
  cryptography 51 does, so the suite catches it on any version.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Before anything reads the environment (tests.support.cli copies it): every Python process
# the tests start loads the hooks, and writes the tracebacks of its internal errors here.
_HOOKS = Path(__file__).resolve().parent / "support" / "childhooks"
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(_HOOKS), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
)
BUGS = Path(tempfile.mkdtemp(prefix="gpucc-test-bugs-"))
os.environ["GPUCCTEST_BUGS"] = str(BUGS)

import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from gpucc.cli import boundary  # noqa: E402
from gpucc.gpuattest.samples import Sample, nvidia_h100_sample  # noqa: E402
from tests.support import aead_guard  # noqa: E402
from tests.support.cli import run_cli  # noqa: E402

#: Runs ``python -m gpucc ARGS`` in ``cwd`` (a clean environment: no GPUCC_*/NVAT_* variables
#: from the caller; ``env`` adds to it) and checks that no traceback reached the user.
GpuccRunner = Callable[..., subprocess.CompletedProcess[str]]


def _run(
    *args: str | Path, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, env=env, timeout=timeout, module=True)


@pytest.fixture
def run_gpucc() -> GpuccRunner:
    """The gpucc command line, run as a separate process."""
    return _run


@pytest.fixture(scope="session")
def nvidia_sample() -> Sample:
    """NVIDIA's H100 sample (driver 545.00) as the package ships it."""
    return nvidia_h100_sample()


def _traceback(exc: BaseException) -> str:
    import traceback

    return "".join(traceback.format_exception(exc))


@pytest.fixture(autouse=True)
def _no_internal_errors(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    aead_guard.install(monkeypatch.setattr)
    seen: list[str] = []
    report_bug = boundary.report_bug

    def recording(invocation: Any, exc: Exception) -> int:
        code: int = report_bug(invocation, exc)
        if code == 70:  # not a missing extra, which report_bug reports as such
            seen.append(_traceback(exc))
        return code

    invoke = CliRunner.invoke

    def invoking(self: CliRunner, *args: Any, **kwargs: Any) -> Any:
        result = invoke(self, *args, **kwargs)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            seen.append(_traceback(result.exception))
        return result

    monkeypatch.setattr(boundary, "report_bug", recording)
    monkeypatch.setattr(CliRunner, "invoke", invoking)
    before = set(BUGS.iterdir())
    yield
    found = sorted(set(BUGS.iterdir()) - before)
    seen += [path.read_text(encoding="utf-8", errors="replace") for path in found]
    for path in found:
        path.unlink()
    if seen and request.node.get_closest_marker("internal_error") is None:
        pytest.fail(
            "internal error (exit 70) in a gpucc command this test ran:\n\n" + "\n\n".join(seen),
            pytrace=False,
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import shutil

    shutil.rmtree(BUGS, ignore_errors=True)
