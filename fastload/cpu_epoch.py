"""The CPU path's epoch: batches split among libjpeg-turbo worker processes that write pixels into
shared batch slots, handed out in order (lent without a copy where nothing is pinned)."""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from fastload.epoch import Epoch, EpochInputs
from fastload.errors import SampleError, rebuild_error
from fastload.field_batch import as_tensor, copied
from fastload.slots import BatchBuffers, spec_columns
from fastload.state import LoaderState
from fastload.stats import StageCounters
from fastload.workers import BatchResult, WorkerConfig, WorkerError, WorkerPool, fill_fields, merge_parts

LENDABLE_SLOTS = 2  # batch slots beyond the workers' queue, for batches the caller still holds
MIN_PART = 16  # the fewest samples a worker is given of a batch


class CpuWorkers:
    """A loader's worker pool and batch slots, made on first use and kept across its epochs."""

    def __init__(self) -> None:
        self.pool: WorkerPool | None = None
        self.buffers: BatchBuffers | None = None
        self.counters: StageCounters | None = None  # the workers' (and inline work's) stage times
        self.runs = 0  # epochs started: tags worker tasks, so answers for an abandoned one are recognised

    def epoch(self, inputs: EpochInputs) -> CpuEpoch:
        """An iterator over the next epoch's batches."""
        return CpuEpoch(inputs, self)

    def ensure(self, inputs: EpochInputs) -> tuple[BatchBuffers, WorkerPool | None, StageCounters]:
        """The slots, (with num_workers > 0) the pool, started if not yet running, and the stage counters."""
        options = inputs.options
        if self.buffers is None:
            in_flight = options.num_workers * (options.prefetch_factor or 0)
            slots = in_flight + LENDABLE_SLOTS if in_flight else 1
            self.buffers = BatchBuffers(slots, options.batch_size, spec_columns(inputs.sample_spec, inputs.image_shape))
        if self.counters is None:
            self.counters = StageCounters(options.num_workers)
        if options.num_workers and self.pool is None:
            config = WorkerConfig(inputs.dataset, options.transform, options.seed, options.on_error,
                                  self.buffers, options.worker_init_fn, inputs.sample_spec, self.counters)
            self.pool = WorkerPool(config, options.num_workers)
        return self.buffers, self.pool, self.counters

    def _stop_pool(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def discard_pool(self) -> None:
        """Stop the workers after a failure: the next epoch starts fresh ones at once."""
        self._stop_pool()
        if self.buffers is not None:
            self.buffers.forget_filling()  # nobody writes into those slots any more

    def close(self) -> None:
        """Stop the workers and release the shared memory."""
        self._stop_pool()
        if self.buffers is not None:
            self.buffers.close()
            self.buffers = None


class CpuEpoch(Epoch):
    """The CPU path: dispatches batches to the workers' free slots, yields them in order."""

    def __init__(self, inputs: EpochInputs, workers: CpuWorkers) -> None:
        super().__init__(inputs)
        self.workers = workers

    def reset(self, state: LoaderState) -> None:
        """Start at ``state``'s position with the loader's workers; slots still lent or being filled
        for an abandoned epoch stay out."""
        self.buffers, self.pool, counters = self.workers.ensure(self.inputs)  # first: the epoch's stats start from its counters
        self.inline_clock = counters.clock(-1)  # num_workers=0: this process times its own stages
        super().reset(state)
        self.workers.runs += 1
        self.run = self.workers.runs
        self.buffers.reclaim()
        self.next_submit = 0
        self.parts: dict[int, list[BatchResult]] = {}  # finished parts of batches not yet whole
        self.expected_parts: dict[int, int] = {}
        self.ready: dict[int, BatchResult] = {}
        self._start_prefetch()

    def _dispatched(self) -> int:
        return self.next_submit

    def _stage_counters(self) -> StageCounters | None:
        return self.workers.counters

    def _indices(self, batch_no: int) -> np.ndarray:
        """The samples the workers make of batch ``batch_no``: all of them here."""
        return self.indices(batch_no)

    def _submit_more(self, pool: WorkerPool) -> None:
        """Give every free slot the next batch, split into one part per worker (at least
        MIN_PART samples each): all workers work on the oldest batch, so a batch, the first
        one included, is ready in 1/workers of the time, and an epoch's last batches don't
        leave workers idle."""
        workers = self.inputs.options.num_workers
        while self.next_submit < len(self.plan) and (slot := self.buffers.take()) is not None:
            indices = self._indices(self.next_submit)
            count = max(1, min(workers, len(indices) // MIN_PART))
            bounds = np.linspace(0, len(indices), count + 1).astype(int)
            self.buffers.filling[slot] = count
            for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
                pool.submit(self.run, self.next_submit, slot, self.epoch, start, indices[start:end])
            self.expected_parts[self.next_submit] = count
            self.next_submit += 1

    def _receive(self, got: BatchResult) -> None:
        """File a finished part; a batch whose parts are all in is ready."""
        parts = self.parts.setdefault(got.batch_no, [])
        parts.append(got)
        if len(parts) == self.expected_parts[got.batch_no]:
            self.ready[got.batch_no] = merge_parts(self.parts.pop(got.batch_no))
            del self.expected_parts[got.batch_no]

    def _run_inline(self) -> BatchResult:
        slot = cast(int, self.buffers.take())  # never None: the inline path copies every batch out
        indices = self._indices(self.next_yield)
        result = BatchResult(run=self.run, batch_no=self.next_yield, slot=slot, count=len(indices))
        options = self.inputs.options
        try:
            result.keys, result.skipped, result.values = fill_fields(
                self.inputs.dataset, indices, self.inputs.sample_spec, options.transform, options.seed,
                self.epoch, options.on_error, self.buffers.slot_columns(slot), self.inline_clock,
            )
        except BaseException:
            self.buffers.give_back(slot)
            raise
        return result

    def _await_ready(self, pool: WorkerPool) -> BatchResult:
        """Wait for the next batch in order; answers for an abandoned iteration free their slots."""
        self._submit_more(pool)
        while self.next_yield not in self.ready:
            try:
                got = pool.get(self.inputs.options.timeout)
            except (WorkerError, TimeoutError):
                self.workers.discard_pool()  # the next iteration starts fresh workers at once
                self.close()
                raise
            self.buffers.part_done(got.slot)
            if got.run != self.run:
                continue
            if got.error is not None:
                self.buffers.release(got.slot)
                self.close()
                if got.bad_sample is not None:
                    raise SampleError(*got.bad_sample) from WorkerError(got.error)
                if got.failure is not None:
                    raise rebuild_error(*got.failure) from WorkerError(got.error)
                raise WorkerError(got.error)
            self._receive(got)
        return self.ready.pop(self.next_yield)

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

    def _slot_columns(self, result: BatchResult) -> dict[str, Any]:
        """A finished slot's columns as tensors: lent without a copy when workers fill the slots and
        nothing is pinned; else copied (into pinned memory when asked) and the slot given back."""
        options, buffers, n = self.inputs.options, self.buffers, result.count
        keep = options.num_workers * (options.prefetch_factor or 0)  # lending never thins the workers' queue
        lent = None if options.pin_memory or self.pool is None else buffers.lend(result.slot, n, keep=keep)
        if lent is not None:
            # per-sample scalars (labels) are copied: a caller keeping them must not keep the slot
            return {name: as_tensor(view if view.ndim > 1 else view.copy()) for name, view in lent.items()}
        columns = {c.name: copied(buffers.column(result.slot, c.name)[:n], options.pin_memory) for c in buffers.columns}
        buffers.give_back(result.slot)
        return columns

    def close(self) -> None:
        """Abandon the epoch: batches in flight are not waited for; their slots come back as the
        workers' answers arrive (recognised by the run they were asked for)."""
        if self.started and not self.finished:
            for slot in list(self.buffers.filling):
                self.buffers.release(slot)
            for batch in self.ready.values():
                self.buffers.release(batch.slot)
            for parts in self.parts.values():
                self.buffers.release(parts[0].slot)
            self.ready.clear()
            self.parts.clear()
            self.expected_parts.clear()
        super().close()
