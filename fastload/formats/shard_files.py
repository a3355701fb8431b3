"""A shard's files, in one place: their names (the shard, a tar's ``.idx``, its sample table),
where each lies under the dataset root, and the opening of a shard's reader by its layout.

Every name a dataset's index gives is checked there to be relative, without ``..``
(:func:`fastload._util.files.check_relative_path`), and confined here to the root once symlinks
are followed, through the one check of where links lead (:func:`fastload._util.files.resolved_inside`,
which the converters' sources use too): at once (:func:`dataset_path`), or, for a file directly in
the root, when a reader opens it without following a link (:func:`root_file`,
:func:`fastload._util.files.open_in_root`), so that it costs no system call until it is a link.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fastload._util.files import inside_root
from fastload.formats.index import DatasetIndex
from fastload.formats.shard_formats import shard_format
from fastload.formats.shard_info import ShardInfo
from fastload.formats.shard_reader import ShardReader
from fastload.formats.table import TABLE_SUFFIX, SampleTable
from fastload.formats.token_counts import ShardTokens


def offsets_name(shard: ShardInfo) -> str:
    """The relative path of a tar shard's DALI offset index."""
    return shard.offsets or str(Path(shard.path).with_suffix(".idx"))


def table_name(shard: ShardInfo) -> str:
    """The relative path of a shard's sample table (:mod:`fastload.formats.table`)."""
    if shard.table is not None:  # a shard's first open asks: no pathlib
        return shard.table
    return str(Path(shard.path).with_suffix(TABLE_SUFFIX))


def dataset_file(root: Path, name: str) -> Path:
    """``root / name`` (``name`` already checked by the index to be a relative path inside it),
    refused with a ShardError when symlinks lead it out of the dataset root."""
    return Path(dataset_path(str(root), name))


def dataset_path(root: str, name: str) -> str:
    """:func:`dataset_file` as a string, without pathlib (a file directly in the root costs one ``lstat``)."""
    path = f"{root}/{name}"
    if "/" not in name:  # a file directly in the root stays there unless it is itself a link
        try:
            if not stat.S_ISLNK(os.lstat(path).st_mode):
                return path
        except OSError:
            return path  # missing: whoever opens it says so
    return inside_root(root, path)


def root_file(root: str, name: str) -> str:
    """The path of dataset file ``name`` for :func:`open_in_root`: no system call where it lies
    directly in the root (its open refuses a symlink there), else checked as by :func:`dataset_path`."""
    return f"{root}/{name}" if "/" not in name else dataset_path(root, name)


def open_shard(root: Path, index: DatasetIndex, shard: ShardInfo, table: SampleTable | None = None, open_files: int | None = None) -> ShardReader:
    """A reader for one shard of a dataset under ``root``, by its layout; its files must lie
    inside ``root`` once symlinks are followed (a tar's ``.idx`` is checked only where it is
    read: where no ``table`` is given)."""
    base, layout = str(root), shard_format(index.layout)
    offsets = None
    if layout.offsets_beside and table is None:
        offsets = dataset_path(base, offsets_name(shard))
    elif layout.holds_tokens:
        offsets = dataset_path(base, table_name(shard))  # a token shard's document table
    files = len(index.shards) if open_files is None else open_files
    data = dataset_path(base, shard.path) if layout.opened_by_path else root_file(base, shard.path)  # checked before a library opens it
    return open_shard_files(index, shard, data, offsets, files, table, base)


def open_shard_files(
    index: DatasetIndex,
    shard: ShardInfo,
    data: str | Path,
    offsets: str | Path | None,
    open_files: int = 1,
    table: SampleTable | None = None,
    root: str | None = None,
) -> ShardReader:
    """A reader over ``shard``'s files wherever they are (the dataset folder ``root``, or a local
    cache: ``root`` None); ``open_files``: how many shards a process may hold open at once (sizes
    HDF5's chunk cache); ``table``: a tar shard's sample table (else its ``.idx`` at ``offsets``
    is parsed into memory); a token shard's document table is at ``offsets``."""
    tokenizer = index.tokenizer
    tokens = None if tokenizer is None else ShardTokens(shard.tokens or 0, tokenizer.dtype, tokenizer.vocab_size)
    return shard_format(index.layout).open_reader(data, offsets, shard.samples, index.decoded_shape, open_files, table, root, tokens,
                                                  shard, index.columns)
