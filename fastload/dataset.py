"""``fastload.open``: a converted dataset as a map-style dataset with random access by position."""

from __future__ import annotations

import bisect
import itertools
import os
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from fastload.errors import ShardError
from fastload.fields import LABEL_FIELD, decode_field, image_field
from fastload.formats import PixelReader, ShardReader, offsets_name, open_shard, open_shard_files
from fastload.index import INDEX_FILE, DatasetIndex, read_index
from fastload.remote import is_url

if TYPE_CHECKING:
    import numpy as np


class ShardedDataset:
    """Samples of a converted dataset. ``ds[i]`` decodes sample i fully: a dict with ``key``,
    ``image`` (HWC uint8), ``label`` (int, when the data has ``cls``) and any extra raw fields.

    Shard files open lazily in each process, so the object can be created before workers fork.
    A remote dataset (``s3://``, ``gs://``, ``http(s)://``, any fsspec URL) reads its index once
    per rank (rank 0 reads and broadcasts it when a process group exists) and its shards through
    a local :class:`~fastload.cache.ShardCache`, whole files checked against the index.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        cache_dir: str | os.PathLike[str] | None = None,
        cache_size: int | str | None = None,
        storage_options: dict | None = None,
    ) -> None:
        url = str(root).rstrip("/") if is_url(root) else None
        self.url, self.root = url, (Path(root) if url is None else None)
        if url is None:
            if cache_dir is not None or cache_size is not None or storage_options is not None:
                raise ValueError("cache_dir, cache_size and storage_options apply to remote datasets (URLs)")
            self.index: DatasetIndex = read_index(Path(root))
            self.cache = None
        else:
            from fastload.cache import ShardCache
            from fastload.sizes import parse_size

            self.index = read_remote_index(url, storage_options)
            limit = parse_size(cache_size) if isinstance(cache_size, str) else cache_size
            self.cache = ShardCache(cache_dir, limit, storage_options)
            largest = max((shard.bytes for shard in self.index.shards), default=0)
            if largest > self.cache.max_bytes:
                raise ValueError(
                    f"{self.location}: the cache limit ({self.cache.max_bytes} bytes) is smaller than its largest "
                    f"shard ({largest} bytes); give cache_size= (or FASTLOAD_CACHE_SIZE) a few shards' worth"
                )
        self._starts = list(itertools.accumulate((s.samples for s in self.index.shards), initial=0))
        self._readers: OrderedDict[int, ShardReader] = OrderedDict()

    def __len__(self) -> int:
        return self._starts[-1]

    def __repr__(self) -> str:
        return f"fastload.open({self.location!r}): {len(self)} samples, {len(self.index.shards)} {self.index.layout} shards"

    @property
    def location(self) -> str:
        """The dataset's folder or URL (without credentials)."""
        from fastload.remote import redact

        return redact(self.url) if self.url is not None else str(self.root)

    @property
    def classes(self) -> list[str] | None:
        """Class names by label, when the source had them."""
        return list(self.index.classes) if self.index.classes is not None else None

    @property
    def has_labels(self) -> bool:
        """Whether samples carry a ``cls`` label."""
        return LABEL_FIELD in self.index.fields

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

    def shards_of(self, indices: np.ndarray) -> np.ndarray:
        """Shard number of each sample index."""
        from fastload.sampling import shards_of

        return shards_of(self._starts, indices)

    def reader(self, shard: int) -> ShardReader:
        """The (lazily opened) reader of shard number ``shard``. A remote dataset keeps at most
        ``MAX_OPEN_REMOTE_SHARDS`` open per process, so evicted cache entries free their disk."""
        reader = self._readers.get(shard)
        if reader is not None:
            self._readers.move_to_end(shard)
            return reader
        if self.root is not None:
            reader = open_shard(self.root, self.index, self.index.shards[shard])
        else:
            reader = self._open_cached(shard)
            while len(self._readers) >= MAX_OPEN_REMOTE_SHARDS:
                self._readers.popitem(last=False)[1].close()
        self._readers[shard] = reader
        return reader

    def _open_cached(self, shard: int) -> ShardReader:
        """A reader over the cached copy, its file opened at once: an open descriptor stays
        readable when another process evicts the entry; one evicted in between is fetched again."""
        data, offsets = self.fetch(shard)
        try:
            return self._open_files(shard, data, offsets)
        except ShardError:
            if all(path is None or path.exists() for path in (data, offsets)):
                raise
        return self._open_files(shard, *self.fetch(shard))

    def _open_files(self, shard: int, data: Path, offsets: Path | None) -> ShardReader:
        info = self.index.shards[shard]
        reader = open_shard_files(self.index, info, data, offsets, min(len(self.index.shards), MAX_OPEN_REMOTE_SHARDS))
        reader.open()
        return reader

    def fetch(self, shard: int) -> tuple[Path, Path | None]:
        """Local paths of a remote shard's files (data, offset index), downloading what the cache
        lacks; several processes asking at once download it once."""
        from fastload.cache import RemoteFile
        from fastload.remote import join

        if self.cache is None or self.url is None:
            raise ValueError(f"{self.location} is a local dataset: nothing to fetch")
        info = self.index.shards[shard]
        offsets = None
        if self.index.layout == "wds":
            name = offsets_name(info)
            offsets = self.cache.path(RemoteFile(join(self.url, name), name, info.offsets_sha256, None))
        data = self.cache.path(RemoteFile(join(self.url, info.path), info.path, info.sha256, info.bytes))
        return data, offsets

    def where(self, i: int) -> str:
        """'shard-00003.tar:key' — how errors name a sample."""
        shard, row = self.locate(i)
        return f"{self.index.shards[shard].path}:{self.reader(shard).key(row)}"

    def raw(self, i: int) -> tuple[str, dict[str, bytes], np.ndarray | None]:
        """(key, encoded fields, decoded pixels or None) of sample ``i``, without decoding."""
        shard, row = self.locate(i)
        reader = self.reader(shard)
        pixels = cast(PixelReader, reader).pixels(row) if self.decoded else None  # only HDF5 shards hold decoded pixels
        return reader.key(row), reader.read(row), pixels

    def __getitem__(self, i: int) -> dict[str, Any]:
        key, fields, pixels = self.raw(i)
        out: dict[str, Any] = {"key": key}
        field = image_field(fields)
        if pixels is not None:
            out["image"] = pixels
        elif field is not None:
            out["image"] = decode_field("image", fields.pop(field), self.where(i), field)
        if LABEL_FIELD in fields:
            out["label"] = decode_field("label", fields.pop(LABEL_FIELD), self.where(i), LABEL_FIELD)
        out.update(fields)
        return out

    def __getitems__(self, indices: list[int]) -> Any:
        """torch's batched fetch: the batch sampler of a fastload loader yields lists that make that
        loader's batch (same plans, same pixels); other index lists give one ``ds[i]`` each."""
        fill = getattr(indices, "fill", None)
        return fill(self) if fill is not None else [self[i] for i in indices]

    # --- per-sample tables: a minimal version reading every shard's members (orders branch; the
    # memory-mapped tables of the tables branch replace these two methods at merge) ---------------

    def indices_of(self, keys: list[str]) -> np.ndarray:
        """Sample index of each key (int64); a KeyError names the first key the dataset lacks."""
        import numpy as np

        wanted = dict.fromkeys(keys, -1)
        for shard in range(len(self.index.shards)):
            reader = self.reader(shard)
            for row in range(len(reader)):
                key = reader.key(row)
                if key in wanted:
                    wanted[key] = self._starts[shard] + row
        for key, index in wanted.items():
            if index < 0:
                raise KeyError(key)
        return np.array([wanted[key] for key in keys], dtype=np.int64)

    def sample_labels(self) -> np.ndarray:
        """Every sample's label (int64), -1 where a sample has none."""
        import numpy as np

        labels = np.full(len(self), -1, dtype=np.int64)
        if not self.has_labels:
            return labels
        for i in range(len(self)):
            _, fields, _ = self.raw(i)
            if LABEL_FIELD in fields:
                labels[i] = decode_field("label", fields[LABEL_FIELD], self.where(i), LABEL_FIELD)
        return labels

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_readers"] = OrderedDict()  # each process opens its own files
        return state

    def close(self) -> None:
        """Close this process's shard files."""
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()


MAX_OPEN_REMOTE_SHARDS = 16


def read_remote_index(url: str, storage_options: dict | None = None) -> DatasetIndex:
    """The index of the dataset at ``url``: read by rank 0 and broadcast when a process group is
    initialized, else just read."""
    from fastload import remote
    from fastload.dist import broadcast_bytes

    where = remote.redact(remote.join(url, INDEX_FILE))
    text = broadcast_bytes(lambda: remote.read_bytes(remote.join(url, INDEX_FILE), storage_options), where)
    return DatasetIndex.from_json(text, where=where)


def open(  # the public name is fastload.open
    path: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None = None,
    cache_size: int | str | None = None,
    storage_options: dict | None = None,
) -> ShardedDataset:
    """Open a converted dataset: a folder holding index.json, or its URL (then shards are cached
    under ``cache_dir`` / FASTLOAD_CACHE_DIR, at most ``cache_size`` / FASTLOAD_CACHE_SIZE)."""
    return ShardedDataset(path, cache_dir, cache_size, storage_options)
