"""Loaded by every Python process the tests start (``tests/conftest.py`` puts this folder
first on ``PYTHONPATH``); it changes nothing a user's process does, only what a test sees:

* every ``AESGCM`` refuses overlapping input and output (:mod:`tests.support.aead_guard`),
  so an in-place AEAD call fails on cryptography 50 exactly as 51 refuses it;
* an internal error of the gpucc command line (exit 70) leaves its traceback as a file in
  ``$GPUCCTEST_BUGS``, which ``tests/conftest.py`` turns into a failure of the test that ran
  the process, whatever that test asserted about the exit status;
* the top-level modules named in ``$GPUCCTEST_BLOCK`` (comma-separated) cannot be imported,
  as on an install without the optional extra that brings them.

Nothing is imported here up front: each change is made when its module is first imported,
so a process that never loads cryptography or the command line pays nothing.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # nothing more is imported at start-up (gpucc's start-up tests count it)
    import importlib.machinery
    from collections.abc import Callable, Sequence
    from types import ModuleType

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
_BLOCKED = frozenset(m for m in os.environ.get("GPUCCTEST_BLOCK", "").split(",") if m)


def _guard_aead(module: ModuleType) -> None:
    # Loaded from its file under a name of its own: "tests" may be another package here.
    import importlib.util

    where = os.path.join(_ROOT, "tests", "support", "aead_guard.py")
    spec = importlib.util.spec_from_file_location("_gpucctest_aead_guard", where)
    assert spec is not None and spec.loader is not None
    guard = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = guard
    spec.loader.exec_module(guard)
    module.AESGCM = guard.GuardedAESGCM  # type: ignore[attr-defined]


def _capture_bugs(module: ModuleType) -> None:
    folder = os.environ.get("GPUCCTEST_BUGS")
    if not folder:
        return
    report_bug = module.report_bug

    def capturing(invocation: Any, exc: Exception) -> int:
        code: int = report_bug(invocation, exc)
        if code == 70:  # not a missing extra, which report_bug reports as such
            import traceback

            text = "".join(traceback.format_exception(exc))
            name = os.path.join(folder, f"{os.getpid()}-{id(exc)}.txt")
            with open(name, "w", encoding="utf-8") as f:
                f.write(f"argv: {sys.argv!r}\n{text}")
        return code

    module.report_bug = capturing  # type: ignore[attr-defined]


_AFTER: dict[str, Callable[[ModuleType], None]] = {
    "cryptography.hazmat.primitives.ciphers.aead": _guard_aead,
    "gpucc.cli.boundary": _capture_bugs,
}


class _Loader:
    def __init__(self, inner: Any, after: Callable[[ModuleType], None]) -> None:
        self._inner, self._after = inner, after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._inner.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        self._after(module)


class _TestHooks:
    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        after = _AFTER.get(name)
        if after is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, after)  # type: ignore[assignment]
                return spec
        return None


class _Hiding:
    """Another finder that finds nothing of the blocked modules: ``import`` then raises
    ModuleNotFoundError and ``importlib.util.find_spec`` answers None, as when the
    distribution is not installed."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name.partition(".")[0] in _BLOCKED or not hasattr(self._inner, "find_spec"):
            return None
        spec: importlib.machinery.ModuleSpec | None = self._inner.find_spec(name, path, target)
        return spec

    def invalidate_caches(self) -> None:
        if hasattr(self._inner, "invalidate_caches"):
            self._inner.invalidate_caches()


if _BLOCKED:
    sys.meta_path[:] = [_Hiding(finder) for finder in sys.meta_path]
sys.meta_path.insert(0, _TestHooks())
