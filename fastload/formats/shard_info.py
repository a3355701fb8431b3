"""One shard of a dataset's index (``index.json``'s ``shards``): its files, counts and checksums,
checked on construction; and the checks of the index's values it shares with
:mod:`fastload.formats.index`. It imports nothing else of ``formats``, so a shard's reader may
name it without a circle through the layouts' registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from fastload._util.files import check_relative_path, is_sha256
from fastload.errors import DatasetIndexError

MAX_INT = 2**63 - 1  # counts, sizes and labels all fit an int64


def check_sha256(value: object, name: str, optional: bool = False) -> None:
    """A sha256 digest (64 lowercase hex digits), or None where ``optional``."""
    if not (is_sha256(value) or (optional and value is None)):
        raise DatasetIndexError(f"{name}: must be a sha256 digest (64 lowercase hex digits)")


def check_int(value: object, name: str, minimum: int = 0) -> None:
    """An int (bool is not one) from ``minimum`` to 2**63 - 1."""
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_INT:
        raise DatasetIndexError(f"{name}: must be an integer from {minimum} to 2**63 - 1")


def check_strings(value: object, name: str) -> None:
    """A tuple of strings."""
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise DatasetIndexError(f"{name}: must be a list of strings")


def check_counts(value: object, name: str) -> None:
    """An object of counts by name."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise DatasetIndexError(f"{name}: must be an object of counts")
    for count in value.values():
        check_int(count, name)


@dataclass(frozen=True)
class ShardInfo:
    """One shard file: its path relative to the dataset root, sample count, size and checksum.
    Every field is checked with its type on construction, so readers trust them afterwards."""

    path: str
    samples: int
    bytes: int
    sha256: str
    offsets: str | None = None  # the DALI .idx beside a tar shard
    offsets_sha256: str | None = None  # its checksum (fetched .idx files are checked too)
    table: str | None = None  # the shard's sample table (fastload.formats.table; a token shard's document table)
    table_sha256: str | None = None  # its checksum (fetched tables are checked too)
    tokens: int | None = None  # a token shard's tokens (its ``samples`` are documents)
    # data read in place (fastload/formats/parquet/README.md): the shard is row group ``row_group`` of the file
    # at ``path`` (of ``file_bytes``, modified at ``mtime_ns`` where local), its rows from ``first_row`` of the
    # file on, its column chunks the ``bytes`` from ``span_start``; the file's footer is its last
    # ``footer_bytes``, and ``sha256`` is the footer's (a file rewritten has another)
    row_group: int | None = None
    first_row: int | None = None
    span_start: int | None = None
    file_bytes: int | None = None
    footer_bytes: int | None = None
    mtime_ns: int | None = None
    version: int | None = None  # a Lance dataset's version (its fragments are read at it)

    def __post_init__(self) -> None:
        check_relative_path(self.path, "path")
        check_int(self.samples, "samples")
        for name in IN_PLACE_FIELDS:
            value = getattr(self, name)
            if value is not None:
                check_int(value, name)
        if self.row_group is not None:
            if any(getattr(self, name) is None for name in IN_PLACE_FIELDS[1:5]):
                raise DatasetIndexError(f"row_group: a row group names its {', '.join(IN_PLACE_FIELDS[1:5])}")
            file_bytes, footer = cast(int, self.file_bytes), cast(int, self.footer_bytes)
            if footer > file_bytes or cast(int, self.span_start) + self.bytes > file_bytes - footer:
                raise DatasetIndexError("span_start: the row group's bytes must lie before the file's footer")
        if self.tokens is not None:
            check_int(self.tokens, "tokens")
        check_int(self.bytes, "bytes")
        check_sha256(self.sha256, "sha256")
        if self.offsets is not None:
            check_relative_path(self.offsets, "offsets")
        check_sha256(self.offsets_sha256, "offsets_sha256", optional=True)
        if self.table is not None:
            check_relative_path(self.table, "table")
        check_sha256(self.table_sha256, "table_sha256", optional=True)


IN_PLACE_FIELDS = ("row_group", "first_row", "span_start", "file_bytes", "footer_bytes", "mtime_ns", "version")
