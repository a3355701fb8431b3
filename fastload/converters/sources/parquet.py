"""Parquet files as exported by Hugging Face datasets: an image column and a label column; or, with
``--text-field``, the documents of a string column (a row group an item)."""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fastload.converters.sample import Sample, SourceItem, file_stamp, unique_keys
from fastload.converters.sources import Document, SourceOptions, inside_source, text_problem
from fastload.errors import SampleError
from fastload.formats.idx import IDX_WHITESPACE


def import_pyarrow_parquet():
    """pyarrow.parquet, or an error naming the extra that installs it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("reading Parquet needs pyarrow: pip install 'fastload[parquet]'") from None
    return pq


MAX_ROW_GROUP_BYTES = 512 << 20  # the most the columns read of one row group may declare, uncompressed
BATCH_BYTES = 16 << 20  # about what one batch of rows decodes at once (HF image exports: ~100 rows a group)
OPEN_GROUPS = 4  # row groups a process reads forward at once


def declared_bytes(meta, group: int, columns: tuple[str, ...]) -> int:
    """What row group ``group``'s ``columns`` (and their nested leaves) declare they hold, uncompressed."""
    row_group = meta.row_group(group)
    return sum(
        leaf.total_uncompressed_size for leaf in (row_group.column(c) for c in range(row_group.num_columns))
        if leaf.path_in_schema.split(".", 1)[0] in columns
    )


class GroupRows:
    """A row group's columns read forward in batches of ``batch_rows`` rows (pyarrow's
    ``iter_batches``), only the current batch held: rows asked for in order cost one pass over
    the group and a batch's memory, never the whole group's (a 49 KB file's group once decoded
    to 1 GB); a row before the current batch needs a new reader. pyarrow still decompresses a
    whole page to read a row of it, and a writer may put many rows in one page: that is bounded
    by the group's declared size, checked against MAX_ROW_GROUP_BYTES when the items are listed."""

    def __init__(self, path: Path, group: int, columns: tuple[str, ...], batch_rows: int) -> None:
        pq = import_pyarrow_parquet()
        self._batches = pq.ParquetFile(path).iter_batches(batch_size=batch_rows, row_groups=[group], columns=list(columns), use_threads=False)
        self.start, self._next = 0, 0  # the rows of the batch held: [start, _next)
        self._values: dict[str, list] = {}

    def row(self, row: int) -> dict[str, Any]:
        """Row ``row`` (at or after :attr:`start`) of the group, by column."""
        while row >= self._next:
            batch = next(self._batches)
            self.start, self._next, self._values = self._next, self._next + batch.num_rows, batch.to_pydict()
        return {name: values[row - self.start] for name, values in self._values.items()}


_open_groups: OrderedDict[tuple, GroupRows] = OrderedDict()  # this process's readers, least recently used first
os.register_at_fork(after_in_child=_open_groups.clear)  # a reader is never shared across a fork


def _row(path: Path, group: int, row: int, columns: tuple[str, ...], batch_rows: int) -> dict[str, Any]:
    """Row ``row`` of row group ``group``, read through this process's reader of that group."""
    key = (path, group, columns)
    reader = _open_groups.pop(key, None)
    if reader is None or row < reader.start:
        reader = GroupRows(path, group, columns, batch_rows)
    _open_groups[key] = reader
    while len(_open_groups) > OPEN_GROUPS:
        _open_groups.popitem(last=False)
    return reader.row(row)


def _class_names(schema_metadata: dict | None, label_column: str) -> tuple[str, ...] | None:
    """Class names from the Hugging Face feature description stored in the file, if present."""
    raw = (schema_metadata or {}).get(b"huggingface")
    if not raw:
        return None
    info = json.loads(raw).get("info", {}).get("features", {}).get(label_column, {})
    names = info.get("names")
    return tuple(names) if names else None


