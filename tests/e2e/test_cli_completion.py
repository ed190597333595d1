"""``gpucc --show-completion SHELL`` prints that shell's script, whatever shell runs it."""

from __future__ import annotations

import pytest

from tests.support.cli import gpucc


@pytest.mark.parametrize(
    ("shell", "starts"),
    [
        ("zsh", "#compdef gpucc"),
        ("fish", "complete --command gpucc"),
        ("bash", "_gpucc_completion() {"),
    ],
)
def test_show_completion_prints_the_named_shells_script(shell: str, starts: str) -> None:
    proc = gpucc("--show-completion", shell, env={"SHELL": "/bin/bash"})  # run from bash
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(starts), proc.stdout[:200]
    assert "_GPUCC_COMPLETE" in proc.stdout
