"""Forked worker pools that are safe to start from any process, and the one rule by which every
forked child of fastload (a loader's workers, a conversion's) dies with its parent.

Garbage the parent holds (a DALI pipeline a loader left, with threads that do not survive a fork)
is collected in the parent before the fork and never in a child, whose first act is to freeze what
it inherited (which also keeps the inherited pages shared: a collection would write to every object).

A child exits within PARENT_POLL_S of its parent's death, even one killed by SIGKILL, whatever the
child is doing, so no orphan keeps working: a thread of the child's own polls ``getppid``. Not
``PR_SET_PDEATHSIG``: it fires when the parent *thread* that forked exits, and a pool outlives the
thread that made it wherever a loader's first epoch ran in a thread of its own or a conversion's
first task was handed out by one (the workers were killed under a live pool).

What a library that is not fork-safe must do (pylance) runs in a :class:`FreshInterpreter` instead:
a ``python -c`` child, never forked, that runs the module functions it is sent and dies with its
owner by the same rule."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, BinaryIO, TypeVar, cast

PARENT_POLL_S = 0.2  # how often a forked child checks that its parent is alive

T = TypeVar("T")


def die_with_parent(parent: int) -> None:
    """In a child (forked, or a :class:`FreshInterpreter`): exit at once if ``parent`` is already
    gone, and from then on within PARENT_POLL_S of its death (a daemon thread polls ``getppid``)."""
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


class FreshInterpreter:
    """A fresh Python interpreter that runs the module functions it is sent, one call at a time, and
    answers each: what a library that is not fork-safe (pylance's threads) does there leaves this
    process free to fork. Started as ``python -c``, not forked and not by multiprocessing's spawn,
    which runs the caller's script again first (one without an ``if __name__ == "__main__":`` guard
    would make its loader again there). Calls and answers travel over two pipes of its own, pickled
    with their large buffers (an Arrow stream's) sent apart, read straight into their memory; it
    exits at :meth:`close`, or within PARENT_POLL_S of this process's death."""

    def __init__(self) -> None:
        from_parent, to_child = os.pipe()  # (read end, write end)
        from_child, to_parent = os.pipe()
        try:
            # this process's very path, so the child finds modules where this process does
            self.process = subprocess.Popen([sys.executable, "-c", _FRESH_CHILD, str(from_parent), str(to_parent), str(os.getpid()),
                                             json.dumps(sys.path)], pass_fds=(from_parent, to_parent), stdin=subprocess.DEVNULL)
        finally:
            os.close(from_parent)
            os.close(to_parent)
        self._calls = open(to_child, "wb", buffering=0)  # noqa: SIM115  # closed by close()
        self._answers = open(from_child, "rb", buffering=0)  # noqa: SIM115
        self._lock = threading.Lock()  # one call at a time, whichever thread makes it

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` (a module's function) run there: its result, or the exception it raised."""
        with self._lock:
            try:
                write_message(self._calls, (fn, args))
                ok, value = read_message(self._answers)
            except (EOFError, OSError):
                status = self.process.poll()
                raise RuntimeError(f"a fresh Python running {fn.__qualname__} exited with status {status} before it answered") from None
        if not ok:
            raise value
        return cast(T, value)

    def close(self) -> None:
        """Let it exit; wait for it."""
        try:
            write_message(self._calls, None)  # not only EOF: forked children hold this pipe's end too
        except OSError:
            pass
        self._calls.close()
        self._answers.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> FreshInterpreter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def in_fresh_process(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` (a module's function) run in a fresh Python interpreter of its own (:class:`FreshInterpreter`)."""
    with FreshInterpreter() as fresh:
        return fresh.call(fn, *args)


def write_message(pipe: BinaryIO, value: Any) -> None:
    """``value`` pickled to ``pipe``: the count of parts, their sizes, the pickle, then each large
    buffer it holds as it is (pickle protocol 5's out-of-band buffers: no copy made of them here)."""
    buffers: list[pickle.PickleBuffer] = []
    parts = [memoryview(pickle.dumps(value, 5, buffer_callback=buffers.append)), *(b.raw() for b in buffers)]
    _write_all(pipe, memoryview(struct.pack(f"<I{len(parts)}Q", len(parts), *(part.nbytes for part in parts))))
    for part in parts:
        _write_all(pipe, part)


def read_message(pipe: BinaryIO) -> Any:
    """The value :func:`write_message` wrote to the other end of ``pipe``; EOFError where it ends first."""
    (count,) = struct.unpack("<I", _read_exact(pipe, 4))
    parts = [_read_exact(pipe, size) for size in struct.unpack(f"<{count}Q", _read_exact(pipe, 8 * count))]
    return pickle.loads(parts[0], buffers=parts[1:])


def _write_all(pipe: BinaryIO, view: memoryview) -> None:
    while view.nbytes:
        view = view[pipe.write(view) or 0 :]


def _read_exact(pipe: BinaryIO, size: int) -> bytearray:
    out = bytearray(size)
    view, got = memoryview(out), 0
    while got < size:
        n = pipe.readinto(view[got:])  # type: ignore[attr-defined]  # a raw FileIO
        if not n:
            raise EOFError("the other end of the pipe closed")
        got += n
    return out


def serve(calls: BinaryIO, answers: BinaryIO) -> None:
    """In a fresh interpreter: run each call read from ``calls``, answer it on ``answers``, until told to stop."""
    while True:
        try:
            task = read_message(calls)
        except EOFError:
            return
        if task is None:
            return
        try:
            fn, args = task
            answer = (True, fn(*args))
        except BaseException as exc:  # sent back, raised there
            answer = (False, exc)
        try:
            write_message(answers, answer)
        except Exception:  # an answer that does not pickle
            write_message(answers, (False, RuntimeError(f"{type(answer[1]).__name__}: {answer[1]}")))


_FRESH_CHILD = """
import json, sys
sys.path[:] = json.loads(sys.argv[4])
from fastload._util.processes import die_with_parent, serve
die_with_parent(int(sys.argv[3]))
serve(open(int(sys.argv[1]), "rb", buffering=0), open(int(sys.argv[2]), "wb", buffering=0))
"""
