"""Dropping duplicates before the shards are planned: exact (``--dedupe``: the same content
hash) or near (``--dedupe near``: perceptual signatures within ``--near-threshold`` bits).

Both read every item once in the engine's workers, in batches, and decide in the caller in plan
order, so the survivors are the same for any worker count: the first occurrence is kept.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from fastload.converters.engines import Engine
from fastload.converters.sample import SourceItem
from fastload.converters.sources import Source
from fastload.decode.header import MAX_PIXELS
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
    """A run of items to hash (or sign) for duplicate detection."""

    source: Source
    items: tuple[SourceItem, ...]
    max_pixels: int = MAX_PIXELS  # near: the decode limit (--max-pixels)


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


def sign_items(task: HashTask) -> list[int | None]:
    """The perceptual signature of each item's image (None where it has none or it does not
    decode: the shard writer reports it as it does without dedupe)."""
    import numpy as np

    from fastload.near.signature import SIDE, reduced_rgb, signatures

    reduced = np.empty((len(task.items), 3, SIDE, SIDE), dtype=np.uint8)
    decoded: list[int] = []  # positions in task.items of the rows of ``reduced`` filled
    for position, item in enumerate(task.items):
        try:
            image = task.source.load(item).image
            if image is not None:
                reduced[len(decoded)] = reduced_rgb(image, item.where, task.max_pixels)
                decoded.append(position)
        except SampleError:
            continue
    out: list[int | None] = [None] * len(task.items)
    for position, signature in zip(decoded, signatures(reduced[: len(decoded)]), strict=True):
        out[position] = signature
    return out


def _batches(source: Source, items: list[SourceItem], max_pixels: int = MAX_PIXELS) -> list[HashTask]:
    return [HashTask(source, tuple(items[i : i + HASH_BATCH]), max_pixels) for i in range(0, len(items), HASH_BATCH)]


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


def find_near_duplicates(source: Source, items: list[SourceItem], engine: Engine, threshold: int, max_pixels: int) -> list[Duplicate]:
    """Items whose image lies within ``threshold`` bits of a kept earlier one's, in item order
    (fastload.near.search.first_occurrences says which is kept)."""
    from fastload.near.search import first_occurrences

    signed = _run_batches(engine, sign_items, _batches(source, items, max_pixels))
    return [Duplicate(items[dup], items[kept], distance) for dup, kept, distance in first_occurrences(signed, threshold)]


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
