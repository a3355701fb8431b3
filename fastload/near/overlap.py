"""``fastload overlap A B``: the samples of converted dataset B (say, validation) that nearly
duplicate samples of A (train), so they can be left out (``--write-exclude``: B's keys, one a
line, UTF-8, which the loader's ``exclude=`` reads).

Each image of both datasets is decoded once, at the reduced scale its signature needs
(fastload.near.signature), in worker processes over runs of rows of each shard (``fastload.open``
reads the shards, local or at a URL); A's signatures go into a multi-index that each of B's
queries. Samples that cannot be read or decoded are listed, never fatal.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from fastload._util.processes import forked_pool
from fastload.errors import FastloadError, SampleError
from fastload.fields import image_field
from fastload.formats.key_list import format_keys
from fastload.formats.shard_reader import PixelReader, ShardReader
from fastload.near.search import MultiIndex
from fastload.storage.dataset import ShardedDataset
from fastload.storage.remote import redact

if TYPE_CHECKING:
    import numpy as np

ROWS_PER_TASK = 512


@dataclass(frozen=True)
class Signed:
    """Every sample of one dataset: its key and its signature (None where it has no readable
    image), plus where and why each unreadable one failed."""

    keys: list[str]
    signatures: list[int | None]
    unreadable: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Match:
    """A sample of B (by position and key) within the threshold of a sample of A."""

    b: int
    b_key: str
    a: int
    a_key: str
    distance: int


@dataclass(frozen=True)
class Overlap:
    """What ``fastload overlap`` found: B's samples near A's, each with its closest match."""

    a: str
    b: str
    threshold: int
    a_samples: int
    b_samples: int
    matches: list[Match]
    unreadable: dict[str, list[tuple[str, str]]]

    def as_json(self) -> dict:
        """A JSON-ready form (``--json``)."""
        return {
            "a": redact(self.a), "b": redact(self.b), "threshold": self.threshold, "a_samples": self.a_samples, "b_samples": self.b_samples,
            "overlapping": len(self.matches),
            "matches": [{"b_key": m.b_key, "a_key": m.a_key, "distance": m.distance} for m in self.matches],
            "unreadable": {name: [{"where": w, "reason": r} for w, r in failed] for name, failed in self.unreadable.items()},
        }


@dataclass(frozen=True)
class _Rows:
    dataset: ShardedDataset
    shard: int
    start: int
    stop: int


def _sign_rows(task: _Rows) -> Signed:
    """Keys and signatures of rows start..stop of one shard (run in a worker process, which
    closes the shard when done: each task brings its own copy of the dataset)."""
    try:
        return _sign_open_rows(task)
    finally:
        task.dataset.close()


def _sign_open_rows(task: _Rows) -> Signed:
    from fastload.near.signature import RunSigner

    ds, rows = task.dataset, range(task.start, task.stop)
    reader = ds.reader(task.shard)
    shard_name = ds.index.shards[task.shard].path
    keys, unreadable = [], []  # type: list[str], list[tuple[str, str]]
    signer = RunSigner(len(rows))
    for position, row in enumerate(rows):
        try:
            keys.append(reader.key(row))
        except (FastloadError, OSError) as exc:  # a damaged table row: reported like a bad image, never fatal
            keys.append(f"#{row}")
            unreadable.append((f"{shard_name}:#{row}", exc.reason if isinstance(exc, SampleError) else str(exc)))
            continue
        where = f"{shard_name}:{keys[-1]}"
        try:
            image = _image(ds, reader, row)
            if image is not None:
                signer.add(position, image, where)
        except (FastloadError, OSError) as exc:
            unreadable.append((where, exc.reason if isinstance(exc, SampleError) else str(exc)))
    return Signed(keys, signer.signatures(), unreadable)


def _image(ds: ShardedDataset, reader: ShardReader, row: int) -> bytes | np.ndarray | None:
    """The row's encoded image, or its pixels in a decoded HDF5 dataset; None when it has none."""
    if ds.decoded:
        return cast(PixelReader, reader).pixels(row)  # only HDF5 shards hold decoded pixels
    fields = reader.read(row)
    name = image_field(fields)
    return fields[name] if name is not None else None


def dataset_signatures(path: str | Path, workers: int = 1) -> Signed:
    """Every sample's key and signature in a converted dataset (folder or URL), in order, signed
    by ``workers`` processes."""
    ds = ShardedDataset(path)
    tasks = [
        _Rows(ds, shard, start, min(start + ROWS_PER_TASK, info.samples))
        for shard, info in enumerate(ds.index.shards)
        for start in range(0, info.samples, ROWS_PER_TASK)
    ]
    if workers <= 1:
        parts = [_sign_rows(task) for task in tasks]
    else:
        with forked_pool(workers) as pool:
            parts = list(pool.map(_sign_rows, tasks))
    ds.close()
    return Signed(
        keys=[k for part in parts for k in part.keys],
        signatures=[s for part in parts for s in part.signatures],
        unreadable=[u for part in parts for u in part.unreadable],
    )


def find_overlap(a: str | Path, b: str | Path, threshold: int, workers: int = os.cpu_count() or 1) -> Overlap:
    """B's samples within ``threshold`` bits of one of A's, in B's order, each with its closest
    sample of A (ties: the first in A's order)."""
    signed_a = dataset_signatures(a, workers)
    signed_b = dataset_signatures(b, workers)
    index = MultiIndex(threshold, len(signed_a.signatures))
    for position, signature in enumerate(signed_a.signatures):
        if signature is not None:
            index.add(signature, position)
    matches = []
    for position, signature in enumerate(signed_b.signatures):
        if signature is None:
            continue
        found = index.closest(signature)
        if found is not None:
            distance, match = found
            matches.append(Match(position, signed_b.keys[position], match, signed_a.keys[match], distance))
    return Overlap(
        a=str(a), b=str(b), threshold=threshold, a_samples=len(signed_a.keys), b_samples=len(signed_b.keys),
        matches=matches, unreadable={"a": signed_a.unreadable, "b": signed_b.unreadable},
    )


def write_exclude(path: str | Path, overlap: Overlap) -> int:
    """B's overlapping keys, one a line (UTF-8; fastload.formats.key_list), each once, in B's
    order; returns how many."""
    keys = list(dict.fromkeys(m.b_key for m in overlap.matches))
    Path(path).write_text(format_keys(keys), encoding="utf-8")
    return len(keys)


def draw_overlap(path: str | Path, overlap: Overlap) -> int:
    """The report PNG: one row per sample of A that B overlaps, B's samples beside it."""
    from fastload.near.duplicate_report import Tile, draw_groups

    datasets = {"a": ShardedDataset(overlap.a), "b": ShardedDataset(overlap.b)}
    groups: dict[int, list[Tile[tuple[str, int]]]] = {}
    for m in overlap.matches:
        group = groups.setdefault(m.a, [Tile(("a", m.a), m.a_key)])
        group.append(Tile(("b", m.b), m.b_key, m.distance))

    def load(ref: tuple[str, int]) -> bytes | np.ndarray:
        ds = datasets[ref[0]]
        _, fields, pixels = ds.raw(ref[1])
        name = image_field(fields)
        if pixels is not None:
            return pixels
        if name is None:
            raise SampleError(ds.where(ref[1]), "no image")
        return fields[name]

    try:
        return draw_groups(path, f"{overlap.b} near {overlap.a}", list(groups.values()), load, first="in A")
    finally:
        for ds in datasets.values():
            ds.close()
