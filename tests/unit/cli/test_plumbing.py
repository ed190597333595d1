"""The command line's plumbing, read from its source: no framework object is altered, no
signature is rewritten, no state is kept at module level, and the output layer imports in
one direction; and every command is built by gpucc's command class."""

from __future__ import annotations

import ast
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parents[3]
CLI = ROOT / "cli"

#: Typer's declaration and model classes (typer.models) and the framework's command,
#: parameter and type objects: what a module could alter to change the framework.
FRAMEWORK_NAMES = {
    "OptionInfo",
    "ArgumentInfo",
    "ParameterInfo",
    "CommandInfo",
    "TyperInfo",
    "registered_commands",
    "registered_groups",
    "registered_callback",
}


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(CLI.glob("*.py"))}


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return []


def _flatten(targets: list[ast.expr]) -> list[ast.expr]:
    out: list[ast.expr] = []
    for t in targets:
        out += _flatten(list(t.elts)) if isinstance(t, (ast.Tuple, ast.List)) else [t]
    return out


def _framework_writes(tree: ast.Module) -> list[str]:
    """Attribute stores that rewrite a signature or alter a framework object."""
    found: list[str] = []
    # names bound to framework declarations (``info`` in ``for info in app.registered_...``)
    suspects: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.For):
            source = ast.unparse(node.iter)
            if any(n in source for n in FRAMEWORK_NAMES) or "get_args(" in source:
                suspects |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        if isinstance(node, ast.Call) and ast.unparse(node.func) in (
            "setattr",
            "object.__setattr__",
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    for node in ast.walk(tree):
        for target in _flatten(_targets(node)):
            if not isinstance(target, ast.Attribute):
                continue
            text = ast.unparse(target)
            base = target.value
            if target.attr in ("__signature__", "__wrapped__", "__annotations__"):
                found.append(f"line {getattr(node, 'lineno', 0)}: {text}")
            elif isinstance(base, ast.Name) and base.id in suspects:
                found.append(f"line {getattr(node, 'lineno', 0)}: {text}")
            elif any(n in ast.unparse(base) for n in FRAMEWORK_NAMES):
                found.append(f"line {getattr(node, 'lineno', 0)}: {text}")
            elif ast.unparse(base).startswith(("typer.", "click.")):
                found.append(f"line {getattr(node, 'lineno', 0)}: {text}")
    return found


def test_no_module_alters_the_framework_or_rewrites_a_signature() -> None:
    offenders = {name: w for name, tree in _modules().items() if (w := _framework_writes(tree))}
    assert not offenders, offenders


def _private_framework_imports(tree: ast.Module) -> list[str]:
    """Imports of a private module of Typer, Click or Rich (a name part starting with ``_``)."""
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] in ("typer", "click", "rich") and any(p.startswith("_") for p in parts):
                found.append(f"line {getattr(node, 'lineno', 0)}: {name}")
    return found


def test_no_module_imports_a_private_module_of_the_framework() -> None:
    offenders = {n: w for n, tree in _modules().items() if (w := _private_framework_imports(tree))}
    assert not offenders, offenders
    found = _private_framework_imports(
        ast.parse("def f():\n    from typer._completion_shared import get_completion_script\n")
    )
    assert found == ["line 2: typer._completion_shared"]


def test_the_check_finds_what_the_old_boundary_did() -> None:
    """The check above can fail: the old boundary's three alterations are each found."""
    old = ast.parse(
        "def wrap(app, fn, sig, params):\n"
        "    for info in app.registered_commands:\n"
        "        info.callback = fn\n"
        "    for name, param in sig.parameters.items():\n"
        "        base, *meta = get_args(param.annotation)\n"
        "        for info in meta:\n"
        "            info.exists, info.readable = False, False\n"
        "            setattr(info, '_gpucc_rule', 1)\n"
        "    fn.__signature__ = sig.replace(parameters=params)\n"
    )
    assert len(_framework_writes(old)) == 5, _framework_writes(old)


def test_no_module_state_is_rebound_at_run_time() -> None:
    """No ``global`` statement and no module-level mutable singleton (``STATE = _State()``)."""
    offenders = []
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                offenders.append(f"{name}: global {', '.join(node.names)}")
        for node in tree.body:
            for target in _targets(node):
                value = getattr(node, "value", None)
                if (
                    isinstance(target, ast.Name)
                    and target.id.isupper()
                    and isinstance(value, ast.Call)
                    and ast.unparse(value.func).lstrip("_").endswith("State")
                ):
                    offenders.append(f"{name}: {target.id} = {ast.unparse(value)}")
    assert not offenders, offenders


def _imports(tree: ast.Module) -> set[str]:
    """The cli modules a module imports (at any depth: deferred imports count)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found |= {a.name for a in node.names}
            elif node.module and node.module.startswith("gpucc.cli."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("gpucc.cli.")}
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt == path[0]:
                cycles.append([*path, nxt])
            elif nxt not in path and nxt > path[0]:  # each cycle once, from its least module
                visit(nxt, [*path, nxt])

    for start in sorted(graph):
        visit(start, [start])
    return cycles


def test_the_cli_modules_import_each_other_without_a_circle() -> None:
    graph = {name: _imports(tree) & set(_modules()) for name, tree in _modules().items()}
    assert not _cycles(graph), _cycles(graph)


def test_the_output_layer_imports_one_way() -> None:
    """terminal (escaping) <- invocation <- output <- logs, boundary, command."""
    graph = {name: _imports(tree) & set(_modules()) for name, tree in _modules().items()}
    assert graph["terminal"] == set()
    assert graph["invocation"] == set()
    assert graph["output"] == {"invocation", "terminal"}
    assert graph["logs"] == {"terminal"}
    for lower in ("terminal", "invocation", "output", "logs"):
        assert not graph[lower] & {"boundary", "command", "main"}, lower


def test_the_circle_check_finds_the_old_circle() -> None:
    old = {"logs": {"terminal"}, "output": {"logs", "terminal"}, "terminal": {"logs", "output"}}
    assert _cycles(old)


def test_every_command_is_a_gpucc_command() -> None:
    """Each command of the whole application is built by gpucc's command class, which adds
    -v/-q and the error boundary (a command registered on a plain typer.Typer would lack
    both)."""
    from gpucc.cli.command import Command
    from gpucc.cli.main import app

    def leaves(command: object, path: str) -> list[tuple[str, object]]:
        subs = getattr(command, "commands", None)
        if subs:
            return [leaf for n, c in subs.items() for leaf in leaves(c, f"{path} {n}".strip())]
        return [(path, command)]

    commands = leaves(typer.main.get_command(app), "")
    assert len(commands) >= 20
    for path, command in commands:
        assert isinstance(command, Command), path
        names = [p.name for p in command.get_params(typer.Context(command))]
        assert names.count("verbose") == names.count("quiet") == 1, path
