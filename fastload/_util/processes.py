"""Forked worker pools that are safe to start from any process, and the one rule by which every
forked child of fastload (a loader's workers, a conversion's) dies with its parent.

Garbage the parent holds (a DALI pipeline a loader left, with threads that do not survive a fork)
is collected in the parent before the fork and never in a child, whose first act is to freeze what
it inherited (which also keeps the inherited pages shared: a collection would write to every object).

A child exits within PARENT_POLL_S of its parent's death, even one killed by SIGKILL, whatever the
child is doing, so no orphan keeps working: a thread of the child's own polls ``getppid``. Not
``PR_SET_PDEATHSIG``: it fires when the parent *thread* that forked exits, and a pool outlives the
thread that made it wherever a loader's first epoch ran in a thread of its own or a conversion's
first task was handed out by one (the workers were killed under a live pool)."""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

PARENT_POLL_S = 0.2  # how often a forked child checks that its parent is alive

T = TypeVar("T")


def die_with_parent(parent: int) -> None:
    """In a forked child: exit at once if ``parent`` is already gone, and from then on within
    PARENT_POLL_S of its death (a daemon thread polls ``getppid``)."""
    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="fastload-parent-watch", daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _start_child(parent: int) -> None:
    gc.freeze()
    die_with_parent(parent)


def forked_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes forked from this one (spawned where fork is not the
    platform's way), after this process's garbage is collected."""
    gc.collect()
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                               initializer=_start_child, initargs=(os.getpid(),))


def in_fresh_process(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` run in a freshly spawned Python (not forked): what a library that is not
    fork-safe (pylance's threads) does there leaves this process free to fork its workers."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()
