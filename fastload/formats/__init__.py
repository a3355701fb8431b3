"""Read side of each shard layout: random access to one sample's raw fields by position."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from fastload.errors import ShardError
from fastload.index import DatasetIndex, ShardInfo

if TYPE_CHECKING:
    import numpy as np

    from fastload.formats.table import SampleTable


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

    def read(self, i: int) -> dict[str, bytes]:
        """Raw fields of sample ``i`` by extension (``jpg``, ``cls``, ...)."""

    def open(self) -> None:
        """Open the shard file in this process now rather than at the first read."""

    def check(self) -> None:
        """Check the whole shard's structure against its index (for ``verify``); ShardError if not."""

    def close(self) -> None:
        """Release file handles."""

    def sample_table(self) -> bytes:
        """The shard's sample table (:mod:`fastload.formats.table`), built from its contents."""


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
    """:func:`dataset_file` as a string, without pathlib: a shard's first open runs it for its
    tar and its table, and string work plus one ``lstat`` is all a file directly in the root needs."""
    path = f"{root}/{name}"
    if "/" not in name:  # a file directly in the root stays there unless it is itself a link
        try:
            if not stat.S_ISLNK(os.lstat(path).st_mode):
                return path
        except OSError:
            return path  # missing: whoever opens it says so
    if not Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root)):
        raise ShardError(f"{path}: a symlink leads outside the dataset root; refusing to read it")
    return path


def open_shard(root: Path, index: DatasetIndex, shard: ShardInfo, table: SampleTable | None = None, open_files: int | None = None) -> ShardReader:
    """A reader for one shard of a dataset under ``root``, by its layout; its files must lie
    inside ``root`` once symlinks are followed (a tar's ``.idx`` is checked only where it is
    read: where no ``table`` is given)."""
    base = str(root)
    offsets = dataset_path(base, offsets_name(shard)) if index.layout == "wds" and table is None else None
    files = len(index.shards) if open_files is None else open_files
    return open_shard_files(index, shard, dataset_path(base, shard.path), offsets, files, table)


def open_shard_files(
    index: DatasetIndex, shard: ShardInfo, data: str | Path, offsets: str | Path | None, open_files: int = 1, table: SampleTable | None = None
) -> ShardReader:
    """A reader over ``shard``'s files wherever they are (the dataset folder, or a local cache);
    ``open_files``: how many shards a process may hold open at once (sizes HDF5's chunk cache);
    ``table``: a tar shard's sample table (else its ``.idx`` at ``offsets`` is parsed into memory)."""
    if index.layout == "wds":
        from fastload.formats.tar import TarShardReader

        if offsets is None and table is None:
            raise ValueError(f"{data}: a tar shard is read through its sample table or its offset index; neither given")
        return TarShardReader(data, offsets, shard.samples, table)
    from fastload.formats.hdf5 import Hdf5ShardReader, chunk_cache_bytes

    return Hdf5ShardReader(Path(data), shard.samples, index.decoded_shape, chunk_cache_bytes(open_files))
