"""The holder service's housekeeping: expired replay rows deleted in the background.

:class:`Housekeeper` runs :meth:`~gpucc.holder.state.SqliteState.housekeep` on a thread of
its own, off the request path: once at start, then every ``interval_s`` seconds, batch after
batch while batches come back full (a short pause between them lets requests use the
state). Why deleting these rows cannot re-open a replay is in
:mod:`gpucc.holder.state_retention`. Each round that deleted something is one
``housekeeping`` log record; a round that failed (the database unreachable) is one
``housekeeping-failed`` record, and the next round tries again. Audit records and receipts
are never touched here (``gpucc holder prune``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from gpucc.core.errors import GpuccError

__all__ = ["Housekeeper", "HousekeepingState"]


class _Batch(Protocol):
    @property
    def challenges(self) -> int: ...

    @property
    def answered(self) -> int: ...

    @property
    def more(self) -> bool: ...


class HousekeepingState(Protocol):
    """A state that deletes its expired replay rows (:class:`~gpucc.holder.state.SqliteState`,
    ``PostgresState``)."""

    def housekeep(self, *, batch: int = 500) -> _Batch: ...


class Housekeeper:
    """Background housekeeping of ``state`` (see the module docstring).

    Args:
        log: receives one JSON-ready record per round that deleted something or failed.
        max_batches: the most batches one round runs (the rest waits for the next round).
    """

    def __init__(
        self,
        state: HousekeepingState,
        log: Callable[[dict[str, Any]], None],
        *,
        interval_s: float = 300.0,
        batch: int = 500,
        max_batches: int = 200,
        pause_s: float = 0.05,
    ) -> None:
        self._state = state
        self._log = log
        self._interval_s = interval_s
        self._batch = batch
        self._max_batches = max_batches
        self._pause_s = pause_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpucc-housekeeping", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the thread (after the batch it is in, if any)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def round(self) -> tuple[int, int]:
        """One round: batches until one is not full; (challenges, answered) deleted.

        Raises:
            StateUnavailableError: the database cannot be used.
        """
        challenges = answered = 0
        for _ in range(self._max_batches):
            done = self._state.housekeep(batch=self._batch)
            challenges += done.challenges
            answered += done.answered
            if not done.more or self._stop.wait(self._pause_s):
                break
        return challenges, answered

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                challenges, answered = self.round()
            except GpuccError as exc:
                detail = " ".join(str(exc).split())[:200]
                self._log({"event": "housekeeping-failed", "error": detail})
            else:
                if challenges or answered:
                    self._log(
                        {
                            "event": "housekeeping",
                            "expired_challenges_deleted": challenges,
                            "answered_challenges_deleted": answered,
                        }
                    )
            self._stop.wait(self._interval_s)
