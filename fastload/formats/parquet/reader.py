"""A row group of a Parquet file read in place as one shard, a row as one sample: each column a
field, its value given as the bytes its role's codec reads (:mod:`fastload.fields`), so the
workers decode, crop and transform it as any shard's field.

A row group is read in bounded batches (:mod:`fastload.formats.parquet.bounds`), never whole; the
batches read are kept in one per-process cache of at most ``FASTLOAD_PARQUET_MEMORY`` (default
256 MiB), so rows asked for in any order within the streaming order's window are decoded once,
and a batch before the one a group's reader stands at restarts that reader (read forward again).
A remote file is read from the cache's copies of the group's bytes and of the file's footer
(:class:`SpanFile`), never whole.
"""

from __future__ import annotations

import io
import json
import os
from collections import OrderedDict
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastload.errors import SampleError, ShardError
from fastload.fields import format_label
from fastload.formats import this_process
from fastload.formats.parquet.bounds import (
    MAX_ROW_GROUP_BYTES,
    arrow_errors,
    batch_rows,
    damage,
    declared_bytes,
    group_batches,
    import_pyarrow_parquet,
)

if TYPE_CHECKING:
    from fastload.formats.index import ShardInfo
    from fastload.formats.table import Facts

MEMORY_ENV = "FASTLOAD_PARQUET_MEMORY"
DEFAULT_MEMORY = 256 << 20  # decoded batches a process keeps
OPEN_GROUPS = 8  # row groups a process keeps a forward reader of
OPEN_FOOTERS = 64  # files whose parsed footer a process keeps


def role_of(arrow_type: Any) -> str:
    """The role (:data:`fastload.fields.ROLES`) of a column of ``arrow_type``: the Hub's image struct
    (``{"bytes", "path"}``) or binary an image, an integer a label, a string text, a list of numbers
    an array, anything else JSON."""
    import pyarrow as pa

    t = arrow_type
    if pa.types.is_dictionary(t):
        t = t.value_type
    binary = lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t)  # noqa: E731
    if pa.types.is_struct(t) and any(t.field(i).name == "bytes" and binary(t.field(i).type) for i in range(t.num_fields)):
        return "image"
    if binary(t) or pa.types.is_fixed_size_binary(t):
        return "image"
    if pa.types.is_integer(t):
        return "label"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "text"
    inner = t
    while pa.types.is_list(inner) or pa.types.is_large_list(inner) or pa.types.is_fixed_size_list(inner):
        inner = inner.value_type
    if inner is not t and (pa.types.is_integer(inner) or pa.types.is_floating(inner) or pa.types.is_boolean(inner)):
        return "array"
    return "json"


def class_names(schema_metadata: Mapping[bytes, bytes] | None, label_column: str) -> tuple[str, ...] | None:
    """Class names of ``label_column`` from the Hugging Face feature description stored in a file
    (a ClassLabel's names), if present and well formed."""
    raw = (schema_metadata or {}).get(b"huggingface")
    if not raw:
        return None
    try:
        info = json.loads(raw).get("info", {}).get("features", {}).get(label_column, {})
        names = info.get("names") if isinstance(info, dict) else None
    except (ValueError, AttributeError):
        return None
    return tuple(names) if isinstance(names, list) and names and all(isinstance(n, str) for n in names) else None


def field_bytes(role: str, value: Any, where: str, column: str) -> bytes:
    """A column's value as the bytes its role's codec reads: an image's encoded bytes (of a Hub
    image struct, its ``bytes``), a label in decimal, text as UTF-8, an array as ``.npy``, else JSON."""
    if role == "image":
        data = value.get("bytes") if isinstance(value, dict) else value
        if not isinstance(data, (bytes, bytearray)):
            path = value.get("path") if isinstance(value, dict) else None
            raise SampleError(where, f"column {column!r} holds no image bytes" + (" (only a path, which fastload does not follow)" if path else ""))
        return bytes(data)
    if role == "label":
        if isinstance(value, bool) or not isinstance(value, int):
            raise SampleError(where, f"column {column!r}: the label is not an integer")
        return format_label(value)
    if role == "text":
        if not isinstance(value, str):
            raise SampleError(where, f"column {column!r}: not text")
        return value.encode("utf-8", "surrogatepass")
    if role == "array":
        import numpy as np

        out = io.BytesIO()
        try:
            np.save(out, np.asarray(value), allow_pickle=False)
        except ValueError:
            raise SampleError(where, f"column {column!r}: its lists are ragged, not an array") from None
        return out.getvalue()
    return json.dumps(value, ensure_ascii=False, default=str).encode()


