"""Duplicates: exact ones (``--dedupe``: the same content hash) found before the shards are
planned, and the record and report of the dropped (exact, or near: converters.in_runs).

Exact: every item is hashed once in the engine's workers, in batches, and the caller decides in
plan order, so the survivors are the same for any worker count: the first occurrence is kept.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from fastload.converters.engines import Engine
from fastload.converters.sample import SourceItem
from fastload.converters.sources import Source
from fastload.errors import SampleError

if TYPE_CHECKING:
    import numpy as np

HASH_BATCH = 256
Result = TypeVar("Result")


@dataclass(frozen=True)
class Duplicate:
    """A dropped item, the kept one it duplicates and how far apart they are (0 for exact)."""

    item: SourceItem
    kept: SourceItem
    distance: int = 0

    def report_line(self, near: bool) -> dict[str, object]:
        """Its duplicates.jsonl record (the distance only for near duplicates)."""
        line: dict[str, object] = {"key": self.item.key, "where": self.item.where, "duplicate_of": self.kept.key}
        if near:
            line["distance"] = self.distance
        return line


@dataclass(frozen=True)
class HashTask:
    """A run of items to hash for duplicate detection."""

    source: Source
    items: tuple[SourceItem, ...]


def hash_items(task: HashTask) -> list[str | None]:
    """sha256 of each item's image content, or of its fields when it has no image (None where the
    item cannot be read)."""
    digests: list[str | None] = []
    for item in task.items:
        try:
            sample = task.source.load(item)
        except SampleError:
            digests.append(None)
            continue
        sha = hashlib.sha256()
        image = sample.image
        if image is None:
            for ext, value in sorted(sample.extra.items()):
                sha.update(f"{ext} {len(value)} ".encode())
                sha.update(value)
            digests.append(sha.hexdigest())
            continue
        if not isinstance(image, bytes):  # pixels: the shape counts too
            sha.update(repr(image.shape).encode())
            image = image.tobytes()
        sha.update(image)
        digests.append(sha.hexdigest())
    return digests


def _batches(source: Source, items: list[SourceItem]) -> list[HashTask]:
    return [HashTask(source, tuple(items[i : i + HASH_BATCH])) for i in range(0, len(items), HASH_BATCH)]


def _run_batches(engine: Engine, fn: Callable[[HashTask], list[Result]], tasks: list[HashTask]) -> list[Result]:
    """``fn``'s results of every batch, in item order whatever order the workers finish in."""
    results: list[list[Result]] = [[] for _ in tasks]
    for position, result in engine.map_unordered(fn, tasks):
        results[position] = result
    return [r for batch in results for r in batch]


def find_duplicates(source: Source, items: list[SourceItem], engine: Engine) -> list[Duplicate]:
    """Items whose content is identical to an earlier one's, in item order, each with the first."""
    first: dict[str, SourceItem] = {}
    pairs = []
    for item, digest in zip(items, _run_batches(engine, hash_items, _batches(source, items)), strict=True):
        if digest is None:
            continue
        if digest in first:
            pairs.append(Duplicate(item, first[digest]))
        else:
            first[digest] = item
    return pairs


def draw_duplicates(path: str, source: Source, duplicates: list[Duplicate], title: str) -> int:
    """The report PNG of ``duplicates``: one row per kept item, its dropped duplicates beside it
    (fastload.near.report); returns the number of groups drawn."""
    from fastload.near.report import Tile, draw_groups

    groups: dict[int, list[Tile[SourceItem]]] = {}
    for dup in duplicates:
        group = groups.setdefault(id(dup.kept), [Tile(dup.kept, dup.kept.key)])
        group.append(Tile(dup.item, dup.item.key, dup.distance))

    def load(item: SourceItem) -> bytes | np.ndarray:
        image = source.load(item).image
        if image is None:
            raise SampleError(item.where, "no image")
        return image

    return draw_groups(path, title, list(groups.values()), load)
