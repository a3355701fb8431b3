"""What an epoch's order and a rank's batches depend on, as plain values (:class:`OrderSpec`): the
loader computes its orders from one, and a worker process (DALI's parallel source) given a copy
computes exactly the same order."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from fastload.orders.balanced import BalancedOrder, ClassMembers
from fastload.orders.epoch_order import EpochOrder, Selection
from fastload.orders.global_order import global_order
from fastload.orders.position import ResumedFrom
from fastload.orders.rank_batches import RankBatches, rank_batches
from fastload.orders.streaming import shard_groups, streaming_order, unseen_groups


@dataclass(frozen=True)
class OrderSpec:
    """Everything an epoch's order and a rank's batches depend on, as plain values: a worker
    process (DALI's parallel source) computes from it exactly the order the loader computes."""

    shard_sizes: tuple[int, ...]
    seed: int
    shuffle: bool
    batch_size: int
    rank: int
    world_size: int
    drop_last: bool
    streaming: bool = False
    shuffle_buffer: int = 1
    resumed_from: tuple[ResumedFrom, ...] = ()  # (world, batch, consumed) where this epoch was left for another topology
    take: tuple[int, ...] | None = None  # the sample indices of a Subset, in its order; None: every sample
    drop_remainder: bool = False  # as DistributedSampler(drop_last=True): no padding to a multiple of the world size
    excluded: tuple[int, ...] = ()  # sample indices left out of every epoch (exclude=), sorted
    class_weights: tuple[float, ...] | None = None  # each present class's share of an epoch (the class-balanced order's ClassMembers.labels)
    ramp: bool = False  # the streaming order's first windows of each lane smaller (data read in place: fastload.orders.streaming.Lane)

    def selection(self) -> Selection:
        """The samples the orders draw from."""
        return Selection(sum(self.shard_sizes), self.take, self.excluded)

    def order(self, epoch: int, classes: ClassMembers | None = None) -> EpochOrder:
        """The epoch's order: global, class-balanced (``classes``: the selection's samples by label)
        or streaming (re-dealt after each earlier topology's consumed part)."""
        selection = self.selection()
        if self.streaming:
            return self._streaming(epoch, selection)
        if self.class_weights is not None:
            if classes is None:
                raise ValueError("the class-balanced order needs the samples grouped by label")
            return BalancedOrder(classes, self.class_weights, self.seed, epoch, self._cut(len(classes.members)))
        return global_order(selection, self.seed, epoch, self.shuffle, self._cut(len(selection)))

    def _cut(self, size: int) -> int:
        return size - size % self.world_size if self.drop_remainder else size

    def _streaming(self, epoch: int, selection: Selection) -> EpochOrder:
        starts = selection.ranks_from(np.cumsum([0, *self.shard_sizes]))  # each shard's first rank
        groups = shard_groups(starts, self.seed, epoch, self.shuffle)
        topologies = [*self.resumed_from, (self.world_size, self.batch_size, 0)]
        for redeal, (world, batch, consumed) in enumerate(topologies):
            streamed = streaming_order(groups, world, batch, self.shuffle_buffer, self.drop_last, self.seed, epoch,
                                       selection, redeal, self.ramp)
            if redeal < len(self.resumed_from):
                groups = unseen_groups(streamed, consumed, starts)
        return streamed

    def at_topology(self, world_size: int, batch_size: int, resumed_from: tuple[ResumedFrom, ...], rank: int | None = None) -> OrderSpec:
        """This spec at another topology (world and batch size; the topologies the epoch was resumed from, which
        only the streaming order depends on), for another ``rank`` if given."""
        return replace(self, world_size=world_size, batch_size=batch_size, rank=self.rank if rank is None else rank,
                       resumed_from=resumed_from if self.streaming else ())

    def batches(self, order_length: int, start: int) -> RankBatches:
        """This rank's batches of an order of ``order_length`` positions, from position ``start``
        (with ``drop_remainder``, a start past this topology's cut, saved at another world size,
        finds the epoch over)."""
        if self.drop_remainder:
            start = min(start, order_length)
        return rank_batches(order_length, start, self.batch_size, self.rank, self.world_size, self.drop_last)
