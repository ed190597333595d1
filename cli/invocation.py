"""One run of one command: what it was asked for, and the result it holds back.

The command class (:class:`gpucc.cli.boundary.Command`) creates an :class:`Invocation` from
the parsed command line when the command starts, puts it on the command's Typer context
(``ctx.obj``) and binds it (:func:`bound`) for exactly as long as the command runs. Code
that takes the context reads ``ctx.obj``; the output helpers (``cli.output``), which run
below functions that take no context, read :func:`current`. Nothing outlives the command:
a second command in the same process (tests, a sub-application run on its own) starts from
a new invocation, never from what the first one left behind.

Outside a command (library use, unit tests) :func:`current` is a default invocation:
normal verbosity, text output, results written at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HeldResult", "Invocation", "bound", "current"]


@dataclass
class HeldResult:
    """The command's JSON result: held until its exit status is known, or written at once."""

    hold: bool = False  # the boundary writes the document once the exit status is known
    document: dict[str, Any] | None = None  # the document held until then
    written: bool = False  # a result document is out: an error adds only its line

    def take(self) -> dict[str, Any] | None:
        """The held document, which is no longer held."""
        document, self.document = self.document, None
        return document


@dataclass(frozen=True)
class Invocation:
    """What the command line asked of one command run."""

    command: str = ""  # the command path, e.g. "session offer" (hints name its options)
    verbosity: int = 0  # -1 quiet (-q), 0 default, 1 -v, 2 -vv and more
    json: bool = False  # the result (or error) goes to stdout as one JSON document
    result: HeldResult = field(default_factory=HeldResult)

    @property
    def quiet(self) -> bool:
        """``-q``: only errors on stderr."""
        return self.verbosity < 0


_CURRENT: ContextVar[Invocation] = ContextVar("gpucc_invocation")


def current() -> Invocation:
    """The invocation of the command running now, or a default one outside any command."""
    found = _CURRENT.get(None)
    return Invocation() if found is None else found


@contextmanager
def bound(invocation: Invocation) -> Iterator[Invocation]:
    """Make ``invocation`` the :func:`current` one while the block runs."""
    token = _CURRENT.set(invocation)
    try:
        yield invocation
    finally:
        _CURRENT.reset(token)
