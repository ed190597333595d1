"""Every parser against mutations of real samples, and every input that ever failed.

Each target (targets.py) must return or raise an error of gpucc's family for any input. An
ordinary run is brief and repeatable (a fixed seed, harness.BRIEF_EXAMPLES inputs per
target); ``GPUCC_FUZZ_EXAMPLES=N`` makes it N random inputs per target. The crash corpus
is replayed through the targets that read each kind of file.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz.harness import (
    BRIEF_EXAMPLES,
    CORPUS,
    TARGETS,
    check,
    corpus_inputs,
    examples,
    mutated,
)

# every module named targets*.py here registers its targets (a new parser brings its own)
for _module in pkgutil.iter_modules([str(Path(__file__).parent)]):
    if _module.name.startswith("targets"):
        importlib.import_module(f"tests.fuzz.{_module.name}")

NAMES = sorted(TARGETS)
REPLAYS = [
    pytest.param(name, path, id=f"{name}-{path.name}")
    for name in NAMES
    for path in corpus_inputs(TARGETS[name])
]


@pytest.mark.parametrize("name", NAMES)
def test_the_seeds_are_read_whole(name: str) -> None:
    t = TARGETS[name]
    seeds = t.seeds()
    assert seeds and all(seeds)
    for seed in seeds:
        check(t, seed)


@pytest.mark.parametrize("name", NAMES)
def test_mutated_samples_give_gpucc_errors_only(name: str) -> None:
    t = TARGETS[name]
    n = examples()

    @settings(
        max_examples=n,
        derandomize=n == BRIEF_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(mutated(t.seeds()))
    def run(data: bytes) -> None:
        check(t, data)

    run()


@pytest.mark.parametrize(("name", "path"), REPLAYS)
def test_the_crash_corpus_gives_gpucc_errors_only(name: str, path: object) -> None:
    check(TARGETS[name], path.read_bytes())  # type: ignore[attr-defined]


def test_every_corpus_file_is_replayed_by_some_target() -> None:
    replayed = {path for _, path in (p.values for p in REPLAYS)}
    kept = {p for p in CORPUS.iterdir() if p.suffix != ".md"}
    assert kept <= replayed, sorted(p.name for p in kept - replayed)
