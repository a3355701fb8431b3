"""Packed token rows on the one CPU engine (fastload.backends.cpu.pool_engine): each task is a
whole batch, its work the batch's first global row, its rows and (best-fit) the window holding it
(fastload.text.token_rows.BatchWork), which the worker turns into segments and fills
(fastload.text.token_batch) from its own shard readers into a shared slot, lent to the caller
without a copy; with ``num_workers=0`` the batch is made in the training process. The dispatch,
the run-ahead across an epoch's end and the lending are the engine's, as for samples. A remote
dataset's shards are downloaded ahead of use (fastload.loading.prefetch): those each batch opens
(best-fit: each window), found from the index alone.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import Any, cast

import numpy as np
import torch

from fastload.backends.cpu.pool_engine import RUN_AHEAD_BATCHES, CpuWorkers, Parts, PoolEpoch, WorkerSetup
from fastload.loading.loader_options import LoaderOptions
from fastload.loading.state import LoaderState
from fastload.loading.stats import LoaderStats
from fastload.orders.position import Position
from fastload.storage.dataset import ShardedDataset
from fastload.text.epoch_rows import BestFitRows
from fastload.text.token_attention import batch_tensors, with_attention
from fastload.text.token_batch import BatchBounds, BatchFiller
from fastload.text.token_corpus import Segments
from fastload.text.token_rows import BatchWork, Cursor, Packing, TokenRows
from fastload.workers.pool import Filled
from fastload.workers.slots import BatchBuffers, Column
from fastload.workers.stage_clock import READ_BYTES, SAMPLES, TRANSFORM, StageClock, StageCounters


@dataclass(frozen=True)
class TokenJob:
    """A token loader's workers: each task's rows made into the slot (a worker's own readers and rows)."""

    rows: TokenRows
    filler: BatchFiller
    buffers: BatchBuffers
    worker_init_fn: Callable[[int], None] | None
    counters: StageCounters

    def fill(self, columns: dict[str, np.ndarray], epoch: int, work: BatchWork, clock: StageClock) -> Filled:
        """The batch whose first row is ``work[0]`` packed into ``columns``; its bounds come back as a value."""
        first, count, cursor = work
        clock.start()
        segments = self.rows.segments(epoch, first, count, cursor)
        bounds = self.filler.fill(segments, columns)
        clock.lap(TRANSFORM)
        clock.count(SAMPLES, bounds.rows)
        clock.count(READ_BYTES, bounds.tokens * self.rows.corpus.dtype.itemsize)
        return [], [], {"bounds": [bounds]}

    def where(self, work: BatchWork, row: int, key: str) -> str:
        """How an error names row ``row`` of the batch made of ``work``: its row of the epoch."""
        return f"row {work[0] + row}"

    def close(self) -> None:
        """Close this worker's shard files."""
        self.rows.corpus.dataset.close()


@dataclass(frozen=True)
class TokenEpochInputs:
    """What a token epoch reads from its loader, fixed when the iterator is made."""

    dataset: ShardedDataset
    rows: TokenRows
    filler: BatchFiller
    options: LoaderOptions
    device: torch.device | None
    state: LoaderState
    stats: LoaderStats
    accelerate: bool
    before_start: Callable[[], None]
    ranks: Callable[[], tuple[int, int]]  # (rank, world size), resolved when the epoch starts


class TokenEpoch(PoolEpoch[TokenEpochInputs]):
    """One pass over this rank's steps: every global step is ``world_size * batch_size`` rows of
    the epoch, rank r taking the r-th ``batch_size`` of them, but the last step's rows split evenly
    over the ranks (TokenRows.rank_rows); rows past the epoch's end are padding, so every rank
    makes the same number of steps (of full ones only, with ``drop_last``)."""

    def __init__(self, inputs: TokenEpochInputs, workers: CpuWorkers[TokenEpochInputs, TokenEpoch]) -> None:
        super().__init__(inputs.state, inputs.stats, inputs.accelerate, inputs.dataset.downloads, inputs.before_start)
        self.inputs, self.workers = inputs, workers

    def _setup(self) -> WorkerSetup:
        """Workers that pack rows into slots of the batch format's (batch_size, seq_len) int64 columns;
        with num_workers=0 this process makes arrays of its own."""
        inputs = self.inputs
        filler = inputs.filler
        return WorkerSetup(lambda: [Column(name, (filler.seq_len,), "int64") for name in filler.format.columns],
                           lambda buffers, counters: TokenJob(inputs.rows, filler, buffers, inputs.options.worker_init_fn, counters),
                           fills_inline=False)

    def _start_prefetch(self) -> None:
        """For a remote dataset, start downloading the shards this rank's batches open, in the order the
        epoch reads them: batch by batch, or best-fit's window by window from the one holding the first batch."""
        if not self.inputs.dataset.downloads:
            return
        rows = self.inputs.rows.of(self.epoch, self.origin)
        if isinstance(rows, BestFitRows):
            if not self._has_batch(0):
                return
            first_window = self.window_reached = cast(Cursor, self._work(0)[2])[0]
            self._prefetch(self.inputs.dataset, map(rows.window_shards, range(first_window, rows.windows)),
                           lambda: self.window_reached - first_window + 1)
        else:
            self._prefetch(self.inputs.dataset, self.inputs.rows.batch_shards(rows, self.start.consumed, self.batch_size, self.rank, self.world,
                                                                              self.inputs.options.drop_last), self._dispatched)

    def _reached(self, work: BatchWork) -> BatchWork:
        """``work``, about to be made: best-fit's prefetching goes on from its window."""
        if self.prefetcher is not None and self.inputs.rows.options.packing is Packing.BEST_FIT and work[2] is not None:
            self.window_reached = max(self.window_reached, work[2][0])
        return work

    def _plan_epoch(self, start: Position) -> None:
        self.rank, self.world = self.inputs.ranks()
        self.batch_size = self.inputs.options.batch_size
        self.step_rows = self.batch_size * self.world
        rows = self.inputs.rows
        self.origin = rows.origin(start.resumed_from)  # after a resume at another seq_len: where its rows are cut from
        self.length = None if rows.options.packing is Packing.BEST_FIT else rows.length(self.epoch, self.origin)  # best-fit: found as it goes
        self.batches: int | None = None  # this rank's batches in the epoch, once a batch past its end was asked for

    def _has_batch(self, batch_no: int) -> bool:
        if self.batches is not None and batch_no >= self.batches:  # asked again once the run-ahead made the next epoch's rows the latest
            return False
        first = self.start.consumed + batch_no * self.step_rows  # the global step's first row
        held = self.inputs.rows.holds_step(self.epoch, first, self.step_rows, self.inputs.options.drop_last, self.origin)
        if not held:
            self.batches = batch_no if self.batches is None else min(self.batches, batch_no)
            if self.length is None:  # best-fit has located the epoch's end: its rows are counted
                self.length = self.inputs.rows.length(self.epoch, self.origin)
        return held

    def _remainder(self) -> int:
        """0 where every global batch is full (or the tail dropped); else -1, as for best-fit until its
        last step is found: the last step's rows are split evenly over the ranks, so its padding is
        not at the end of the batch gathered over the ranks (accelerate's ``remainder`` means that)
        and ``gather_for_metrics`` leaves it to the caller (the padding rows' attention_mask is 0)."""
        if self.length is not None and (self.inputs.options.drop_last or (self.length - self.start.consumed) % self.step_rows == 0):
            return 0
        return -1

    def position(self) -> Position:
        """Where this epoch is: the rows consumed once the batches handed out so far count."""
        return Position(self.epoch, self.start.consumed + self.next_yield * self.step_rows, self.start.resumed_from)

    def _work(self, batch_no: int) -> BatchWork:
        """This rank's rows of batch ``batch_no`` (fastload.text.token_rows.TokenRows.step_batch)."""
        return self.inputs.rows.step_batch(self.epoch, self.start.consumed + batch_no * self.step_rows, self.batch_size, self.rank, self.world,
                                           self.origin)

    def _parts(self, work: BatchWork) -> Parts:
        """A whole batch is one task (its rows are a few NumPy operations to make)."""
        return [(0, self.batch_size, self._reached(work))]

    def _next_works(self, start: Position) -> list[Any]:
        """The first batches of the epoch from ``start`` (rows from the epoch's start)."""
        batches = self.inputs.rows.rank_batches(start.epoch, 0, self.batch_size, self.rank, self.world, self.inputs.options.drop_last)
        return list(islice(batches, RUN_AHEAD_BATCHES))

    def _made_here(self) -> tuple[dict[str, np.ndarray], BatchBounds]:
        """num_workers=0: the batch made in this process, into arrays of its own."""
        clock = self.inline_clock
        clock.start()
        first, count, cursor = self._reached(self._work(self.next_yield))
        segments: Segments = self.inputs.rows.segments(self.epoch, first, count, cursor)
        arrays, bounds = self.inputs.filler.batch(segments, self.batch_size)
        clock.lap(TRANSFORM)
        clock.count(SAMPLES, bounds.rows)
        clock.flush()
        return arrays, bounds

    def _next_batch(self) -> dict[str, Any]:
        stats = self.inputs.stats
        if self.prefetcher is not None:
            self.prefetcher.check()
        with stats.waiting():
            if self.pool is None:
                arrays, bounds = self._made_here()
            else:
                got = self._await_ready(self.pool)
                arrays, bounds = self._slot_columns(got), got.values["bounds"][0]
        filler = self.inputs.filler
        batch = batch_tensors(arrays, bounds, filler.format)
        device = self.inputs.device
        if device is not None:
            with stats.to_device():
                batch = {name: value.to(device, non_blocking=True) for name, value in batch.items()}
        stats.record_batch(bounds.rows)
        stats.record_tokens(bounds.tokens)
        return with_attention(batch, bounds, filler.attention)
