"""How a mixture shares positions among its members, the arithmetic every mixture order uses (the
fixed-weight order by samples, :mod:`fastload.orders.mixture_order`; weights that change over the run,
:mod:`fastload.orders.schedule`; the rows of a mixture by tokens, :mod:`fastload.text.epoch_rows`):
how many positions each member gets (:func:`apportion`, by largest remainder), which member each
position of a part takes (:class:`Leaf`: spread evenly or permuted by a seeded draw), which member
each row of a mixture by tokens takes (:func:`mixture_members`), and each member's own seed
(:func:`member_seed`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MASK64 = (1 << 64) - 1  # numpy's seeds are unsigned: a negative loader seed= is taken mod 2**64


def apportion(total: int, weights: tuple[float, ...]) -> tuple[int, ...]:
    """``total`` split in proportion to ``weights`` (largest remainder; ties to the earlier member)."""
    relative = np.asarray(weights, dtype=np.float64) / max(weights)  # the sum of huge weights would overflow
    shares = relative * total / relative.sum()
    counts = np.floor(shares).astype(np.int64)
    left = total - int(counts.sum())
    counts[np.argsort(-(shares - counts), kind="stable")[:left]] += 1
    return tuple(int(c) for c in counts)


def spread_evenly(counts: np.ndarray) -> np.ndarray:
    """The member of each of ``sum(counts)`` positions, member m's j-th at (j + 1/2) / counts[m] of them."""
    members = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    spots = np.concatenate([(np.arange(n) + 0.5) / n for n in counts.tolist() if n])
    return members[np.argsort(spots, kind="stable")]


@dataclass(frozen=True)
class Leaf:
    """A part of a mixture's positions: where it starts, each member's positions before it, and
    the member of each of its positions."""

    start: int
    before: np.ndarray
    members: np.ndarray

    def ranks(self) -> np.ndarray:
        """Of each position, how many of its member's positions come before it in the leaf."""
        by_member = np.argsort(self.members, kind="stable")
        firsts = np.concatenate([[0], np.cumsum(np.bincount(self.members))[:-1]]).astype(np.int64)
        ranks = np.empty(len(self.members), dtype=np.int64)
        ranks[by_member] = np.arange(len(self.members)) - firsts[self.members[by_member]]
        return ranks


def member_seed(seed: int, member: int) -> int:
    """The seed of member ``member``'s own epoch orders: apart from every other member's."""
    return int(np.random.SeedSequence([seed & MASK64, member, 0x313C]).generate_state(1, np.uint64)[0])


def mixture_members(rows: np.ndarray, weights: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """For rows ``rows`` of a mixture by tokens with fixed weights, each one's member and its row number in that member's own
    sequence: the members split in halves recursively, each half's count after k rows being
    ``floor(k * share + 1/2)``, so every member's count stays within a row per halving of ``k * weight``."""
    rows = np.asarray(rows, dtype=np.int64)
    members = np.zeros(len(rows), dtype=np.int64)
    local = rows.copy()
    _split(local, members, np.arange(len(rows)), np.asarray(weights, dtype=np.float64) / sum(weights), 0)
    return members, local


def _split(local: np.ndarray, members: np.ndarray, at: np.ndarray, weights: np.ndarray, first: int) -> None:
    """Assign the rows ``at`` (numbered ``local`` within this group of members ``first..``) to the group's members."""
    if len(weights) == 1 or not len(at):
        members[at] = first
        return
    half = len(weights) // 2
    share = weights[:half].sum() / weights.sum()
    k = local[at]
    before = np.floor(k * share + 0.5).astype(np.int64)
    into_left = np.floor((k + 1) * share + 0.5).astype(np.int64) > before
    left, right = at[into_left], at[~into_left]
    local[left] = before[into_left]
    local[right] = k[~into_left] - before[~into_left]
    _split(local, members, left, weights[:half], first)
    _split(local, members, right, weights[half:], first + half)
