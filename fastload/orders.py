"""A loader's epoch orders and this rank's batches at any training position: pure functions of
the options, the dataset's shard sizes, rank and world size (read when asked) and the position.
:class:`OrderSpec` holds them as plain values; :class:`LoaderOrders` is one loader's."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fastload.balance import BalancedOrder, ClassMembers, class_members, class_weight_vector
from fastload.dataset import ShardedDataset
from fastload.dist import resolve_rank_world
from fastload.options import LoaderOptions
from fastload.sampling import EpochOrder, RankBatches, Selection, global_order, rank_batches
from fastload.state import Layout, Position
from fastload.streaming import shard_groups, streaming_order, unseen_groups


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
    generations: tuple[Layout, ...] = ()  # (world, batch, consumed) of earlier layouts this epoch
    take: tuple[int, ...] | None = None  # the sample indices of a Subset, in its order; None: every sample
    drop_remainder: bool = False  # as DistributedSampler(drop_last=True): no padding to a multiple of the world size
    excluded: tuple[int, ...] = ()  # sample indices left out of every epoch (exclude=), sorted
    class_weights: tuple[float, ...] | None = None  # each label's share of an epoch (the class-balanced order)

    def selection(self) -> Selection:
        """The samples the orders draw from."""
        return Selection(sum(self.shard_sizes), self.take, self.excluded)

    def order(self, epoch: int, classes: ClassMembers | None = None) -> EpochOrder:
        """The epoch's order: global, class-balanced (``classes``: the selection's samples by label)
        or streaming (re-dealt after each earlier layout's consumed part)."""
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
        layouts = [*self.generations, (self.world_size, self.batch_size, 0)]
        for generation, (world, batch, consumed) in enumerate(layouts):
            streamed = streaming_order(groups, world, batch, self.shuffle_buffer, self.drop_last, self.seed, epoch,
                                       selection, generation)
            if generation < len(self.generations):
                groups = unseen_groups(streamed, consumed, starts)
        return streamed

    def batches(self, order_length: int, start: int) -> RankBatches:
        """This rank's batches of an order of ``order_length`` positions, from position ``start``."""
        return rank_batches(order_length, start, self.batch_size, self.rank, self.world_size, self.drop_last)


def read_exclude(exclude: Sequence[str] | str | os.PathLike[str]) -> list[str]:
    """The keys of ``exclude=``: a sequence of keys, or a path to a UTF-8 file of one key per line
    (as ``fastload overlap --write-exclude`` writes; blank lines ignored)."""
    if not isinstance(exclude, (str, os.PathLike)):
        return [str(key) for key in exclude]
    path = Path(exclude)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"exclude=: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"exclude=: {path} is not UTF-8 text (one key per line)") from None
    return [line for line in text.splitlines() if line]


def excluded_indices(dataset: ShardedDataset, exclude: Sequence[str] | str | os.PathLike[str] | None) -> tuple[int, ...] | None:
    """The sorted sample indices of ``exclude=``'s keys; a key the dataset lacks is refused by name."""
    if exclude is None:
        return None
    try:
        indices = dataset.indices_of(read_exclude(exclude))
    except KeyError as exc:
        raise KeyError(f"exclude= names key {exc.args[0]!r}, which {dataset.location} does not hold") from None
    return tuple(np.unique(indices).tolist())


class LoaderOrders:
    """The orders of one loader, the current epoch's cached (every backend and the sampler views
    read the same one)."""

    def __init__(self, dataset: ShardedDataset, options: LoaderOptions) -> None:
        self.shard_sizes = tuple(shard.samples for shard in dataset.index.shards)
        self.options = options
        self._cached: tuple[tuple[int, OrderSpec], EpochOrder] | None = None
        self.classes: ClassMembers | None = None  # the class-balanced order's samples by label
        self.class_weights: tuple[float, ...] | None = None
        if options.balanced or options.class_weights is not None:
            labels = dataset.sample_labels()
            count = len(dataset.classes) if dataset.classes is not None else int(labels.max(initial=-1)) + 1
            self.classes = class_members(labels, self._spec(0, 1, ()).selection(), count)
            self.class_weights = class_weight_vector(options.class_weights, self.classes.counts, dataset.classes)

    def ranks(self) -> tuple[int, int]:
        """(rank, world size): rank=/world_size=, a DistributedSampler's, the process group's, the launcher's."""
        return resolve_rank_world(self.options.rank, self.options.world_size)

    def spec(self, generations: tuple[Layout, ...] = ()) -> OrderSpec:
        """What the orders depend on, as plain values (DALI's workers get a copy)."""
        return self._spec(*self.ranks(), generations)

    def _spec(self, rank: int, world: int, generations: tuple[Layout, ...]) -> OrderSpec:
        options = self.options
        return OrderSpec(
            self.shard_sizes, options.seed, options.shuffle, options.batch_size, rank, world,
            options.drop_last, options.streaming, options.buffer_size, generations, options.take, options.drop_remainder,
            options.exclude or (), self.class_weights,
        )

    def order(self, position: Position) -> EpochOrder:
        """The order of the position's epoch (the same for every backend)."""
        spec = self.spec(position.generations)
        if self._cached is None or self._cached[0] != (position.epoch, spec):
            self._cached = ((position.epoch, spec), spec.order(position.epoch, self.classes))
        return self._cached[1]

    def batches(self, position: Position) -> RankBatches:
        """This rank's batches from the position to the end of its epoch."""
        return self.spec(position.generations).batches(len(self.order(position)), position.consumed)

    def remainder(self, position: Position) -> int:
        """Real samples in the epoch's last global batch, as accelerate's ``remainder``: 0 when
        every global batch is full, -1 when padding is not at the end (the streaming order)."""
        if self.options.streaming:
            return -1
        if self.options.drop_last:
            return 0
        return len(self.order(position)) % self.batches(position).step
