"""A rank's batches of an epoch: the order consumed in global steps of ``world_size * batch_size``
positions, rank r taking the r-th slice of each, every rank the same number of batches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastload.orders.epoch_order import EpochOrder


@dataclass(frozen=True)
class RankBatches:
    """The batches of one rank for the rest of an epoch, as positions into the epoch's order,
    computed per batch: ``full`` batches of ``batch_size``, then (``share`` > 0) one of ``share``
    covering the order's tail, padded with positions from its start where the ranks' shares differ."""

    start: int  # global position this plan starts at (samples already consumed)
    step: int  # global samples consumed per batch (world_size * batch_size)
    end: int  # global position after the last batch
    batch_size: int
    rank: int
    order_length: int
    full: int  # full batches
    share: int = 0  # size of the last, smaller batch; 0: none
    first_step: int | None = None  # the epoch's global step of batch 0 (EpochSegments.current); None: start // step, no elastic resume

    def __len__(self) -> int:
        return self.full + (self.share > 0)

    def _tail(self) -> np.ndarray:
        tail_start = self.start + self.full * self.step
        return np.arange(tail_start + self.rank * self.share, tail_start + (self.rank + 1) * self.share, dtype=np.int64)

    def positions(self, batch_no: int) -> np.ndarray:
        """Order positions of batch ``batch_no``."""
        if not 0 <= batch_no < len(self):
            raise IndexError(f"batch {batch_no} of {len(self)}")
        if batch_no < self.full:
            first = self.start + batch_no * self.step + self.rank * self.batch_size
            return np.arange(first, first + self.batch_size, dtype=np.int64)
        positions, tail_start = self._tail(), self.start + self.full * self.step
        return np.where(positions < self.order_length, positions, positions - tail_start) % self.order_length

    def valid(self, batch_no: int, order: EpochOrder | None = None) -> np.ndarray:
        """Which entries of batch ``batch_no`` are real samples: not this plan's padding, nor (given the
        epoch's ``order``) the order's own (``EpochOrder.valid``)."""
        valid = self._tail() < self.order_length if batch_no == self.full and self.share else np.ones(self.batch_size, dtype=bool)
        if order is not None and (real := order.valid(self.positions(batch_no))) is not None:
            valid = valid & real
        return valid

    def global_step(self, batch_no: int) -> int:
        """The epoch's global step of batch ``batch_no`` as ``describe``, ``batch_map``'s generator and the samplers'
        batches number it: :attr:`first_step` (else the steps of this plan's size before it), then its batches."""
        return (self.start // self.step if self.first_step is None else self.first_step) + batch_no

    def consumed_after(self, batches_done: int) -> int:
        """Global samples consumed once ``batches_done`` of these batches were handed out."""
        if batches_done >= len(self):
            return self.end
        return self.start + batches_done * self.step


def rank_batches(
    num_samples: int, start: int, batch_size: int, rank: int, world_size: int, drop_last: bool
) -> RankBatches:
    """Split order positions ``[start, num_samples)`` into this rank's batches.

    Every rank gets the same number of batches (so collective operations never wait for a rank
    that has finished). The tail that does not fill a global step is dropped with ``drop_last``;
    otherwise one more, smaller batch per rank covers it, padded with samples from the start of
    the order when the ranks' shares would be unequal; ``RankBatches.valid`` marks the padding.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    if not 0 <= start <= num_samples:
        raise ValueError(f"resume position {start} is outside the epoch's {num_samples} samples")
    step = batch_size * world_size
    full = (num_samples - start) // step
    tail_start = start + full * step
    tail = num_samples - tail_start
    if tail and not drop_last:
        share = -(-tail // world_size)  # ceil: every rank gets the same count
        return RankBatches(start, step, num_samples, batch_size, rank, num_samples, full, share)
    return RankBatches(start, step, tail_start, batch_size, rank, num_samples, full)
