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
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar, cast

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
    """``fn(*args)`` (a module's function) run in a fresh Python interpreter (not forked): what a library
    that is not fork-safe (pylance's threads) does there leaves this process free to fork its workers.
    Started as ``python -c``, not by multiprocessing's spawn, which runs the caller's script again first
    (one without an ``if __name__ == "__main__":`` guard would make its loader again there); the result,
    or the exception it raised, comes back pickled."""
    with tempfile.TemporaryDirectory(prefix="fastload-fresh-") as folder:
        task, answer = os.path.join(folder, "task"), os.path.join(folder, "answer")
        with open(task, "wb") as file:
            pickle.dump(sys.path, file)  # first: where the child finds the modules the task names
            pickle.dump((fn, args), file)
        done = subprocess.run([sys.executable, "-c", _FRESH_CHILD, task, answer], stdin=subprocess.DEVNULL, check=False)
        try:
            with open(answer, "rb") as file:
                ok, value = pickle.load(file)
        except OSError:
            raise RuntimeError(f"a fresh Python running {fn.__qualname__} exited with status {done.returncode} before it answered") from None
    if not ok:
        raise value
    return cast(T, value)


_FRESH_CHILD = """
import pickle, sys
with open(sys.argv[1], "rb") as file:
    sys.path[:0] = pickle.load(file)
    fn, args = pickle.load(file)
try:
    answer = (True, fn(*args))
except BaseException as exc:
    answer = (False, exc)
try:
    data = pickle.dumps(answer)
except Exception:
    data = pickle.dumps((False, RuntimeError(f"{type(answer[1]).__name__}: {answer[1]}")))
with open(sys.argv[2], "wb") as file:
    file.write(data)
"""
