"""Parquet read in bounded memory, whoever reads it (``convert --from parquet``, and Parquet read in
place): the one module importing pyarrow. A row group is read in batches of about BATCH_BYTES,
never whole (a 49 KB file once peaked at 1.06 GB to convert 10 rows); a group whose read columns
declare more than MAX_ROW_GROUP_BYTES is refused by name; dictionary-encoded leaves stay
dictionaries and prefix-encoded ones are read a row at a time (a dictionary bomb decoded whole was
1 GB); a damaged footer or page is one line naming the file (:func:`damage`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

MAX_ROW_GROUP_BYTES = 512 << 20  # the most the columns read of one row group may declare, uncompressed
BATCH_BYTES = 16 << 20  # about what one batch of rows decodes at once (HF image exports: ~100 rows a group)


def import_pyarrow() -> Any:
    """pyarrow, or an error naming the extra that installs it (the one place fastload imports it)."""
    try:
        import pyarrow as pa
    except ImportError:
        raise ImportError("reading Parquet or Arrow needs pyarrow: pip install 'fastload[parquet]'") from None
    return pa


def import_pyarrow_parquet() -> Any:
    """pyarrow.parquet, or an error naming the extra that installs it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("reading Parquet needs pyarrow: pip install 'fastload[parquet]'") from None
    return pq


def damage(exc: BaseException) -> str:
    """pyarrow's complaint about a damaged file as one short line (its messages span lines)."""
    return " ".join(str(exc).split())[:160] or type(exc).__name__


def arrow_errors() -> tuple[type[BaseException], ...]:
    """What pyarrow raises for a damaged file: its own errors, and OSError for what it reads."""
    pa = import_pyarrow()
    return (pa.ArrowException, OSError)


def parquet_file(path: Path) -> Any:
    """``path`` opened as a Parquet file, or a ValueError naming it in one line (a damaged footer or
    schema: no row of it can be read)."""
    pq = import_pyarrow_parquet()
    try:
        return pq.ParquetFile(path)
    except arrow_errors() as exc:
        raise ValueError(f"{path}: not a readable Parquet file ({damage(exc)})") from None


def declared_bytes(meta: Any, group: int, columns: tuple[str, ...]) -> int:
    """What row group ``group``'s ``columns`` (and their nested leaves) declare they hold, uncompressed."""
    row_group = meta.row_group(group)
    return sum(
        leaf.total_uncompressed_size for leaf in (row_group.column(c) for c in range(row_group.num_columns))
        if leaf.path_in_schema.split(".", 1)[0] in columns
    )


def batch_rows(meta: Any, group: int, columns: tuple[str, ...], declared: int) -> int:
    """The rows a batch of row group ``group`` holds: about BATCH_BYTES of what its ``columns``
    declare (``declared``, encoded), or one where a binary or string leaf shares prefixes between
    values (DELTA_BYTE_ARRAY: 64 rows of 8 MiB in a 689-byte file, declaring 8 MiB, decoded to
    800 MB at once; one row at a time, to about ten times a value)."""
    row_group = meta.row_group(group)
    chunks = map(row_group.column, range(row_group.num_columns))
    if any("DELTA_BYTE_ARRAY" in chunk.encodings for chunk in chunks if chunk.path_in_schema.split(".", 1)[0] in columns):
        return 1
    return max(1, BATCH_BYTES * row_group.num_rows // max(declared, 1))


def group_batches(source: Any, group: int, columns: tuple[str, ...], batch_rows: int, meta: Any = None, mapped: bool = False) -> Iterator[Any]:
    """Row group ``group``'s ``columns`` in batches of ``batch_rows`` rows (pyarrow's
    ``iter_batches``) from ``source`` (a path, or a file object with the file's footer ``meta``),
    their dictionary-encoded binary and string leaves read as dictionaries: a value a dictionary
    page repeats is held once, never once a row. A batch's rows are sized from the group's declared
    (encoded) size, which says nothing of how often a dictionary repeats a value: a 49 KB file's
    group of one 8 MiB value in every row decoded to 1 GB, one of 50 KB of text to 450 MiB. (A
    plain-encoded leaf is read as it is: made a dictionary, its values would be copied twice more.)
    ``mapped`` (a local file's path): its pages are read from the file mapped, not copied to memory first."""
    pq = import_pyarrow_parquet()
    meta = pq.read_metadata(source) if meta is None else meta
    chunks = map(meta.row_group(group).column, range(meta.num_columns))
    leaves = [chunk.path_in_schema for chunk in chunks if chunk.physical_type == "BYTE_ARRAY"
              and chunk.path_in_schema.split(".", 1)[0] in columns and any("DICTIONARY" in encoding for encoding in chunk.encodings)]
    file = pq.ParquetFile(source, metadata=meta, read_dictionary=leaves, memory_map=mapped, pre_buffer=not mapped)
    return file.iter_batches(batch_size=batch_rows, row_groups=[group], columns=list(columns), use_threads=False)


def column_values(column: Any) -> list:
    """A batch's column as Python values; of a dictionary column, each value its rows use decoded
    once (the rows repeating it share that one object)."""
    pa = import_pyarrow()
    if not pa.types.is_dictionary(column.type):
        return column.to_pylist()
    indices = column.indices.to_pylist()
    used = sorted({i for i in indices if i is not None})
    decoded = dict(zip(used, column.dictionary.take(used).to_pylist()))
    return [None if i is None else decoded[i] for i in indices]

