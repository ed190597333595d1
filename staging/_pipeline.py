"""Chunks processed in parallel with bounded memory, failing deterministically.

``threads`` workers claim chunk indices from a shared counter, in increasing order, and
each worker owns one scratch slot, so at most ``threads`` chunks are in flight and memory
stays bounded whatever the dataset size. Workers never wait for the calling thread to hand
out work (it only reports progress), so no core idles between chunks.

When a chunk fails, workers stop claiming new indices and finish the chunk they hold, so no
worker writes after the caller starts cleaning up. The failure with the *lowest* index is
reported: every lower index was claimed earlier and has completed, so the answer does not
depend on thread timing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["ChunkFailure", "run_chunks", "window_for"]


class ChunkFailure(Exception):
    """Internal: chunk ``index`` raised ``cause``; every chunk below ``index`` succeeded."""

    def __init__(self, index: int, cause: Exception) -> None:
        super().__init__(index, cause)
        self.index = index
        self.cause = cause


def window_for(threads: int, count: int) -> int:
    """Number of scratch slots (chunks in flight) for ``threads`` workers."""
    return max(1, min(count, threads))


class _State:
    """What the workers and the calling thread share, under one condition variable."""

    def __init__(self, count: int) -> None:
        self.cond = threading.Condition()
        self.count = count
        self.next_index = 0
        self.completed = bytearray(count)
        self.failures: list[tuple[int, BaseException]] = []
        self.stop = False
        self.running = 0


def _worker(state: _State, slot: int, work: Callable[[int, int], None]) -> None:
    cond = state.cond
    try:
        while True:
            with cond:
                if state.stop or state.failures or state.next_index >= state.count:
                    return
                index = state.next_index
                state.next_index += 1
            try:
                work(index, slot)
            except BaseException as exc:  # recorded; the calling thread re-raises it
                with cond:
                    state.failures.append((index, exc))
                    cond.notify_all()
                return
            with cond:
                state.completed[index] = 1
                cond.notify_all()
    finally:
        with cond:
            state.running -= 1
            cond.notify_all()


def run_chunks(
    count: int,
    work: Callable[[int, int], None],
    *,
    threads: int,
    on_done: Callable[[int], None] | None = None,
) -> None:
    """Run ``work(index, slot)`` for every chunk index in ``range(count)``.

    ``slot`` is in ``range(window_for(threads, count))`` and is never used by two chunks at
    once. ``on_done(index)`` is called in the calling thread, in index order, after each
    chunk succeeds.

    Raises:
        ChunkFailure: the lowest-index chunk that raised, with its exception.
        BaseException: anything raised in the calling thread (``KeyboardInterrupt``, or an
            exception from ``on_done``), after every worker has stopped.
    """
    if threads < 1:
        raise ValueError("threads must be at least 1")
    if threads == 1 or count <= 1:
        for index in range(count):
            try:
                work(index, 0)
            except Exception as exc:
                raise ChunkFailure(index, exc) from exc
            if on_done is not None:
                on_done(index)
        return

    slots = window_for(threads, count)
    state = _State(count)
    state.running = slots
    workers = [
        threading.Thread(
            target=_worker, args=(state, slot, work), name=f"gpucc-chunk-{slot}", daemon=True
        )
        for slot in range(slots)
    ]
    for worker in workers:
        worker.start()
    reported = 0
    try:
        while True:
            with state.cond:
                while (
                    state.running
                    and not state.failures
                    and (reported >= count or not state.completed[reported])
                ):
                    state.cond.wait()
                ready = reported
                while ready < count and state.completed[ready]:
                    ready += 1
                finished = not state.running or bool(state.failures)
            if on_done is not None and not state.failures:
                for index in range(reported, ready):
                    on_done(index)
            reported = ready
            if finished:
                break
    except BaseException:
        with state.cond:
            state.stop = True
        raise
    finally:
        for worker in workers:
            worker.join()
    if state.failures:
        index, error = min(state.failures, key=lambda item: item[0])
        if not isinstance(error, Exception):  # a worker's SystemExit and the like
            raise error
        raise ChunkFailure(index, error) from error