class SpanFile(io.RawIOBase):
    """A file of ``size`` bytes of which only some pieces are here (each ``(offset in the file, local
    path)``): what pyarrow reads a remote row group from, its column chunks and the footer fetched
    by ranges. A read outside the pieces is an OSError (the footer lied about where a chunk is)."""

    def __init__(self, size: int, pieces: Sequence[tuple[int, str | Path]], name: str) -> None:
        super().__init__()
        self.size, self.name_shown, self._at = size, name, 0
        self._pieces = [(offset, os.path.getsize(path), open(path, "rb")) for offset, path in pieces]  # noqa: SIM115  # closed by close()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._at = offset if whence == io.SEEK_SET else self._at + offset if whence == io.SEEK_CUR else self.size + offset
        return self._at

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), max(0, self.size - self._at))
        if want == 0:
            return 0
        for offset, length, file in self._pieces:
            if offset <= self._at and self._at + want <= offset + length:
                file.seek(self._at - offset)
                got = file.readinto(memoryview(buffer)[:want])
                self._at += got
                return got
        raise OSError(f"{self.name_shown}: bytes {self._at}-{self._at + want} lie outside the row group and footer fetched")

    def close(self) -> None:
        for _, _, file in self._pieces:
            file.close()
        super().close()


def _footer_metadata(footer: str | Path) -> Any:
    """The metadata parsed from a file's fetched footer (its last bytes: the footer, its length, PAR1)."""
    import pyarrow as pa

    with open(footer, "rb") as file:
        return import_pyarrow_parquet().read_metadata(pa.BufferReader(b"PAR1" + file.read()))


def memory_budget() -> int:
    """FASTLOAD_PARQUET_MEMORY (bytes, or a size such as "512MB"), else DEFAULT_MEMORY."""
    from fastload._util.sizes import parse_size

    text = os.environ.get(MEMORY_ENV)
    return parse_size(text) if text else DEFAULT_MEMORY


class _Cache:
    """This process's decoded batches (least recently used dropped past the budget), forward readers
    of row groups and parsed footers."""

    def __init__(self) -> None:
        self.batches: OrderedDict[tuple, Any] = OrderedDict()
        self.held = 0
        self.readers: OrderedDict[tuple, tuple[Iterator[Any], int]] = OrderedDict()  # group -> (its batches, the next one's number)
        self.footers: OrderedDict[tuple, Any] = OrderedDict()
        self.budget = -1

    def keep(self, key: tuple, batch: Any) -> None:
        if self.budget < 0:
            self.budget = memory_budget()
        self.batches[key] = batch
        self.held += batch.nbytes
        while self.held > self.budget and len(self.batches) > 1:
            _, dropped = self.batches.popitem(last=False)
            self.held -= dropped.nbytes


_cache = _Cache()


def _forked() -> None:
    global _cache
    _cache = _Cache()  # a reader is never shared across a fork


os.register_at_fork(after_in_child=_forked)


