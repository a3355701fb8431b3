"""Forked worker pools that are safe to start from any process: garbage the parent holds (a DALI
pipeline a loader left, with threads that do not survive a fork) is collected in the parent
before the fork and never in a child, whose first act is to freeze what it inherited (which also
keeps the inherited pages shared: a collection would write to every object). On Linux a child dies
with its parent, even one killed by SIGKILL, so no orphan keeps working."""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

T = TypeVar("T")


def die_with_parent(parent: int) -> None:
    """In a forked child: the kernel SIGKILLs it when ``parent`` dies (Linux; elsewhere a no-op),
    and it exits at once if the parent is already gone."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
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