@dataclass(frozen=True)
class ParquetSource:
    """Rows of one or more Parquet files, read row group by row group in bounded batches; a row
    group whose read columns declare more than MAX_ROW_GROUP_BYTES is refused by name (each of its
    rows a SampleError: an error naming the file and group, or with ``--on-error skip`` skips)."""

    files: tuple[Path, ...]
    image_column: str
    label_column: str | None
    classes: tuple[str, ...] | None

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns read: the image's, and the label's if any."""
        return (self.image_column,) + ((self.label_column,) if self.label_column else ())

    def items(self) -> list[SourceItem]:
        """One item per row, file by file, row group by row group, keyed by file name (whitespace as
        ``_``), group and row; a name repeated in another folder gets ``_1``, ``_2`` suffixes."""
        pq = import_pyarrow_parquet()
        out = []
        names = [IDX_WHITESPACE.sub("_", path.stem.replace(".", "_")) for path in self.files]
        for path, name in zip(self.files, names):
            stamp = file_stamp(path)
            meta = pq.ParquetFile(path).metadata
            for group in range(meta.num_row_groups):
                rows = meta.row_group(group).num_rows
                declared = declared_bytes(meta, group, self.columns)
                refused = (
                    f"row group {group} declares {declared} bytes uncompressed in columns {', '.join(self.columns)}, over the "
                    f"{MAX_ROW_GROUP_BYTES} fastload reads of a group; write the file with smaller row groups"
                ) if declared > MAX_ROW_GROUP_BYTES else None
                batch_rows = max(1, BATCH_BYTES * rows // max(declared, 1))
                size = declared // max(rows, 1)
                for row in range(rows):
                    key = f"{name}_{group:04d}_{row:06d}"
                    out.append(SourceItem(key=key, where=f"{path}#group{group}/row{row}", size_hint=size,
                                          ref=(path, group, row, batch_rows, refused), stamp=stamp))
        if len(set(names)) == len(names):
            return out  # a key spells its file's name, group and row: unique unless a name repeats
        keys = unique_keys([item.key for item in out])
        return [item if item.key == key else replace(item, key=key) for item, key in zip(out, keys)]

    def load(self, item: SourceItem) -> Sample:
        """The row's image bytes (from an ``{bytes, path}`` struct or a binary column) and label (a null: none)."""
        path, group, row, batch_rows, refused = item.ref
        if refused is not None:
            raise SampleError(item.where, refused)
        values = _row(path, group, row, self.columns, batch_rows)
        value = values[self.image_column]
        data = value.get("bytes") if isinstance(value, dict) else value
        if not isinstance(data, (bytes, bytearray)):
            raise SampleError(item.where, f"column {self.image_column!r} holds no image bytes")
        label = values[self.label_column] if self.label_column else None
        if label is not None and not isinstance(label, (int, float)):
            raise SampleError(item.where, f"the label in column {self.label_column!r} is not a number")
        if isinstance(label, float) and not label.is_integer():
            raise SampleError(item.where, f"label {label!r} in column {self.label_column!r} is not a whole class index")
        return Sample(key=item.key, where=item.where, image=bytes(data), label=None if label is None else int(label))


@dataclass(frozen=True)
class ParquetTextSource:
    """Documents in a string column of Parquet files (``--text-field``), a row group an item, read
    in batches of about BATCH_BYTES (a row group declaring more than MAX_ROW_GROUP_BYTES in that
    column is refused by name, as for images)."""

    files: tuple[Path, ...]
    text_column: str
    classes: tuple[str, ...] | None = None

    def items(self) -> list[SourceItem]:
        """One item per row group, file by file."""
        pq = import_pyarrow_parquet()
        out = []
        names = unique_keys([IDX_WHITESPACE.sub("_", path.stem.replace(".", "_")) for path in self.files])
        for path, name in zip(self.files, names):
            stamp, meta = file_stamp(path), pq.ParquetFile(path).metadata
            for group in range(meta.num_row_groups):
                declared = declared_bytes(meta, group, (self.text_column,))
                batch_rows = max(1, BATCH_BYTES * meta.row_group(group).num_rows // max(declared, 1))
                out.append(SourceItem(key=f"{name}_{group:04d}", where=f"{path}#group{group}", size_hint=meta.row_group(group).total_byte_size,
                                      ref=(path, group, batch_rows, declared), stamp=stamp))
        return out

    def documents(self, item: SourceItem) -> Iterator[Document]:
        """Each row's text (a null, a non-string or an empty one reported, not raised)."""
        path, group, batch_rows, declared = item.ref
        if declared > MAX_ROW_GROUP_BYTES:
            yield Document(item.where, None, f"row group {group} declares {declared} bytes uncompressed in column {self.text_column}, "
                                             f"over the {MAX_ROW_GROUP_BYTES} fastload reads of a group; write the file with smaller row groups")
            return
        pq = import_pyarrow_parquet()
        row = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows, row_groups=[group], columns=[self.text_column], use_threads=False):
            for value in batch.column(0).to_pylist():
                where = f"{path}#group{group}/row{row}"
                problem = text_problem(value, self.text_column)
                yield Document(where, None, problem) if problem else Document(where, value)
                row += 1


def open_source(path: str, options: SourceOptions) -> ParquetSource | ParquetTextSource:
    """Open a .parquet file or a folder of them (sorted by name): images and labels, or with
    ``text_field`` the documents of that column."""
    pq = import_pyarrow_parquet()
    p = Path(path)
    files = tuple(inside_source(p, f, options.follow_symlinks) for f in sorted(p.rglob("*.parquet"))) if p.is_dir() else (p,)
    if not files or not files[0].is_file():
        raise FileNotFoundError(f"{path}: no .parquet files")
    schema = pq.ParquetFile(files[0]).schema_arrow
    if options.text_field is not None:
        if options.text_field not in schema.names:
            raise ValueError(f"{files[0]}: no column {options.text_field!r}; columns are {schema.names} (--text-field)")
        return ParquetTextSource(files=files, text_column=options.text_field)
    if options.image_column not in schema.names:
        raise ValueError(f"{files[0]}: no column {options.image_column!r}; columns are {schema.names} (--image-column)")
    label_column = options.label_column if options.label_column in schema.names else None
    return ParquetSource(
        files=files,
        image_column=options.image_column,
        label_column=label_column,
        classes=_class_names(schema.metadata, options.label_column),
    )
