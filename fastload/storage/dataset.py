"""``fastload.open``: a converted dataset as a map-style dataset with random access by position."""

from __future__ import annotations

import bisect
import itertools
import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from fastload._util.files import reserve_descriptors, this_process
from fastload.errors import ShardError
from fastload.fields import DECODED_FIELD, LABEL_FIELD, classic_names, decode_field, default_role, image_field
from fastload.formats.index import INDEX_FILE, DatasetIndex, read_index
from fastload.formats.part_table import PartTable
from fastload.formats.shard_files import offsets_name, open_shard, open_shard_files, table_name
from fastload.formats.shard_formats import ShardFormat, shard_format
from fastload.formats.shard_info import ShardInfo
from fastload.formats.shard_reader import PixelReader, ShardReader
from fastload.formats.table import Facts, SampleTable
from fastload.storage.remote import is_url
from fastload.storage.sample_tables import (
    DatasetKeys,
    built_table,
    indices_holding,
    indices_of,
    local_table,
    missing_tables,
    sample_labels,
)

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Iterator, Sequence

    import numpy as np

# Shards a process keeps open at once (least recently used closed first): a tar shard holds two
# descriptors (data, sample table), an HDF5 one two (h5py's, ours). By default half the process's
# descriptor limit goes to shards (a mixture's members split it): 256 under the common
# `ulimit -n 1024`, clear of the rest (the training process holds ~3 a worker, 26 with 8 workers;
# a worker ~20 besides its shards), and all 4,096 shards of a 40.96M-sample dataset open under
# `ulimit -n 20000` (a quarter kept 2,500: a worker's random access then reopened ~7,000 shards
# in 200 batches).
FDS_PER_SHARD = 2
SHARE_OF_DESCRIPTORS = 2  # a 1/SHARE_OF_DESCRIPTORS part of RLIMIT_NOFILE
MIN_OPEN_SHARDS = 4
MAX_OPEN_SHARDS_ENV = "FASTLOAD_MAX_OPEN_SHARDS"
log = logging.getLogger("fastload")


