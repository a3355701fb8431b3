"""A Parquet file's footer, checked, as the index of data read in place holds it: its row groups
(rows, where their column chunks lie), its columns' roles, its size and the footer's sha256.
Pure: the caller reads the file's tail (locally, or by a range request) and hands it here.

A footer comes from anyone, so every claim is checked before it is used: its length against the
file and :data:`MAX_FOOTER_BYTES`, each row group's rows against the file's, and each group's
column chunks against the bytes before the footer (a lying footer is a ValueError naming the
file, never a read past the end or an allocation of what it declares)."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any

from fastload.formats.in_place_reader import column_roles as in_place_roles
from fastload.formats.parquet.bounds import arrow_errors, damage, import_pyarrow, import_pyarrow_parquet
from fastload.formats.shard_info import ShardInfo

MAGIC = b"PAR1"
TAIL = 8  # the footer's length (4 bytes, little-endian) and the magic
MAX_FOOTER_BYTES = 64 << 20  # a footer this big describes ~10^6 column chunks: refused past it


@dataclass(frozen=True)
class Footer:
    """One file's footer: its parsed metadata, its length (with the 8 bytes after it), its sha256."""

    meta: Any
    footer_bytes: int
    sha256: str


def footer_length(last: bytes, size: int, name: str) -> int:
    """The bytes of the footer and its 8-byte tail, from the file's last 8 bytes (``last``); a
    ValueError naming the file when it is no Parquet file or its footer claims more than it can."""
    if size < len(MAGIC) + TAIL or len(last) != TAIL or last[4:] != MAGIC:
        raise ValueError(f"{name}: not a Parquet file (no PAR1 at its end)")
    length = struct.unpack("<I", last[:4])[0]
    if length + TAIL + len(MAGIC) > size or length > MAX_FOOTER_BYTES:
        raise ValueError(f"{name}: its footer claims {length} bytes, more than the file's {size} (or over {MAX_FOOTER_BYTES})")
    return length + TAIL


def parse_footer(tail: bytes, size: int, name: str) -> Footer:
    """The footer of the file ``name`` of ``size`` bytes, from its last ``len(tail)`` bytes (exactly
    the footer and its 8-byte tail); a ValueError naming the file when pyarrow cannot parse it."""
    pa = import_pyarrow()
    pq = import_pyarrow_parquet()
    try:
        meta = pq.read_metadata(pa.BufferReader(MAGIC + tail))
    except arrow_errors() as exc:
        raise ValueError(f"{name}: not a readable Parquet footer ({damage(exc)})") from None
    return Footer(meta, len(tail), hashlib.sha256(tail).hexdigest())


def chunk_span(column: Any) -> tuple[int, int]:
    """(first byte, end) of one column chunk: from its dictionary page when it has one."""
    start = column.data_page_offset
    if column.has_dictionary_page and column.dictionary_page_offset is not None and 0 < column.dictionary_page_offset < start:
        start = column.dictionary_page_offset
    return start, start + column.total_compressed_size


def row_groups(path: str, footer: Footer, size: int, mtime_ns: int | None, where: str) -> list[ShardInfo]:
    """The file's row groups as shards of the index (``path``: its name in the dataset); a
    ValueError naming the file (``where``) where the footer lies (rows that do not add up, chunks
    outside the file's data)."""
    meta, shards, first = footer.meta, [], 0
    data_end = size - footer.footer_bytes
    for group in range(meta.num_row_groups):
        row_group = meta.row_group(group)
        rows = row_group.num_rows
        spans = [chunk_span(row_group.column(c)) for c in range(row_group.num_columns)]
        start = min((s for s, _ in spans), default=len(MAGIC))
        end = max((e for _, e in spans), default=len(MAGIC))
        if rows < 0 or start < len(MAGIC) or end > data_end or any(s < len(MAGIC) or e < s for s, e in spans):
            raise ValueError(f"{where}: its footer lies: row group {group}'s column chunks or rows are not in the file")
        shards.append(ShardInfo(path, rows, end - start, footer.sha256, row_group=group, first_row=first, span_start=start,
                                file_bytes=size, footer_bytes=footer.footer_bytes, mtime_ns=mtime_ns))
        first += rows
    if first != meta.num_rows:
        raise ValueError(f"{where}: its footer lies: its row groups hold {first} rows, it says {meta.num_rows}")
    return shards


def column_roles(footer: Footer) -> dict[str, str]:
    """Each top-level column's role, by name."""
    return in_place_roles(footer.meta.schema.to_arrow_schema())
