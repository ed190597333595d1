"""The fuzzing harness: targets, mutations of real samples, and the regression corpus.

A *target* is one parser as gpucc's callers meet it: a function that takes the bytes an
attacker controls and either returns or raises an error of gpucc's family
(:class:`~gpucc.core.errors.GpuccError`). Anything else (a ``ValueError`` from a library, a
``TypeError``, a ``RecursionError``) is a defect: the command line would report it as an
internal error (exit 70), the holder as a 500.

Each target names its seeds (real samples, read lazily) and the crash-corpus prefixes it
replays. A new parser gets one :func:`target` call, in ``targets.py`` or in a module of its
own named ``targets_*.py`` here (``test_fuzz.py`` imports every such module); nothing else
changes.

Mutations (:func:`mutated`) are what found the defects the corpus keeps: bit flips,
truncation, length fields set to zero or to huge values, repeated blocks, NUL and invalid
UTF-8 inserted, deep nesting, and splices of two seeds, stacked up to four at a time.

Environment:

* ``GPUCC_FUZZ_EXAMPLES``: inputs per target (default: a brief run with a fixed seed, as
  every test run does). Set it, and the run is random (``derandomize`` off), e.g.
  ``GPUCC_FUZZ_EXAMPLES=20000 pytest tests/fuzz``.
* ``GPUCC_FUZZ_SAVE``: a directory; every input that raises outside gpucc's family is
  written there as ``fuzz--TARGET--EXCEPTION-DIGEST.bin`` (move it to
  ``tests/data/crash-corpus`` once fixed: it is replayed from then on), and at exit
  ``counts.json`` says how many inputs each target was given (also after an interrupt).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from gpucc.core.errors import GpuccError
from tests.support.paths import DATA

__all__ = [
    "BRIEF_EXAMPLES",
    "CORPUS",
    "TARGETS",
    "Target",
    "check",
    "corpus_inputs",
    "examples",
    "mutated",
    "target",
]

CORPUS = DATA / "crash-corpus"
#: inputs per target in an ordinary test run (with a fixed seed)
BRIEF_EXAMPLES = 50


@dataclass(frozen=True)
class Target:
    """One parser: ``run(data)`` returns or raises a gpucc error; ``seeds()`` gives the real
    samples mutations start from; ``corpus`` names the crash-corpus prefixes it replays
    (``fuzz--NAME--`` files are always its own)."""

    name: str
    run: Callable[[bytes], object]
    seeds: Callable[[], list[bytes]]
    corpus: tuple[str, ...] = ()


TARGETS: dict[str, Target] = {}


def target(
    name: str, seeds: Callable[[], list[bytes]], corpus: tuple[str, ...] = ()
) -> Callable[[Callable[[bytes], object]], Callable[[bytes], object]]:
    """Register the decorated function as the target ``name``."""

    def register(run: Callable[[bytes], object]) -> Callable[[bytes], object]:
        assert name not in TARGETS, name
        TARGETS[name] = Target(name, run, seeds, corpus)
        return run

    return register


def examples() -> int:
    """Inputs per target: ``GPUCC_FUZZ_EXAMPLES``, else the brief run's."""
    return int(os.environ.get("GPUCC_FUZZ_EXAMPLES") or BRIEF_EXAMPLES)


COUNTS: Counter[str] = Counter()


def _write_counts() -> None:
    save = os.environ.get("GPUCC_FUZZ_SAVE")
    if save and COUNTS:
        Path(save).mkdir(parents=True, exist_ok=True)
        (Path(save) / "counts.json").write_text(json.dumps(dict(COUNTS), sort_keys=True))


atexit.register(_write_counts)


def check(t: Target, data: bytes) -> None:
    """Run ``t`` on ``data``: a gpucc error is an answer; anything else is saved (when
    ``GPUCC_FUZZ_SAVE`` names a directory) and raised."""
    COUNTS[t.name] += 1
    try:
        t.run(data)
    except GpuccError:
        return
    except BaseException as exc:
        save = os.environ.get("GPUCC_FUZZ_SAVE")
        if save and isinstance(exc, Exception):
            digest = hashlib.sha256(data).hexdigest()[:12]
            out = Path(save) / f"fuzz--{t.name}--{type(exc).__name__}-{digest}.bin"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
        raise


def corpus_inputs(t: Target) -> list[Path]:
    """The crash-corpus files ``t`` replays."""
    prefixes = (*t.corpus, f"fuzz--{t.name}--")
    return sorted(p for p in CORPUS.iterdir() if p.name.startswith(prefixes))


_INVALID_UTF8 = (b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82")
_NESTING = (b"[", b'{"a":', b"- ", b"<a>", b"\x30\x80")


def _mutate(data: bytes, draw: Callable[[st.SearchStrategy[int]], int]) -> bytes:
    """One mutation of ``data``; ``draw`` picks the numbers."""
    n = len(data)

    def at() -> int:
        return draw(st.integers(0, max(n - 1, 0)))

    kind = draw(st.integers(0, 8))
    if n == 0:
        return b"\x00" * draw(st.integers(0, 8))
    if kind == 0:  # flip one bit
        i = at()
        return data[:i] + bytes([data[i] ^ (1 << draw(st.integers(0, 7)))]) + data[i + 1 :]
    if kind == 1:  # truncate
        return data[: at()]
    if kind == 2:  # a length field of 1, 2 or 4 bytes set to zero or to all ones
        i, width = at(), draw(st.sampled_from([1, 2, 4]))
        value = b"\x00" * width if draw(st.booleans()) else b"\xff" * width
        return data[:i] + value + data[i + width :]
    if kind == 3:  # repeat a block
        i = at()
        j = min(n, i + draw(st.integers(1, 64)))
        return data[:j] + data[i:j] * draw(st.integers(1, 16)) + data[j:]
    if kind == 4:  # insert NUL
        i = at()
        return data[:i] + b"\x00" * draw(st.integers(1, 4)) + data[i:]
    if kind == 5:  # insert invalid UTF-8
        i = at()
        return data[:i] + _INVALID_UTF8[draw(st.integers(0, len(_INVALID_UTF8) - 1))] + data[i:]
    if kind == 6:  # deep nesting
        i = at()
        opener = _NESTING[draw(st.integers(0, len(_NESTING) - 1))]
        return data[:i] + opener * draw(st.integers(10, 5000)) + data[i:]
    if kind == 7:  # delete a span
        i = at()
        return data[:i] + data[i + draw(st.integers(1, 256)) :]
    i = at()  # overwrite a byte with a chosen value
    return data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1 :]


def mutated(seeds: list[bytes]) -> st.SearchStrategy[bytes]:
    """Inputs made from ``seeds``: one seed (or two spliced), then one to four mutations."""

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        data = draw(st.sampled_from(seeds))
        if len(seeds) > 1 and draw(st.integers(0, 9)) == 0:
            other = draw(st.sampled_from(seeds))
            data = (
                data[: draw(st.integers(0, len(data)))] + other[draw(st.integers(0, len(other))) :]
            )
        for _ in range(draw(st.integers(1, 4))):
            data = _mutate(data, draw)
        return data

    return build()
