"""A local process pool (or the calling process itself for one worker)."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """Pool worker initializer: the kernel SIGKILLs this worker when ``parent`` (the forking
    thread's process) dies, even by SIGKILL, so no orphan keeps converting or holds the caller's
    stdout open; exit at once if the parent is already gone. Linux only (elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


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
        context = multiprocessing.get_context("fork")  # workers are forked by this thread, up front
        with ProcessPoolExecutor(self.workers, mp_context=context, initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
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
