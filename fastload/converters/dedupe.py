"""Duplicates: exact ones (``--dedupe``: the same content hash) found before the shards are
planned, and the record and report of the dropped (exact, or near: converters.in_runs).

Exact, one rule for samples and for a token conversion's documents: every unit (a sample, or a
document) is hashed once in the engine's workers, item runs at a time, and the caller decides in
plan order, so the survivors are the same for any worker count: the first occurrence is kept.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.converters.engines import ConversionEngine
from fastload.converters.sample import SourceItem
from fastload.converters.sources import Source, TextSource
from fastload.errors import SampleError

HASH_BATCH = 256  # samples a hashing task (a chunk of documents is one task alone)
DIGEST_BYTES = 16  # blake2b: 128 bits, a collision beyond reach in any dataset


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
    """A run of items to hash for exact dedupe (picklable): ``digests`` gives an item's units'
    digests (a sample: one; a chunk of documents: one a document), None for a unit never dropped."""

    source: Source | TextSource
    items: tuple[SourceItem, ...]
    digests: Callable[[Any, SourceItem], list[bytes | None]]


@dataclass(frozen=True)
class Digests:
    """A run of items' units' digests, packed (17 bytes a unit): (units, DIGEST_BYTES) uint8, which
    units were readable, and each item's number of units."""

    digests: np.ndarray
    readable: np.ndarray
    counts: np.ndarray


def hash_items(task: HashTask) -> Digests:
    """Each item's units' digests (run in the engine's workers)."""
    per_item = [task.digests(task.source, item) for item in task.items]
    units = [d for item in per_item for d in item]
    packed = b"".join(d if d is not None else bytes(DIGEST_BYTES) for d in units)
    return Digests(np.frombuffer(packed, dtype=np.uint8).reshape(len(units), DIGEST_BYTES),
                   np.array([d is not None for d in units], dtype=bool), np.array([len(item) for item in per_item], dtype=np.int64))


def sample_digest(source: Source, item: SourceItem) -> list[bytes | None]:
    """The digest of a sample's image content, or of its fields when it has no image (None where
    the item cannot be read)."""
    try:
        sample = source.load(item)
    except SampleError:
        return [None]
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    image = sample.image
    if image is None:
        for ext, value in sorted(sample.extra.items()):
            digest.update(f"{ext} {len(value)} ".encode())
            digest.update(value)
        return [digest.digest()]
    if not isinstance(image, bytes):  # pixels: the shape counts too
        digest.update(repr(image.shape).encode())
        image = image.tobytes()
    digest.update(image)
    return [digest.digest()]


def document_digests(source: TextSource, item: SourceItem) -> list[bytes | None]:
    """The digest of each of a chunk's documents' text (None for one that could not be read)."""
    return [hashlib.blake2b(d.text.encode(), digest_size=DIGEST_BYTES).digest() if d.text is not None else None
            for d in source.documents(item)]


@dataclass(frozen=True)
class Unit:
    """A unit a duplicate names: its item's position in plan order, and its number in the item."""

    item: int
    number: int


def exact_duplicates(source: Source | TextSource, items: list[SourceItem], engine: ConversionEngine,
                     digests: Callable[[Any, SourceItem], list[bytes | None]], batch: int) -> list[tuple[Unit, Unit]]:
    """Every unit whose digest an earlier unit (in plan order) has, with that first one: hashed on
    the engine in runs of ``batch`` items, compared here in plan order, so the survivors are the
    same for any worker count."""
    if not items:
        return []
    tasks = [HashTask(source, tuple(items[i : i + batch]), digests) for i in range(0, len(items), batch)]
    finished = dict(engine.map_unordered(hash_items, tasks))
    runs = [finished[position] for position in range(len(tasks))]  # plan order, whatever order they finished in
    hashes, readable = np.concatenate([r.digests for r in runs]), np.concatenate([r.readable for r in runs])
    starts = np.concatenate([[0], np.cumsum(np.concatenate([r.counts for r in runs]))])
    at = np.flatnonzero(readable)  # an unreadable unit is never dropped, nor kept in another's place
    _, first, inverse = np.unique(hashes[at].view(f"V{DIGEST_BYTES}").ravel(), return_index=True, return_inverse=True)
    originals = at[first[inverse.ravel()]]
    pairs = []
    for unit, kept in zip(at[originals != at].tolist(), originals[originals != at].tolist(), strict=True):
        item, kept_item = int(np.searchsorted(starts, unit, side="right") - 1), int(np.searchsorted(starts, kept, side="right") - 1)
        pairs.append((Unit(item, unit - int(starts[item])), Unit(kept_item, kept - int(starts[kept_item]))))
    return pairs


def find_duplicates(source: Source, items: list[SourceItem], engine: ConversionEngine) -> list[Duplicate]:
    """Items whose content is identical to an earlier one's, in item order, each with the first."""
    return [Duplicate(items[unit.item], items[kept.item]) for unit, kept in exact_duplicates(source, items, engine, sample_digest, HASH_BATCH)]


@dataclass(frozen=True)
class DocumentDuplicates:
    """Documents whose text came earlier in the conversion: per item, the numbers of its dropped
    documents, and a report line for each (the document, and the first with its text)."""

    drops: dict[int, tuple[int, ...]]  # item position -> its dropped documents' numbers
    lines: list[dict]

    def __len__(self) -> int:
        return len(self.lines)


def find_duplicate_documents(source: TextSource, items: list[SourceItem], engine: ConversionEngine) -> DocumentDuplicates:
    """Every document whose exact text an earlier document (in plan order) has, with the first."""
    drops: dict[int, list[int]] = {}
    lines = []
    for unit, kept in exact_duplicates(source, items, engine, document_digests, 1):  # an item holds many documents
        drops.setdefault(unit.item, []).append(unit.number)
        lines.append({"where": items[unit.item].where, "document": unit.number, "duplicate_of": items[kept.item].where,
                      "duplicate_of_document": kept.number})
    return DocumentDuplicates({item: tuple(numbers) for item, numbers in drops.items()}, lines)


def draw_duplicates(path: str, source: Source, duplicates: list[Duplicate], title: str) -> int:
    """The report PNG of ``duplicates``: one row per kept item, its dropped duplicates beside it
    (fastload.near.duplicate_report); returns the number of groups drawn."""
    from fastload.near.duplicate_report import Tile, draw_groups

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
