"""The token loader's workers run ahead across an epoch's end (fastload.backends.cpu.pool_engine.CpuWorkers, as
the image path's, tests/backends/test_cpu_run_ahead.py): the next epoch's first batch is made while this
epoch's last ones are handed out. Its batches and state stay those of a loader that never runs ahead
(a fresh one set to that epoch), whether the next iteration adopts that batch (it starts where the
epoch left off) or discards it (another topology here; set_epoch, load_state_dict and a break in
tests/backends/test_cpu_run_ahead.py, for both kinds of batch). The data: test_token_loader's real
paragraphs in token shards."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import fastload
from fastload.workers.stage_clock import WORKER_STAGES
from tests.conftest import WorkerLog
from tests.text.test_token_loader import loader, tokens  # noqa: F401 - a fixture

READS = WorkerLog("token-run-ahead")
ROWS = len(WORKER_STAGES) + 1  # the workers' counters' column of rows made (stage_clock.SAMPLES)


def log_reads(worker_id: int) -> None:
    """worker_init_fn: this worker notes each span it reads (one ``os.preadv`` a segment; one line each, appended)."""
    read = os.preadv

    def logged(fd: int, buffers: Any, offset: int) -> int:
        READS.note()
        return read(fd, buffers, offset)

    os.preadv = logged


@pytest.fixture()
def reads_log() -> Iterator[None]:
    yield from READS.cleared()


def taken(batches: Any, count: int | None = None) -> list[torch.Tensor]:
    """The batches' input_ids as copies (the lent slots are freed at once, so the workers may run ahead)."""
    return [batch["input_ids"].clone() for batch in itertools.islice(batches, count)]


def never_ahead(path: Path, epoch: int, **kwargs: Any) -> list[torch.Tensor]:
    """``epoch``'s batches from a fresh loader set to it, in the training process (it never runs ahead)."""
    with loader(path, **kwargs) as fresh:
        fresh.set_epoch(epoch)
        return taken(fresh)


def assert_same(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


def segments(ld: fastload.DataLoader, epoch: int, steps: int) -> int:
    """The spans the first ``steps`` batches of ``epoch`` read (describe names each)."""
    return sum(len(row) for step in range(steps) for row in ld.describe(step, epoch))


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_the_next_epochs_first_batch_is_made_before_it_starts_and_the_batches_are_a_fresh_loaders(tokens: Path, packing: str,  # noqa: F811
                                                                                                   reads_log: None) -> None:
    want = [never_ahead(tokens, epoch, packing=packing) for epoch in range(3)]
    with loader(tokens, packing=packing, num_workers=2, worker_init_fn=log_reads) as workers:
        first = taken(workers)
        expected = segments(workers, 0, len(first)) + segments(workers, 1, 1)
        assert READS.settled(expected) == expected, "epoch 1's first batch was not made (once) before its iteration"
        got = [first, taken(workers), taken(workers)]
        state = workers.state_dict()
        rows = [int(epoch.workers[:, ROWS].sum()) for epoch in workers.stats.epochs]
        delivered = [epoch.samples for epoch in workers.stats.epochs]
    for batches, expected in zip(got, want):
        assert_same(batches, expected)
    assert rows == delivered  # the batch made ahead counts to the epoch that used it
    with loader(tokens, packing=packing) as inline:
        for _ in range(3):
            taken(inline)
        assert state == inline.state_dict()


def test_another_topology_at_the_next_epoch_discards_the_run_ahead(tokens: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    want = never_ahead(tokens, 1, rank=1, world_size=2)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with loader(tokens, num_workers=2) as workers:
        taken(workers)  # epoch 0 at rank 0 of 1, running ahead into epoch 1 there
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert_same(taken(workers), want)
