"""What every layout read in place shares (``parquet``, ``arrow``, ``lance``: data written by others,
read where it is): a column's role from its Arrow type, a value as the bytes its role's codec reads
(:mod:`fastload.fields`), the per-process cache of decoded batches, and the reader every such
layout's is (:class:`InPlaceReader`: a shard is a part of a file, a row a sample, each column a
field). The batches a process has read are kept up to ``FASTLOAD_PARQUET_MEMORY`` (default 256 MiB;
least recently used dropped), so rows asked for in any order within the streaming order's window
are decoded once."""

from __future__ import annotations

import io
import json
import os
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fastload.errors import SampleError, ShardError
from fastload.fields import format_label
from fastload.formats.parquet.bounds import import_pyarrow

if TYPE_CHECKING:
    from fastload.formats.shard_info import ShardInfo
    from fastload.formats.table import Facts

MEMORY_ENV = "FASTLOAD_PARQUET_MEMORY"
DEFAULT_MEMORY = 256 << 20  # decoded batches a process keeps
OPEN_GROUPS = 8  # shards a process keeps a forward reader of
OPEN_FILES = 64  # files whose parsed footer (schema, handle) a process keeps
MAX_ID = 2**63 - 1  # the largest token id a column of ids may hold (a batch's arrays are int64)


def role_of(arrow_type: Any) -> str:
    """The role (:data:`fastload.fields.ROLES`) of a column of ``arrow_type``: the Hub's image struct
    (``{"bytes", "path"}``) or binary an image, an integer a label, a string text, a list of numbers
    an array, anything else JSON."""
    pa = import_pyarrow()
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


def column_roles(schema: Any) -> dict[str, str]:
    """Each top-level column's role (:func:`role_of`) of an Arrow ``schema``, by name."""
    return {f.name: role_of(f.type) for f in schema}


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
        out = io.BytesIO()
        try:
            np.save(out, np.asarray(value), allow_pickle=False)
        except ValueError:
            raise SampleError(where, f"column {column!r}: its lists are ragged, not an array") from None
        return out.getvalue()
    return json.dumps(value, ensure_ascii=False, default=str).encode()


_UNREAD = object()  # a column whose values read() has not yet looked at


def _plain_values(column: Any, role: str) -> Callable[[int], bytes] | None:
    """A row's value of ``column`` as :func:`field_bytes` gives it, read straight from the batch's
    buffers where that is plain (no null in the column): an image's bytes sliced from a binary
    column's (or a Hub image struct's ``bytes``) data, a label from the column made a list once;
    None for any other column (each value made a pyarrow scalar, 5-10 us a row)."""
    pa = import_pyarrow()
    if not isinstance(column, pa.Array) or column.null_count:
        return None
    if role == "label" and pa.types.is_integer(column.type):
        labels = [format_label(label) for label in column.to_pylist()]
        return labels.__getitem__
    if role != "image":
        return None
    if pa.types.is_struct(column.type):
        at = column.type.get_field_index("bytes")
        if at < 0:
            return None
        column = column.flatten()[at]
        if column.null_count:
            return None
    width = np.int32 if pa.types.is_binary(column.type) else np.int64 if pa.types.is_large_binary(column.type) else None
    if width is None:
        return None
    _, offsets, data = column.buffers()
    starts = np.frombuffer(offsets, dtype=width)[column.offset : column.offset + len(column) + 1].tolist()
    view = memoryview(data) if data is not None else memoryview(b"")
    return lambda row: bytes(view[starts[row] : starts[row + 1]])


def memory_budget() -> int:
    """FASTLOAD_PARQUET_MEMORY (bytes, or a size such as "512MB"), else DEFAULT_MEMORY."""
    from fastload._util.sizes import parse_size

    text = os.environ.get(MEMORY_ENV)
    return parse_size(text) if text else DEFAULT_MEMORY


