"""The CPU workers run ahead across an epoch's end (fastload.backends.cpu.pool_engine.RunAhead): the next epoch's
first batches are made while this epoch's last ones are handed out. Order, pixels, state_dict and
resume stay those of a loader that never runs ahead (the inline one), whether the next iteration
adopts those batches (it starts where the epoch left off) or discards them (set_epoch,
load_state_dict, a break), for images and for packed token rows alike (the rest of the token rows'
run-ahead: tests/text/test_token_run_ahead.py). The data: conftest's ``clean`` (30 JPEGs in 4 tar
shards); test_token_loader's real paragraphs in token shards (``tokens``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import fastload
from fastload import transforms as T
from fastload.workers.stage_clock import WORKER_STAGES
from tests.conftest import WorkerLog
from tests.text.conftest import tokenizer_file  # noqa: F401 - a fixture
from tests.text.test_token_loader import loader as token_loader
from tests.text.test_token_loader import tokens  # noqa: F401 - a fixture

BATCH = 4
EPOCH_SAMPLES = 30
MADE = WorkerLog("run-ahead")


def count_made(sample: dict[str, Any], rng: Any) -> dict[str, Any]:
    """A no-op map= that notes each sample a worker makes."""
    MADE.note()
    return sample


@pytest.fixture()
def made_log() -> Iterator[None]:
    yield from MADE.cleared()


def loader(clean: Path, workers: int) -> fastload.DataLoader:
    return fastload.DataLoader(clean, batch_size=BATCH, shuffle=True, seed=3, transform=T.train(16), return_keys=True,
                               num_workers=workers, backend="cpu", map=count_made)


def taken(batches: Any, count: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor, list[str]]]:
    """The batches as copies (the lent slots are freed at once, so the workers may run ahead)."""
    return [(images.clone(), labels.clone(), list(keys)) for images, labels, keys in itertools.islice(batches, count)]


def token_rows(batches: Any, count: int | None = None) -> list[tuple[torch.Tensor]]:
    """Token batches' input_ids as copies (the lent slots are freed at once, so the workers may run ahead)."""
    return [(batch["input_ids"].clone(),) for batch in itertools.islice(batches, count)]


def assert_same(got: list, expected: list) -> None:
    """The same batches: tensors equal, keys the same."""
    assert len(got) == len(expected)
    for batch, want in zip(got, expected):
        assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(batch, want, strict=True))


KINDS = {  # a kind of batch: (its dataset's fixture, its loader with so many workers, its batches copied)
    "images": ("clean", loader, taken),
    "token rows": ("tokens", lambda path, workers: token_loader(path, packing="best-fit", num_workers=workers), token_rows),
}


def test_the_next_epoch_is_made_before_it_starts_and_equals_a_loader_that_never_runs_ahead(clean: Path, made_log: None) -> None:
    with loader(clean, 0) as inline:
        expected = [taken(inline) for _ in range(3)]
        want_state = inline.state_dict()
    assert MADE.count() == 3 * EPOCH_SAMPLES
    MADE.clear()
    with loader(clean, 2) as workers:
        first = taken(workers)
        assert MADE.settled() > EPOCH_SAMPLES, "no sample of epoch 1 was made before its iteration started"
        held = list(workers)  # epoch 1's batches as lent (the first from the run-ahead's slot), copied only now
        got = [first, taken(held), taken(workers)]
        assert workers.state_dict() == want_state
        made_in = [int(epoch.workers[:, len(WORKER_STAGES) + 1].sum()) for epoch in workers.stats.epochs]
        assert made_in == [EPOCH_SAMPLES] * 3  # the batch made ahead counts to the epoch that used it
    for batches, want in zip(got, expected):
        assert_same(batches, want)


def test_resume_mid_epoch_after_a_run_ahead(clean: Path, made_log: None) -> None:
    with loader(clean, 0) as inline:
        taken(inline)
        want_before = taken(iter(inline), 3)
        want_state = inline.state_dict()
        want_after = taken(inline)  # the epoch starts over after the break: the whole of epoch 1
    with loader(clean, 2) as workers:
        taken(workers)  # epoch 0, which runs ahead into epoch 1
        before = taken(iter(workers), 3)
        state = workers.state_dict()
    assert state == want_state and state["epoch"] == 1 and state["samples_consumed"] == 3 * BATCH
    assert_same(before, want_before)
    with loader(clean, 2) as resumed:
        resumed.load_state_dict(state)
        rest = taken(resumed)
    assert_same(before + rest, want_after)


@pytest.mark.parametrize("kind", KINDS)
def test_a_break_a_boundary_state_set_epoch_and_load_state_dict_adopt_or_discard_the_run_ahead(kind: str, request: pytest.FixtureRequest,
                                                                                               made_log: None) -> None:
    fixture, make, copies = KINDS[kind]
    data = request.getfixturevalue(fixture)
    with make(data, 0) as inline:
        want = {epoch: (inline.set_epoch(epoch), copies(inline))[1] for epoch in (0, 1, 2, 5)}
    with make(data, 2) as workers:
        copies(workers)  # epoch 0, which runs ahead into epoch 1
        assert_same(copies(iter(workers), 2), want[1][:2])  # adopted, then broken off
        assert_same(copies(workers), want[1])  # the epoch starts over after the break, and runs ahead into epoch 2
        at_boundary = workers.state_dict()
        assert at_boundary["epoch"] == 2 and at_boundary["samples_consumed"] == 0
        with make(data, 2) as fresh:
            fresh.load_state_dict(at_boundary)
            assert_same(copies(fresh), want[2])
        workers.load_state_dict(at_boundary)  # the position the run-ahead was made for: adopted
        assert_same(copies(workers), want[2])
        workers.set_epoch(5)  # another epoch than the one run ahead into (3): discarded
        assert_same(copies(workers), want[5])
        workers.set_epoch(0)
        mid = copies(iter(workers), 3)
        state = workers.state_dict()
        workers.set_epoch(0)
        copies(workers)  # epoch 0 whole, running ahead into epoch 1
        workers.load_state_dict(state)  # back into epoch 0: the run-ahead is discarded
        assert_same(mid + copies(workers), want[0])
        assert_same(copies(workers), want[1])
