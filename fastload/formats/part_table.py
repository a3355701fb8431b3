"""The shards of data read in place, kept compact: a table of its files (one entry a file: path,
size, footer, mtime, the footer's sha256, a Lance version) and one row of six integers a part
(a Parquet row group, an Arrow record batch, a Lance fragment slice: its file, number there, rows,
first row, byte span). :class:`PartTable` is the index's ``shards``, a sequence of
:class:`~fastload.formats.index.ShardInfo` made as each is asked for, so opening an index of a
million row groups makes no million objects. In index.json it is ``{"files": [...], "parts":
{"count": N, "data": BASE64}}``, the parts little-endian int64, compressed with zlib."""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast, overload

import numpy as np

from fastload.errors import DatasetIndexError

if TYPE_CHECKING:
    from fastload.formats.shard_info import ShardInfo

PART_COLUMNS = ("file", "row_group", "samples", "first_row", "span_start", "bytes")  # a part's row, in this order
FILE_FIELDS = ("path", "file_bytes", "footer_bytes", "mtime_ns", "sha256", "version")  # a file's entry
MAX_PARTS_BYTES = 1 << 34  # a declared table larger than this is refused before it is inflated


class PartTable(Sequence["ShardInfo"]):
    """The parts of files read in place (see the module docstring); ``files``: each file's
    :data:`FILE_FIELDS`, ``parts``: an (N, 6) int64 array of :data:`PART_COLUMNS`."""

    def __init__(self, files: tuple[tuple[Any, ...], ...], parts: np.ndarray) -> None:
        self.files, self.parts = files, parts
        self._last: tuple[int, ShardInfo] | None = None  # the part last made a shard: a row group's samples are read one after another
        self._check()

    def _check(self) -> None:
        """Every file entry and part row within bounds (the table may come from anyone): a
        DatasetIndexError naming the field."""
        from fastload.formats.shard_info import ShardInfo

        for number, entry in enumerate(self.files):
            path, file_bytes, footer_bytes, mtime_ns, sha256, version = entry
            try:  # a file's fields checked as a shard's are
                ShardInfo(path, 0, 0, sha256, row_group=0, first_row=0, span_start=0, file_bytes=file_bytes,
                          footer_bytes=footer_bytes, mtime_ns=mtime_ns, version=version)
            except DatasetIndexError as exc:
                raise DatasetIndexError(f"files[{number}].{exc}") from None
        parts = self.parts
        if parts.ndim != 2 or parts.shape[1] != len(PART_COLUMNS) or parts.dtype != np.int64:
            raise DatasetIndexError("parts: must be rows of six integers")
        if len(parts) and (parts.min() < 0 or parts[:, 0].max() >= len(self.files)):
            raise DatasetIndexError("parts: a part names a file that is not listed, or a negative number")
        if len(parts):
            data_end = np.array([e[1] - e[2] for e in self.files], dtype=np.int64)[parts[:, 0]]
            if np.any(parts[:, 4] > data_end - parts[:, 5]):
                raise DatasetIndexError("parts: a part's bytes must lie before its file's footer")
            if int(parts[:, 2].sum(dtype=np.float64)) >= 2**63:
                raise DatasetIndexError("parts: more than 2**63 - 1 samples in all")

    @classmethod
    def of(cls, shards: Sequence[ShardInfo]) -> PartTable:
        """The table of ``shards`` (each a part of a file; those of one file share its fields)."""
        if isinstance(shards, PartTable):
            return shards
        files: dict[tuple[Any, ...], int] = {}
        parts = np.empty((len(shards), len(PART_COLUMNS)), dtype=np.int64)
        for number, shard in enumerate(shards):
            entry = tuple(getattr(shard, name) for name in FILE_FIELDS)
            parts[number] = [files.setdefault(entry, len(files)), *(cast(int, getattr(shard, name)) for name in PART_COLUMNS[1:])]
        return cls(tuple(files), parts)

    @classmethod
    def of_whole(cls, shards: Sequence[ShardInfo]) -> PartTable:
        """Shards that are files of their own (a converted dataset's) as parts: each file one part of
        its samples and bytes, no footer (a mixture's index, beside members read in place)."""
        files = tuple((s.path, s.bytes, 0, None, s.sha256, None) for s in shards)
        parts = np.array([[n, 0, s.samples, 0, 0, s.bytes] for n, s in enumerate(shards)], dtype=np.int64).reshape(-1, len(PART_COLUMNS))
        return cls(files, parts)

    @classmethod
    def joined(cls, tables: Sequence[PartTable]) -> PartTable:
        """The parts of ``tables`` one after another (a mixture's members read in place)."""
        firsts = np.cumsum([0, *(len(t.files) for t in tables)])
        parts = [t.parts + np.array([first, 0, 0, 0, 0, 0], dtype=np.int64) for t, first in zip(tables, firsts.tolist(), strict=False)]
        return cls(tuple(entry for t in tables for entry in t.files), np.concatenate(parts) if parts else np.zeros((0, 6), np.int64))

    def __len__(self) -> int:
        return len(self.parts)

    @overload
    def __getitem__(self, i: int) -> ShardInfo: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[ShardInfo, ...]: ...

    def __getitem__(self, i: int | slice) -> ShardInfo | tuple[ShardInfo, ...]:
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        last = self._last
        if last is not None and last[0] == i:
            return last[1]
        from fastload.formats.shard_info import ShardInfo

        file, row_group, samples, first_row, span_start, size = self.parts[i].tolist()
        path, file_bytes, footer_bytes, mtime_ns, sha256, version = self.files[file]
        shard = ShardInfo(path, samples, size, sha256, row_group=row_group, first_row=first_row, span_start=span_start,
                          file_bytes=file_bytes, footer_bytes=footer_bytes, mtime_ns=mtime_ns, version=version)
        self._last = (int(i), shard)
        return shard

    def __iter__(self) -> Iterator[ShardInfo]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PartTable) and self.files == other.files and np.array_equal(self.parts, other.parts)

    __hash__ = None  # type: ignore[assignment]  # mutable arrays: as a list, not hashable

    def column(self, name: str) -> np.ndarray:
        """Column ``name`` of every part, without making a shard: one of :data:`PART_COLUMNS`, or a
        file's number field (``file_bytes``, ``footer_bytes``) repeated for each of its parts."""
        if name in PART_COLUMNS:
            return self.parts[:, PART_COLUMNS.index(name)]
        at = FILE_FIELDS.index(name)
        return np.array([entry[at] for entry in self.files], dtype=np.int64)[self.parts[:, 0]]

    def to_json(self) -> dict[str, Any]:
        """Its form in index.json."""
        data = base64.b64encode(zlib.compress(self.parts.astype("<i8").tobytes(), 6)).decode()
        return {"files": [dict(zip(FILE_FIELDS, entry, strict=True)) for entry in self.files], "parts": {"count": len(self), "data": data}}

    @classmethod
    def from_json(cls, data: object) -> PartTable:
        """The table index.json holds (:meth:`to_json`); a DatasetIndexError naming what is wrong."""
        if not isinstance(data, dict) or set(data) != {"files", "parts"} or not isinstance(data["files"], list):
            raise DatasetIndexError("shards: must be an object of files and parts")
        files = []
        for number, entry in enumerate(data["files"]):
            if not isinstance(entry, dict) or set(entry) != set(FILE_FIELDS):
                raise DatasetIndexError(f"files[{number}]: must be an object of {', '.join(FILE_FIELDS)}")
            files.append(tuple(entry[name] for name in FILE_FIELDS))
        parts = data["parts"]
        if not isinstance(parts, dict) or set(parts) != {"count", "data"} or not isinstance(parts["data"], str):
            raise DatasetIndexError("parts: must be an object of count and data")
        count = parts["count"]
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_PARTS_BYTES // 48:
            raise DatasetIndexError("parts: count must be an integer of at most 2**34 / 48")
        try:
            raw = zlib.decompressobj().decompress(base64.b64decode(parts["data"], validate=True), count * 48 + 1)
        except (binascii.Error, zlib.error, ValueError):
            raise DatasetIndexError("parts: data is not base64 of zlib-compressed integers") from None
        if len(raw) != count * 48:
            raise DatasetIndexError(f"parts: data holds {len(raw)} bytes, not the {count} parts' {count * 48}")
        return cls(tuple(files), np.frombuffer(raw, dtype="<i8").astype(np.int64, copy=False).reshape(count, len(PART_COLUMNS)))
