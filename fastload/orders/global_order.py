"""The global order: every epoch a seeded permutation of the selection, as a pure function of
(dataset size, seed, epoch, rank, world size, position).

The epoch's order is a seeded bijection on the samples it draws from (:class:`Selection`: all,
a Subset's, those not excluded), evaluated at the positions a batch needs (fastload.orders.permutation),
never materialised: start-up and memory do not grow with the dataset. Training consumes the
order in *global steps* of ``world_size * batch_size`` samples; in each step rank r takes the
r-th slice of ``batch_size``. So after k steps exactly the first ``k * world_size * batch_size``
positions of the order have been seen, whatever the world size, and a resume (at any world
size) continues from that position.

The streaming order (fastload.orders.streaming, for object storage) and the class-balanced order
(fastload.orders.balanced) lay out the same global steps over their own position → sample maps.
"""

from __future__ import annotations

import numpy as np

from fastload.orders.epoch_order import EpochOrder, Selection
from fastload.orders.permutation import Permutation, mix_key

ORDER_KEY = 0x5EED  # tags the global order's key, apart from the other orders'


class GlobalOrder(EpochOrder):
    """A seeded permutation of the selection, its first ``length`` positions."""

    def __init__(self, selection: Selection, permutation: Permutation, length: int) -> None:
        self.selection, self.permutation, self.length = selection, permutation, length

    def indices(self, positions: np.ndarray) -> np.ndarray:
        """Sample index at each position: the selection's rank the permutation puts there."""
        return self.selection.indices(self.permutation(positions))


def global_order(selection: Selection, seed: int, epoch: int, shuffle: bool, length: int | None = None) -> GlobalOrder:
    """The epoch's global order: the selection in rank order, or permuted by a key of (seed, epoch)."""
    permutation = Permutation(len(selection), mix_key(seed, epoch, ORDER_KEY), shuffle)
    return GlobalOrder(selection, permutation, len(selection) if length is None else length)
