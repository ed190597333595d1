"""The wheel built from the tracked tree holds the package and its data, and nothing else:
the schemas, the bundled GPU and CVM samples and trust roots with their notices, the CUDA sources; no
tests, benchmarks, CI or development files. (CI also installs it into a fresh virtual
environment and runs ``gpucc demo`` and ``gpucc attest --sample`` from it: ``.ci/run``.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.slow


def _tracked_copy(to: Path) -> Path:
    """The tracked files (symbolic links kept), as a fresh clone has them."""
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for raw in filter(None, names):
        name = raw.decode()
        source, target = ROOT / name, to / name
        if not source.exists() and not source.is_symlink():
            continue  # removed in this checkout, not yet committed
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(source.readlink())
        else:
            shutil.copy2(source, target)
    return to


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    tree = _tracked_copy(tmp_path_factory.mktemp("tree"))
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(out), str(tree)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (found,) = out.glob("gpucc-*.whl")
    return zipfile.ZipFile(found)


def _data_files(folder: str, *patterns: str) -> list[str]:
    """The tracked files of ``folder`` matching ``patterns``, as the wheel names them."""
    base = ROOT / folder
    return sorted(
        f"gpucc/{folder}/{p.relative_to(base).as_posix()}"
        for pattern in patterns
        for p in base.glob(pattern)
    )


def test_the_wheel_holds_the_package_data(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    wanted = [
        *_data_files("cli/schemas", "*.json"),
        *_data_files("gpuattest/_samples", "*.hex", "*.pem", "*.swidtag", "NOTICE"),
        *_data_files("gpuattest/_samples", "tdx/*", "snp/*"),  # the CVM samples, notices
        *_data_files("gpuattest/_roots", "**/*.pem", "**/NOTICE"),
        *_data_files("gpuattest/_schemas", "*.xsd", "NOTICE"),
        *_data_files("staging/kernels", "*.cu", "*.cuh"),
        "gpucc/py.typed",
        "gpucc/cli/main.py",
    ]
    assert len(wanted) > 30
    missing = [n for n in wanted if n not in names]
    assert not missing, missing
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "gpucc = gpucc.cli.main:run" in wheel.read(entry).decode()


def test_the_wheel_holds_nothing_else(wheel: zipfile.ZipFile) -> None:
    stray = [
        n
        for n in wheel.namelist()
        if not (n.startswith("gpucc/") or ".dist-info/" in n)
        or any(part in n.split("/") for part in ("tests", "benchmarks", ".ci", "__pycache__"))
        or n.endswith((".pyc", "conftest.py"))
    ]
    assert not stray, stray
