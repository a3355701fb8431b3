"""The CPU path's epoch of samples: batches split among libjpeg-turbo worker processes that write
pixels (and every stacked field) into shared batch slots, on the one CPU engine
(fastload.backends.cpu.pool_engine: its dispatch, run-ahead and lending are every kind's)."""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from fastload.backends.cpu.pool_engine import RUN_AHEAD_BATCHES, CpuWorkers, Parts, PoolEpoch, WorkerSetup
from fastload.loading.epoch import Epoch, EpochInputs
from fastload.orders.position import Position
from fastload.workers.batch_fill import fill_fields
from fastload.workers.pool import BatchResult, WorkerConfig
from fastload.workers.slots import spec_columns

MIN_PART = 16  # the fewest samples a worker is given of a batch


def image_parts(indices: np.ndarray, workers: int) -> Parts:
    """An image batch's samples split into one part per worker (at least MIN_PART samples each):
    all workers work on the oldest batch, so a batch, the first one included, is ready in
    1/workers of the time."""
    count = max(1, min(workers, len(indices) // MIN_PART))
    bounds = np.linspace(0, len(indices), count + 1).astype(int)
    return [(start, end - start, indices[start:end]) for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist())]


class CpuEpoch(PoolEpoch[EpochInputs], Epoch):
    """The CPU path: a batch's work is its sample indices, split among the workers; a finished
    slot's columns are shaped into the batch (fastload.loading.epoch.Epoch)."""

    def __init__(self, inputs: EpochInputs, workers: CpuWorkers[EpochInputs, CpuEpoch]) -> None:
        super().__init__(inputs)
        self.workers = workers

    def _setup(self) -> WorkerSetup:
        """Workers that decode and transform samples into slots of the fields' columns; with
        num_workers=0 this process fills a slot alike."""
        inputs, options = self.inputs, self.inputs.options
        return WorkerSetup(lambda: spec_columns(inputs.sample_spec, inputs.image_shape),
                           lambda buffers, counters: WorkerConfig(inputs.dataset, options.transform, options.seed, options.on_error,
                                                                  inputs.skip_limit, buffers, options.worker_init_fn, inputs.sample_spec,
                                                                  counters),
                           fills_inline=True)

    def _work(self, batch_no: int) -> np.ndarray:
        """The samples the CPU workers make of batch ``batch_no``: all of them here."""
        return self.indices(batch_no)

    def _parts(self, work: np.ndarray) -> Parts:
        return image_parts(work, self.inputs.options.num_workers)

    def _next_works(self, start: Position) -> list[Any]:
        orders = self.inputs.orders
        plan, order = orders.batches(start), orders.order(start)
        return [order.indices(plan.positions(batch_no)) for batch_no in range(min(len(plan), RUN_AHEAD_BATCHES))]

    def _run_inline(self) -> BatchResult:
        buffers = self.buffers
        assert buffers is not None  # this kind fills a slot in this process too
        slot = cast(int, buffers.take())  # never None: the inline path copies every batch out
        indices = self._work(self.next_yield)
        result = BatchResult(run=self.run, batch_no=self.next_yield, slot=slot, count=len(indices))
        options = self.inputs.options
        try:
            result.keys, result.skipped, result.values = fill_fields(
                self.inputs.dataset, indices, self.inputs.sample_spec, options.transform, options.seed,
                self.epoch, options.on_error, buffers.slot_columns(slot), self.inline_clock, self.inputs.skip_limit,
            )
        except BaseException:
            buffers.give_back(slot)
            raise
        return result

    def _next_batch(self) -> Any:
        stats = self.inputs.stats
        if self.prefetcher is not None:
            self.prefetcher.check()
        with stats.waiting():
            result = self._run_inline() if self.pool is None else self._await_ready(self.pool)
        batch = self._deliver(result)
        stats.record_batch(result.count)
        return batch

    def _deliver(self, result: BatchResult) -> Any:
        """Hand a finished slot's columns out and finish the batch."""
        return self._finish_batch(self._slot_columns(result), result.values, result.keys, result.skipped, self.next_yield)
