"""What the command line says about itself: `gpucc` or a group alone prints its help (exit
0), every option of `holder serve` has help, and an option's error names its environment
variables as words, never as a Python list."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli import gpucc


def test_gpucc_or_a_group_alone_prints_its_help_and_exits_0() -> None:
    for args in ((), ("session",), ("holder",)):
        proc = gpucc(*args, env={"COLUMNS": "200"})
        assert proc.returncode == 0, (args, proc.stderr)
        assert "Usage:" in proc.stdout and proc.stderr == "", args


def test_an_unknown_command_is_still_a_usage_error() -> None:
    proc = gpucc("no-such-command")
    assert proc.returncode == 2 and "no-such-command" in proc.stderr


def test_an_environment_variable_error_names_the_variables_as_words() -> None:
    proc = gpucc("attest", "--sample", env={"GPUCC_FORMAT": "xml"})
    assert proc.returncode == 2
    text = " ".join(proc.stderr.replace("│", " ").split())
    assert "(env var GPUCC_FORMAT or NVAT_FORMAT)" in text, proc.stderr
    assert "['" not in proc.stderr


def test_the_tls_options_have_help() -> None:
    proc = gpucc("holder", "serve", "--help", env={"COLUMNS": "250"})
    for line in proc.stdout.splitlines():
        if "--tls-cert " in line or "--tls-key " in line:
            assert "PEM" in line, line


def _commands() -> list[list[str]]:
    from typer.main import get_command

    from gpucc.cli.main import build

    found: list[list[str]] = []

    def walk(command: object, path: list[str]) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands is None:
            found.append(path)
            return
        for name, sub in subcommands.items():
            if not getattr(sub, "hidden", False):
                walk(sub, [*path, name])

    walk(get_command(build()), [])
    return found


def test_every_help_lists_the_exit_codes_and_shows_no_python_value() -> None:
    commands = _commands()
    assert len(commands) >= 30
    for path in commands:
        proc = gpucc(*path, "--help", env={"COLUMNS": "400", "NO_COLOR": "1"})
        assert proc.returncode == 0, (path, proc.stderr)
        text = " ".join(proc.stdout.split())
        codes = text[text.find("Exit codes") :]
        assert "Exit codes" in text and " 8 " in codes[:600], path
        for leak in ("['", "<unicode string>", "None", "<str>", "<int range>", "<float range>"):
            assert leak not in text, (path, leak)


def test_verbose_adds_lines_to_seal_and_stage_and_quiet_removes_them(tmp_path: Path) -> None:
    (tmp_path / "d.bin").write_bytes(b"x" * 100_000)
    key = str(tmp_path / "k.key")
    runs = {}
    for flag in ("-q", "", "-v"):
        extra = (flag,) if flag else ()
        out = str(tmp_path / f"d{flag}.gcc")
        sealed = gpucc("seal", str(tmp_path / "d.bin"), "-o", out, "--data-key", key, *extra)
        staged = gpucc("stage", out, "--data-key", key, *extra)
        assert sealed.returncode == staged.returncode == 0, (sealed.stderr, staged.stderr)
        runs[flag] = (sealed.stderr.splitlines(), staged.stderr.splitlines())
    for step in (0, 1):
        quiet, normal, verbose = (len(runs[f][step]) for f in ("-q", "", "-v"))
        assert quiet == 0 and normal >= 1 and verbose > normal, runs
    assert any("key id" in line for line in runs["-v"][0])
    assert any("thread(s)" in line for line in runs["-v"][1])
