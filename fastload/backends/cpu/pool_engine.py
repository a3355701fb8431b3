"""The CPU engine, one for every kind of batch: batches made by the forked worker pool
(fastload.workers.pool) into shared batch slots, handed out in order (lent without a copy where
nothing is pinned), or made in the training process with ``num_workers=0``.

:class:`CpuWorkers` is what lasts across a loader's epochs (the pool, its slots, the stage counters,
the batches made ahead); :class:`PoolEpoch` is one pass on it: the dispatch of batches to free
slots, their collection in order, the run-ahead, the failures. A kind of batch subclasses
:class:`PoolEpoch` with what differs: the workers it needs (:class:`WorkerSetup`: the slot columns
and the job that fills them), the work of its batch b, that work split into parts for the workers,
and how a finished slot becomes the batch handed out (samples: fastload.backends.cpu.cpu_epoch;
token rows: fastload.backends.cpu.token_epoch).

Workers run ahead across an epoch's end: once this epoch's last batch is handed out, the next
epoch's first batch is submitted (its work from ``Position(epoch + 1)``, where a finished epoch
leaves the loader, at this rank and world size), so it is being made while the caller finishes the
epoch (a validation pass, a checkpoint). The next iteration adopts it when it starts exactly there
and its first batch is the same work, and its stage stats then count from when that work began;
anything else (set_epoch, load_state_dict, a break, another topology) discards it, so order,
resume and each epoch's stats are those of a loader that never ran ahead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from fastload.loading.epoch import EpochLifecycle
from fastload.loading.field_batch import as_tensor, copied
from fastload.loading.loader_options import LoaderOptions
from fastload.loading.state import LoaderState
from fastload.loading.stats import LoaderStats
from fastload.orders.position import Position
from fastload.storage.dataset import ShardedDataset
from fastload.workers.pool import BatchResult, WorkerError, WorkerJob, WorkerPool, merge_parts, raise_failure
from fastload.workers.slots import BatchBuffers, Column
from fastload.workers.stage_clock import StageCounters

LENDABLE_SLOTS = 2  # batch slots beyond the workers' queue, for batches the caller still holds
# The next epoch's batches made ahead: one has the first batch ready as the next iteration starts
# (it submits the rest then) and wastes at most one batch after the last epoch.
RUN_AHEAD_BATCHES = 1


@dataclass
class Dispatch:
    """The batches of one run (an iteration, or the next epoch's run-ahead) in the workers' hands:
    the tag its tasks carry, the next batch to submit, the slot of each batch submitted and not yet
    handed out, the finished parts of batches not yet whole, and the whole ones."""

    run: int
    next_submit: int = 0
    slots: dict[int, int] = field(default_factory=dict)  # batch number -> its slot
    expected_parts: dict[int, int] = field(default_factory=dict)
    parts: dict[int, list[BatchResult]] = field(default_factory=dict)
    ready: dict[int, BatchResult] = field(default_factory=dict)

    def submit(self, pool: WorkerPool, buffers: BatchBuffers, slot: int, epoch: int, parts: list[tuple[int, int, Any]]) -> None:
        """Give batch ``next_submit`` to the workers in ``slot``, as ``parts`` (each its first row,
        its rows and their work), which any free worker takes."""
        buffers.start_filling(slot, len(parts))
        for start, count, work in parts:
            pool.submit(self.run, self.next_submit, slot, epoch, start, count, work)
        self.expected_parts[self.next_submit] = len(parts)
        self.slots[self.next_submit] = slot
        self.next_submit += 1

    def receive(self, got: BatchResult) -> None:
        """File a finished part; a batch whose parts are all in is ready."""
        parts = self.parts.setdefault(got.batch_no, [])
        parts.append(got)
        if len(parts) == self.expected_parts[got.batch_no]:
            self.ready[got.batch_no] = merge_parts(self.parts.pop(got.batch_no))
            del self.expected_parts[got.batch_no]

    def wait(self, pool: WorkerPool, buffers: BatchBuffers, batch_no: int, timeout: float) -> BatchResult:
        """Collect the workers' answers until batch ``batch_no`` is whole, and take it; answers for
        an abandoned run free their slots. A failed part comes back as it is (the caller raises
        its error); a dead worker or the timeout raise from the pool."""
        while batch_no not in self.ready:
            got = pool.get(timeout)
            buffers.part_done(got.slot)
            if got.run != self.run:
                continue
            if got.error is not None:
                return got
            self.receive(got)
        return self.take(batch_no)

    def take(self, batch_no: int) -> BatchResult:
        """Batch ``batch_no``, ready: it leaves the run (its slot is the caller's now)."""
        del self.slots[batch_no]
        return self.ready.pop(batch_no)

    def release(self, buffers: BatchBuffers) -> None:
        """Nobody will take this run's batches: their slots are free now, or once the workers writing them are done."""
        for slot in self.slots.values():
            buffers.release(slot)
        self.slots.clear()
        self.expected_parts.clear()
        self.parts.clear()
        self.ready.clear()


Parts = list[tuple[int, int, Any]]  # a batch's parts for the workers: each its first row, its rows and their work


def same_work(got: Any, submitted: Any) -> bool:
    """Whether a batch's work (an image batch's sample indices, a token batch's rows) is the one submitted."""
    return got is not None and (np.array_equal(got, submitted) if isinstance(submitted, np.ndarray) else got == submitted)


@dataclass
class RunAhead:
    """The next epoch's first batches, submitted as this epoch ended, with each one's work (an image
    batch's sample indices; a token batch's first row, rows and cursor), checked on adoption."""

    start: Position  # where the next iteration must start to adopt them
    dispatch: Dispatch
    since: np.ndarray  # the workers' stage counters when they were submitted: the adopting epoch counts from there
    submitted: list[Any] = field(default_factory=list)  # each batch's work

    def fits(self, start: Position, work: Callable[[int], Any]) -> bool:
        """Whether these are the first batches of an epoch from ``start`` whose batch b is ``work(b)`` (None: it has none)."""
        return start == self.start and all(same_work(work(batch_no), done) for batch_no, done in enumerate(self.submitted))




class PoolInputs(Protocol):
    """What a :class:`PoolEpoch` reads from its inputs (each kind's have more)."""

    @property
    def dataset(self) -> ShardedDataset: ...

    @property
    def options(self) -> LoaderOptions: ...

    @property
    def stats(self) -> LoaderStats: ...


@dataclass(frozen=True)
class WorkerSetup:
    """A kind of batch's workers, as :meth:`CpuWorkers.ensure` makes them: the slot columns, the job
    that fills a slot (given the slots and the stage counters), and whether ``num_workers=0`` fills
    a slot in this process too (else that kind makes arrays of its own)."""

    columns: Callable[[], Sequence[Column]]
    job: Callable[[BatchBuffers, StageCounters], WorkerJob]
    fills_inline: bool


InputsT = TypeVar("InputsT", bound=PoolInputs)
EpochT = TypeVar("EpochT", bound="PoolEpoch")


class CpuWorkers(Generic[InputsT, EpochT]):
    """The CPU engine: what a loader keeps across its epochs on the worker pool, whatever its kind
    of batch (samples, token rows): the pool and its batch slots (made by :meth:`ensure` as the
    epoch's kind says), the stage counters, the runs' tags, and the next epoch's first batches made
    ahead. Its epochs are ``make_epoch(inputs, self)`` (the ``Engine`` protocol's ``epoch``)."""

    def __init__(self, make_epoch: Callable[[InputsT, CpuWorkers[InputsT, EpochT]], EpochT]) -> None:
        self.make_epoch = make_epoch
        self.pool: WorkerPool | None = None
        self.buffers: BatchBuffers | None = None
        self.counters: StageCounters | None = None  # the workers' (and inline work's) stage times
        self.runs = 0  # runs started (epochs, run-aheads): tags worker tasks, so answers for an abandoned one are recognised
        self._run_ahead: RunAhead | None = None  # the next epoch's first batches, made before it starts

    def epoch(self, inputs: InputsT) -> EpochT:
        """An iterator over the next epoch's batches."""
        return self.make_epoch(inputs, self)

    def ensure(self, options: LoaderOptions, setup: WorkerSetup) -> tuple[BatchBuffers | None, WorkerPool | None, StageCounters]:
        """The slots (with num_workers > 0, or where ``setup`` fills one in this process too), with
        num_workers > 0 the pool, started if not yet running, and the stage counters."""
        if self.buffers is None and (options.num_workers or setup.fills_inline):
            in_flight = options.num_workers * (options.prefetch_factor or 0)
            slots = in_flight + LENDABLE_SLOTS if in_flight else 1
            self.buffers = BatchBuffers(slots, options.batch_size, setup.columns())
        if self.counters is None:
            self.counters = StageCounters(options.num_workers)
        if options.num_workers and self.pool is None:
            assert self.buffers is not None  # made above: workers fill slots
            self.pool = WorkerPool(setup.job(self.buffers, self.counters), options.num_workers)
        return self.buffers, self.pool, self.counters

    def new_run(self) -> Dispatch:
        """A run under a tag of its own."""
        self.runs += 1
        return Dispatch(self.runs)

    def start_run(self, start: Position, work: Callable[[int], Any], stats: LoaderStats, stats_token: object) -> tuple[Dispatch, object]:
        """An epoch from ``start`` (whose batch b is ``work(b)``, None past its end) starts: its run is
        the batches made ahead when they are its first ones (its stats ``stats_token`` then count from
        when that work began: the token returned), else a new one (those made ahead are discarded).
        Slots still lent or being filled for an abandoned run stay out."""
        ahead, self._run_ahead = self._run_ahead, None
        if ahead is not None and self.buffers is not None and ahead.fits(start, work):
            dispatch, stats_token = ahead.dispatch, stats.count_from(stats_token, ahead.since)
        else:
            if ahead is not None and self.buffers is not None:
                ahead.dispatch.release(self.buffers)
            dispatch = self.new_run()
        if self.buffers is not None:
            self.buffers.reclaim(held=dispatch.slots.values())
        return dispatch, stats_token

    def run_ahead(self, start: Position, works: list[Any], parts: Callable[[Any], Parts]) -> None:
        """Give free slots the next epoch's first RUN_AHEAD_BATCHES batches (``works``: its first
        batches' work, ``parts(work)``: as the workers take it), for the next iteration from ``start``
        to adopt or discard."""
        pool, buffers, counters = self.pool, self.buffers, self.counters
        assert pool is not None and buffers is not None and counters is not None  # the epoch ending ran on them
        ahead = self._run_ahead = RunAhead(start, self.new_run(), counters.snapshot())
        for work in works[:RUN_AHEAD_BATCHES]:
            if (slot := buffers.take()) is None:
                break
            ahead.submitted.append(work)
            ahead.dispatch.submit(pool, buffers, slot, start.epoch, parts(work))

    def _stop_pool(self) -> None:
        self._run_ahead = None
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


class PoolEpoch(EpochLifecycle, Generic[InputsT]):
    """One pass on the CPU engine, whatever its kind of batch: the work of batch b (``_work(b)``),
    split into parts (``_parts``), goes to the workers' free slots in order and comes back in order;
    as its last batch is handed out, the next epoch's first batches are submitted. A subclass plans
    the epoch (EpochLifecycle), names its workers (``_setup``) and its batches' work, and makes the
    batch handed out from a finished slot (or in this process with ``num_workers=0``)."""

    RUNS_AHEAD = True  # submit the next epoch's first batches as this one's last is handed out
    inputs: InputsT
    workers: CpuWorkers[Any, Any]

    def reset(self, state: LoaderState) -> None:
        """Start at ``state``'s position with the loader's workers, adopting the batches made ahead
        for it; slots still lent or being filled for an abandoned run stay out."""
        self.buffers, self.pool, counters = self.workers.ensure(self.inputs.options, self._setup())  # first: the epoch's stats start from its counters
        self.inline_clock = counters.clock(-1)  # num_workers=0: this process times its own stages
        super().reset(state)
        self.dispatch, self.stats_token = self.workers.start_run(self.start, self._work_of, self.inputs.stats, self.stats_token)
        self._start_prefetch()

    def _setup(self) -> WorkerSetup:
        """The workers this kind of batch needs."""
        raise NotImplementedError

    def _work(self, batch_no: int) -> Any:
        """What the workers make of batch ``batch_no`` of this epoch."""
        raise NotImplementedError

    def _parts(self, work: Any) -> Parts:
        """A batch's ``work`` as the workers take it: parts, each its first row, its rows and their work."""
        raise NotImplementedError

    def _next_works(self, start: Position) -> list[Any]:
        """The work of the first (at most RUN_AHEAD_BATCHES) batches of the epoch from ``start``, at this rank and world size."""
        raise NotImplementedError

    @property
    def run(self) -> int:
        """The tag of this epoch's worker tasks."""
        return self.dispatch.run

    def _work_of(self, batch_no: int) -> Any | None:
        """Batch ``batch_no``'s work, None past the epoch's end."""
        return self._work(batch_no) if self._has_batch(batch_no) else None

    def _dispatched(self) -> int:
        """Batches given to the workers (or made here) so far."""
        return self.next_yield if self.pool is None else self.dispatch.next_submit

    def _stage_counters(self) -> StageCounters | None:
        return self.workers.counters

    def _submit_more(self, pool: WorkerPool, buffers: BatchBuffers) -> None:
        """Give every free slot the next batch of the epoch."""
        dispatch = self.dispatch
        while self._has_batch(dispatch.next_submit) and (slot := buffers.take()) is not None:
            dispatch.submit(pool, buffers, slot, self.epoch, self._parts(self._work(dispatch.next_submit)))

    def _await_ready(self, pool: WorkerPool) -> BatchResult:
        """The next batch in order, from the workers (more batches submitted first); a failure closes the epoch and raises."""
        buffers = self.buffers
        assert buffers is not None  # a pool fills slots
        self._submit_more(pool, buffers)
        try:
            got = self.dispatch.wait(pool, buffers, self.next_yield, self.inputs.options.timeout)
        except (WorkerError, TimeoutError):
            self.workers.discard_pool()  # the next iteration starts fresh workers at once
            self.close()
            raise
        if got.error is not None:
            self.close()
            raise_failure(got)
        return got

    def _slot_columns(self, result: BatchResult) -> dict[str, Any]:
        """A finished slot's columns as tensors: lent without a copy when workers fill the slots and
        nothing is pinned; else copied (into pinned memory when asked) and the slot given back."""
        options, buffers, n = self.inputs.options, self.buffers, result.count
        assert buffers is not None  # the batch was made in a slot
        keep = options.num_workers * (options.prefetch_factor or 0)  # lending never thins the workers' queue
        lent = None if options.pin_memory or self.pool is None else buffers.lend(result.slot, n, keep=keep)
        if lent is not None:
            # per-sample scalars (labels) are copied: a caller keeping them must not keep the slot
            return {name: as_tensor(view if view.ndim > 1 else view.copy()) for name, view in lent.items()}
        columns = {c.name: copied(buffers.column(result.slot, c.name)[:n], options.pin_memory) for c in buffers.columns}
        buffers.give_back(result.slot)
        return columns

    def __next__(self) -> Any:
        batch = super().__next__()
        if self.finished and self.RUNS_AHEAD and self.pool is not None and not self.inputs.dataset.downloads:
            # after the epoch's stats ended; remote shards (a mixture's remote members too) are fetched for the epoch that reads them
            start = Position(self.epoch + 1)  # where LoaderState.finish() leaves the next iteration
            self.workers.run_ahead(start, self._next_works(start), self._parts)
        return batch

    def close(self) -> None:
        """Abandon the epoch: batches in flight are not waited for; their slots come back as the
        workers' answers arrive (recognised by the run they were asked for)."""
        if self.started and not self.finished and self.buffers is not None:
            self.dispatch.release(self.buffers)
        super().close()
