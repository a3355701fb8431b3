"""Deterministic ordering, subsetting and shard assignment of source items."""

from __future__ import annotations

import random
from dataclasses import dataclass

from fastload.converters.sample import SourceItem
from fastload.converters.writers import SHARD_SUFFIX

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
    return f"shard-{number:05d}{SHARD_SUFFIX[layout]}"


def assign_shards(
    items: list[SourceItem], layout: str, shard_bytes: int | None, samples_per_shard: int | None
) -> list[ShardPlan]:
    """Cut the ordered items into consecutive shards by count or by estimated bytes."""
    groups: list[list[SourceItem]] = []
    if samples_per_shard is not None:
        groups = [items[i : i + samples_per_shard] for i in range(0, len(items), samples_per_shard)]
    else:
        budget = shard_bytes or 0
        size = 0
        for item in items:
            cost = item.size_hint + 2 * TAR_OVERHEAD_PER_MEMBER
            if not groups or (size + cost > budget and groups[-1]):
                groups.append([])
                size = 0
            groups[-1].append(item)
            size += cost
    return [ShardPlan(number=i, name=shard_name(i, layout), items=tuple(g)) for i, g in enumerate(groups)]
