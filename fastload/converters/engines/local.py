"""A local process pool (or the calling process itself for one worker)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TypeVar

from fastload._util.processes import forked_pool

T = TypeVar("T")
R = TypeVar("R")

class LocalEngine:
    """Runs tasks in ``workers`` forked processes, keeping at most 2 per worker queued."""

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def map_unordered(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[tuple[int, R]]:
        """Yield (position, result) as tasks finish; on an error, cancel the rest and re-raise it."""
        if self.workers == 1:
            for position, task in enumerate(tasks):
                yield position, fn(task)
            return
        pending: dict[Future, int] = {}
        todo = iter(enumerate(tasks))
        with forked_pool(self.workers) as pool:  # workers are forked by this thread, up front
            try:
                while True:
                    for position, task in todo:
                        pending[pool.submit(fn, task)] = position
                        if len(pending) >= 2 * self.workers:
                            break
                    if not pending:
                        return
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        yield pending.pop(future), future.result()
            finally:
                for future in pending:
                    future.cancel()
