"""A loader's epoch orders and this rank's batches at any training position: pure functions of
the options, the dataset's shard sizes, rank and world size (read when asked) and the position."""

from __future__ import annotations

from fastload.dataset import ShardedDataset
from fastload.dist import resolve_rank_world
from fastload.options import LoaderOptions
from fastload.sampling import EpochOrder, OrderSpec, RankBatches
from fastload.state import Layout, Position


class LoaderOrders:
    """The orders of one loader, the current epoch's cached (every backend and the sampler views
    read the same one)."""

    def __init__(self, dataset: ShardedDataset, options: LoaderOptions) -> None:
        self.shard_sizes = tuple(shard.samples for shard in dataset.index.shards)
        self.options = options
        self._cached: tuple[tuple[int, OrderSpec], EpochOrder] | None = None

    def ranks(self) -> tuple[int, int]:
        """(rank, world size): rank=/world_size=, a DistributedSampler's, the process group's, the launcher's."""
        return resolve_rank_world(self.options.rank, self.options.world_size)

    def spec(self, generations: tuple[Layout, ...] = ()) -> OrderSpec:
        """What the orders depend on, as plain values (DALI's workers get a copy)."""
        options = self.options
        rank, world = self.ranks()
        return OrderSpec(
            self.shard_sizes, options.seed, options.shuffle, options.batch_size, rank, world,
            options.drop_last, options.streaming, options.buffer_size, generations, options.take, options.drop_remainder,
        )

    def order(self, position: Position) -> EpochOrder:
        """The global order of the position's epoch (the same for every backend)."""
        spec = self.spec(position.generations)
        if self._cached is None or self._cached[0] != (position.epoch, spec):
            self._cached = ((position.epoch, spec), spec.order(position.epoch))
        return self._cached[1]

    def batches(self, position: Position) -> RankBatches:
        """This rank's batches from the position to the end of its epoch."""
        return self.spec(position.generations).batches(len(self.order(position)), position.consumed)

    def remainder(self, position: Position) -> int:
        """Real samples in the epoch's last global batch, as accelerate's ``remainder``: 0 when
        every global batch is full, -1 when padding is not at the end (the streaming order)."""
        order = self.order(position)
        if order.valid is not None:
            return -1
        if self.options.drop_last:
            return 0
        return len(order) % self.batches(position).step
