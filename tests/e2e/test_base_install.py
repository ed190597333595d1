"""The base install works on its own: the commands README's first line leads to import only
what gpucc's own dependencies (no extras) provide.

The test environment holds much more (the test tools, the extras, their dependencies); a
module that arrives only with them (Click, brought by uvicorn and model-signing, while Typer
carries its own copy) would pass every other test and fail on a user's fresh install. Each
command runs as a real process with every such module made unimportable.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.paths import ROOT

SAMPLE_AT = "2024-01-01T00:00:00Z"

_RUNNER = """
import importlib.abc, json, sys

BLOCKED = frozenset(json.loads(sys.argv[1]))


class NotInTheBaseInstall(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInTheBaseInstall())
sys.argv = ["gpucc", *sys.argv[2:]]
from gpucc.cli.main import run

run()
"""


def _requirements(dist: metadata.Distribution, extras: set[str]) -> list[Requirement]:
    found = []
    for line in dist.requires or []:
        req = Requirement(line)
        wanted = req.marker is None or any(
            req.marker.evaluate({"extra": extra}) for extra in (extras or {""})
        )
        if wanted:
            found.append(req)
    return found


def _base_distributions() -> set[str]:
    """gpucc and everything its requirements pull in, without gpucc's extras."""
    seen: set[str] = set()
    todo: list[tuple[str, set[str]]] = [("gpucc", set())]
    while todo:
        name, extras = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a requirement whose marker does not hold here
        key = canonicalize_name(name)
        if key in seen and not extras:
            continue
        seen.add(key)
        todo += [(r.name, set(r.extras)) for r in _requirements(dist, extras)]
    return seen


def _blocked_modules() -> list[str]:
    """Installed top-level modules that only come with distributions outside the base."""
    base = _base_distributions()
    blocked = []
    for module, dists in metadata.packages_distributions().items():
        if module == "gpucc" or not module.isidentifier():
            continue
        if module in sys.stdlib_module_names:
            continue
        if not any(canonicalize_name(d) in base for d in dists):
            blocked.append(module)
    return sorted(blocked)


@pytest.fixture(scope="module")
def blocked() -> list[str]:
    modules = _blocked_modules()
    assert "click" in modules  # installed here by test tools, not by the base install
    assert "typer" not in modules and "cryptography" not in modules
    return modules


def _gpucc(blocked: list[str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _RUNNER, json.dumps(blocked), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_runner_really_blocks(blocked: list[str], tmp_path: Path) -> None:
    probe = _RUNNER.replace("from gpucc.cli.main import run\n\nrun()", "import click")
    done = subprocess.run(
        [sys.executable, "-c", probe, json.dumps(blocked)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and "No module named 'click'" in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--help"],
        ["demo"],
        ["attest", "--sample", "--at", SAMPLE_AT],
        ["attest", "--sample", "--at", SAMPLE_AT, "--format", "json"],
        ["attest", "--sample", "--at", SAMPLE_AT, "--offline", "--policy", "nope.yaml"],
        ["model", "digest", str(ROOT / "docs")],
        ["holder", "serve", "--help"],
    ],
    ids=" ".join,
)
def test_base_commands_need_no_extra(blocked: list[str], tmp_path: Path, args: list[str]) -> None:
    done = _gpucc(blocked, tmp_path, *args)
    assert "No module named" not in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode in (0, 8), (done.returncode, done.stderr[-2000:])


def test_seal_and_stage_need_no_extra(blocked: list[str], tmp_path: Path) -> None:
    (tmp_path / "data.bin").write_bytes(bytes(range(256)) * 4096)
    sealed = _gpucc(
        blocked, tmp_path, "seal", "data.bin", "-o", "data.gcc", "--data-key", "data.key"
    )
    assert sealed.returncode == 0, sealed.stderr[-2000:]
    for device in ("cpu", "auto"):
        staged = _gpucc(
            blocked, tmp_path, "stage", "data.gcc", "--data-key", "data.key", "--backend", device
        )
        assert staged.returncode == 0, staged.stderr[-2000:]
        assert "verified" in staged.stderr
