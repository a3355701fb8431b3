"""The streaming order (for object storage): whole shards dealt to the ranks, each rank reading its
own shards in sequence, shuffled within windows of consecutive shards holding at least
``buffer_size`` samples, so every shard is fetched by one rank, once per epoch.

Nothing here grows with the number of samples: the shard list is shuffled and dealt (O(shards)),
and a window's permutation is a seeded bijection (fastload.orders.permutation) evaluated for the
positions asked, when that window is reached. Samples are *ranks* of a
:class:`~fastload.orders.global_order.Selection` (the samples not excluded; a shard's are consecutive).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from fastload.orders.epoch_order import EpochOrder, Selection, shards_of
from fastload.orders.permutation import Permutation, mix64, mix_key, permute

LANE_KEY = 0xB0FF  # tags the windows' keys, apart from the other orders'
SHARD_KEY = 0x5AAD
RAMP = 16  # with ramp: a lane's first window holds buffer_size // RAMP samples, each next twice the last, up to buffer_size


@dataclass(eq=False, slots=True)  # one per shard: slotted (not frozen) is ~5x cheaper to make
class Group:
    """Samples read together (a shard, half of one, or a resume's leftovers of one): the ranks
    ``start..stop``, or ``members[start:stop]`` when ``members`` is given."""

    start: int
    stop: int
    members: np.ndarray | None = None

    def __len__(self) -> int:
        return self.stop - self.start

    def ranks(self) -> np.ndarray:
        """The group's ranks, in order."""
        if self.members is None:
            return np.arange(self.start, self.stop, dtype=np.int64)
        return self.members[self.start : self.stop]

    def halves(self) -> tuple[Group, Group]:
        """The group's first and second half (the second the larger by one when odd)."""
        middle = self.start + len(self) // 2
        return Group(self.start, middle, self.members), Group(middle, self.stop, self.members)


def shard_groups(shard_starts: np.ndarray, seed: int, epoch: int, shuffle: bool) -> list[Group]:
    """Each non-empty shard as a group (``shard_starts``: first ranks, the total last), the shards in
    a seeded random order when shuffling."""
    count = len(shard_starts) - 1
    shards = Permutation(count, mix_key(seed, epoch, SHARD_KEY), shuffle)(np.arange(count))
    starts = np.asarray(shard_starts, dtype=np.int64).tolist()
    return [Group(starts[s], starts[s + 1]) for s in shards.tolist() if starts[s + 1] > starts[s]]


def deal(groups: list[Group], lanes: int) -> list[list[Group]]:
    """Deal whole groups (shards) to ``lanes`` in turn, each to the lane holding fewest samples (the
    first such on a tie). With fewer groups than lanes, the largest groups are halved first so no
    lane is left empty."""
    groups = list(groups)
    while 0 < len(groups) < lanes and max(len(g) for g in groups) > 1:
        big = max(range(len(groups)), key=lambda i: len(groups[i]))
        groups[big : big + 1] = list(groups[big].halves())
    dealt: list[list[Group]] = [[] for _ in range(lanes)]
    heap = [(0, lane) for lane in range(lanes)]
    for group in groups:
        count, lane = heapq.heappop(heap)
        dealt[lane].append(group)
        heapq.heappush(heap, (count + len(group), lane))
    return dealt


class Lane:
    """One rank's stream: its groups in sequence, each window of consecutive groups holding at least
    ``buffer_size`` samples permuted by its own seeded bijection (``buffer_size`` 1: unshuffled).
    With ``ramp`` the first windows are smaller (:data:`RAMP`), so the lane's first batches read few
    groups: a worker's first batch waits for a sixteenth of a window's reads, not all of them."""

    def __init__(self, groups: list[Group], buffer_size: int, key: int, ramp: bool = False) -> None:
        self.groups = groups
        lengths = np.array([g.stop - g.start for g in groups], dtype=np.int64)
        self.group_starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.length = int(self.group_starts[-1])
        self.shuffled, self.key = buffer_size > 1, np.uint64(key)
        self.window_bounds = self._windows(lengths, buffer_size, ramp)  # group numbers where windows start (and the count)
        self.window_starts = self.group_starts[self.window_bounds]
        explicit = [g for g in groups if g.members is not None]
        self.members = np.concatenate([g.ranks() for g in explicit]) if explicit else np.zeros(0, np.int64)
        self.is_explicit = np.array([g.members is not None for g in groups], dtype=bool)
        explicit_base = np.cumsum([0] + [len(g) for g in explicit])[:-1]
        self.base = np.array([g.start for g in groups], dtype=np.int64)
        self.base[self.is_explicit] = explicit_base

    def _windows(self, lengths: np.ndarray, buffer_size: int, ramp: bool) -> np.ndarray:
        if not self.shuffled or not len(lengths) or lengths.min() >= buffer_size:
            return np.arange(len(lengths) + 1)
        bounds, group = [0], 0
        size = max(1, buffer_size // RAMP) if ramp else buffer_size
        while group < len(lengths):
            group = max(group + 1, int(np.searchsorted(self.group_starts, self.group_starts[group] + size)))
            bounds.append(min(group, len(lengths)))
            size = min(buffer_size, 2 * size)
        return np.asarray(bounds)

    def ranks(self, lane_positions: np.ndarray) -> np.ndarray:
        """The rank at each of ``lane_positions`` (each in ``[0, length)``) of this lane's stream."""
        j = np.asarray(lane_positions, dtype=np.int64)
        if self.shuffled:
            window = np.searchsorted(self.window_starts, j, side="right") - 1
            first = self.window_starts[window]
            keys = mix64(self.key ^ window.astype(np.uint64))
            j = first + permute(j - first, self.window_starts[window + 1] - first, keys)
        group = np.searchsorted(self.group_starts, j, side="right") - 1
        out = self.base[group] + (j - self.group_starts[group])
        if len(self.members):
            explicit = self.is_explicit[group]
            out[explicit] = self.members[out[explicit]]
        return out

    def unseen(self, seen: int) -> list[Group]:
        """The groups not yet read after the lane's first ``seen`` positions: the rest of the window
        being read as one explicit group, then the later windows' groups as they are."""
        if seen >= self.length:
            return []
        window = int(np.searchsorted(self.window_starts, seen, side="right")) - 1
        if seen == self.window_starts[window]:
            return self.groups[self.window_bounds[window] :]
        rest = self.ranks(np.arange(seen, self.window_starts[window + 1]))
        return [Group(0, len(rest), rest), *self.groups[self.window_bounds[window + 1] :]]


class StreamingOrder(EpochOrder):
    """The lanes side by side in global steps (rank r takes the r-th ``batch_size`` slice of each),
    so a rank's batches are its own lane. With ``drop_last`` every rank stops at the shortest
    lane's last full batch; otherwise shorter lanes are padded with repeats of their own samples
    (an empty lane: of ``every``), which :meth:`valid` marks."""

    def __init__(self, lanes: list[Lane], every: Lane, batch_size: int, drop_last: bool, selection: Selection) -> None:
        self.lanes, self.every, self.batch_size, self.selection = lanes, every, batch_size, selection
        self.lane_lengths = np.array([lane.length for lane in lanes], dtype=np.int64)
        if drop_last:
            self.full, self.last = int(self.lane_lengths.min()) // batch_size, 0
        else:  # like the global order's tail: one smaller last batch, as long as the longest lane needs
            self.full, self.last = divmod(int(self.lane_lengths.max()), batch_size)
        self.span = self.full * batch_size + self.last  # positions of each lane in the order
        self.length = len(lanes) * self.span

    def lane_positions(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lane, position in that lane) of each order position."""
        positions = np.asarray(positions, dtype=np.int64)
        world, batch = len(self.lanes), self.batch_size
        head = self.full * batch * world
        step, within = np.divmod(positions, world * batch)
        lane, j = within // batch, step * batch + within % batch
        tail = positions >= head
        if tail.any():
            lane[tail], j[tail] = np.divmod(positions[tail] - head, self.last)
            j[tail] += self.full * batch
        return lane, j

    def valid(self, positions: np.ndarray) -> np.ndarray:
        """Real samples: positions within their lane's length."""
        lane, j = self.lane_positions(positions)
        return j < self.lane_lengths[lane]

    def indices(self, positions: np.ndarray) -> np.ndarray:
        """Sample index at each position (padding repeats the lane's samples from its start)."""
        lane, j = self.lane_positions(positions)
        ranks = np.empty(len(lane), dtype=np.int64)
        for number in np.unique(lane).tolist():
            at = lane == number
            source = self.lanes[number] if self.lane_lengths[number] else self.every
            ranks[at] = source.ranks(j[at] % source.length)
        return self.selection.indices(ranks)

    def lane_seen(self, consumed: int) -> np.ndarray:
        """Positions of each lane read once ``consumed`` positions of the order were (padding included)."""
        world, batch = len(self.lanes), self.batch_size
        head = self.full * batch * world
        lanes = np.arange(world)
        if consumed <= head:
            steps, rest = divmod(consumed, world * batch)
            return steps * batch + np.clip(rest - lanes * batch, 0, batch)
        return self.full * batch + np.clip(consumed - head - lanes * self.last, 0, self.last)


def streaming_order(
    groups: list[Group], world_size: int, batch_size: int, buffer_size: int, drop_last: bool,
    seed: int, epoch: int, selection: Selection, redeal: int = 0, ramp: bool = False,
) -> StreamingOrder:
    """The streaming order of ``groups`` for ``world_size`` ranks. The trade-off against a global
    permutation: samples close together in a lane come from the few shards its window spans, so a
    buffer several shards deep keeps batches varied. ``redeal`` counts resumes at another
    world size within the epoch (each re-deals the unseen samples); ``ramp``: each lane's first
    windows smaller (:class:`Lane`)."""
    if buffer_size < 1:
        raise ValueError("buffer_size must be >= 1")
    lanes = [Lane(dealt, buffer_size, mix_key(seed, epoch, redeal, lane, LANE_KEY), ramp)
             for lane, dealt in enumerate(deal(groups, world_size))]
    every = Lane(groups if any(not lane.length for lane in lanes) else [], 1, 0)  # pads empty lanes only
    return StreamingOrder(lanes, every, batch_size, drop_last, selection)


def unseen_groups(order: StreamingOrder, consumed: int, shard_starts: np.ndarray) -> list[Group]:
    """Samples of a streaming epoch not yet read after ``consumed`` positions, one group per shard
    in order of first appearance (lane by lane): what a resume at another world size deals anew."""
    by_shard: dict[int, list[Group]] = {}
    for lane, seen in zip(order.lanes, order.lane_seen(consumed).tolist()):
        for group in lane.unseen(seen):
            if group.members is None:  # a whole shard, or half of one
                by_shard.setdefault(int(shards_of(shard_starts, np.array([group.start]))[0]), []).append(group)
                continue
            ranks = group.ranks()  # a window's leftovers: split by shard
            shards = shards_of(shard_starts, ranks)
            for shard in dict.fromkeys(shards.tolist()):
                chosen = ranks[shards == shard]
                by_shard.setdefault(shard, []).append(Group(0, len(chosen), chosen))
    return [parts[0] if len(parts) == 1 else joined(parts) for parts in by_shard.values()]


def joined(parts: list[Group]) -> Group:
    """One explicit group of the parts' ranks, in order."""
    ranks = np.concatenate([part.ranks() for part in parts])
    return Group(0, len(ranks), ranks)
