"""Read side of each shard layout: random access to one sample's raw fields by position."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from fastload.index import DatasetIndex, ShardInfo


class ShardReader(Protocol):
    """Random access into one shard; opened lazily so it can be created before a fork."""

    def __len__(self) -> int:
        """Samples in the shard."""

    def key(self, i: int) -> str:
        """The key of sample ``i``."""

    def read(self, i: int) -> dict[str, bytes]:
        """Raw fields of sample ``i`` by extension (``jpg``, ``cls``, ...)."""

    def close(self) -> None:
        """Release file handles."""


def open_shard(root: Path, index: DatasetIndex, shard: ShardInfo) -> ShardReader:
    """A reader for one shard of a dataset, by its layout."""
    if index.layout == "wds":
        from fastload.formats.tar import TarShardReader

        return TarShardReader(root / shard.path, root / (shard.offsets or Path(shard.path).with_suffix(".idx")))
    from fastload.formats.hdf5 import Hdf5ShardReader

    return Hdf5ShardReader(root / shard.path)
