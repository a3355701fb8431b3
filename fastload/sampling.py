"""Sample order as pure functions of (dataset size, seed, epoch, rank, world size, position).

The epoch's order is one global permutation. Training consumes it in *global steps* of
``world_size * batch_size`` samples; in each step rank r takes the r-th slice of ``batch_size``.
So after k steps exactly the first ``k * world_size * batch_size`` samples of the order have been
seen, whatever the world size, and a resume (at any world size) continues from that position.

The streaming order (:func:`streaming_order`, for object storage) lays out the same global steps,
but each rank's slices come from its own whole shards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The epoch's global order: ``arange`` or a permutation seeded by (seed, epoch)."""
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    return np.random.Generator(np.random.PCG64([seed, epoch, 0x5EED])).permutation(num_samples).astype(np.int64)


@dataclass(frozen=True)
class EpochOrder:
    """An epoch's global order: sample index at each position, and (streaming order only) which
    positions are real samples rather than padding that evens out the ranks' batch counts."""

    order: np.ndarray
    valid: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.order)


def shard_groups(shard_sizes: list[int], seed: int, epoch: int, shuffle: bool) -> list[np.ndarray]:
    """Each shard's sample indices, the shards in a seeded random order when shuffling."""
    starts = np.concatenate([[0], np.cumsum(shard_sizes)]).astype(np.int64)
    shards = np.arange(len(shard_sizes))
    if shuffle:
        shards = np.random.Generator(np.random.PCG64([seed, epoch, 0x5AAD])).permutation(len(shard_sizes))
    return [np.arange(starts[s], starts[s + 1], dtype=np.int64) for s in shards if shard_sizes[s]]


def deal(groups: list[np.ndarray], lanes: int) -> list[list[np.ndarray]]:
    """Deal whole groups (shards) to ``lanes`` in turn, each to the lane holding fewest samples.
    With fewer groups than lanes, the largest groups are halved first so no lane is left empty."""
    groups = list(groups)
    while 0 < len(groups) < lanes and max(len(g) for g in groups) > 1:
        big = max(range(len(groups)), key=lambda i: len(groups[i]))
        half = len(groups[big]) // 2
        groups[big : big + 1] = [groups[big][:half], groups[big][half:]]
    dealt: list[list[np.ndarray]] = [[] for _ in range(lanes)]
    counts = [0] * lanes
    for group in groups:
        lane = counts.index(min(counts))
        dealt[lane].append(group)
        counts[lane] += len(group)
    return dealt


def buffer_shuffle(stream: np.ndarray, buffer_size: int, rng: np.random.Generator) -> np.ndarray:
    """``stream`` passed through a shuffle buffer: each output is a random pick among the next
    ``buffer_size`` candidates, so a sample moves at most about ``buffer_size`` places."""
    if buffer_size <= 1 or len(stream) <= 1:
        return stream.copy()
    size = min(buffer_size, len(stream))
    picks = rng.integers(0, size, size=len(stream) - size)
    # Step t outputs what slot picks[t] holds, then puts stream[size + t] there. So it outputs
    # the item put there at the slot's previous pick, or the slot's first item: found for all
    # steps at once by sorting the steps by slot (stable, so each slot's steps stay in order).
    keys = picks.astype(np.uint16) if size <= 1 << 16 else picks  # numpy radix-sorts 16-bit keys
    steps = np.argsort(keys, kind="stable")
    sorted_picks = picks[steps]
    first_of_slot = np.ones(len(steps), dtype=bool)
    first_of_slot[1:] = sorted_picks[1:] != sorted_picks[:-1]
    previous = np.empty(len(steps), dtype=np.int64)
    previous[steps[1:]] = steps[:-1]
    previous[steps[first_of_slot]] = -1
    out = np.empty_like(stream)
    head = len(stream) - size
    out[:head] = np.where(previous >= 0, stream[size + np.maximum(previous, 0)], stream[picks])
    buffer = stream[:size].copy()  # what each slot holds at the end: its last incoming item
    last_of_slot = np.ones(len(steps), dtype=bool)
    last_of_slot[:-1] = first_of_slot[1:]
    buffer[sorted_picks[last_of_slot]] = stream[size + steps[last_of_slot]]
    rng.shuffle(buffer)
    out[head:] = buffer
    return out


