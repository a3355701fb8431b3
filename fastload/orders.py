"""A loader's epoch orders and this rank's batches at any training position: pure functions of
the options, the dataset's shard sizes, rank and world size (read when asked) and the position."""

from __future__ import annotations

from fastload.dataset import ShardedDataset
from fastload.dist import resolve_rank_world
from fastload.mixture import MixedDataset
from fastload.mixture_order import MemberPosition, MixtureOrder
from fastload.options import LoaderOptions
from fastload.sampling import EpochOrder, OrderSpec, RankBatches
from fastload.state import Layout, Position


class LoaderOrders:
    """The orders of one loader, the current epoch's cached (every backend and the sampler views
    read the same one)."""

    def __init__(self, dataset: ShardedDataset, options: LoaderOptions) -> None:
        self.shard_sizes = tuple(shard.samples for shard in dataset.index.shards)
        self.options = options
        self.mixture = dataset if isinstance(dataset, MixedDataset) else None
        if self.mixture is not None:
            refuse_for_mixture(options)
        self._cached: tuple[tuple[int, OrderSpec | MixtureOrder], EpochOrder] | None = None

    def ranks(self) -> tuple[int, int]:
        """(rank, world size): rank=/world_size=, a DistributedSampler's, the process group's, the launcher's."""
        return resolve_rank_world(self.options.rank, self.options.world_size)

    def spec(self, generations: tuple[Layout, ...] = ()) -> OrderSpec | MixtureOrder:
        """What the orders depend on, as plain values (DALI's workers get a copy)."""
        options = self.options
        rank, world = self.ranks()
        spec = OrderSpec(
            self.shard_sizes, options.seed, options.shuffle, options.batch_size, rank, world,
            options.drop_last, options.streaming, options.buffer_size, generations, options.take, options.drop_remainder,
        )
        return spec if self.mixture is None else self.mixture.order(spec)

    def order(self, position: Position) -> EpochOrder:
        """The global order of the position's epoch (the same for every backend)."""
        spec = self.spec(position.generations)
        if self._cached is None or self._cached[0] != (position.epoch, spec):
            self._cached = ((position.epoch, spec), spec.order(position.epoch))
        return self._cached[1]

    def batches(self, position: Position) -> RankBatches:
        """This rank's batches from the position to the end of its epoch."""
        return self.spec(position.generations).batches(len(self.order(position)), position.consumed)

    def member_positions(self, position: Position) -> tuple[MemberPosition, ...]:
        """Where each member of a mixture is at ``position``."""
        spec = self.spec(position.generations)
        assert isinstance(spec, MixtureOrder), "only a mixture has members"
        return spec.member_positions(position.epoch, position.consumed)

    def remainder(self, position: Position) -> int:
        """Real samples in the epoch's last global batch, as accelerate's ``remainder``: 0 when
        every global batch is full, -1 when padding is not at the end (the streaming order)."""
        order = self.order(position)
        if order.valid is not None:
            return -1
        if self.options.drop_last:
            return 0
        return len(order) % self.batches(position).step


def refuse_for_mixture(options: LoaderOptions) -> None:
    """A ValueError naming the option a mixture's order cannot follow, if one was given."""
    if options.take is not None:
        raise ValueError("a Subset (or SubsetRandomSampler) of a mixture: give mix() the members' own datasets instead")
    if options.shuffle_buffer is not None:
        raise ValueError("shuffle_buffer= (the streaming order) with a mixture: its remote members already read their "
                         "shards in sequence (fastload.mixture_order)")
    if options.evaluation:
        raise ValueError("evaluation= reads every sample once, and a weighted mixture has no such pass: evaluate each member on its own")
    if options.drop_remainder:
        raise ValueError("a DistributedSampler(drop_last=True) with a mixture: give drop_last=True to the loader instead")
