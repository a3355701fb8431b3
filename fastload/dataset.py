"""``fastload.open``: a converted dataset as a map-style dataset with random access by position."""

from __future__ import annotations

import bisect
import itertools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastload.errors import SampleError
from fastload.formats import ShardReader, open_shard
from fastload.index import DatasetIndex, image_field, read_index

if TYPE_CHECKING:
    import numpy as np


class ShardedDataset:
    """Samples of a converted dataset. ``ds[i]`` decodes sample i fully: a dict with ``key``,
    ``image`` (HWC uint8), ``label`` (int, when the data has ``cls``) and any extra raw fields.

    Shard files open lazily in each process, so the object can be created before workers fork.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.index: DatasetIndex = read_index(self.root)
        self._starts = list(itertools.accumulate((s.samples for s in self.index.shards), initial=0))
        self._readers: dict[int, ShardReader] = {}

    def __len__(self) -> int:
        return self.index.num_samples

    def __repr__(self) -> str:
        return f"fastload.open({str(self.root)!r}): {len(self)} samples, {len(self.index.shards)} {self.index.layout} shards"

    @property
    def classes(self) -> list[str] | None:
        """Class names by label, when the source had them."""
        return list(self.index.classes) if self.index.classes is not None else None

    @property
    def has_labels(self) -> bool:
        """Whether samples carry a ``cls`` label."""
        return "cls" in self.index.fields

    @property
    def decoded(self) -> bool:
        """Whether shards hold decoded pixels (HDF5 ``pixels``) rather than encoded images."""
        return self.index.decoded_shape is not None

    def locate(self, i: int) -> tuple[int, int]:
        """(shard number, row in shard) of sample ``i``."""
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} samples")
        shard = bisect.bisect_right(self._starts, i) - 1
        return shard, i - self._starts[shard]

    def reader(self, shard: int) -> ShardReader:
        """The (lazily opened) reader of shard number ``shard``."""
        reader = self._readers.get(shard)
        if reader is None:
            reader = self._readers[shard] = open_shard(self.root, self.index, self.index.shards[shard])
        return reader

    def where(self, i: int) -> str:
        """'shard-00003.tar:key' — how errors name a sample."""
        shard, row = self.locate(i)
        return f"{self.index.shards[shard].path}:{self.reader(shard).key(row)}"

    def raw(self, i: int) -> tuple[str, dict[str, bytes], np.ndarray | None]:
        """(key, encoded fields, decoded pixels or None) of sample ``i``, without decoding."""
        shard, row = self.locate(i)
        reader = self.reader(shard)
        pixels = reader.pixels(row) if self.decoded else None  # type: ignore[attr-defined]
        return reader.key(row), reader.read(row), pixels

    def __getitem__(self, i: int) -> dict[str, Any]:
        from fastload.decode.cpu import decode_image

        key, fields, pixels = self.raw(i)
        out: dict[str, Any] = {"key": key}
        if pixels is None:
            field = image_field(fields)
            if field is None:
                raise SampleError(self.where(i), f"no image field among {sorted(fields)}")
            pixels = decode_image(fields.pop(field), self.where(i))
        out["image"] = pixels
        if "cls" in fields:
            out["label"] = int(fields.pop("cls"))
        out.update(fields)
        return out

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_readers"] = {}
        return state

    def close(self) -> None:
        """Close this process's shard files."""
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()


def open(path: str | os.PathLike[str]) -> ShardedDataset:  # noqa: A001 - the public name is fastload.open
    """Open a converted dataset (a folder holding index.json)."""
    return ShardedDataset(path)
