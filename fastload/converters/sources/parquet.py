"""Parquet files as exported by Hugging Face datasets: an image column and a label column; or, with
``--text-field``, the documents of a string column (a row group an item)."""

from __future__ import annotations

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
from fastload.formats.in_place_reader import class_names
from fastload.formats.parquet.bounds import (
    MAX_ROW_GROUP_BYTES,
    arrow_errors,
    batch_rows,
    column_values,
    damage,
    declared_bytes,
    group_batches,
    parquet_file,
)

OPEN_GROUPS = 4  # row groups a process reads forward at once


class GroupRows:
    """A row group's columns read forward in batches (group_batches), only the current batch held
    and a row's values made when it is asked for: rows asked for in order cost one pass over the
    group and a batch's memory, never the whole group's; a row before the current batch needs a new
    reader. pyarrow still decompresses a whole page to read a row of it, and a writer may put many
    rows in one page: that is bounded by the group's declared size, checked against
    MAX_ROW_GROUP_BYTES when the items are listed."""

    def __init__(self, path: Path, group: int, columns: tuple[str, ...], batch_rows: int) -> None:
        self._batches = group_batches(path, group, columns, batch_rows)
        self.start, self._next = 0, 0  # the rows of the batch held: [start, _next)
        self._batch: Any = None

    def row(self, row: int) -> dict[str, Any]:
        """Row ``row`` (at or after :attr:`start`) of the group, by column."""
        while row >= self._next:
            self._batch = next(self._batches)
            self.start, self._next = self._next, self._next + self._batch.num_rows
        return {name: self._batch.column(n)[row - self.start].as_py() for n, name in enumerate(self._batch.schema.names)}


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
        out = []
        names = [IDX_WHITESPACE.sub("_", path.stem.replace(".", "_")) for path in self.files]
        for path, name in zip(self.files, names):
            stamp = file_stamp(path)
            meta = parquet_file(path).metadata
            for group in range(meta.num_row_groups):
                rows = meta.row_group(group).num_rows
                declared = declared_bytes(meta, group, self.columns)
                refused = (
                    f"row group {group} declares {declared} bytes uncompressed in columns {', '.join(self.columns)}, over the "
                    f"{MAX_ROW_GROUP_BYTES} fastload reads of a group; write the file with smaller row groups"
                ) if declared > MAX_ROW_GROUP_BYTES else None
                rows_a_batch = batch_rows(meta, group, self.columns, declared)
                size = declared // max(rows, 1)
                for row in range(rows):
                    key = f"{name}_{group:04d}_{row:06d}"
                    out.append(SourceItem(key=key, where=f"{path}#group{group}/row{row}", size_hint=size,
                                          ref=(path, group, row, rows_a_batch, refused), stamp=stamp))
        if len(set(names)) == len(names):
            return out  # a key spells its file's name, group and row: unique unless a name repeats
        keys = unique_keys([item.key for item in out])
        return [item if item.key == key else replace(item, key=key) for item, key in zip(out, keys)]

    def load(self, item: SourceItem) -> Sample:
        """The row's image bytes (from an ``{bytes, path}`` struct or a binary column) and label (a null: none)."""
        path, group, row, batch_rows, refused = item.ref
        if refused is not None:
            raise SampleError(item.where, refused)
        try:
            values = _row(path, group, row, self.columns, batch_rows)
        except arrow_errors() as exc:
            _open_groups.pop((path, group, self.columns), None)  # its reader stopped at the damage
            raise SampleError(item.where, f"damaged Parquet data in row group {group}: {damage(exc)}") from None
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
        out = []
        names = unique_keys([IDX_WHITESPACE.sub("_", path.stem.replace(".", "_")) for path in self.files])
        for path, name in zip(self.files, names):
            stamp, meta = file_stamp(path), parquet_file(path).metadata
            for group in range(meta.num_row_groups):
                declared = declared_bytes(meta, group, (self.text_column,))
                rows_a_batch = batch_rows(meta, group, (self.text_column,), declared)
                out.append(SourceItem(key=f"{name}_{group:04d}", where=f"{path}#group{group}", size_hint=meta.row_group(group).total_byte_size,
                                      ref=(path, group, rows_a_batch, declared), stamp=stamp))
        return out

    def documents(self, item: SourceItem) -> Iterator[Document]:
        """Each row's text (a null, a non-string or an empty one reported, not raised)."""
        path, group, batch_rows, declared = item.ref
        if declared > MAX_ROW_GROUP_BYTES:
            yield Document(item.where, None, f"row group {group} declares {declared} bytes uncompressed in column {self.text_column}, "
                                             f"over the {MAX_ROW_GROUP_BYTES} fastload reads of a group; write the file with smaller row groups")
            return
        row = 0
        try:
            for batch in group_batches(path, group, (self.text_column,), batch_rows):
                for value in column_values(batch.column(0)):
                    where = f"{path}#group{group}/row{row}"
                    problem = text_problem(value, self.text_column)
                    yield Document(where, None, problem) if problem else Document(where, value)
                    row += 1
        except arrow_errors() as exc:  # the group's pages: what came before the damage is kept
            yield Document(f"{path}#group{group}/row{row}", None,
                           f"damaged Parquet data in row group {group} ({damage(exc)}): its rows from {row} on are lost")


def open_source(path: str, options: SourceOptions) -> ParquetSource | ParquetTextSource:
    """Open a .parquet file or a folder of them (sorted by name): images and labels, or with
    ``text_field`` the documents of that column."""
    p = Path(path)
    files = tuple(inside_source(p, f, options.follow_symlinks) for f in sorted(p.rglob("*.parquet"))) if p.is_dir() else (p,)
    if not files or not files[0].is_file():
        raise FileNotFoundError(f"{path}: no .parquet files")
    schema = parquet_file(files[0]).schema_arrow
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
        classes=class_names(schema.metadata, options.label_column),
    )
