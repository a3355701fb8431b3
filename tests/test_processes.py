"""Forked worker pools (fastload._util.processes) start safely from a process holding garbage whose
finaliser must not run in a child (a DALI pipeline's threads do not survive a fork: its
``__del__`` in a forked ``fastload index`` worker hung the run): such garbage is collected in the
parent before the fork, through every pool fastload forks."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastload.converters import ConvertOptions, convert
from fastload.converters.index_tars import index_tars

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
