"""The package's import graph: one-way layers, no circles between files, no library module
that imports the command line.

Every import is counted, deferred and type-only ones included, as a reader sees them::

    core  <-  gpuattest  <-  staging  <-  keyrelease  <-  assembly  <-  travel, ddp
          <-  holder  <-  cli

(``gpucc/__init__.py`` is the lazy public facade over all of them.)
"""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Each package's layer: a module may import its own layer and those below it.
LAYERS = {
    "core": 0,
    "gpuattest": 1,
    "staging": 2,
    "keyrelease": 3,
    "assembly": 4,
    "travel": 5,
    "ddp": 5,
    "holder": 6,
    "cli": 7,
}
#: Old import paths that still work: each module only re-exports the module that moved
#: (docs/ARCHITECTURE.md, "What moved"). They stand outside the layers; nothing imports them.
MOVED = {
    "gpucc.staging.release": "gpucc.keyrelease.protocol",
    "gpucc.staging.release_cvm": "gpucc.keyrelease.cvm",
    "gpucc.staging.release_messages": "gpucc.keyrelease.messages",
    "gpucc.staging.requester": "gpucc.keyrelease.requester",
    "gpucc.staging.replay": "gpucc.keyrelease.replay",
    "gpucc.staging.statedb": "gpucc.holder.state",
    "gpucc.staging.statedb_retention": "gpucc.holder.state_retention",
    "gpucc.staging.statedb_schema": "gpucc.holder.state_schema",
    "gpucc.travel.holder": "gpucc.holder.service",
    "gpucc.travel.decide": "gpucc.holder.decide",
    "gpucc.travel.audit": "gpucc.holder.audit",
    "gpucc.travel.housekeeping": "gpucc.holder.housekeeping",
    "gpucc.travel.httpserver": "gpucc.core.httpserver",
    "gpucc.travel.accept": "gpucc.core.accept",
    "gpucc.travel.metrics": "gpucc.holder.metrics",
}


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["gpucc", *parts])


def _files() -> dict[str, Path]:
    found = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_of(path)] = path
    return found


def _imports(path: Path, module: str, known: dict[str, Path]) -> set[str]:
    """The package's own modules that ``path`` imports (resolved to files)."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from P import m`` imports the module P.m when there is one, else a name of P
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module and name.startswith("gpucc."):
                targets.add(name)
    return targets


def _graph() -> dict[str, set[str]]:
    """Every module's imports, the old paths in :data:`MOVED` left out."""
    return {m: targets for m, targets in _full_graph().items() if m not in MOVED}


@functools.cache
def _full_graph() -> dict[str, set[str]]:
    known = _files()
    return {m: _imports(p, m, known) for m, p in known.items()}


def _layer(module: str) -> int:
    return LAYERS[module.split(".")[1]]


def test_no_library_module_imports_the_command_line() -> None:
    offenders = [
        f"{m} -> {t}"
        for m, targets in _graph().items()
        if not m.startswith("gpucc.cli")
        for t in targets
        if t.startswith("gpucc.cli")
    ]
    assert offenders == []


def test_imports_go_one_way_down_the_layers() -> None:
    upward = [
        f"{m} -> {t}"
        for m, targets in _graph().items()
        for t in targets
        if _layer(t) > _layer(m) or (_layer(t) == _layer(m) and m.split(".")[1] != t.split(".")[1])
    ]
    assert upward == []


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one file (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_circles_between_files() -> None:
    assert _circles(_graph()) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_every_layer_is_read(package: str) -> None:
    assert any(m.split(".")[1] == package for m in _graph())


def test_no_package_imports_another_packages_private_module() -> None:
    private = [
        f"{m} -> {t}"
        for m, targets in _graph().items()
        for t in targets
        if any(part.startswith("_") for part in t.split(".")[2:-1] + [t.split(".")[-1]])
        and not t.split(".")[-1].startswith("__")
        and m.split(".")[1] != t.split(".")[1]
    ]
    assert private == []


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_path_re_exports_the_module_that_moved(old: str, new: str) -> None:
    assert _full_graph()[old] == {new}
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    assert old_module.__all__ == new_module.__all__
    assert all(getattr(old_module, n) is getattr(new_module, n) for n in new_module.__all__)


def test_nothing_in_the_library_imports_an_old_path() -> None:
    assert [f"{m} -> {t}" for m, targets in _graph().items() for t in targets if t in MOVED] == []
