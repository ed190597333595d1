"""A bounded window of chunks processed in parallel, in file order, failing deterministically.

Chunks are submitted in index order to a thread pool, at most ``2 * threads`` at a time; each
in-flight chunk owns one of that many scratch slots, so memory stays bounded whatever the
dataset size. When a chunk fails, nothing new is submitted, every chunk already in flight is
allowed to finish (so no worker writes after the caller starts cleaning up), and the failure
with the *lowest* index is reported: every chunk below it was submitted earlier and has
completed, so the answer does not depend on thread timing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["ChunkFailure", "run_chunks", "window_for"]


class ChunkFailure(Exception):
    """Internal: chunk ``index`` raised ``cause``; every chunk below ``index`` succeeded."""

    def __init__(self, index: int, cause: Exception) -> None:
        super().__init__(index, cause)
        self.index = index
        self.cause = cause


def window_for(threads: int, count: int) -> int:
    """Number of scratch slots (chunks in flight) for ``threads`` workers."""
    return max(1, min(count, 2 * threads if threads > 1 else 1))


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
        BaseException: anything raised in the calling thread (``KeyboardInterrupt``), after
            every running chunk has stopped.
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
    free = list(range(slots))
    inflight: deque[tuple[int, int, Future[None]]] = deque()
    failures: list[tuple[int, Exception]] = []
    next_index = 0
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gpucc-chunk") as pool:
        try:
            while inflight or (next_index < count and not failures):
                while free and next_index < count and not failures:
                    slot = free.pop()
                    inflight.append((next_index, slot, pool.submit(work, next_index, slot)))
                    next_index += 1
                index, slot, future = inflight.popleft()
                error = future.exception()
                free.append(slot)
                if error is not None:
                    if not isinstance(error, Exception):  # a worker's KeyboardInterrupt etc.
                        raise error
                    failures.append((index, error))
                elif on_done is not None and not failures:
                    on_done(index)
        except BaseException:
            for _, _, future in inflight:
                future.cancel()
            raise  # leaving the with-block waits for the running chunks
    if failures:
        index, error = min(failures, key=lambda item: item[0])
        raise ChunkFailure(index, error) from error