class ShardedDataset:
    """Samples of a converted dataset. ``ds[i]`` decodes sample i fully: a dict with ``key``,
    ``image`` (HWC uint8), ``label`` (int, when the data has ``cls``) and any extra raw fields.

    Shard files open lazily in each process, so the object can be created before workers fork;
    each process keeps at most ``max_open_shards`` open (FASTLOAD_MAX_OPEN_SHARDS, else half
    its descriptor limit's worth: 256 under ``ulimit -n 1024``).
    Per-sample positions, keys and labels come from each shard's sample table, read by ``pread``
    (built beside the shard on first open for datasets converted without them).
    A remote dataset (``s3://``, ``gs://``, ``http(s)://``, any fsspec URL) reads its index once
    per rank (rank 0 reads and broadcasts it when a process group exists) and its shards through
    a local :class:`~fastload.storage.cache.ShardCache`, whole files checked against the index.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        cache_dir: str | os.PathLike[str] | None = None,
        cache_size: int | str | None = None,
        storage_options: dict | None = None,
        max_open_shards: int | None = None,
    ) -> None:
        from fastload.storage.in_place_index import locate, shown

        located = locate(root, storage_options)  # Parquet files read in place (None: a dataset with its index.json)
        self._shown = shown(located) if located is not None else None  # one file read in place: its path, not its folder
        if located is not None:
            root = located.base
        url = str(root).rstrip("/") if is_url(root) else None
        self._cache_dir = cache_dir
        self.url, self.root = url, (Path(root) if url is None else None)
        if url is None:
            if located is None and (cache_dir is not None or cache_size is not None or storage_options is not None):
                raise ValueError("cache_dir, cache_size and storage_options apply to remote datasets (URLs)")
            self.index: DatasetIndex = read_index(Path(root)) if located is None else _in_place_index(located, cache_dir, storage_options)
            if located is None and self.layout.in_place:
                from fastload.storage.in_place_index import check_beside

                check_beside(Path(root), self.index)
            self.cache = None
        else:
            from fastload._util.sizes import parse_size
            from fastload.storage.cache import ShardCache

            limit = parse_size(cache_size) if isinstance(cache_size, str) else cache_size
            self.cache = ShardCache(cache_dir, limit, storage_options)
            self.index = read_remote_index(url, storage_options) if located is None else _in_place_index(located, self.cache.root, storage_options)
            largest = self._largest_shard()
            if largest > self.cache.max_bytes:
                raise ValueError(
                    f"{self.location}: the cache limit ({self.cache.max_bytes} bytes) is smaller than its largest "
                    f"shard ({largest} bytes); give cache_size= (or FASTLOAD_CACHE_SIZE) a few shards' worth"
                )
        if self.layout.in_place:  # pyarrow imported here once, not in each forked worker at its first row (~0.4 s a worker)
            from fastload.formats.parquet.bounds import import_pyarrow_parquet

            import_pyarrow_parquet()
        counts = self.index.shard_samples().tolist()
        self._starts = list(itertools.accumulate(counts, initial=0))
        self.max_open_shards = _max_open_shards(max_open_shards)
        self._readers: dict[int, ShardReader] = {}  # local: every shard read so far (closed or open)
        self._open: OrderedDict[int, ShardReader] = OrderedDict()  # the open ones, least recently used first
        self._reserved = -1  # the process that reserved descriptors for its shards
        self._process = this_process()  # the process its remote readers were opened in
        self._evicts = len(self.index.shards) > self._open_limit()  # False: every shard stays open, no LRU order kept
        self._per_shard = counts[0] if counts and counts[0] > 0 and all(c == counts[0] for c in counts[:-1]) and counts[-1] <= counts[0] else 0
        if self.root is not None and (missing := missing_tables(self.root, self.index)):
            log.warning(
                "%s: %d shard(s) have no sample table and the folder is read-only: each process parses their .idx "
                "into memory (~70 bytes a sample); run fastload on a writable copy once to build the tables",
                self.location, missing,
            )

    def __len__(self) -> int:
        return self._starts[-1]

    @property
    def layout(self) -> ShardFormat:
        """Its shards' layout: the row of fastload.formats.shard_formats that index.json names."""
        return shard_format(self.index.layout)

    def __repr__(self) -> str:
        return f"fastload.open({self.location!r}): {len(self)} samples, {len(self.index.shards)} {self.index.layout} shards"

    @property
    def location(self) -> str:
        """The dataset's folder or URL (without credentials); of one file read in place, the file's."""
        from fastload.storage.remote import redact

        if self._shown is not None:
            return self._shown
        return redact(self.url) if self.url is not None else str(self.root)

    def kept_in(self) -> Path:
        """The folder holding what fastload derives from this dataset and keeps (an index of data read in
        place, a column's document table): the shard cache's, else ``cache_dir=``, else FASTLOAD_CACHE_DIR's."""
        from fastload.storage.cache import default_cache_dir

        if self.cache is not None:
            return self.cache.root
        return Path(self._cache_dir) if self._cache_dir is not None else default_cache_dir()

    @property
    def classes(self) -> list[str] | None:
        """Class names by label, when the source had them."""
        return list(self.index.classes) if self.index.classes is not None else None

    @property
    def has_labels(self) -> bool:
        """Whether samples carry a label (a ``cls`` field, or a column read in place as one)."""
        return LABEL_FIELD in self.index.fields or "label" in self.index.columns.values()

    @property
    def streams(self) -> bool:
        """Whether it is read in the streaming order (shards in sequence, shuffled within a window):
        a remote dataset, or data read in place (whose rows are read a row group's batch at a time)."""
        return self.url is not None or self.layout.in_place

    @property
    def shuffle_window(self) -> int | None:
        """The streaming order's shuffle buffer where none is given (None: the loader's default). For
        data read in place: the rows whose bytes fill half of a process's Parquet memory
        (FASTLOAD_PARQUET_MEMORY), so each worker decodes a window's row groups once."""
        if not self.layout.in_place or not len(self):
            return None
        from fastload.formats.in_place_reader import memory_budget

        row_bytes = max(1, self.index.total_bytes // len(self))
        return max(1, memory_budget() // 2 // row_bytes)

    @property
    def classic_names(self) -> tuple[str, str]:
        """(image, label) stored names of the classic sample (:func:`fastload.fields.classic_names`)."""
        return classic_names(self.index.columns)

    def role(self, field: str) -> str:
        """The role of stored field ``field``: its column's, for data read in place, else its extension's default."""
        return self.index.columns.get(field) or default_role(field)

    @property
    def decoded(self) -> bool:
        """Whether shards hold decoded pixels (HDF5 ``pixels``) rather than encoded images."""
        return self.index.decoded_shape is not None

    def locate(self, i: int) -> tuple[int, int]:
        """(shard number, row in shard) of sample ``i``."""
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} samples")
        if self._per_shard:  # shards of one size (the converters'), the last maybe smaller
            return divmod(i, self._per_shard)
        shard = bisect.bisect_right(self._starts, i) - 1
        return shard, i - self._starts[shard]

    def shards_of(self, indices: np.ndarray) -> np.ndarray:
        """Shard number of each sample index."""
        from fastload.orders.epoch_order import shards_of

        return shards_of(self._starts, indices)

    def reader(self, shard: int) -> ShardReader:
        """The open reader of shard number ``shard``. At most ``max_open_shards`` stay open per
        process, least recently used closed first (a local reader keeps its table's schema, so
        reopening is two ``open`` calls); a remote dataset keeps at most
        ``MAX_OPEN_REMOTE_SHARDS`` and drops evicted readers, so evicted cache entries free their disk;
        data read in place keeps at most ``MAX_OPEN_IN_PLACE`` and drops them too, so a process keeps
        no reader per row group it read (its decoded batches are the process's cache's)."""
        if self._process != this_process() and self.root is None:  # forked: the parent's cached copies may be evicted by now
            self._open, self._readers, self._process = OrderedDict(), {}, this_process()
        reader = self._open.get(shard)  # one lookup a read
        if reader is not None:
            if self._evicts:  # the order matters only where shards are ever closed
                self._open.move_to_end(shard)
            return reader
        remote, in_place, limit = self.root is None, self.layout.in_place, self._open_limit()
        while len(self._open) >= limit:
            evicted, closing = self._open.popitem(last=False)
            closing.close()
            if remote or in_place:  # a row group's reader is cheap to make again: not one kept a row group read
                del self._readers[evicted]
        reader = self._readers.get(shard)
        if reader is None:
            if self._reserved != this_process():  # this process's first new reader
                reserve_descriptors(min(len(self.index.shards), limit) * FDS_PER_SHARD)
                self._reserved = this_process()
            reader = self._open_local(shard) if self.root is not None else self._open_cached(shard)
            self._readers[shard] = reader
        reader.open()
        self._open[shard] = reader
        return reader

    def _open_limit(self) -> int:
        """The readers a process keeps open (see :meth:`reader`)."""
        if self.root is None:
            return min(self.max_open_shards, MAX_OPEN_REMOTE_SHARDS)
        return min(self.max_open_shards, MAX_OPEN_IN_PLACE) if self.layout.in_place else self.max_open_shards

    def _open_local(self, shard: int) -> ShardReader:
        info, root = self.index.shards[shard], cast(Path, self.root)
        table = local_table(root, self.index, info) if self.layout.reads_through_table else None
        return open_shard(root, self.index, info, table, open_files=min(len(self.index.shards), self.max_open_shards))

    def _open_cached(self, shard: int) -> ShardReader:
        """A reader over the cached copy, its file opened at once: an open descriptor stays
        readable when another process evicts the entry; one evicted in between is fetched again."""
        data, offsets = self.fetch(shard)
        table = self.fetch_table(shard)
        try:
            return self._open_files(shard, data, offsets, table)
        except ShardError:
            if all(path is None or path.exists() for path in (data, offsets, table)):
                raise
        return self._open_files(shard, *self.fetch(shard), self.fetch_table(shard))

    def _open_files(self, shard: int, data: Path, offsets: Path | None, table: Path | None) -> ShardReader:
        info = self.index.shards[shard]
        samples = SampleTable(table, info.samples) if table is not None and self.layout.reads_through_table else None
        reader = open_shard_files(self.index, info, data, offsets, min(len(self.index.shards), MAX_OPEN_REMOTE_SHARDS), samples)
        reader.open()
        return reader

    @property
    def downloads(self) -> bool:
        """Whether some of its shards are downloaded (a remote dataset) before they are read."""
        return self.url is not None

    def is_remote(self, shard: int) -> bool:
        """Whether shard number ``shard`` is downloaded before it is read."""
        return self.url is not None

    def _largest_shard(self) -> int:
        """The bytes of its largest shard as the cache holds it (read in place: a row group and its file's footer)."""
        shards = self.index.shards
        if isinstance(shards, PartTable):
            return int((shards.column("bytes") + shards.column("footer_bytes")).max(initial=0))
        return max((shard.bytes for shard in shards), default=0)

    def fetch(self, shard: int) -> tuple[Path, Path | None]:
        """Local paths of a remote shard's files (data, offset index: a token shard's document
        table), downloading what the cache lacks (its sample table too); several processes asking at
        once download it once."""
        from fastload.storage.cache import RemoteFile
        from fastload.storage.remote import join

        if self.cache is None or self.url is None:
            raise ValueError(f"{self.location} is a local dataset: nothing to fetch")
        info = self.index.shards[shard]
        if self.layout.in_place:  # a row group's bytes and its file's footer, by range requests: never the whole file
            url, size, footer = join(self.url, info.path), info.file_bytes or 0, info.footer_bytes or 0
            footer_copy = self.cache.path(RemoteFile(url, info.path, None, footer, start=size - footer, version=info.sha256))
            span = RemoteFile(url, info.path, None, info.bytes, start=info.span_start, version=info.sha256)
            return self.cache.path(span), footer_copy  # the group last: the most recently used, the last evicted
        offsets = None
        if self.layout.offsets_beside:
            name = offsets_name(info)
            offsets = self.cache.path(RemoteFile(join(self.url, name), name, info.offsets_sha256, None, side_file_bytes(info)))
        data = self.cache.path(RemoteFile(join(self.url, info.path), info.path, info.sha256, info.bytes))
        table = self.fetch_table(shard)
        return data, table if self.layout.holds_tokens else offsets

    def fetch_table(self, shard: int) -> Path | None:
        """The local path of a remote shard's sample table (checked against its sha256), None when
        the index lists none (a dataset converted before tables: the shard's ``.idx`` is read)."""
        from fastload.storage.cache import RemoteFile
        from fastload.storage.remote import join

        info = self.index.shards[shard]
        if self.cache is None or self.url is None or info.table is None:
            return None
        return self.cache.path(RemoteFile(join(self.url, info.table), info.table, info.table_sha256, None, side_file_bytes(info)))

    def substitute(self, i: int, offset: int) -> int:
        """The sample ``offset`` places after ``i`` in dataset order (wrapping): what stands in for an
        unreadable sample with ``on_error="skip"``."""
        return (i + offset) % len(self)

    def shard_name(self, shard: int) -> str:
        """'shard-00003.tar' — how errors and descriptions name shard number ``shard``."""
        return self.index.shards[shard].path

    def where(self, i: int) -> str:
        """'shard-00003.tar:key' — how errors name a sample ('file.parquet:row12' for data read in place)."""
        shard, row = self.locate(i)
        key = self.reader(shard).key(row)
        return key if self.layout.in_place else f"{self.index.shards[shard].path}:{key}"  # in place: the key names its file

    def raw(self, i: int, fields: Collection[str] | None = None) -> tuple[str, dict[str, bytes], np.ndarray | None]:
        """(key, encoded fields, decoded pixels or None) of sample ``i``, without decoding; only the
        fields named in ``fields`` when given (decoded pixels: ``pixels``), the others not read."""
        shard, row = self.locate(i)
        reader = self.reader(shard)
        wants_pixels = self.decoded and (fields is None or DECODED_FIELD in fields)
        pixels = cast(PixelReader, reader).pixels(row) if wants_pixels else None  # only HDF5 shards hold decoded pixels
        return reader.key(row), reader.read(row, fields), pixels

    def stream_facts(self, i: int) -> Facts:
        """The stream facts of sample ``i``'s videos by field (its shard's sample table; nothing
        of the video is read)."""
        shard, row = self.locate(i)
        return self.reader(shard).stream_facts(row)

    def __getitem__(self, i: int) -> dict[str, Any]:
        key, fields, pixels = self.raw(i)
        out: dict[str, Any] = {"key": key}
        if self.index.columns:  # read in place: each column by its role, under its name
            out.update({name: decode_field(self.role(name), data, self.where(i), name) for name, data in fields.items()})
            return out
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

    def table(self, shard: int) -> SampleTable:
        """Shard ``shard``'s sample table (built in memory where it cannot be written); close it after use."""
        info = self.index.shards[shard]
        if self.root is not None:
            table = local_table(self.root, self.index, info)
            if table is not None:
                return table
            return SampleTable(self.root / table_name(info), info.samples, built_table(open_shard(self.root, self.index, info, open_files=1)))
        path = self.fetch_table(shard)
        if path is not None:
            return SampleTable(path, info.samples)
        return SampleTable(Path(table_name(info)), info.samples, built_table(self._open_files(shard, *self.fetch(shard), None)))

    def _tables(self) -> Iterator[SampleTable]:
        for shard in range(len(self.index.shards)):
            table = self.table(shard)
            try:
                yield table
            finally:
                table.close()

    def sample_labels(self) -> np.ndarray:
        """Every sample's label by global index (read-only int64, -1 where unlabelled), from the
        sample tables without reading shards: 8 bytes a sample, one read per shard."""
        return sample_labels(self._tables())

    def sample_keys(self) -> Sequence[str]:
        """Every sample's key by global index: a view that reads keys from the tables as asked."""
        return DatasetKeys(self.key_of, self._tables, len(self))

    def key_of(self, i: int) -> str:
        """The key of sample ``i``."""
        shard, row = self.locate(i)
        return self.reader(shard).key(row)

    def indices_of(self, keys: Iterable[str]) -> np.ndarray:
        """The global index (int64) of each of ``keys``, in their order, found through the tables'
        key hashes (one read per shard); a KeyError names the first key no sample has."""
        return indices_of(keys, zip(self._starts, self._tables()), self.location)

    def indices_holding(self, keys: Iterable[str]) -> np.ndarray:
        """The sorted global indices of every sample holding one of ``keys`` (foreign tars may
        repeat a key across shards; ``exclude=`` leaves them all out); a KeyError names the first
        key no sample has."""
        return indices_holding(keys, zip(self._starts, self._tables()), self.location)

    def made_here(self) -> dict[Any, Any]:
        """What this process keeps made of the dataset (a token loader's rows, for torch's batch sampler), by what
        made it; never pickled, and let go with the dataset."""
        return self.__dict__.setdefault("_made_here", {})

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_readers"], state["_open"] = {}, OrderedDict()  # each process opens its own files
        state.pop("_made_here", None)  # each process makes its own
        return state

    def close(self) -> None:
        """Close this process's shard files."""
        for reader in self._open.values():
            reader.close()
        self._open.clear()
        if self.root is None:
            self._readers.clear()


MAX_OPEN_REMOTE_SHARDS = 16
MAX_OPEN_IN_PLACE = 1024  # readers of row groups a process keeps (a few KiB each, made again in microseconds)


def side_file_bytes(shard: ShardInfo) -> int:
    """The most a shard's ``.idx`` or sample table may hold, which the index gives no size for: no
    more than the shard itself (a line or a row per member, which the shard holds with its header
    and data) or :data:`~fastload.storage.remote.MAX_UNSIZED_BYTES` for a small shard."""
    from fastload.storage.remote import MAX_UNSIZED_BYTES

    return max(MAX_UNSIZED_BYTES, shard.bytes)


def default_max_open_shards() -> int:
    """The shards a process keeps open by default: half its descriptor limit's worth."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(MIN_OPEN_SHARDS, soft // SHARE_OF_DESCRIPTORS // FDS_PER_SHARD)


def open_shards_each(datasets: int) -> int:
    """The open-shard cap of each of ``datasets`` datasets a process reads together (a mixture's
    members): FASTLOAD_MAX_OPEN_SHARDS, else the default, split between them."""
    return max(MIN_OPEN_SHARDS, _max_open_shards(None) // max(1, datasets))


def _max_open_shards(value: int | None) -> int:
    """``value``, else FASTLOAD_MAX_OPEN_SHARDS, else the default; at least 1."""
    if value is None:
        text = os.environ.get(MAX_OPEN_SHARDS_ENV)
        if text is None:
            return default_max_open_shards()
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{MAX_OPEN_SHARDS_ENV}={text!r}: must be a whole number of shards") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_open_shards: must be a whole number of shards, at least 1 (got {value!r})")
    return value


def _in_place_index(located: Any, cache_dir: str | os.PathLike[str] | None, storage_options: dict | None) -> DatasetIndex:
    """The index of files read in place (:mod:`fastload.storage.in_place_index`), kept under ``cache_dir``
    (default: the shard cache's folder)."""
    from fastload.storage.cache import default_cache_dir
    from fastload.storage.in_place_index import open_index

    return open_index(located, Path(cache_dir) if cache_dir is not None else default_cache_dir(), storage_options)


def read_remote_index(url: str, storage_options: dict | None = None) -> DatasetIndex:
    """The index of the dataset at ``url``: read by rank 0 and broadcast when a process group is
    initialized, else just read."""
    from fastload._util.dist import broadcast_bytes
    from fastload.storage import remote

    where = remote.redact(remote.join(url, INDEX_FILE))
    text = broadcast_bytes(lambda: remote.read_bytes(remote.join(url, INDEX_FILE), storage_options), where)
    return DatasetIndex.from_json(text, where=where)


def open(  # the public name is fastload.open
    path: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None = None,
    cache_size: int | str | None = None,
    storage_options: dict | None = None,
    max_open_shards: int | None = None,
) -> ShardedDataset:
    """Open a converted dataset: a folder holding index.json, or its URL (then shards are cached
    under ``cache_dir`` / FASTLOAD_CACHE_DIR, at most ``cache_size`` / FASTLOAD_CACHE_SIZE);
    each process keeps at most ``max_open_shards`` shards open (FASTLOAD_MAX_OPEN_SHARDS, else
    half its descriptor limit's worth: 256 under ``ulimit -n 1024``)."""
    return ShardedDataset(path, cache_dir, cache_size, storage_options, max_open_shards)