class _Cache:
    """This process's decoded batches (least recently used dropped past the budget), forward readers
    of shards and per-file handles."""

    def __init__(self) -> None:
        self.batches: OrderedDict[tuple, Any] = OrderedDict()
        self.values: dict[int, dict[str, Any]] = {}  # a kept batch (by id) -> its columns' values read without pyarrow's scalars
        self.held = 0
        self.readers: OrderedDict[tuple, tuple[Iterator[Any], int]] = OrderedDict()  # group -> (its batches, the next one's number)
        self.files: OrderedDict[tuple, Any] = OrderedDict()  # a layout's per-file handles (parsed footers, schemas)
        self.budget = -1

    def keep(self, key: tuple, batch: Any) -> None:
        if self.budget < 0:
            self.budget = memory_budget()
        replaced = self.batches.pop(key, None)
        if replaced is not None:  # read again (a reader restarted): its values may not outlive it under its id
            self.held -= replaced.nbytes
            self.values.pop(id(replaced), None)
        self.batches[key] = batch
        self.held += batch.nbytes
        while self.held > self.budget and len(self.batches) > 1:
            _, dropped = self.batches.popitem(last=False)
            self.values.pop(id(dropped), None)
            self.held -= dropped.nbytes

    def hit(self, key: tuple) -> Any:
        """The batch kept under ``key`` (now the most recently used), or None."""
        batch = self.batches.get(key)
        if batch is not None:
            self.batches.move_to_end(key)
        return batch

    def drop(self, key: tuple) -> Any:
        """The batch kept under ``key``, no longer kept."""
        batch = self.batches.pop(key)
        self.held -= batch.nbytes
        self.values.pop(id(batch), None)
        return batch

    def file(self, key: tuple, opened: Callable[[], Any]) -> Any:
        """A layout's per-file handle under ``key``, made by ``opened()`` on first use; the
        OPEN_FILES most recently used are kept."""
        found = self.files.get(key)
        if found is None:
            found = self.files[key] = opened()
            while len(self.files) > OPEN_FILES:
                self.files.popitem(last=False)
        self.files.move_to_end(key)
        return found


_cache = _Cache()  # this process's (shared by every in-place layout's readers)


def _forked() -> None:
    global _cache
    _cache = _Cache()  # this process's (shared by every in-place layout's readers)  # a reader is never shared across a fork


os.register_at_fork(after_in_child=_forked)