def streaming_order(
    groups: list[np.ndarray], world_size: int, batch_size: int, buffer_size: int, drop_last: bool,
    seed: int, epoch: int, generation: int = 0,
) -> EpochOrder:
    """The streaming order: whole shards dealt to the ranks, each rank reading its own shards in
    sequence through a shuffle buffer (what object storage needs: every shard is fetched by one
    rank, once per epoch).

    Laid out in global steps like :func:`epoch_order` (rank r takes the r-th ``batch_size`` slice
    of each step), so a rank's batches are its own lane. Lanes differ in length by up to a shard:
    with ``drop_last`` every rank stops at the shortest lane's last full batch; otherwise shorter
    lanes are padded with repeats of their own samples, marked invalid. The trade-off against a
    global permutation: samples close together in a lane come from the few shards its buffer
    spans, so a buffer several shards deep keeps batches varied. ``generation`` counts resumes at
    another world size within the epoch (each re-deals the unseen samples).
    """
    if buffer_size < 1:
        raise ValueError("buffer_size must be >= 1")
    lanes = [
        buffer_shuffle(np.concatenate(dealt) if dealt else np.zeros(0, np.int64), buffer_size,
                       np.random.Generator(np.random.PCG64([seed, epoch, generation, lane, 0xB0FF])))
        for lane, dealt in enumerate(deal(groups, world_size))
    ]
    lengths = [len(lane) for lane in lanes]
    if drop_last:
        full, last = min(lengths) // batch_size, 0
    else:  # like the global order's tail: one smaller last batch, as long as the longest lane needs
        full, last = divmod(max(lengths), batch_size)
    span = full * batch_size + last
    every = np.concatenate(groups) if groups else np.zeros(0, np.int64)
    columns = np.zeros((world_size, span), dtype=np.int64)
    masks = np.zeros((world_size, span), dtype=bool)
    for rank, lane in enumerate(lanes):
        real = min(len(lane), span)
        if span:
            columns[rank] = np.resize(lane if len(lane) else every, span)
        columns[rank, :real] = lane[:real]
        masks[rank, :real] = True

    def steps(a: np.ndarray) -> np.ndarray:  # lanes side by side, one batch each per global step
        head = a[:, : full * batch_size].reshape(world_size, full, batch_size).transpose(1, 0, 2)
        return np.concatenate([head.reshape(-1), a[:, full * batch_size :].reshape(-1)])

    return EpochOrder(steps(columns), steps(masks))


def shards_of(starts: Sequence[int] | np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Shard number of each sample index, given the shards' first indices (and the total last)."""
    return np.searchsorted(np.asarray(starts), indices, side="right") - 1


def unseen_groups(order: EpochOrder, consumed: int, shard_of: Callable[[np.ndarray], np.ndarray]) -> list[np.ndarray]:
    """Samples of a streaming epoch not yet consumed after ``consumed`` positions, grouped by
    shard (``shard_of`` maps samples to shards) in order of first appearance: what a resume at
    another world size deals anew."""
    rest = order.order[consumed:]
    if order.valid is not None:
        rest = rest[order.valid[consumed:]]
    shard_numbers = shard_of(rest)
    shards, first = np.unique(shard_numbers, return_index=True)
    return [rest[shard_numbers == shard] for shard in shards[np.argsort(first)]]


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
    """The batches of one rank for the rest of an epoch: positions into the epoch's order."""

    batches: tuple[np.ndarray, ...]
    start: int  # global position this plan starts at (samples already consumed)
    step: int  # global samples consumed per batch (world_size * batch_size)
    end: int  # global position after the last batch
    last_valid: np.ndarray | None = None  # False where the last batch repeats a sample as padding

    def valid(self, batch_no: int) -> np.ndarray:
        """Which entries of batch ``batch_no`` are real samples rather than padding."""
        if batch_no == len(self.batches) - 1 and self.last_valid is not None:
            return self.last_valid
        return np.ones(len(self.batches[batch_no]), dtype=bool)

    def consumed_after(self, batches_done: int) -> int:
        """Global samples consumed once ``batches_done`` of these batches were handed out."""
        if batches_done >= len(self.batches):
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
    full_steps = (num_samples - start) // step
    batches = [
        np.arange(start + k * step + rank * batch_size, start + k * step + (rank + 1) * batch_size, dtype=np.int64)
        for k in range(full_steps)
    ]
    tail_start = start + full_steps * step
    tail = num_samples - tail_start
    end = tail_start
    last_valid = None
    if tail and not drop_last:
        share = -(-tail // world_size)  # ceil: every rank gets the same count
        positions = np.arange(tail_start + rank * share, tail_start + (rank + 1) * share, dtype=np.int64)
        last_valid = positions < num_samples
        batches.append(np.where(last_valid, positions, positions - tail_start) % num_samples)
        end = num_samples
    return RankBatches(batches=tuple(batches), start=start, step=step, end=end, last_valid=last_valid)


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
    generations: tuple[tuple[int, int, int], ...] = ()  # (world, batch, consumed) of earlier layouts this epoch
    take: tuple[int, ...] | None = None  # the sample indices of a Subset, in its order; None: every sample
    drop_remainder: bool = False  # as DistributedSampler(drop_last=True): no padding to a multiple of the world size

    def order(self, epoch: int) -> EpochOrder:
        """The epoch's global order (streaming: re-dealt after each earlier layout's consumed part)."""
        if not self.streaming:
            size = sum(self.shard_sizes) if self.take is None else len(self.take)
            order = epoch_order(size, self.seed, epoch, self.shuffle)
            if self.drop_remainder:
                order = order[: size - size % self.world_size]
            return EpochOrder(order if self.take is None else np.asarray(self.take, dtype=np.int64)[order])
        starts = np.cumsum([0, *self.shard_sizes], dtype=np.int64)
        groups = shard_groups(list(self.shard_sizes), self.seed, epoch, self.shuffle)
        layouts = [*self.generations, (self.world_size, self.batch_size, 0)]
        for generation, (world, batch, consumed) in enumerate(layouts):
            streamed = streaming_order(groups, world, batch, self.shuffle_buffer, self.drop_last, self.seed, epoch, generation)
            if generation < len(self.generations):
                groups = unseen_groups(streamed, consumed, lambda indices: shards_of(starts, indices))
        return streamed

    def batches(self, order_length: int, start: int) -> RankBatches:
        """This rank's batches of an order of ``order_length`` positions, from position ``start``."""
        return rank_batches(order_length, start, self.batch_size, self.rank, self.world_size, self.drop_last)
