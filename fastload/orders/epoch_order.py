"""What every order is: an :class:`EpochOrder` maps an epoch's positions to sample indices, drawn
from a :class:`Selection` (all samples, a Subset's, those not excluded); and the helpers the orders
share (the shard of a sample, an epoch's seed)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fastload.orders.permutation import mix_key


class EpochOrder:
    """An epoch's order, evaluated where asked: the sample index at any positions, and (orders
    that pad lanes, the streaming one) which positions are real samples rather than padding."""

    length: int

    def __len__(self) -> int:
        return self.length

    def indices(self, positions: np.ndarray) -> np.ndarray:
        """Sample index at each of ``positions`` (each in ``[0, len)``)."""
        raise NotImplementedError

    def valid(self, positions: np.ndarray) -> np.ndarray | None:
        """Which of ``positions`` are real samples; None: all are."""
        return None


class Selection:
    """The samples an order draws from, ranked: rank k is the k-th of a Subset's indices or, without
    one, the k-th sample index not excluded. Memory: the Subset's indices, or the excluded ones."""

    def __init__(self, size: int, take: Sequence[int] | np.ndarray | None = None, excluded: Sequence[int] | np.ndarray = ()) -> None:
        excluded = np.asarray(excluded, dtype=np.int64)
        # sorted; np.unique's first call imports numpy.ma (~12 ms at the first epoch's start, the workers idle): only when needed
        self.excluded = np.unique(excluded) if len(excluded) else excluded
        self.take: np.ndarray | None = None
        if take is not None:
            take = np.asarray(take, dtype=np.int64)
            self.take = take[~np.isin(take, self.excluded)] if len(self.excluded) else take
            self.length = len(self.take)
        else:
            self.length = size - len(self.excluded)
        self._kept_before = self.excluded - np.arange(len(self.excluded))  # kept samples before each excluded one

    def __len__(self) -> int:
        return self.length

    def indices(self, ranks: np.ndarray) -> np.ndarray:
        """Sample index of each rank (O(log excluded) each)."""
        ranks = np.asarray(ranks, dtype=np.int64)
        if self.take is not None:
            return self.take[ranks]
        if not len(self.excluded):
            return ranks
        return ranks + np.searchsorted(self._kept_before, ranks, side="right")

    def ranks_from(self, indices: np.ndarray) -> np.ndarray:
        """The rank of the first selected sample at or after each sample index (shard starts in
        rank space: the kept samples of a shard have consecutive ranks). Not for a Subset."""
        return np.asarray(indices, dtype=np.int64) - np.searchsorted(self.excluded, indices, side="left")


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed that is a pure function of (seed, epoch), for orders drawn by torch."""
    return mix_key(seed, epoch, 0x70C4) >> 1


def shards_of(starts: Sequence[int] | np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Shard number of each sample index, given the shards' first indices (and the total last)."""
    return np.searchsorted(np.asarray(starts), indices, side="right") - 1
