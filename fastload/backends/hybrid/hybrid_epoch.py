"""The hybrid backend's epoch: every batch split between DALI (its first samples) and the CPU workers
(the rest) in proportion to the two engines' measured rates (fastload.backends.hybrid.split), in the same
order, with the same crop plans and the same position as either engine alone."""

from __future__ import annotations

import math
import time
from typing import Any, cast

import numpy as np
import torch

from fastload.backends.cpu.cpu_epoch import CpuEpoch
from fastload.backends.cpu.pool_engine import CpuWorkers
from fastload.backends.dali.dali_epoch import DaliBatches, DaliPipeline, as_tensors
from fastload.backends.dali.shares import DaliShares
from fastload.backends.hybrid.split import SplitController
from fastload.loading.epoch import EpochInputs
from fastload.loading.state import LoaderState
from fastload.workers.pool import WorkerPool

PIPELINE_AHEAD = 3  # batches DALI's pipeline runs beyond its feed's prefetch queue (its own queue, plus one)
FEED_WORKERS_PER_CPU_WORKER = 4  # DALI's feed only reads and plans (~35 us a sample): a process per 4 decoders


class HybridEngine:
    """A loader's two engines, kept across its epochs: the CPU workers and DALI's pipeline, the
    split controller (its rates carry over from epoch to epoch) and the shares DALI's feed reads."""

    def __init__(self, gpu: bool, num_workers: int, rates: tuple[float, float] | None = None) -> None:
        self.cpu = CpuWorkers(CpuEpoch)
        self.dali = DaliPipeline(gpu, feed_workers=math.ceil(num_workers / FEED_WORKERS_PER_CPU_WORKER))
        self.split = SplitController(*rates) if rates is not None else SplitController()
        self.shares: DaliShares | None = None

    def epoch(self, inputs: EpochInputs) -> HybridEpoch:
        """An iterator over the next epoch's batches."""
        return HybridEpoch(inputs, self)

    def shares_for(self, batches: int) -> DaliShares:
        """The shares table, large enough for an epoch of ``batches`` batches."""
        if self.shares is None or self.shares.capacity < batches:
            if self.shares is not None:
                self.shares.close()
            self.shares = DaliShares(batches)
        return self.shares

    def close(self) -> None:
        """Stop both engines and remove the shares table."""
        self.cpu.close()
        self.dali.close()
        if self.shares is not None:
            self.shares.close()
            self.shares = None


class HybridEpoch(CpuEpoch):
    """One pass in which DALI decodes each batch's first ``shares`` samples and the CPU workers the
    rest, joined in order. Shares are published ahead of both engines (DALI's feed waits for a
    share not yet published), from the controller's rates at the time."""

    RUNS_AHEAD = False  # the next epoch's CPU share is decided by the split as its batches come

    def __init__(self, inputs: EpochInputs, engine: HybridEngine) -> None:
        super().__init__(inputs, engine.cpu)
        self.engine = engine

    def reset(self, state: LoaderState) -> None:
        """Start at ``state``'s position with both engines; the first shares are published before
        DALI's feed asks for them."""
        super().reset(state)
        self.shares = self.engine.shares_for(len(self.plan))
        decoder = self.engine.dali.ensure(self.inputs)
        self.dali = DaliBatches(self, decoder, self.shares)
        if not decoder.carries_on(self.dali.feed):
            decoder.close()  # before the shares change under its workers
        self.shares.clear()
        self.published = 0
        self.ahead = max(2, decoder.workers) + PIPELINE_AHEAD
        self._publish_through(self.ahead)
        self.dali.start()
        self.last_ready: float | None = None

    def _publish_through(self, batch_no: int) -> None:
        """Decide DALI's share of every batch up to ``batch_no`` not decided yet."""
        last = min(batch_no, len(self.plan) - 1)
        while self.published <= last:
            self.shares.publish(self.published, self.engine.split.dali_count(len(self.plan.positions(self.published))))
            self.published += 1

    def _dali_count(self, batch_no: int) -> int:
        self._publish_through(batch_no)
        return int(self.shares.published(batch_no) or 0)  # published just above

    def _work(self, batch_no: int) -> np.ndarray:
        """The CPU workers' part of the batch: what DALI leaves."""
        return self.indices(batch_no)[self._dali_count(batch_no) :]

    def _next_batch(self) -> Any:
        stats, batch_no = self.inputs.stats, self.next_yield
        if self.prefetcher is not None:
            self.prefetcher.check()
        self._publish_through(batch_no + self.ahead)
        dali_indices = self.indices(batch_no)[: self._dali_count(batch_no)]
        with stats.waiting():
            began = time.perf_counter()
            try:
                dali_columns, dali_values, keys, skipped = self.dali.next(batch_no, dali_indices)
            except BaseException:
                self.close()
                raise
            got_dali = time.perf_counter()
            result = self._await_ready(cast(WorkerPool, self.pool))  # there is one: options refuse hybrid without workers
            ready = time.perf_counter()
        if self.last_ready is not None:
            self.engine.split.observe(len(dali_indices), result.count, got_dali - began, ready - got_dali, ready - self.last_ready)
        self.last_ready = ready
        columns = join_columns(as_tensors(dali_columns), self._slot_columns(result))
        values = {name: dali_values.get(name, []) + result.values.get(name, []) for name in {*dali_values, *result.values}}
        batch = self._finish_batch(columns, values, keys + result.keys, skipped + result.skipped, batch_no)
        stats.record_batch(len(keys) + result.count)
        return batch


def join_columns(first: dict[str, Any], rest: dict[str, Any]) -> dict[str, Any]:
    """Each stacked column's rows of ``first`` then ``rest``, on ``first``'s device (DALI's images
    may be CUDA tensors; the CPU part is copied there)."""
    joined: dict[str, Any] = {}
    for name, head in first.items():
        tail = rest[name]
        if isinstance(head, torch.Tensor) and isinstance(tail, torch.Tensor):
            joined[name] = torch.cat([head, tail.to(head.device, non_blocking=True)])
        else:  # a dtype torch lacks stays numpy on both sides
            joined[name] = np.concatenate([np.asarray(head), np.asarray(tail)])
    return joined
