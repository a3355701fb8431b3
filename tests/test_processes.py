"""Forked worker pools (fastload._util.processes) start safely from a process holding garbage whose
finaliser must not run in a child (a DALI pipeline's threads do not survive a fork: its
``__del__`` in a forked ``fastload index`` worker hung the run): such garbage is collected in the
parent before the fork, through every pool fastload forks. And every pool's children, a loader's
and a conversion's, follow one rule: they die with their parent process, even a stuck one and
one killed by SIGKILL, and never with the thread that forked them."""

from __future__ import annotations

import functools
import gc
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import fastload
import fastload.transforms as T
from fastload.converters import ConvertOptions, convert
from fastload.converters.engines.local import LocalEngine
from fastload.converters.index_tars import index_tars
from tests.conftest import alive, cli_env

finalised_in: list[int] = []


class Finalised:
    """Garbage in a reference cycle: records the process its finaliser runs in."""

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        finalised_in.append(os.getpid())


@pytest.fixture
def garbage_left_behind() -> Iterator[None]:
    """One unreachable cycle, with automatic collection off so only an explicit one finds it."""
    finalised_in.clear()
    gc.collect()
    gc.disable()
    try:
        Finalised()
        yield
    finally:
        gc.enable()
        gc.collect()


def test_index_workers_fork_after_the_garbage_is_finalised(garbage_left_behind: None, clean: Path, tmp_path: Path) -> None:
    copy = tmp_path / "tars"
    copy.mkdir()
    for tar in clean.glob("*.tar"):
        (copy / tar.name).write_bytes(tar.read_bytes())
    index_tars(copy, workers=2)
    assert finalised_in == [os.getpid()]


def test_conversion_workers_fork_after_the_garbage_is_finalised(garbage_left_behind: None, image_folder: Path, tmp_path: Path) -> None:
    convert(str(image_folder), str(tmp_path / "out"), ConvertOptions(source="imagefolder", samples_per_shard=4, workers=2), quiet=True)
    assert finalised_in == [os.getpid()]


DYING_PARENT = Path(__file__).with_name("dying_parent.py")
GUARD_S = 30  # a hang guard only: the children go within PARENT_POLL_S of their parent


def wait_for(done: Callable[[], bool], what: str) -> None:
    """Return once ``done()``; fail naming ``what`` after GUARD_S."""
    deadline = time.monotonic() + GUARD_S
    while not done():
        assert time.monotonic() < deadline, f"{what} within {GUARD_S} s"
        time.sleep(0.05)


def children_left_by_a_killed_parent(args: list[str], pid_dir: Path) -> list[int]:
    """Start tests/dying_parent.py with ``args``, SIGKILL it once its two stuck children are up,
    and return those of them still running after GUARD_S (killed then, so none outlives the test)."""
    parent = subprocess.Popen([sys.executable, str(DYING_PARENT), *args], env=cli_env())
    children: list[int] = []
    try:
        wait_for(lambda: parent.poll() is not None or len(list(pid_dir.iterdir())) == 2, "two children started")
        assert parent.poll() is None, f"the parent exited {parent.returncode} before it was killed"
        children = [int(p.name) for p in pid_dir.iterdir()]
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + GUARD_S
        while alive(children) and time.monotonic() < deadline:
            time.sleep(0.05)
        return alive(children)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for pid in alive(children):
            os.kill(pid, signal.SIGKILL)


def test_loader_workers_die_with_a_killed_parent(clean: Path, tmp_path: Path) -> None:
    """A loader's workers, stuck in worker_init_fn, exit when the training process is SIGKILLed
    (they checked for their parent only between batches, so a stuck one lived on)."""
    assert children_left_by_a_killed_parent(["loader", str(clean), str(tmp_path)], tmp_path) == []


def test_conversion_workers_die_with_a_killed_parent(tmp_path: Path) -> None:
    """A conversion's workers, stuck in a task, exit when the converting process is SIGKILLed."""
    assert children_left_by_a_killed_parent(["converter", str(tmp_path)], tmp_path) == []


def run_in_a_thread_that_ends(work: Callable[[], object]) -> None:
    """Run ``work`` in a thread and return once the thread is gone from the kernel too."""
    native: list[int] = []
    thread = threading.Thread(target=lambda: (native.append(threading.get_native_id()), work()))
    thread.start()
    thread.join()
    wait_for(lambda: not Path(f"/proc/self/task/{native[0]}").exists(), "the thread gone")


def square(n: int) -> int:
    return n * n


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the workers are forked on Linux")
def test_conversion_workers_outlive_the_thread_that_forked_them() -> None:
    """A conversion engine's workers, forked by the thread that asked for the first result, keep
    working for the thread that asks for the rest (PR_SET_PDEATHSIG killed them with the first
    thread: BrokenProcessPool)."""
    results = LocalEngine(2).map_unordered(square, list(range(40)))
    first: list[tuple[int, int]] = []
    run_in_a_thread_that_ends(lambda: first.append(next(results)))
    assert dict([*first, *results]) == {n: n * n for n in range(40)}


def note_pid(pid_dir: str, worker_id: int) -> None:
    Path(pid_dir, str(os.getpid())).touch()


def test_loader_workers_outlive_the_thread_that_forked_them(clean: Path, tmp_path: Path) -> None:
    """A loader's workers, forked for an epoch run in a thread that then ends, serve the next epoch
    in another thread (they live as long as the loader)."""
    loader = fastload.DataLoader(clean, batch_size=4, num_workers=2, transform=T.val(16),
                                 worker_init_fn=functools.partial(note_pid, str(tmp_path)))
    epochs: list[int] = []
    run_in_a_thread_that_ends(lambda: epochs.append(len(list(loader))))
    epochs.append(len(list(loader)))
    workers = [int(p.name) for p in tmp_path.iterdir()]
    assert epochs == [len(loader)] * 2
    assert len(workers) == 2 and alive(workers) == workers
    loader.close()