class ParquetGroupReader:
    """One row group of one Parquet file (``shard``: its index entry) as a shard: ``columns`` maps
    each column read to its role. ``path`` is the local file (``root``: the dataset folder its
    links must stay in), or with ``footer`` the cache's copy of the group's bytes and that of the
    file's footer (a remote file)."""

    def __init__(self, path: str | Path, shard: ShardInfo, columns: Mapping[str, str], footer: str | Path | None = None,
                 root: str | None = None) -> None:
        self.path, self.footer, self.root = path, footer, root
        self.shard, self.columns = shard, dict(columns)
        self.group = shard.row_group if shard.row_group is not None else 0
        self.rows = shard.samples
        self._id = (shard.path, shard.sha256, self.group)  # the file's footer names its content
        self._pid = -1
        self._meta: Any = None
        self._span: SpanFile | None = None  # a remote file's fetched pieces, held open (an evicted entry stays readable)

    def __len__(self) -> int:
        return self.rows

    @property
    def shown(self) -> str:
        """The file as errors name it: its path in the dataset."""
        return self.shard.path

    def where(self, i: int) -> str:
        """'file.parquet:row123', as errors name a row: its key."""
        return self.key(i)

    def key(self, i: int) -> str:
        """The key of row ``i`` of the group: its file and its row number there, ``data/train.parquet:row123``
        (unique in the dataset, as a tar's keys are)."""
        return f"{self.shown}:row{(self.shard.first_row or 0) + i}"

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_meta"], state["_span"], state["_pid"] = None, None, -1
        return state

    def _source(self) -> Any:
        """What pyarrow reads: the file's path, or a SpanFile of the fetched pieces (opened in this
        process at its first use)."""
        if self.footer is None:
            return str(self.path)
        if self._span is None or self._pid != this_process():
            info = self.shard
            size, footer = info.file_bytes or 0, info.footer_bytes or 0
            try:
                self._span = SpanFile(size, [(info.span_start or 0, self.path), (size - footer, self.footer)], self.shown)
            except OSError as exc:
                raise ShardError(f"{self.shown}: cannot open the fetched row group {self.group} ({exc.strerror})") from None
            self._pid = this_process()
        return self._span

    def metadata(self) -> Any:
        """The file's parsed footer (kept per process for OPEN_FOOTERS files); a ShardError naming the
        file when it cannot be read or disagrees with the index (a file changed since it was indexed)."""
        if self._meta is not None and self._pid == this_process():
            return self._meta
        footers, file = _cache.footers, self._id[:2]
        meta = footers.get(file)
        source = self._source()
        if meta is None:
            pq = import_pyarrow_parquet()
            try:  # a remote file's footer is parsed from its fetched copy (pyarrow would read the file's last 64 KiB)
                meta = pq.read_metadata(source) if self.footer is None else _footer_metadata(self.footer)
            except arrow_errors() as exc:
                raise ShardError(f"{self.shown}: not a readable Parquet file ({damage(exc)})") from None
            footers[file] = meta
            while len(footers) > OPEN_FOOTERS:
                footers.popitem(last=False)
        footers.move_to_end(file)
        if self.group >= meta.num_row_groups or meta.row_group(self.group).num_rows != self.rows:
            raise ShardError(f"{self.shown}: row group {self.group} is not the {self.rows} rows the index lists (the file changed "
                             "since it was indexed: run fastload index again)")
        self._meta, self._pid = meta, this_process()
        return meta

    def open(self) -> None:
        """Read the file's footer in this process now."""
        self.metadata()

    def read(self, i: int, fields: Collection[str] | None = None) -> dict[str, bytes]:
        """Row ``i``'s columns (those named in ``fields`` when given) as their roles' bytes; a null
        value is left out, as a tar leaves out a member a sample lacks."""
        columns = tuple(name for name in self.columns if fields is None or name in fields)
        if not columns:
            return {}
        batch, row = self._batch_of(i, columns)
        out = {}
        for n, name in enumerate(columns):
            value = batch.column(n)[row].as_py()
            if value is not None:
                out[name] = field_bytes(self.columns[name], value, self.where(i), name)
        return out

    def _batch_of(self, i: int, columns: tuple[str, ...]) -> tuple[Any, int]:
        """(the decoded batch holding row ``i``, its row there), from this process's cache or read."""
        if not 0 <= i < self.rows:
            raise IndexError(f"{self.shown}: row {i} of row group {self.group} out of range ({self.rows} rows)")
        meta = self.metadata()
        declared = declared_bytes(meta, self.group, columns)
        if declared > MAX_ROW_GROUP_BYTES:
            raise SampleError(self.where(i), f"row group {self.group} declares {declared} bytes uncompressed in columns "
                                             f"{', '.join(columns)}, over the {MAX_ROW_GROUP_BYTES} fastload reads of a group")
        per_batch = batch_rows(meta, self.group, columns, declared)
        number, row = divmod(i, per_batch)
        key = (*self._id, columns, number)
        batch = _cache.batches.get(key)
        if batch is not None:
            _cache.batches.move_to_end(key)
            return batch, row
        group_key = (*self._id, columns)
        batches, at = _cache.readers.pop(group_key, (None, 0))
        if batches is None or at > number:
            batches, at = self._batches(columns, per_batch, meta), 0
        try:
            while at <= number:
                batch = next(batches)
                _cache.keep((*group_key, at), batch)
                at += 1
        except StopIteration:
            raise ShardError(f"{self.shown}: row group {self.group} ends before row {i} (the file changed since it was indexed?)") from None
        except arrow_errors() as exc:
            raise SampleError(self.where(i), f"damaged Parquet data in row group {self.group}: {damage(exc)}") from None
        _cache.readers[group_key] = (batches, at)
        while len(_cache.readers) > OPEN_GROUPS:
            _cache.readers.popitem(last=False)
        return batch, row

    def _batches(self, columns: tuple[str, ...], per_batch: int, meta: Any) -> Iterator[Any]:
        """The group's batches, read forward."""
        return group_batches(self._source(), self.group, columns, per_batch, meta)

    def check(self) -> None:
        """Read every row of the group (for ``verify``): a ShardError naming the file where one cannot be."""
        for i in range(self.rows):
            try:
                self.read(i)
            except SampleError as exc:
                raise ShardError(str(exc)) from None

    def sample_table(self, facts: Sequence[Facts] = ()) -> bytes:
        """Data read in place has no sample table: its index locates every row."""
        raise ValueError(f"{self.shown}: a Parquet row group is read in place, without a sample table")

    def stream_facts(self, i: int) -> Facts:
        """No videos are read from Parquet: no stream facts."""
        return {}

    def close(self) -> None:
        """Close this process's fetched pieces and the group's forward readers (the batches read stay in
        the process's cache until evicted)."""
        for key in [key for key in _cache.readers if key[:3] == self._id]:
            del _cache.readers[key]
        if self._span is not None and self._pid == this_process():
            self._span.close()
        self._meta, self._span = None, None
