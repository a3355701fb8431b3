"""The order of a weighted mixture of datasets, as pure functions of (seed, epoch, position).

A mixture's *epoch* is ``samples_per_epoch`` positions. Member m owns exactly ``counts[m]`` of
them (its weight's share, apportioned by largest remainder), arranged uniformly at random by a
seeded draw (shuffle) or spread evenly (no shuffle). The arrangement is made part by part
(:meth:`MixtureOrder.leaf`): the member at any position, and how many of its positions come
before, follow from the halvings above the position's leaf and the leaf alone, so any batch is
evaluated without an array of the epoch's length (:meth:`MixtureOrder.indices`). Member m's k-th position
over the whole run takes the sample at position ``k % size`` of the member's own epoch
``k // size``, an order seeded per member (:class:`~fastload.orders.spec.OrderSpec`), so a member
that runs out starts its next epoch with its own reshuffle while the others carry on.

The mixture is one index space (members concatenated), its order a global order like any other:
ranks take their slices of global steps (:func:`~fastload.orders.rank_batches.rank_batches`), and a resume
at any world size continues from the samples consumed, every member where it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from fastload.orders.balanced import ClassMembers
from fastload.orders.epoch_order import EpochOrder
from fastload.orders.mixing import MASK64, Leaf, apportion, member_seed, spread_evenly
from fastload.orders.position import ResumedFrom
from fastload.orders.rank_batches import RankBatches
from fastload.orders.schedule import WeightSchedule
from fastload.orders.spec import OrderSpec

MEMBER_BUFFER = 4096  # a remote member's shuffle buffer: it reads its shards in sequence (see MixtureOrder)
LEAF = 1 << 14  # positions of the smallest parts of a mixture epoch's schedule, arranged at once (MixtureOrder.leaf)
NUMPY_HYPERGEOMETRIC_LIMIT = 10**9  # numpy's multivariate draw needs fewer items in all; the univariate, fewer of each kind


def hypergeometric_split(rng: np.random.Generator, counts: np.ndarray, take: int) -> np.ndarray:
    """How many of each member's ``counts`` positions fall among ``take`` drawn without replacement
    (a multivariate hypergeometric draw). Past numpy's limits (epochs of 10^9 positions and more)
    the same distribution is drawn member by member, each conditional on the ones before, from the
    univariate hypergeometric, or its normal approximation where that too is past its limit."""
    if int(counts.sum()) < NUMPY_HYPERGEOMETRIC_LIMIT:
        return rng.multivariate_hypergeometric(counts, take)
    left = np.zeros(len(counts), dtype=np.int64)
    rest, wanted = int(counts.sum()), take
    for member, good in enumerate(counts.tolist()):
        rest -= good
        if wanted == 0 or rest == 0:
            left[member] = wanted if rest == 0 else 0
        elif max(good, rest) < NUMPY_HYPERGEOMETRIC_LIMIT:
            left[member] = rng.hypergeometric(good, rest, wanted)
        else:
            total = good + rest
            mean = wanted * good / total
            sd = (wanted * (good / total) * (rest / total) * (total - wanted) / (total - 1)) ** 0.5
            left[member] = min(max(round(rng.normal(mean, sd)), wanted - rest, 0), good, wanted)
        wanted -= int(left[member])
    return left


@dataclass(frozen=True)
class MemberPosition:
    """Where one member is: ``consumed`` samples into its own epoch ``epoch``."""

    epoch: int
    consumed: int


@dataclass(frozen=True)
class MixtureOrder:
    """Everything a mixture's epoch orders and a rank's batches depend on, as plain values: the
    loader's :class:`~fastload.orders.spec.OrderSpec` (seed, shuffle, rank, world and batch size),
    which it stands in for (DALI's workers get a copy), and the members' shards.

    ``member_shards`` holds each member's shard sizes; a member with a buffer (``buffers``: a remote
    member's, or data read in place) reads its own epoch in the streaming order of one lane: its
    shards in a shuffled sequence, rows shuffled within windows of that many samples, so the
    ranks work through a few of its shards (row groups) at a time instead of all of them at once;
    a member without (0) takes its own global order.
    """

    loader: OrderSpec
    member_shards: tuple[tuple[int, ...], ...]
    counts: tuple[int, ...]  # each member's positions in a mixture epoch (with a schedule: the epoch's length only)
    buffers: tuple[int, ...]  # each member's streaming shuffle buffer (0: its global order)
    schedule: WeightSchedule | None = None  # weights that change over the run (fastload.orders.schedule)
    # (member, its epoch) -> its order, those made last: a streaming member's (its shards dealt, its windows) is made
    # once an epoch, not once a batch (0.19 s a batch at 10^5 row groups); the same at any topology, so shared by replace()
    made: dict[tuple[int, int], EpochOrder] = field(default_factory=dict, compare=False, repr=False)

    @property
    def rank(self) -> int:
        """The loader's rank."""
        return self.loader.rank

    @property
    def world_size(self) -> int:
        """The loader's world size."""
        return self.loader.world_size

    @property
    def batch_size(self) -> int:
        """The loader's batch size."""
        return self.loader.batch_size

    @property
    def streaming(self) -> bool:
        """False: a mixture's own order is global (its members' may stream)."""
        return False

    def at_topology(self, world_size: int, batch_size: int, resumed_from: tuple[ResumedFrom, ...], rank: int | None = None) -> MixtureOrder:
        """This mixture's orders at another topology of the loader (world and batch size), for another
        ``rank`` if given."""
        return replace(self, loader=self.loader.at_topology(world_size, batch_size, resumed_from, rank))

    @property
    def sizes(self) -> tuple[int, ...]:
        """Each member's number of samples."""
        return tuple(sum(shards) for shards in self.member_shards)

    def member_indices(self, member: int, member_epoch: int, rows: np.ndarray) -> np.ndarray:
        """Member ``member``'s own order of its epoch ``member_epoch`` at ``rows`` (indices into the member)."""
        order = self.made.get((member, member_epoch))
        if order is None:
            shuffle = self.loader.shuffle
            spec = OrderSpec(self.member_shards[member], member_seed(self.loader.seed, member), shuffle, 1, 0, 1, False,
                             streaming=bool(self.buffers[member]) and shuffle, shuffle_buffer=max(1, self.buffers[member]))
            if len(self.made) >= 2 * len(self.member_shards):  # a member's epoch and the next, at most
                self.made.clear()
            order = self.made[(member, member_epoch)] = spec.order(member_epoch)
        return order.indices(rows)

    def _generator(self, epoch: int, start: int, end: int) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64([self.loader.seed & MASK64, epoch, start, end, 0x313C]))

    def leaf(self, epoch: int, position: int) -> Leaf:
        """The leaf of mixture epoch ``epoch``'s schedule holding ``position``: the epoch's positions
        are halved until parts of at most LEAF, each half given its share of each member's positions
        (a seeded multivariate hypergeometric draw: a uniformly random arrangement; without
        shuffle, the proportional share), and a leaf's positions arranged at once."""
        counts, before = np.asarray(self.counts, dtype=np.int64), np.zeros(len(self.counts), dtype=np.int64)
        start, end = 0, int(counts.sum())
        while end - start > LEAF:
            middle = (start + end) // 2
            if self.loader.shuffle:
                left = hypergeometric_split(self._generator(epoch, start, end), counts, middle - start)
            else:
                left = np.asarray(apportion(middle - start, tuple(counts.tolist())), dtype=np.int64)
            if position < middle:
                counts, end = left, middle
            else:
                counts, before, start = counts - left, before + left, middle
        if self.loader.shuffle:
            members = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
            return Leaf(start, before, self._generator(epoch, start, end).permutation(members))
        return Leaf(start, before, spread_evenly(counts))

    def _members(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Of each of ``positions`` of mixture epoch ``epoch``: its member, and how many of that
        member's positions come before it over the whole run."""
        if self.schedule is not None:
            parts = self.schedule.parts(1, LEAF)
            return parts.members(epoch * sum(self.counts) + positions, self.loader.seed, self.loader.shuffle)
        counts = np.asarray(self.counts, dtype=np.int64)
        member_at, taken = np.empty(len(positions), dtype=np.int64), np.empty(len(positions), dtype=np.int64)
        ascending = bool(np.all(positions[1:] >= positions[:-1]))  # a whole epoch, a batch: no sort needed
        by_position = np.arange(len(positions)) if ascending else np.argsort(positions, kind="stable")
        sorted_positions = positions[by_position]
        first = 0
        while first < len(positions):
            leaf = self.leaf(epoch, int(sorted_positions[first]))
            last = int(np.searchsorted(sorted_positions, leaf.start + len(leaf.members)))
            chosen = by_position[first:last]
            local = positions[chosen] - leaf.start
            member_at[chosen] = leaf.members[local]
            taken[chosen] = epoch * counts[leaf.members[local]] + leaf.before[leaf.members[local]] + leaf.ranks()[local]
            first = last
        return member_at, taken

    def weights_at(self, epoch: int, position: int) -> tuple[float, ...]:
        """The members' weights in force at ``position`` of mixture epoch ``epoch`` (summing to 1)."""
        if self.schedule is not None:
            return self.schedule.weights_at(epoch * sum(self.counts) + position)
        return tuple(c / sum(self.counts) for c in self.counts)

    def indices(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The samples (indices into the concatenated members) at ``positions`` of mixture epoch
        ``epoch``, from the leaves holding them alone: no array of the epoch's length is made."""
        sizes = self.sizes
        member_at, taken = self._members(epoch, positions)
        out = np.empty(len(positions), dtype=np.int64)
        offsets = np.cumsum([0, *sizes])
        for member, size in enumerate(sizes):
            at = np.flatnonzero(member_at == member)
            if not len(at):
                continue
            member_epochs, rows = np.divmod(taken[at], size)
            for member_epoch in range(int(member_epochs.min()), int(member_epochs.max()) + 1):  # those this mixture epoch reaches
                here = member_epochs == member_epoch
                out[at[here]] = offsets[member] + self.member_indices(member, member_epoch, rows[here])
        return out

    def order(self, epoch: int, classes: ClassMembers | None = None) -> EpochOrder:
        """Mixture epoch ``epoch``'s global order: indices into the concatenated members, evaluated
        where asked (``classes``: unused, a mixture's weights set its members' shares)."""
        return MixtureEpochOrder(self, epoch)

    def batches(self, order_length: int, start: int) -> RankBatches:
        """This rank's batches of an order of ``order_length`` positions, from position ``start``."""
        return self.loader.batches(order_length, start)

    def member_positions(self, epoch: int, consumed: int) -> tuple[MemberPosition, ...]:
        """Where each member is after ``consumed`` positions of mixture epoch ``epoch``."""
        if self.schedule is not None:
            parts = self.schedule.parts(1, LEAF)
            taken = parts.before_position(epoch * sum(self.counts) + consumed, self.loader.seed, self.loader.shuffle).tolist()
            return tuple(MemberPosition(k // size, k % size) for k, size in zip(taken, self.sizes, strict=True))
        if consumed >= sum(self.counts):
            before = np.asarray(self.counts, dtype=np.int64)
        else:
            leaf = self.leaf(epoch, consumed)
            before = leaf.before + np.bincount(leaf.members[: consumed - leaf.start], minlength=len(self.counts))
        taken = [epoch * count + int(b) for count, b in zip(self.counts, before.tolist(), strict=True)]
        return tuple(MemberPosition(k // size, k % size) for k, size in zip(taken, self.sizes, strict=True))


class MixtureEpochOrder(EpochOrder):
    """One mixture epoch's order, evaluated at the positions a batch needs (:meth:`MixtureOrder.indices`)."""

    def __init__(self, mixture: MixtureOrder, epoch: int) -> None:
        self.mixture, self.epoch, self.length = mixture, epoch, sum(mixture.counts)

    def indices(self, positions: np.ndarray) -> np.ndarray:
        """Sample index (into the concatenated members) at each position."""
        return self.mixture.indices(self.epoch, np.asarray(positions, dtype=np.int64))
