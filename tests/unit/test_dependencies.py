"""The dependency envelope is declared once and tested whole (README: Which versions gpucc is
tested with): the lock pins every requirement inside pyproject.toml's bounds, the oldest pass
installs exactly the lower bounds, an upper bound says why, and CI runs README's commands."""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement
from packaging.version import Version

from tests.support.paths import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
#: The extras on the critical paths, which the oldest pass installs with the base.
OLDEST_EXTRAS = ("holder", "torch")


def _pins(path: str) -> dict[str, Version]:
    pins = {}
    for line in (ROOT / path).read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{path}: {line!r} is not an exact pin"
            pins[_canonical(name)] = Version(version)
    return pins


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lower_bound(requirement: Requirement) -> Version:
    bounds = [Version(s.version) for s in requirement.specifier if s.operator in (">=", "==")]
    assert len(bounds) == 1, f"{requirement}: one lower bound (>= or ==) expected"
    return bounds[0]


def test_the_lock_pins_every_requirement_inside_its_bounds() -> None:
    lock = _pins("requirements/ci.lock")
    requirements = [
        Requirement(r)
        for r in [*PYPROJECT["dependencies"], *PYPROJECT["optional-dependencies"]["test"]]
    ]
    for requirement in requirements:
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": "test"}):
            continue
        name = _canonical(requirement.name)
        assert name in lock, (
            f"requirements/ci.lock does not pin {requirement.name}: run bash .ci/lock"
        )
        assert requirement.specifier.contains(lock[name], prereleases=True), (
            f"requirements/ci.lock pins {name}=={lock[name]}, outside {requirement}: run bash .ci/lock"
        )


def test_the_oldest_pass_installs_exactly_the_lower_bounds() -> None:
    oldest = _pins("requirements/oldest.txt")
    wanted = {}
    for text in PYPROJECT["dependencies"] + [
        r for extra in OLDEST_EXTRAS for r in PYPROJECT["optional-dependencies"][extra]
    ]:
        requirement = Requirement(text)
        wanted[_canonical(requirement.name)] = _lower_bound(requirement)
    assert oldest == wanted


def test_every_upper_bound_says_why() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    block = text[text.index("dependencies = [") : text.index("[project.optional-dependencies]")]
    extras = text[text.index("[project.optional-dependencies]") : text.index("test = [")]
    for line in (block + extras).splitlines():
        if re.search(r'"[^"]*<[^"]*"', line):
            assert "#" in line, f"an upper bound without its reason: {line.strip()}"


def test_ci_runs_readme_commands_verbatim() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    block = readme[readme.index("```sh\n") + len("```sh\n") :]
    commands = [
        line for line in block[: block.index("```")].splitlines() if line.startswith("python3 ")
    ]
    assert len(commands) == 2
    for command in commands:
        assert command in ci, f".ci/run does not run README's command: {command}"
