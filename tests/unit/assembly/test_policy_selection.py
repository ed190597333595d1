"""The policy-selection rule, written once: the policy file, else the simulation's, else the
default; the command line's front ends all ask it."""

from __future__ import annotations

import ast
from pathlib import Path

from gpucc.assembly import select_policy, simulation_policy
from gpucc.gpuattest.policy import Policy, parse_policy
from gpucc.gpuattest.samples import sample_policy
from tests.support.paths import ROOT


def test_a_policy_file_wins(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("ocsp:\n  require: false\n", encoding="utf-8")
    expected = parse_policy({"ocsp": {"require": False}}, source="test")
    chosen = select_policy(path, simulation=True, default=sample_policy())
    assert chosen == expected != Policy()


def test_without_a_file_the_simulations_then_the_default() -> None:
    assert select_policy(None, simulation=True, default=sample_policy()) == simulation_policy()
    assert select_policy(None, default=sample_policy()) == sample_policy()
    assert select_policy(None) == Policy()
    assert simulation_policy() != Policy()


def test_no_command_chooses_a_policy_itself() -> None:
    """The rule is in the library alone: no command module calls simulation_policy."""
    callers = []
    for path in sorted((ROOT / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name | ast.alias) and "simulation_policy" in (
                node.id if isinstance(node, ast.Name) else node.name
            ):
                callers.append(path.name)
    assert callers == []
