r"""One pass over a rank's batches: :class:`EpochLifecycle` (whatever makes the batches, image or
token rows: where it starts from the loader's state, advancing it batch by batch, finishing or
breaking off, accelerate's epoch hooks, the epoch's stats, a remote dataset's downloads ahead of
use) and :class:`Epoch`, the image path's (which shards its batches read, and the finishing of each batch: device, Normalize/ToDtype,
the outputs' shape, then ``collate_fn=`` on its samples and ``batch_map=`` on the whole batch).
Image backends subclass :class:`Epoch`, and their engines (what lasts across epochs: worker
processes, a pipeline) are :class:`Engine`\ s; on the CPU engine every kind's epoch subclasses
fastload.backends.cpu.pool_engine.PoolEpoch (an :class:`EpochLifecycle`): the image path's with
:class:`Epoch`, the token rows' alone (fastload.backends.cpu.token_epoch)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import torch

from fastload.errors import SampleError, skip_allowance
from fastload.fields import SampleSpec
from fastload.loading.batch_outputs import BatchOutputs, samples_of
from fastload.loading.field_batch import shaped_batch
from fastload.loading.frameworks import AccelerateEpoch
from fastload.loading.loader_options import LoaderOptions
from fastload.loading.loader_orders import LoaderOrders
from fastload.loading.prefetch import ShardPrefetcher, shards_in_use_order
from fastload.loading.state import LoaderState
from fastload.loading.stats import LoaderStats
from fastload.orders.position import Position
from fastload.storage.dataset import ShardedDataset
from fastload.workers.rng import batch_generator
from fastload.workers.stage_clock import StageCounters


@dataclass(frozen=True)
class EpochInputs:
    """What an epoch reads from its loader, fixed when the iterator is made."""

    dataset: ShardedDataset
    options: LoaderOptions
    sample_spec: SampleSpec  # the fields made of each sample (fields=, map=)
    image_shape: tuple[int, int, int] | None  # None: the samples hold no image
    device: torch.device | None  # device=, or the Accelerator's
    batch_fn: Callable[[torch.Tensor], torch.Tensor] | None  # Normalize/ToDtype on whole batches
    outputs: BatchOutputs
    orders: LoaderOrders
    state: LoaderState
    stats: LoaderStats
    accelerate: bool  # prepared by accelerate: report the epoch to its GradientState
    before_start: Callable[[], None]  # the loader's checks as an epoch starts (a sampler's set_epoch, ranks agree)

    @property
    def skip_limit(self) -> int:
        """The most bad samples one search for a readable sample passes: ``max_skipped`` of the dataset."""
        return skip_allowance(self.options.max_skipped, len(self.dataset))


class EpochLifecycle:
    """One pass over a rank's batches, whatever makes them (images, token rows): where it starts
    (the loader's state), its batches handed out one by one, each advancing the state, accelerate's
    epoch hooks, and the epoch's stats. Subclasses plan the batches and make them.

    Nothing is read when the iterator is made: the first ``next()`` starts the epoch (``reset``),
    taking the state's position, rank and world size then (torch's samplers are lazy alike). The
    epoch is finished once its last batch is handed out, whether or not StopIteration is reached;
    an iterator dropped or closed before that breaks it off (the next iteration starts it over).
    """

    def __init__(self, state: LoaderState, stats: LoaderStats, accelerate: bool, remote: bool,
                 before_start: Callable[[], None]) -> None:
        self.state, self.stats, self.remote, self.before_start = state, stats, remote, before_start
        self.reports_to_accelerate = accelerate  # prepared by accelerate: report the epoch to its GradientState
        self.started = self.finished = False
        self.next_yield = 0
        self.accelerate: AccelerateEpoch | None = None
        self.prefetcher: ShardPrefetcher | None = None  # a remote dataset's shards downloaded ahead of use

    def reset(self, state: LoaderState) -> None:
        """Start at ``state``'s upcoming position, which this epoch then advances batch by batch."""
        self.loader_state = state
        self.start = state.begin()
        self.epoch = self.start.epoch
        self._plan_epoch(self.start)
        self.started = True
        self.stats_token = self.stats.begin_epoch(self.epoch, self._stage_counters(), self.remote)
        if self.reports_to_accelerate:
            self.accelerate = AccelerateEpoch(self, self._remainder())

    def _plan_epoch(self, start: Position) -> None:
        """Plan this rank's batches from ``start``."""
        raise NotImplementedError

    def _has_batch(self, batch_no: int) -> bool:
        """Whether the epoch holds a batch ``batch_no`` for this rank."""
        raise NotImplementedError

    def _remainder(self) -> int:
        """The real samples in the epoch's last global batch (accelerate's ``remainder``), -1 when unknown."""
        raise NotImplementedError

    def position(self) -> Position:
        """Where this epoch is once the batches handed out so far count."""
        raise NotImplementedError

    def _stage_counters(self) -> StageCounters | None:
        """The counters this backend's workers time their stages into (None: it has none)."""
        return None

    def _start_prefetch(self) -> None:
        """For a remote dataset, start downloading this rank's shards ahead of use (a backend that reads one says how)."""

    def _next_batch(self) -> Any:
        raise NotImplementedError

    def _handed_out(self, batch: Any) -> Any:
        """The batch as the caller gets it (the image path applies ``collate_fn=`` and ``batch_map=`` here)."""
        return batch

    def __iter__(self) -> EpochLifecycle:
        return self

    def __next__(self) -> Any:
        if not self.started:
            if self.finished:  # closed before it started
                raise StopIteration
            self.before_start()
            self.reset(self.state)
        entered = time.perf_counter()
        try:
            return self._next()
        finally:
            self.stats.add_inside(time.perf_counter() - entered)
            if self.finished:  # its last batch handed out (or closed: then ended already, as broken off)
                self.stats.end_epoch(self.stats_token, complete=True)

    def _next(self) -> Any:
        if not self._has_batch(self.next_yield):
            self._finish()
            self._end_accelerate()
            raise StopIteration
        last = not self._has_batch(self.next_yield + 1)
        if last and self.accelerate is not None:
            self.accelerate.last_batch(self._remainder())  # known by now where rows are counted as they come
        batch = self._handed_out(self._next_batch())
        self.next_yield += 1
        if last:
            self._finish()  # all handed out: the next iter() starts the next epoch
        elif not self.finished:
            self.loader_state.advance(self.position())
        return batch

    def _end_accelerate(self) -> None:
        if self.accelerate is not None:
            self.accelerate.end()
            self.accelerate = None

    def _prefetch(self, dataset: ShardedDataset, shards_by_step: Iterable[np.ndarray], progress: Callable[[], int]) -> None:
        """Download ``dataset``'s remote shards ahead of use (fastload.loading.prefetch), this rank's
        ``shards_by_step`` (each step's, a batch or a window of rows, in reading order) as
        ``progress()`` (the steps dispatched so far) gets near them, until the epoch ends."""
        self.prefetcher = ShardPrefetcher(dataset, shards_in_use_order(dataset, shards_by_step), progress)

    def _stop_prefetch(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.stop()
            self.prefetcher = None

    def _finish(self) -> None:
        self._stop_prefetch()
        if not self.finished:
            self.finished = True
            self.loader_state.finish()

    def close(self) -> None:
        """Abandon the epoch (a break, an exception, the iterator dropped): like torch, the next
        iteration starts this epoch over; state_dict() still says where it stopped, so
        load_state_dict resumes there."""
        self._stop_prefetch()
        self._end_accelerate()
        if self.started and not self.finished:
            self.loader_state.break_off()
            self.stats.end_epoch(self.stats_token, complete=False)
        self.finished = True

    def __del__(self) -> None:
        if not self.finished:
            try:
                self.close()
            except Exception:
                pass


class Epoch(EpochLifecycle):
    """An image loader's pass (the CPU, DALI and hybrid backends subclass it): its batches are
    positions of the epoch's order (fastload.loading.loader_orders), a remote dataset's shards are
    downloaded ahead, and each batch is finished here (device, outputs, ``collate_fn=``, ``batch_map=``)."""

    def __init__(self, inputs: EpochInputs) -> None:
        super().__init__(inputs.state, inputs.stats, inputs.accelerate, inputs.dataset.downloads, inputs.before_start)
        self.inputs = inputs

    def _plan_epoch(self, start: Position) -> None:
        orders = self.inputs.orders
        self.plan = orders.batches(start)
        self.order = orders.order(start)
        world = self.plan.step // self.plan.batch_size
        self.skip_budget = skip_allowance(self.inputs.options.max_skipped, -(-self.plan.order_length // world))  # of this rank's epoch

    def _has_batch(self, batch_no: int) -> bool:
        return batch_no < len(self.plan)

    def _remainder(self) -> int:
        return self.inputs.orders.remainder(self.start)

    def position(self) -> Position:
        """Where this epoch is: the global samples consumed once the batches handed out so far count."""
        return replace(self.start, consumed=self.plan.consumed_after(self.next_yield))

    def _start_prefetch(self) -> None:
        """For a remote dataset (or a mixture's remote members), start downloading this rank's
        shards ahead of use."""
        dataset = self.inputs.dataset
        if dataset.downloads and len(self.plan):
            self._prefetch(dataset, (dataset.shards_of(self.indices(batch_no)) for batch_no in range(len(self.plan))), self._dispatched)

    def _dispatched(self) -> int:
        """Batches whose samples have been handed to the decoders so far."""
        return self.next_yield

    def indices(self, batch_no: int) -> np.ndarray:
        """Sample indices of batch ``batch_no``."""
        return self.order.indices(self.plan.positions(batch_no))

    def valid(self, batch_no: int) -> np.ndarray:
        """Which entries of batch ``batch_no`` are real samples (not padding)."""
        return self.plan.valid(batch_no, self.order)

    def _handed_out(self, batch: Any) -> Any:
        options = self.inputs.options
        if options.collate_fn is not None:
            batch = options.collate_fn(samples_of(batch))
        if options.batch_map is not None:
            batch = options.batch_map(batch, self._batch_generator())
        return batch

    def _batch_generator(self) -> torch.Generator:
        """``batch_map``'s generator for the batch about to be handed out, on the batch's device."""
        return batch_generator(self.inputs.options.seed, self.epoch, self.plan.global_step(self.next_yield), self.inputs.orders.ranks()[0],
                               self.inputs.device)

    def _finish_batch(self, columns: Mapping[str, torch.Tensor | np.ndarray], values: dict[str, list], keys: list[str],
                      skipped: list, batch_no: int) -> Any:
        """Move the stacked fields to ``device`` (Normalize/ToDtype on images there), count skips and
        shape the batch: ``(images, labels, ...)`` classically, else the ``fields=`` in their order."""
        inputs = self.inputs
        for where, reason in skipped:
            if inputs.stats.record_skip(where, reason) > self.skip_budget:
                self.close()
                raise SampleError(where, f"{reason}; and on_error='skip' has skipped {self.skip_budget + 1} samples this epoch, "
                                  f"more than max_skipped={inputs.options.max_skipped!r} allows ({self.skip_budget})")
        with inputs.stats.to_device():
            return shaped_batch(inputs.sample_spec, inputs.outputs, dict(columns), values, keys, self.valid(batch_no),
                                inputs.device, inputs.batch_fn)

class Engine(Protocol):
    """What makes a loader's epochs, kept across them (worker processes, a DALI pipeline) and
    closed with the loader. fastload.backends.engines makes one per loader."""

    def epoch(self, inputs: EpochInputs) -> Epoch:
        """An iterator over the next epoch's batches."""

    def close(self) -> None:
        """Stop what the engine runs and release its memory."""
