"""Every hint printed is a command that works: it names only options the command has."""

from __future__ import annotations

import re

import pytest
import typer

from gpucc.cli import exitcodes
from gpucc.cli.main import app
from gpucc.gpuattest import errors


def _commands() -> dict[str, set[str]]:
    """Command path (``session offer``) -> its option names."""
    root = typer.main.get_command(app)
    found: dict[str, set[str]] = {}

    def walk(command: object, path: str) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands:
            for name, sub in subcommands.items():
                walk(sub, f"{path} {name}".strip())
            return
        options: set[str] = set()
        for param in getattr(command, "params", []):
            options.update(o for o in getattr(param, "opts", []) if o.startswith("-"))
        found[path] = options

    walk(root, "")
    return found


COMMANDS = _commands()


def _named_options(hint: str) -> list[tuple[str, str | None]]:
    """(option, command it belongs to, or None for the failing command) named by ``hint``."""
    named: list[tuple[str, str | None]] = []
    for quoted in re.findall(r"'gpucc ([a-z ]+?)((?: --?[a-z][\w-]*[^']*)?)'", hint):
        command, rest = quoted
        named += [(o, command.strip()) for o in re.findall(r"--?[a-z][\w-]*", rest)]
    outside = re.sub(r"'gpucc [^']*'", "", hint)
    outside = re.sub(r"\(pip install [^)]*\)", "", outside)
    named += [(o, None) for o in re.findall(r"(?<![\w-])--?[a-z][\w-]*", outside)]
    return named


def test_the_app_has_the_commands_the_hints_name() -> None:
    for _, commands, _ in exitcodes._HINTS:
        for command in commands or ():  # "attest (cvm)": attest, failing on the CVM's part
            assert command.split(" (")[0] in COMMANDS, command


def _subject(command: str) -> tuple[str, str]:
    base, _, rest = command.partition(" (")
    return base, rest.rstrip(")")


SUBJECTS = sorted({c for _, cs, _ in exitcodes._HINTS for c in cs or () if " (" in c})


@pytest.mark.parametrize("command", sorted(COMMANDS) + SUBJECTS)
def test_hints_name_only_options_the_command_has(command: str) -> None:
    base, subject = _subject(command)
    for family, commands, hint in exitcodes._HINTS:
        if commands is not None and command not in commands:
            continue
        exc = family.__new__(family)
        exc.subject = subject
        shown = exitcodes.cli_hint(exc, base)
        for option, owner in _named_options(shown):
            where = owner or base
            assert option in COMMANDS[where], f"{command}: {shown!r} names {option} of {where}"
        del hint


def test_no_hint_downloads_instead_of_installing() -> None:
    for _, _, hint in exitcodes._HINTS:
        assert "pip download" not in hint


def test_nvml_hint_depends_on_the_command() -> None:
    exc = errors.NvmlUnavailableError("NVML is not available")
    assert "--evidence" in exitcodes.cli_hint(exc, "attest")
    for command in ("evidence collect", "session offer", "session local"):
        assert "--evidence" not in exitcodes.cli_hint(exc, command)
    assert "--simulate" in exitcodes.cli_hint(exc, "session offer")


def test_a_launch_fault_is_not_told_as_a_build_failure() -> None:
    from gpucc.cli.exitcodes import cli_hint
    from gpucc.staging.errors import GpuKernelError

    built = GpuKernelError("nvrtc failed", device_id=0, stage="build")
    faulted = GpuKernelError("a kernel faulted", device_id=0, stage="launch")
    assert "build or verify" in cli_hint(built, "stage")
    assert "faulted on the data" in cli_hint(faulted, "stage")
    assert "build" not in cli_hint(faulted, "stage")


@pytest.mark.parametrize("family", [errors.OfflineError, errors.CollateralUnavailableError])
def test_a_cvm_collateral_failure_is_not_sent_to_a_bundle(family: type[errors.GpuccError]) -> None:
    """A CVM's collateral (Intel's, AMD's) is never in a collateral bundle."""
    for command in ("attest", "session answer", "session local"):
        exc = family("not contacting https://api.trustedservices.intel.com/...")
        exc.subject = "cvm"
        hint = exitcodes.cli_hint(exc, command)
        assert "--cvm-collateral FILE" in hint, (command, hint)
        assert "--collateral B" not in hint and "collateral fetch" not in hint, hint
        exc.subject = ""
        assert "--cvm-collateral" not in exitcodes.cli_hint(exc, command)


@pytest.mark.parametrize(
    ("family", "says"),
    [
        (errors.OfflineError, "drop --offline"),
        (errors.NetworkError, "--nras-url"),
        (errors.ServiceAccessDeniedError, "--service-key"),
    ],
)
def test_a_remote_verifier_failure_names_the_remote_remedy(
    family: type[errors.GpuccError], says: str
) -> None:
    text = "https://nras.attestation.nvidia.com/v4/attest/gpu: refused"
    exc = family(text, status=403) if family is errors.ServiceAccessDeniedError else family(text)
    exc.subject = "remote"
    hint = exitcodes.cli_hint(exc, "attest")
    assert says in hint, hint
    assert "--collateral BUNDLE --offline" not in hint and "collateral fetch" not in hint, hint
