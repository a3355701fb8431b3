"""A record batch of an Arrow IPC stream file (what ``datasets.save_to_disk`` writes:
``data-00000-of-00002.arrow`` beside ``state.json``) read in place as one shard, a row as one
sample. The file is memory-mapped: a batch is read from the offset the index gives without
copying (its pages are read as its rows are), and the stream's schema from its first message.

:func:`stream_parts` makes the index's entries: it walks the stream's messages (their headers
and lengths, checked by pyarrow against the file) and records each record batch's offset, length
and rows; a stream holding dictionary batches (which ``datasets`` never writes) is refused by
name, as is one pyarrow cannot read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastload.errors import ShardError
from fastload.formats.in_place_reader import InPlaceReader, _cache
from fastload.formats.parquet.bounds import arrow_errors, damage, import_pyarrow

if TYPE_CHECKING:
    from fastload.formats.shard_info import ShardInfo


def _mapped(path: str, shown: str) -> tuple[Any, Any]:
    """(the memory-mapped file, its stream's schema), kept per process for OPEN_FILES files."""
    pa = import_pyarrow()

    def opened() -> tuple[Any, Any]:
        try:
            source = pa.memory_map(path)
            return source, pa.ipc.open_stream(source).schema
        except arrow_errors() as exc:
            raise ShardError(f"{shown}: not a readable Arrow stream ({damage(exc)})") from None

    return _cache.file(("arrow", path), opened)


class ArrowBatchReader(InPlaceReader):
    """Record batch ``shard.row_group`` of the Arrow stream file at ``path`` (its bytes the index's
    span) as a shard; ``columns`` maps each column read to its role."""

    def __init__(self, path: str | Path, shard: ShardInfo, columns: Mapping[str, str]) -> None:
        super().__init__(shard, columns, path)
        self.path = str(path)

    def open(self) -> None:
        """Map the file in this process now."""
        _mapped(self.path, self.shown)

    def _batch_of(self, i: int, columns: tuple[str, ...]) -> tuple[Any, int]:
        """(the record batch, row ``i``): read from the mapped file at the index's offset, once a process while cached."""
        return self._cached(columns, 0, lambda: iter([self._record_batch(columns)]), 1), i

    def _record_batch(self, columns: tuple[str, ...]) -> Any:
        pa = import_pyarrow()
        source, schema = _mapped(self.path, self.shown)
        start, length = self.shard.span_start or 0, self.shard.bytes
        if start + length > source.size():
            raise ShardError(f"{self.shown}: record batch {self.part} lies past the file's end (the file changed since it was indexed?)")
        try:
            source.seek(start)
            message = pa.ipc.read_message(source.read_buffer(length))
            batch = pa.ipc.read_record_batch(message, schema)
        except arrow_errors() as exc:
            raise ShardError(f"{self.shown}: record batch {self.part} is not readable ({damage(exc)})") from None
        if batch.num_rows != self.rows:
            raise ShardError(f"{self.shown}: record batch {self.part} holds {batch.num_rows} rows, the index says {self.rows}")
        return batch.select(list(columns))


def stream_parts(path: str, name: str, size: int, mtime_ns: int | None) -> tuple[list[ShardInfo], Any]:
    """(the index's entries of the stream file at ``path``, named ``name`` in the dataset: one a
    record batch; its schema); a ValueError naming the file where it is no readable stream."""
    pa = import_pyarrow()
    from fastload.formats.shard_info import ShardInfo

    shards: list[ShardInfo] = []
    try:
        source = pa.memory_map(path)
        reader = pa.ipc.MessageReader.open_stream(source)
        schema_message = reader.read_next_message()
        if schema_message is None or schema_message.type != "schema":
            raise ValueError(f"{path}: not an Arrow stream (no schema first)")
        schema = pa.ipc.read_schema(schema_message)
        digest = hashlib.sha256(schema_message.serialize().to_pybytes()).hexdigest()
        start, first = source.tell(), 0
        while (message := _next(reader)) is not None:
            end = source.tell()
            if message.type == "dictionary batch":
                raise ValueError(f"{path}: holds dictionary batches, which fastload does not read in place")
            if message.type != "record batch":
                raise ValueError(f"{path}: holds a {message.type} message where record batches are")
            rows = pa.ipc.read_record_batch(message, schema).num_rows
            shards.append(ShardInfo(name, rows, end - start, digest, row_group=len(shards), first_row=first, span_start=start,
                                    file_bytes=size, footer_bytes=0, mtime_ns=mtime_ns))
            start, first = end, first + rows
    except arrow_errors() as exc:
        raise ValueError(f"{path}: not a readable Arrow stream ({damage(exc)})") from None
    return shards, schema


def _next(reader: Any) -> Any:
    """The stream's next message, or None at its end."""
    try:
        return reader.read_next_message()
    except StopIteration:
        return None
