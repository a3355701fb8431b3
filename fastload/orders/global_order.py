"""Sample order as pure functions of (dataset size, seed, epoch, rank, world size, position).

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

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fastload.orders.permutation import Permutation, mix_key

ORDER_KEY = 0x5EED  # tags the global order's key, apart from the other orders'


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


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed that is a pure function of (seed, epoch), for orders drawn by torch."""
    return mix_key(seed, epoch, 0x70C4) >> 1


def shards_of(starts: Sequence[int] | np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Shard number of each sample index, given the shards' first indices (and the total last)."""
    return np.searchsorted(np.asarray(starts), indices, side="right") - 1


_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(z: int) -> int:
    """SplitMix64's finaliser: a bijective 64-bit hash with full avalanche."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class SampleRandom:
    """One sample's random stream: SplitMix64 from a key hashed from (seed, epoch, index).

    Counter-based, so any sample's stream is available without state, and cheap: ~1 us a draw,
    where creating a numpy Philox generator per sample cost ~35 us. Has the three methods of
    ``numpy.random.Generator`` the transforms use.
    """

    __slots__ = ("_state",)

    def __init__(self, seed: int, epoch: int, index: int) -> None:
        key = _mix64((seed & _MASK64) ^ 0x5EED)
        key = _mix64(key ^ (epoch & _MASK64))
        self._state = _mix64(key ^ (index & _MASK64))

    def random(self) -> float:
        """A float uniform in [0, 1), 53 bits."""
        self._state = (self._state + _GOLDEN) & _MASK64
        return (_mix64(self._state) >> 11) * (1.0 / (1 << 53))

    def uniform(self, low: float, high: float) -> float:
        """A float uniform in [low, high)."""
        return low + (high - low) * self.random()

    def integers(self, low: int, high: int) -> int:
        """An int uniform in [low, high) (bias below 2**-40 for ranges under 2**13)."""
        return low + int(self.random() * (high - low))


def sample_rng(seed: int, epoch: int, index: int) -> SampleRandom:
    """The random stream of one sample's augmentation: depends only on (seed, epoch, index)."""
    return SampleRandom(seed, epoch, index)


RANK_STRIDE = 0x9E3779B97F4A7C15  # spreads the ranks' batch_map seeds apart


def batch_generator(seed: int, epoch: int, step: int, rank: int, device: torch.device | None) -> torch.Generator:
    """``batch_map``'s generator for one batch, on ``device`` (None: the CPU): seeded from (seed,
    epoch, global step, rank) only, so a resumed epoch, or a torch DataLoader of the loader's parts,
    replays it exactly."""
    value = SampleRandom(seed, epoch, step).integers(0, 2**62) + rank * RANK_STRIDE
    generator = torch.Generator(device=device or "cpu")
    generator.manual_seed(value % 2**63)
    return generator


_MAP_GENERATOR: list[np.random.Generator] = []  # this process's one Generator for map=, re-seeded per sample
_PCG_INCREMENT = 0xDA3E39CB94B95BDB_5851F42D4C957F2D  # odd: PCG64's stream constant


def sample_generator(seed: int, epoch: int, index: int) -> np.random.Generator:
    """A numpy Generator for one sample's user augmentation (``map=``): its stream depends only on
    (seed, epoch, index), apart from the crop's. One per process, re-seeded for each sample
    (~2 us, where seeding a new PCG64 cost ~25 us: 4% of a decode); valid until the next call."""
    if not _MAP_GENERATOR:
        _MAP_GENERATOR.append(np.random.Generator(np.random.PCG64(0)))
    generator = _MAP_GENERATOR[0]
    key = SampleRandom(seed, epoch, index)._state
    state = (_mix64(key ^ 0x3A9) << 64) | _mix64(key ^ 0xA93)
    generator.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": state, "inc": _PCG_INCREMENT},
                                     "has_uint32": 0, "uinteger": 0}
    return generator



@dataclass(frozen=True)
class RankBatches:
    """The batches of one rank for the rest of an epoch, as positions into the epoch's order,
    computed per batch: ``full`` batches of ``batch_size``, then (``share`` > 0) one of ``share``
    covering the order's tail, padded with positions from its start where the ranks' shares differ."""

    start: int  # global position this plan starts at (samples already consumed)
    step: int  # global samples consumed per batch (world_size * batch_size)
    end: int  # global position after the last batch
    batch_size: int
    rank: int
    order_length: int
    full: int  # full batches
    share: int = 0  # size of the last, smaller batch; 0: none

    def __len__(self) -> int:
        return self.full + (self.share > 0)

    def _tail(self) -> np.ndarray:
        tail_start = self.start + self.full * self.step
        return np.arange(tail_start + self.rank * self.share, tail_start + (self.rank + 1) * self.share, dtype=np.int64)

    def positions(self, batch_no: int) -> np.ndarray:
        """Order positions of batch ``batch_no``."""
        if not 0 <= batch_no < len(self):
            raise IndexError(f"batch {batch_no} of {len(self)}")
        if batch_no < self.full:
            first = self.start + batch_no * self.step + self.rank * self.batch_size
            return np.arange(first, first + self.batch_size, dtype=np.int64)
        positions, tail_start = self._tail(), self.start + self.full * self.step
        return np.where(positions < self.order_length, positions, positions - tail_start) % self.order_length

    def valid(self, batch_no: int) -> np.ndarray:
        """Which entries of batch ``batch_no`` are real samples rather than padding."""
        if batch_no == self.full and self.share:
            return self._tail() < self.order_length
        return np.ones(self.batch_size, dtype=bool)

    def consumed_after(self, batches_done: int) -> int:
        """Global samples consumed once ``batches_done`` of these batches were handed out."""
        if batches_done >= len(self):
            return self.end
        return self.start + batches_done * self.step


def rank_batches(
    num_samples: int, start: int, batch_size: int, rank: int, world_size: int, drop_last: bool
) -> RankBatches:
    """Split order positions ``[start, num_samples)`` into this rank's batches.

    Every rank gets the same number of batches (so collective operations never wait for a rank
    that has finished). The tail that does not fill a global step is dropped with ``drop_last``;
    otherwise one more, smaller batch per rank covers it, padded with samples from the start of
    the order when the ranks' shares would be unequal; ``RankBatches.valid`` marks the padding.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    if not 0 <= start <= num_samples:
        raise ValueError(f"resume position {start} is outside the epoch's {num_samples} samples")
    step = batch_size * world_size
    full = (num_samples - start) // step
    tail_start = start + full * step
    tail = num_samples - tail_start
    if tail and not drop_last:
        share = -(-tail // world_size)  # ceil: every rank gets the same count
        return RankBatches(start, step, num_samples, batch_size, rank, num_samples, full, share)
    return RankBatches(start, step, tail_start, batch_size, rank, num_samples, full)
