"""Every --help example names a real command and only options that command has."""

from __future__ import annotations

import shlex
from typing import Any

import typer

from gpucc.cli.examples import EXAMPLES
from gpucc.cli.main import app


def _commands() -> dict[str, Any]:
    def leaves(command: Any, path: str) -> list[tuple[str, Any]]:
        subs = getattr(command, "commands", None)
        if subs:
            return [leaf for n, c in subs.items() for leaf in leaves(c, f"{path} {n}".strip())]
        return [(path, command)]

    return dict(leaves(typer.main.get_command(app), ""))


def test_examples_name_real_commands_and_options() -> None:
    commands = _commands()
    assert set(EXAMPLES) <= set(commands), set(EXAMPLES) - set(commands)
    for path, examples in EXAMPLES.items():
        options = {o for p in commands[path].params for o in (*p.opts, *p.secondary_opts)}
        for example in examples:
            words = shlex.split(example, comments=True)
            assert words[: 1 + len(path.split())] == ["gpucc", *path.split()], example
            for word in words:
                if word.startswith("-") and word != "-":
                    assert word in options, f"{example}: {word} is not an option of {path}"


def test_every_command_shows_examples() -> None:
    assert set(_commands()) == set(EXAMPLES)
