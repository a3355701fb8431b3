"""A dataset's per-sample tables (:mod:`fastload.formats.table`): each shard's found beside it,
built on first open for a dataset converted before tables existed (written atomically, so
workers and ranks may race to build one), or built in memory where the folder is read-only; and
their columns read over the whole dataset (labels, keys, samples by key) without reading shards."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from fastload._util.files import atomic_write_bytes
from fastload.errors import ShardError
from fastload.formats.index import DatasetIndex
from fastload.formats.shard_files import open_shard, root_file, table_name
from fastload.formats.shard_formats import shard_format
from fastload.formats.shard_info import ShardInfo
from fastload.formats.shard_reader import ShardReader
from fastload.formats.table import SampleTable, key_hashes

log = logging.getLogger("fastload")


def built_table(reader: ShardReader) -> bytes:
    """A shard's sample table built from its reader (its ``.idx`` or columns), the reader then closed."""
    try:
        return reader.sample_table()
    finally:
        reader.close()


def local_table(root: Path, index: DatasetIndex, shard: ShardInfo) -> SampleTable | None:
    """The table of a shard under ``root``: its file, else one built from the shard and written
    beside it (temporary name, then rename: identical bytes whoever wins a race); None where the
    folder is read-only (the caller falls back to parsing the shard's ``.idx``)."""
    base = str(root)
    path = root_file(base, table_name(shard))
    table = SampleTable.found(path, shard.samples, base)
    if table is not None:
        return table
    if shard.table is not None:
        raise ShardError(f"{path}: missing, though index.json lists it")
    if not os.access(os.path.dirname(path), os.W_OK):
        return None
    data = built_table(open_shard(root, index, shard, open_files=1))
    try:
        atomic_write_bytes(path, data)
    except OSError as exc:
        log.warning("%s: cannot write the sample table (%s); reading the shard's .idx instead", path, exc.strerror)
        return None
    return SampleTable(path, shard.samples, root=base)


def missing_tables(root: Path, index: DatasetIndex) -> int:
    """How many shards under ``root`` lack a sample table that cannot be built (the folder is read-only)."""
    if os.access(root, os.W_OK) or shard_format(index.layout).in_place:  # data read in place has no tables to build
        return 0
    return sum(1 for shard in index.shards if not (root / table_name(shard)).exists())


class DatasetKeys(Sequence[str]):
    """Every sample's key by global index, read from the tables as asked (nothing held)."""

    def __init__(self, key_of: Callable[[int], str], tables: Callable[[], Iterator[SampleTable]], size: int) -> None:
        self._key_of, self._tables, self._size = key_of, tables, size

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, i: int) -> str:  # type: ignore[override]  # int only: a slice of 40M keys is no view
        if not isinstance(i, int):
            raise TypeError("sample keys are indexed by one int")
        if not -self._size <= i < self._size:
            raise IndexError(f"sample {i} out of range for {self._size} samples")
        return self._key_of(i % self._size)

    def __iter__(self) -> Iterator[str]:
        for table in self._tables():
            yield from table.keys()


def sample_labels(tables: Iterable[SampleTable]) -> np.ndarray:
    """Every sample's label (int64, -1 where none), read-only: one read per shard."""
    parts = [table.labels() for table in tables]
    labels = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    labels.setflags(write=False)
    return labels


def key_matches(keys: Iterable[str], tables: Iterable[tuple[int, SampleTable]], where: str) -> tuple[list[str], list[list[int]]]:
    """(``keys`` as a list, the global indices of the samples holding each), found through the
    tables' key hashes (``tables``: each shard's first index and table) and confirmed by the keys
    themselves; a KeyError names the first key no sample has. Foreign tars may repeat a key in
    several shards: every sample holding it is listed."""
    wanted = list(keys)
    found: list[list[int]] = [[] for _ in wanted]
    hashes = key_hashes(wanted)
    order = np.argsort(hashes, kind="stable")
    sorted_hashes = hashes[order]
    for start, table in tables:
        if not wanted:
            break
        shard_hashes = table.hashes()
        at = np.minimum(np.searchsorted(sorted_hashes, shard_hashes), len(wanted) - 1)
        rows = np.flatnonzero(sorted_hashes[at] == shard_hashes)
        if not rows.size:
            continue
        shard_keys = table.keys() if rows.size * 16 > len(table) else None
        for row in rows.tolist():
            key = shard_keys[row] if shard_keys is not None else table.key(row)
            first, last = np.searchsorted(sorted_hashes, shard_hashes[row], side="left"), np.searchsorted(sorted_hashes, shard_hashes[row], side="right")
            for j in order[first:last].tolist():
                if wanted[j] == key:
                    found[j].append(start + row)
    missing = next((j for j, where_found in enumerate(found) if not where_found), None)
    if missing is not None:
        raise KeyError(f"{where}: no sample has the key {wanted[missing]!r}")
    return wanted, found


def indices_of(keys: Iterable[str], tables: Iterable[tuple[int, SampleTable]], where: str) -> np.ndarray:
    """The global index of each of ``keys`` (see :func:`key_matches`); a key that several samples
    hold is a ValueError naming it (it names no one sample)."""
    wanted, found = key_matches(keys, tables, where)
    repeated = next((j for j, where_found in enumerate(found) if len(where_found) > 1), None)
    if repeated is not None:
        raise ValueError(f"{where}: {len(found[repeated])} samples have the key {wanted[repeated]!r} (samples "
                         f"{found[repeated][:4]}): a key repeated across shards names no one sample")
    return np.asarray([where_found[0] for where_found in found], dtype=np.int64)


def indices_holding(keys: Iterable[str], tables: Iterable[tuple[int, SampleTable]], where: str) -> np.ndarray:
    """The sorted global indices of every sample holding one of ``keys`` (see :func:`key_matches`)."""
    _, found = key_matches(keys, tables, where)
    return np.unique(np.asarray([i for where_found in found for i in where_found], dtype=np.int64))
