"""The order of a weighted mixture of datasets, as pure functions of (seed, epoch, position).

A mixture's *epoch* is ``samples_per_epoch`` positions. Member m owns exactly ``counts[m]`` of
them (its weight's share, apportioned by largest remainder), at positions drawn by a seeded
permutation of that multiset (shuffle) or spread evenly (no shuffle). Member m's k-th position
over the whole run takes the sample at position ``k % size`` of the member's own epoch
``k // size``, an order seeded per member (:class:`~fastload.sampling.OrderSpec`), so a member
that runs out starts its next epoch with its own reshuffle while the others carry on.

The mixture is one index space (members concatenated), its order a global order like any other:
ranks take their slices of global steps (:func:`~fastload.sampling.rank_batches`), and a resume
at any world size continues from the samples consumed, every member where it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastload.sampling import EpochOrder, OrderSpec, RankBatches

MEMBER_BUFFER = 4096  # a remote member's shuffle buffer: it reads its shards in sequence (see MixtureOrder)


def apportion(total: int, weights: tuple[float, ...]) -> tuple[int, ...]:
    """``total`` split in proportion to ``weights`` (largest remainder; ties to the earlier member)."""
    shares = np.asarray(weights, dtype=np.float64) * total / sum(weights)
    counts = np.floor(shares).astype(np.int64)
    left = total - int(counts.sum())
    counts[np.argsort(-(shares - counts), kind="stable")[:left]] += 1
    return tuple(int(c) for c in counts)


def member_seed(seed: int, member: int) -> int:
    """The seed of member ``member``'s own epoch orders: apart from every other member's."""
    return int(np.random.SeedSequence([seed, member, 0x313C]).generate_state(1, np.uint64)[0])


@dataclass(frozen=True)
class MemberPosition:
    """Where one member is: ``consumed`` samples into its own epoch ``epoch``."""

    epoch: int
    consumed: int


@dataclass(frozen=True)
class MixtureOrder:
    """Everything a mixture's epoch orders and a rank's batches depend on, as plain values: the
    loader's :class:`~fastload.sampling.OrderSpec` (seed, shuffle, rank, world and batch size),
    which it stands in for (DALI's workers get a copy), and the members' layout.

    ``member_shards`` holds each member's shard sizes; a ``remote`` member reads its own epoch in
    shard order through a shuffle buffer (the streaming order of one lane), so the ranks work
    through a few of its shards at a time in their caches instead of all of them at once.
    """

    loader: OrderSpec
    member_shards: tuple[tuple[int, ...], ...]
    counts: tuple[int, ...]  # each member's positions in a mixture epoch
    remote: tuple[bool, ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        """Each member's number of samples."""
        return tuple(sum(shards) for shards in self.member_shards)

    def member_order(self, member: int, member_epoch: int) -> np.ndarray:
        """Member ``member``'s own order of its epoch ``member_epoch`` (indices into the member)."""
        shuffle = self.loader.shuffle
        spec = OrderSpec(self.member_shards[member], member_seed(self.loader.seed, member), shuffle, 1, 0, 1, False,
                         streaming=self.remote[member] and shuffle, shuffle_buffer=MEMBER_BUFFER)
        return spec.order(member_epoch).order

    def choices(self, epoch: int) -> np.ndarray:
        """The member of each position of mixture epoch ``epoch``."""
        members = np.repeat(np.arange(len(self.counts), dtype=np.int64), self.counts)
        if self.loader.shuffle:
            return np.random.Generator(np.random.PCG64([self.loader.seed, epoch, 0x313C])).permutation(members)
        # spread evenly: member m's j-th position at (j + 1/2) / counts[m] of the epoch
        spots = np.concatenate([(np.arange(n) + 0.5) / n for n in self.counts if n])
        return members[np.argsort(spots, kind="stable")]

    def order(self, epoch: int) -> EpochOrder:
        """Mixture epoch ``epoch``'s global order: indices into the concatenated members."""
        choices = self.choices(epoch)
        by_member = np.argsort(choices, kind="stable")  # each member's positions, in order
        order = np.empty(len(choices), dtype=np.int64)
        offset, first = 0, 0
        for member, (size, count) in enumerate(zip(self.sizes, self.counts, strict=True)):
            positions = by_member[first : first + count]
            first += count
            start, end = epoch * count, (epoch + 1) * count  # the member's k of this epoch
            for member_epoch in range(start // size, -(-end // size)) if count else ():
                low, high = max(start, member_epoch * size), min(end, (member_epoch + 1) * size)
                samples = self.member_order(member, member_epoch)[low - member_epoch * size : high - member_epoch * size]
                order[positions[low - start : high - start]] = offset + samples
            offset += size
        return EpochOrder(order)

    def batches(self, order_length: int, start: int) -> RankBatches:
        """This rank's batches of an order of ``order_length`` positions, from position ``start``."""
        return self.loader.batches(order_length, start)

    def member_positions(self, epoch: int, consumed: int) -> tuple[MemberPosition, ...]:
        """Where each member is after ``consumed`` positions of mixture epoch ``epoch``."""
        before = np.bincount(self.choices(epoch)[:consumed], minlength=len(self.counts))
        taken = [epoch * count + int(b) for count, b in zip(self.counts, before, strict=True)]
        return tuple(MemberPosition(k // size, k % size) for k, size in zip(taken, self.sizes, strict=True))
