"""A row group of a Parquet file read in place as one shard, a row as one sample
(:class:`fastload.formats.in_place_reader.InPlaceReader`: each column a field, given as the bytes its
role's codec reads, so the workers decode, crop and transform it as any shard's field).

A row group is read in bounded batches (:mod:`fastload.formats.parquet.bounds`), never whole,
kept in the process's cache of decoded batches; a batch before the one a group's reader stands
at restarts that reader (read forward again). A remote file is read from the cache's copies of
the group's bytes and of the file's footer (:class:`SpanFile`), never whole.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastload._util.files import this_process
from fastload.errors import SampleError, ShardError
from fastload.formats.in_place_reader import OPEN_FILES, InPlaceReader, _cache
from fastload.formats.parquet.bounds import (
    MAX_ROW_GROUP_BYTES,
    arrow_errors,
    batch_rows,
    damage,
    declared_bytes,
    group_batches,
    import_pyarrow,
    import_pyarrow_parquet,
)

if TYPE_CHECKING:
    from fastload.formats.shard_info import ShardInfo


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
    pa = import_pyarrow()
    with open(footer, "rb") as file:
        return import_pyarrow_parquet().read_metadata(pa.BufferReader(b"PAR1" + file.read()))


class ParquetGroupReader(InPlaceReader):
    """One row group of one Parquet file (``shard``: its index entry) as a shard: ``columns`` maps
    each column read to its role. ``path`` is the local file, or with ``footer`` the cache's copy of
    the group's bytes and that of the file's footer (a remote file)."""

    def __init__(self, path: str | Path, shard: ShardInfo, columns: Mapping[str, str], footer: str | Path | None = None) -> None:
        super().__init__(shard, columns, path)
        self.path, self.footer, self.group = path, footer, self.part
        self._pid = -1
        self._meta: Any = None
        self._span: SpanFile | None = None  # a remote file's fetched pieces, held open (an evicted entry stays readable)
        self._planned: dict[tuple[str, ...], tuple[int, int]] = {}  # columns -> (bytes they declare, rows a batch)

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
        """The file's parsed footer (kept per process for OPEN_FILES files); a ShardError naming the
        file when it cannot be read or disagrees with the index (a file changed since it was indexed)."""
        if self._meta is not None and self._pid == this_process():
            return self._meta
        files, file = _cache.files, (str(self.footer or self.path), self.shard.sha256)  # a remote file's footer: one cache entry for its groups
        meta = files.get(file)
        source = self._source()
        if meta is None:
            pq = import_pyarrow_parquet()
            try:  # a remote file's footer is parsed from its fetched copy (pyarrow would read the file's last 64 KiB)
                meta = pq.read_metadata(source) if self.footer is None else _footer_metadata(self.footer)
            except arrow_errors() as exc:
                raise ShardError(f"{self.shown}: not a readable Parquet file ({damage(exc)})") from None
            files[file] = meta
            while len(files) > OPEN_FILES:
                files.popitem(last=False)
        files.move_to_end(file)
        if self.group >= meta.num_row_groups or meta.row_group(self.group).num_rows != self.rows:
            raise ShardError(f"{self.shown}: row group {self.group} is not the {self.rows} rows the index lists (the file changed "
                             "since it was indexed: run fastload index again)")
        self._meta, self._pid = meta, this_process()
        return meta

    def open(self) -> None:
        """Read the file's footer in this process now."""
        self.metadata()

    def _batch_of(self, i: int, columns: tuple[str, ...]) -> tuple[Any, int]:
        """(the decoded batch holding row ``i``, its row there): a group whose read columns declare
        more than MAX_ROW_GROUP_BYTES refused row by row (a SampleError naming the file and row)."""
        meta = self.metadata()
        planned = self._planned.get(columns)
        if planned is None:  # once a set of columns: the footer's metadata is walked in Python
            declared = declared_bytes(meta, self.group, columns)
            planned = self._planned[columns] = (declared, batch_rows(meta, self.group, columns, declared))
        declared, per_batch = planned
        if declared > MAX_ROW_GROUP_BYTES:
            raise SampleError(self.where(i), f"row group {self.group} declares {declared} bytes uncompressed in columns "
                                             f"{', '.join(columns)}, over the {MAX_ROW_GROUP_BYTES} fastload reads of a group")
        number, row = divmod(i, per_batch)
        try:
            return self._cached(columns, number, lambda: group_batches(self._source(), self.group, columns, per_batch, meta, mapped=self.footer is None),
                                -(-self.rows // per_batch)), row
        except arrow_errors() as exc:
            raise SampleError(self.where(i), f"damaged Parquet data in row group {self.group}: {damage(exc)}") from None

    def close(self) -> None:
        """Close this process's fetched pieces and the group's forward readers."""
        super().close()
        if self._span is not None and self._pid == this_process():
            self._span.close()
        self._meta, self._span = None, None
