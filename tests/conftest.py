"""Fixtures shared across the suite: gpucc as a real process, and NVIDIA's bundled sample.

Two checks hold for every test (``_no_internal_errors``):

* An internal error is a failure. A gpucc process that a test starts and that exits 70 (an
  untyped exception reached the command line's boundary) leaves its traceback behind
  (``tests/support/childhooks``); so does the boundary in this process, and a command run
  through Typer's ``CliRunner`` that raised anything but an exit. The test fails with the
  traceback, whatever it asserted about the exit status, unless it is marked
  ``internal_error`` (it provokes one on purpose).
* A library error is typed. ``pytest.raises(Exception)`` (or ``BaseException``, alone or in
  a tuple) passes only for an error of gpucc's family (:class:`GpuccError`): a crash that a
  broad expectation would swallow fails the test with its traceback. A test that expects a
  builtin error names it (``pytest.raises(ValueError)``: a caller's programming error).
* No AES-GCM call works in place: every ``AESGCM`` refuses overlapping input and output, in
  this process and in the processes the tests start (:mod:`tests.support.aead_guard`), as
  cryptography 51 does, so the suite catches it on any version.
"""

from __future__ import annotations

import importlib.util
import os
import re
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
from gpucc.core.errors import GpuccError  # noqa: E402
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


_BROAD = (Exception, BaseException)
_raises = pytest.raises


def _typed(expected: Any, caught: BaseException | None) -> None:
    """Fail when a broad expectation caught something outside gpucc's error family."""
    if caught is None or isinstance(caught, GpuccError):
        return
    named = expected if isinstance(expected, tuple) else (expected,)
    if any(isinstance(caught, t) for t in named if t not in _BROAD):
        return  # the test named this type (or a base of it) itself
    pytest.fail(
        f"pytest.raises({expected!r}) caught {type(caught).__name__}, outside gpucc's error "
        f"family (a crash, not a typed error):\n\n{_traceback(caught)}",
        pytrace=False,
    )


class _TypedRaises:
    """``pytest.raises`` as a context manager, checked by :func:`_typed` on the way out."""

    def __init__(self, inner: Any, expected: Any) -> None:
        self._inner, self._expected = inner, expected

    def __enter__(self) -> Any:
        return self._inner.__enter__()

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        suppressed = bool(self._inner.__exit__(kind, value, tb))
        if suppressed:
            _typed(self._expected, value)
        return suppressed


def _checked_raises(expected: Any, *args: Any, **kwargs: Any) -> Any:
    named = expected if isinstance(expected, tuple) else (expected,)
    result = _raises(expected, *args, **kwargs)
    if not any(t in _BROAD for t in named):
        return result
    if args:  # the callable form: it already ran
        _typed(expected, result.value)
        return result
    return _TypedRaises(result, expected)


pytest.raises = _checked_raises  # type: ignore[assignment]


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
        # Reported: a command's own outcome (report_bug, above, saw an internal error)
        if result.exception is not None and not isinstance(
            result.exception, (SystemExit, boundary.Reported)
        ):
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


# --- PyTorch, an optional extra ---------------------------------------------------------------
#
# CI runs the whole suite with torch (the `test` extra pins its CPU build) and sets
# GPUCC_REQUIRE_TORCH, so that no torch test can go missing there. Where no CPU build of torch
# exists for the interpreter (CI's pass on the newest Python), the modules that import torch are
# not collected, and the summary says how many and why.

_TORCH_IMPORT = re.compile(
    r"^(?:import torch\b|from torch\b|from tests\.support import [^\n]*\btorch"
    r"|from gpucc\.staging import [^\n]*\btorch|from gpucc\.ddp\b|import gpucc\.ddp\b)",
    re.MULTILINE,
)
_TORCH_MISSING = importlib.util.find_spec("torch") is None
_not_collected: set[str] = set()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if not _TORCH_MISSING or collection_path.suffix != ".py":
        return None
    if os.environ.get("GPUCC_REQUIRE_TORCH"):
        return None  # collected, so that a missing torch is an error, never a silent gap
    if not collection_path.name.startswith("test_"):
        return None
    if _TORCH_IMPORT.search(collection_path.read_text(encoding="utf-8")):
        _not_collected.add(collection_path.name)
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _TORCH_MISSING or os.environ.get("GPUCC_REQUIRE_TORCH"):
        return
    skip = pytest.mark.skip(reason="needs torch, which is not installed")
    for item in items:
        if item.get_closest_marker("torch") is not None:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _not_collected:
        terminalreporter.write_line(
            f"{len(_not_collected)} test modules not collected: torch is not installed "
            f"({', '.join(sorted(_not_collected))})"
        )
