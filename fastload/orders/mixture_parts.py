"""A part of a mixture's positions, as both mixture orders make it: how many positions each member
gets (:func:`apportion`, by largest remainder) and which member each position of the part takes
(:class:`Leaf`, spread evenly or permuted by a seeded draw).

The fixed-weight order (:mod:`fastload.orders.mixture`) halves an epoch down to its leaves; the
weight schedule (:mod:`fastload.orders.schedule`) cuts the run into parts; both arrange a part the
same way, so these live below both.
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
