"""Start-up cost: what a process imports before any verification is asked for."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

HEAVY = ("cryptography", "lxml", "requests", "urllib3", "pydantic")


def imported_modules(*args: str) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCC_", "NVAT_", "NV_"))}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    found = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)$", proc.stderr, re.MULTILINE)
    assert found, proc.stderr[-2000:]
    return set(found)


def heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in HEAVY}


def test_version_imports_no_crypto_xml_network_or_pydantic() -> None:
    modules = imported_modules("-m", "gpucc", "--version")
    assert "gpucc.cli.main" in modules
    assert heavy(modules) == set()


@pytest.mark.parametrize(
    "module", ["gpucc.cli.main", "gpucc.gpuattest.result", "gpucc.gpuattest.measurements"]
)
def test_verdict_and_measurement_types_import_light(module: str) -> None:
    modules = imported_modules("-c", f"import {module}")
    assert module in modules
    assert heavy(modules) == set()
    assert "gpucc.gpuattest.rim" not in modules


def test_attest_imports_what_verification_needs() -> None:
    """The other side of the lazy imports: attest really loads the verifier."""
    modules = imported_modules(
        "-m", "gpucc", "attest", "--sample", "--offline", "--at", "2024-01-01T00:00:00Z"
    )
    assert {"gpucc.gpuattest.verifier", "gpucc.gpuattest.rim", "cryptography.x509"} <= modules


def test_a_command_builds_only_itself_and_pipes_skip_rich() -> None:
    """Only the command being run is imported, and a report to a pipe needs no Rich console
    (tests/unit/cli/test_plain_render.py holds its text to Rich's)."""
    modules = imported_modules(
        "-m", "gpucc", "attest", "--sample", "--offline", "--at", "2024-01-01T00:00:00Z"
    )
    assert "gpucc.cli.attest" in modules
    others = {"gpucc.cli.stage", "gpucc.cli.seal", "gpucc.cli.demo", "gpucc.cli.session"}
    assert modules & others == set()
    assert {"rich.console", "rich.table"} & modules == set()


def test_help_lists_every_command() -> None:
    from gpucc.cli.main import COMMANDS

    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCC_", "NVAT_", "NV_"))}
    shown = subprocess.run(
        [sys.executable, "-m", "gpucc", "--help"],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "200"},
        timeout=120,
        check=True,
    ).stdout
    for _module, _attr, name, _group in COMMANDS:
        assert re.search(rf"^\W*{name}\s", shown, re.MULTILINE), name


def test_gpu_only_attest_loads_no_cvm_parsers_or_resource_readers() -> None:
    """A GPU-only verification imports neither the vTPM/HCL parsers nor importlib.resources
    (package data is read beside its module); each cost a few milliseconds of start-up."""
    modules = imported_modules(
        "-m", "gpucc", "attest", "--sample", "--offline", "--at", "2024-01-01T00:00:00Z"
    )
    assert "gpucc.gpuattest.verifier" in modules
    assert {"gpucc.gpuattest.cvm.vtpm_evidence", "gpucc.gpuattest.cvm.hcl"} & modules == set()
    assert "importlib.resources" not in modules
    assert "secrets" not in modules


def test_the_cli_freezes_its_objects_before_shutdown_and_still_runs_atexit() -> None:
    """Interpreter shutdown skips the cycle search over frozen objects; the exit status,
    the output and the atexit handlers are unchanged."""
    code = (
        "import atexit, gc, sys\n"
        "from gpucc.cli.main import run\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 1000, flush=True))\n"
        "sys.argv = ['gpucc', '--version']\n"
        "run()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [proc.stdout.splitlines()[0], "frozen True"]
    assert proc.stdout.startswith("gpucc ")
