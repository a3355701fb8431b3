"""Read side of each shard layout (the table in ``shard_formats``): random access to one sample's
raw fields by position, every file confined to the dataset root."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from fastload._util.files import open_regular_sized, resolved_inside
from fastload.errors import ShardError
from fastload.formats.index import DatasetIndex, ShardInfo
from fastload.formats.shard_formats import shard_format
from fastload.formats.token_counts import ShardTokens

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

    from fastload.formats.table import Facts, SampleTable


_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def this_process() -> int:
    """This process's id, kept by a fork hook: readers check it on every read (never share a
    descriptor across a fork), and ``os.getpid()`` is a system call (~7 a sample: ~2 us)."""
    return _pid


class ShardReader(Protocol):
    """Random access into one shard; opened lazily so it can be created before a fork."""

    def __len__(self) -> int:
        """Samples in the shard."""

    def key(self, i: int) -> str:
        """The key of sample ``i``."""

    def read(self, i: int, fields: Collection[str] | None = None) -> dict[str, bytes]:
        """Raw fields of sample ``i`` by extension (``jpg``, ``cls``, ...); only those named in
        ``fields`` when given (the others are not read)."""

    def open(self) -> None:
        """Open the shard file in this process now rather than at the first read."""

    def check(self) -> None:
        """Check the whole shard's structure against its index (for ``verify``); ShardError if not."""

    def close(self) -> None:
        """Release file handles."""

    def sample_table(self, facts: Sequence[Facts] = ()) -> bytes:
        """The shard's sample table (:mod:`fastload.formats.table`), built from its contents, with
        its videos' stream ``facts`` (read at conversion: none are probed here)."""

    def stream_facts(self, i: int) -> Facts:
        """The stream facts of sample ``i``'s videos, from the shard's sample table (empty: none)."""


class PixelReader(ShardReader, Protocol):
    """A reader of a shard holding decoded pixels (HDF5's ``pixels`` column)."""

    def pixels(self, i: int) -> np.ndarray:
        """Decoded HWC uint8 pixels of sample ``i``."""


def offsets_name(shard: ShardInfo) -> str:
    """The relative path of a tar shard's DALI offset index."""
    return shard.offsets or str(Path(shard.path).with_suffix(".idx"))


def table_name(shard: ShardInfo) -> str:
    """The relative path of a shard's sample table (:mod:`fastload.formats.table`)."""
    if shard.table is not None:  # a shard's first open asks: no import, no pathlib
        return shard.table
    from fastload.formats.table import TABLE_SUFFIX

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


def inside_root(root: str, path: str) -> str:
    """``path`` once symlinks are followed, refused with a ShardError where that leaves ``root``."""
    real = resolved_inside(root, path)
    if real is None:
        raise ShardError(f"{path}: a symlink leads outside the dataset root; refusing to read it")
    return str(real)


def root_file(root: str, name: str) -> str:
    """The path of dataset file ``name`` for :func:`open_in_root`: no system call where it lies
    directly in the root (its open refuses a symlink there), else checked as by :func:`dataset_path`."""
    return f"{root}/{name}" if "/" not in name else dataset_path(root, name)


def open_in_root(path: str | Path, root: str | None) -> tuple[int, int, str | Path]:
    """(descriptor, size, the path opened) of a regular file: a file of a dataset under ``root``
    is opened without following a symlink at its end (two ``lstat`` calls fewer on a shard's
    first open), a link followed only where it stays inside ``root`` (then its resolved path
    comes back); with ``root`` None (a cache's file) as it is. OSError where it cannot be opened."""
    if root is None:
        return (*open_regular_sized(path), path)
    try:
        return (*open_regular_sized(path, follow=False), path)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
    real = inside_root(root, str(path))
    return (*open_regular_sized(real), real)


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
