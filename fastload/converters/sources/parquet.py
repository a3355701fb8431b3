"""Parquet files as exported by Hugging Face datasets: an image column and a label column."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from pathlib import Path

from fastload.converters.sample import Sample, SourceItem, file_stamp, unique_keys
from fastload.converters.sources import SourceOptions, inside_source
from fastload.errors import SampleError
from fastload.formats.idx import IDX_WHITESPACE


def import_pyarrow_parquet():
    """pyarrow.parquet, or an error naming the extra that installs it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("reading Parquet needs pyarrow: pip install 'fastload[parquet]'") from None
    return pq


@functools.lru_cache(maxsize=4)
def _row_group(path: Path, group: int, columns: tuple[str, ...]) -> dict[str, list]:
    pq = import_pyarrow_parquet()
    return pq.ParquetFile(path).read_row_group(group, columns=list(columns)).to_pydict()


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
    """Rows of one or more Parquet files, read row group by row group."""

    files: tuple[Path, ...]
    image_column: str
    label_column: str | None
    classes: tuple[str, ...] | None

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
                size = meta.row_group(group).total_byte_size // max(rows, 1)
                for row in range(rows):
                    key = f"{name}_{group:04d}_{row:06d}"
                    out.append(SourceItem(key=key, where=f"{path}#group{group}/row{row}", size_hint=size, ref=(path, group, row), stamp=stamp))
        if len(set(names)) == len(names):
            return out  # a key spells its file's name, group and row: unique unless a name repeats
        keys = unique_keys([item.key for item in out])
        return [item if item.key == key else replace(item, key=key) for item, key in zip(out, keys)]

    def load(self, item: SourceItem) -> Sample:
        """The row's image bytes (from an ``{bytes, path}`` struct or a binary column) and label (a null: none)."""
        path, group, row = item.ref
        columns = (self.image_column,) + ((self.label_column,) if self.label_column else ())
        table = _row_group(path, group, columns)
        value = table[self.image_column][row]
        data = value.get("bytes") if isinstance(value, dict) else value
        if not isinstance(data, (bytes, bytearray)):
            raise SampleError(item.where, f"column {self.image_column!r} holds no image bytes")
        label = table[self.label_column][row] if self.label_column else None
        if isinstance(label, float) and not label.is_integer():
            raise SampleError(item.where, f"label {label!r} in column {self.label_column!r} is not a whole class index")
        return Sample(key=item.key, where=item.where, image=bytes(data), label=None if label is None else int(label))


def open_source(path: str, options: SourceOptions) -> ParquetSource:
    """Open a .parquet file or a folder of them (sorted by name)."""
    pq = import_pyarrow_parquet()
    p = Path(path)
    files = tuple(inside_source(p, f, options.follow_symlinks) for f in sorted(p.rglob("*.parquet"))) if p.is_dir() else (p,)
    if not files or not files[0].is_file():
        raise FileNotFoundError(f"{path}: no .parquet files")
    schema = pq.ParquetFile(files[0]).schema_arrow
    if options.image_column not in schema.names:
        raise ValueError(f"{files[0]}: no column {options.image_column!r}; columns are {schema.names} (--image-column)")
    label_column = options.label_column if options.label_column in schema.names else None
    return ParquetSource(
        files=files,
        image_column=options.image_column,
        label_column=label_column,
        classes=_class_names(schema.metadata, options.label_column),
    )