class InPlaceReader:
    """One shard of data read in place (``shard``: its index entry; ``columns``: each column read, by
    its role): rows by number as their columns' bytes. A layout's reader gives :meth:`_batch_of`."""

    def __init__(self, shard: ShardInfo, columns: Mapping[str, str], location: str | Path) -> None:
        self.shard, self.columns = shard, dict(columns)
        self.part = shard.row_group if shard.row_group is not None else 0
        self.rows = shard.samples
        # the batch cache's name for it: where it is (two datasets' files may share a name and a footer,
        # two Lance datasets a name and a version) and what the index says its content is
        self._id: tuple[Any, ...] = (str(location), shard.sha256, self.part)

    def __len__(self) -> int:
        return self.rows

    @property
    def shown(self) -> str:
        """The file as errors name it: its path in the dataset."""
        return self.shard.path

    def where(self, i: int) -> str:
        """How errors name row ``i``: its key."""
        return self.key(i)

    def key(self, i: int) -> str:
        """The key of row ``i``: its file and its row number there, ``data/train.parquet:row123``
        (unique in the dataset, as a tar's keys are)."""
        return f"{self.shown}:row{(self.shard.first_row or 0) + i}"

    def read(self, i: int, fields: Collection[str] | None = None) -> dict[str, bytes]:
        """Row ``i``'s columns (those named in ``fields`` when given) as their roles' bytes; a null
        value is left out, as a tar leaves out a member a sample lacks."""
        columns = tuple(name for name in self.columns if fields is None or name in fields)
        if not columns:
            return {}
        if not 0 <= i < self.rows:
            raise IndexError(f"{self.shown}: row {i} of part {self.part} out of range ({self.rows} rows)")
        batch, row = self._batch_of(i, columns)
        values = _cache.values.setdefault(id(batch), {})
        out = {}
        for name in columns:
            role = self.columns[name]
            fast = values.get(name, _UNREAD)
            if fast is _UNREAD:
                fast = values[name] = _plain_values(batch.column(name), role)
            if fast is not None:
                out[name] = fast(row)
                continue
            value = batch.column(name)[row].as_py()
            if value is not None:
                out[name] = field_bytes(role, value, self.where(i), name)
        return out

    def list_lengths(self, column: str, vocab_size: int | None = None) -> np.ndarray:
        """Each row's number of ids in ``column``, a list of integers (a null row: 0), read a bounded
        batch at a time; a ShardError naming the row whose list holds a null or an id below 0 (or at or
        past ``vocab_size``), or naming the column when it holds no lists of integers."""
        pa = import_pyarrow()
        lengths = np.zeros(self.rows, dtype=np.int64)
        i = 0
        while i < self.rows:
            batch, row = self._batch_of(i, (column,))
            lists = batch.column(column).slice(row)
            kind = lists.type
            if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)) \
                    or not pa.types.is_integer(kind.value_type):
                raise ShardError(f"{self.shown}: column {column!r} holds {kind}, not lists of token ids")
            lengths[i : i + len(lists)] = lists.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
            values = lists.flatten()
            ids = values.to_numpy(zero_copy_only=False) if len(values) and not values.null_count else None
            highest = MAX_ID if vocab_size is None else vocab_size - 1
            if values.null_count or (ids is not None and (int(ids.min()) < 0 or int(ids.max()) > highest)):
                for n in range(len(lists)):
                    self.check_ids(i + n, column, lists[n].values, vocab_size)
            i += len(lists)
        return lengths

    def list_values(self, i: int, column: str) -> Any:
        """Row ``i``'s list of ids in ``column`` as a NumPy array (not copied where Arrow holds it so; a null row: none)."""
        batch, row = self._batch_of(i, (column,))
        values = batch.column(column)[row].values
        if values is None:
            return np.zeros(0, dtype=np.int64)
        if values.null_count:
            raise ShardError(f"{self.key(i)}: column {column!r} holds a null among its ids")
        return values.to_numpy(zero_copy_only=False)

    def texts(self, rows: Sequence[int], column: str) -> list[str | None]:
        """Rows ``rows``' values in ``column``, a text column, as strings (a null: None; no bytes made of them), a
        SampleError naming a row whose value is no text."""
        out: list[str | None] = []
        for i in rows:
            batch, row = self._batch_of(i, (column,))
            value = batch.column(column)[row].as_py()
            if value is not None and not isinstance(value, str):
                raise SampleError(self.where(i), f"column {column!r}: not text")
            out.append(value)
        return out

    def check_ids(self, i: int, column: str, values: Any, vocab_size: int | None) -> None:
        """A ShardError naming row ``i`` where ``values`` (its ids, an Arrow or NumPy array) hold a null or an
        id below 0, past an int64's range, or at or past ``vocab_size``."""
        if values is None or not len(values):
            return
        if getattr(values, "null_count", 0):
            raise ShardError(f"{self.key(i)}: column {column!r} holds a null among its ids")
        ids = np.asarray(values)
        low, high = int(ids.min()), int(ids.max())
        if low < 0:
            raise ShardError(f"{self.key(i)}: column {column!r} holds token id {low}, below 0")
        if high > MAX_ID:
            raise ShardError(f"{self.key(i)}: column {column!r} holds token id {high}, past an int64's range")
        if vocab_size is not None and high >= vocab_size:
            raise ShardError(f"{self.key(i)}: column {column!r} holds token id {high} at or beyond the tokenizer's vocabulary of {vocab_size}")

    def _batch_of(self, i: int, columns: tuple[str, ...]) -> tuple[Any, int]:
        """(a decoded batch holding row ``i``'s ``columns``, its row there)."""
        raise NotImplementedError

    def _cached(self, columns: tuple[str, ...], number: int, read: Callable[[], Iterator[Any]], count: int) -> Any:
        """Batch ``number`` of this shard's ``columns`` (of ``count``): from the process's cache,
        else read forward through the shard's reader (``read()`` makes a new one where the batch
        lies behind it). A reader that has given its last batch is let go, with what it buffered
        (a Parquet group's column chunks), rather than kept among the OPEN_GROUPS."""
        batch = _cache.hit((*self._id, columns, number))
        if batch is not None:
            return batch
        group_key = (*self._id, columns)
        reader, at = _cache.readers.pop(group_key, (None, 0))
        if reader is None or at > number:
            reader, at = read(), 0
        try:
            while at <= number:
                batch = next(reader)
                _cache.keep((*group_key, at), batch)
                at += 1
        except StopIteration:
            raise ShardError(f"{self.shown}: part {self.part} ends before its batch {number} (the file changed since it was indexed?)") from None
        if at < count:
            _cache.readers[group_key] = (reader, at)
        while len(_cache.readers) > OPEN_GROUPS:
            _cache.readers.popitem(last=False)
        return batch

    def open(self) -> None:
        """Open what reading it needs in this process now."""

    def check(self) -> None:
        """Read every row (for ``verify``): a ShardError naming the file where one cannot be."""
        for i in range(self.rows):
            try:
                self.read(i)
            except SampleError as exc:
                raise ShardError(str(exc)) from None

    def sample_table(self, facts: Sequence[Facts] = ()) -> bytes:
        """Data read in place has no sample table: its index locates every row."""
        raise ValueError(f"{self.shown}: read in place, without a sample table")

    def stream_facts(self, i: int) -> Facts:
        """No videos are read in place: no stream facts."""
        return {}

    def close(self) -> None:
        """Drop this shard's forward readers (the batches read stay in the process's cache until evicted)."""
        for key in [key for key in _cache.readers if key[: len(self._id)] == self._id]:
            del _cache.readers[key]
