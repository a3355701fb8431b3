"""Deterministic ordering, subsetting and shard assignment of source items."""

from __future__ import annotations

import random
from dataclasses import dataclass

from fastload.converters.sample import SourceItem
from fastload.formats.shard_formats import shard_format

TAR_OVERHEAD_PER_MEMBER = 1024  # header + average padding, for planning tar shards by bytes


@dataclass(frozen=True)
class ShardPlan:
    """One output shard: its number, file name and the items it will hold, in order."""

    number: int
    name: str
    items: tuple[SourceItem, ...]


def order_items(items: list[SourceItem], shuffle: bool, seed: int, limit: int | None) -> list[SourceItem]:
    """Source order, or a seeded shuffle of it; then the first ``limit`` items."""
    ordered = list(items)
    if shuffle:
        random.Random(seed).shuffle(ordered)
    return ordered if limit is None else ordered[:limit]


def shard_name(number: int, layout: str) -> str:
    """File name of shard ``number``: shard-00000.tar, shard-00001.h5, ..."""
    return f"shard-{number:05d}{shard_format(layout).suffix}"


class ShardCutter:
    """Cuts ordered items into consecutive shards one item at a time, by count or by estimated
    bytes: ``starts_shard(item)`` says whether ``item`` opens a new shard."""

    def __init__(self, shard_bytes: int | None, samples_per_shard: int | None, overhead: int = 2 * TAR_OVERHEAD_PER_MEMBER) -> None:
        self.shard_bytes, self.samples_per_shard, self.overhead = shard_bytes or 0, samples_per_shard, overhead
        self._count = self._size = 0
        self._first = True

    def starts_shard(self, item: SourceItem) -> bool:
        """Place ``item`` after the ones placed before; True when it is the first of a shard."""
        if self.samples_per_shard is not None:
            new = self._count % self.samples_per_shard == 0
            self._count += 1
            return new
        cost = item.size_hint + self.overhead
        new = self._first or self._size + cost > self.shard_bytes
        if new:
            self._first, self._size = False, 0
        self._size += cost
        return new


def assign_shards(
    items: list[SourceItem], layout: str, shard_bytes: int | None, samples_per_shard: int | None,
    overhead: int = 2 * TAR_OVERHEAD_PER_MEMBER,
) -> list[ShardPlan]:
    """Cut the ordered items into consecutive shards by count or by estimated bytes (``overhead``:
    what each item adds to its size_hint in the shard)."""
    cutter = ShardCutter(shard_bytes, samples_per_shard, overhead)
    groups: list[list[SourceItem]] = []
    for item in items:
        if cutter.starts_shard(item):
            groups.append([])
        groups[-1].append(item)
    return [ShardPlan(number=i, name=shard_name(i, layout), items=tuple(g)) for i, g in enumerate(groups)]
