"""HDF5 shards read by row: encoded images (``image``) or fixed-size pixels (``pixels``), labels
(the label field's column, ``cls``), keys, and extra fields (``extra/EXT``).

Byte columns written by this version are flat (a group of contiguous ``bytes`` + ``offsets``):
a value is one ``pread`` at the dataset's file offset. Older shards' variable-length columns are
read through h5py."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from fastload.errors import ShardError
from fastload.fields import LABEL_FIELD, format_label
from fastload.files import open_regular
from fastload.formats import this_process
from fastload.formats.columns import PackedStrings, int_column

if TYPE_CHECKING:
    from fastload.formats.table import Facts

# Decompressed chunks kept per process over its open files (h5py's default is 1 MB a file, a
# handful of 64-row chunks, so shuffled reading of a compressed shard decompressed a chunk for
# nearly every row). Only chunked (compressed) datasets use it, and only as chunks are read.
CHUNK_CACHE_BUDGET = 256 << 20
CHUNK_CACHE_SLOTS = 10007  # a prime well above the chunks that fit


def chunk_cache_bytes(open_files: int) -> int:
    """Each open file's share of the budget, between h5py's default 1 MB and 32 MB."""
    return max(1 << 20, min(32 << 20, CHUNK_CACHE_BUDGET // max(open_files, 1)))


class ByteColumn:
    """Row access to a column of byte strings: flat (one ``pread`` a value when the bytes are
    stored contiguously, else an h5py slice) or a variable-length uint8 dataset (older shards).
    Its shape is checked against ``rows`` once, here: ``where`` names the column in the error."""

    def __init__(self, node, fd: int, rows: int, where: str) -> None:
        import h5py

        self._vlen = None if isinstance(node, h5py.Group) else node
        self.present: np.ndarray | None = None  # which rows hold a value (None: all of them)
        if self._vlen is not None:
            if not isinstance(node, h5py.Dataset) or h5py.check_vlen_dtype(node.dtype) != np.uint8 or node.shape != (rows,):
                raise ShardError(f"{where}: not {rows} rows of bytes, as the index says")
            return
        if "present" in node:
            present = node["present"]
            if not isinstance(present, h5py.Dataset) or present.shape != (rows,) or present.dtype.kind not in "iub":
                raise ShardError(f"{where}: its present column is not {rows} rows, as the index says")
            self.present = present[:].astype(bool)
        offsets, self._bytes = node["offsets"][:], node["bytes"]
        if (
            offsets.shape != (rows + 1,) or offsets.dtype.kind not in "iu"
            or self._bytes.dtype != np.uint8 or self._bytes.ndim != 1
            or offsets[0] < 0 or np.any(offsets[1:] < offsets[:-1]) or offsets[-1] > self._bytes.shape[0]
        ):
            raise ShardError(f"{where}: its offsets do not describe {rows} rows of its bytes, as the index says")
        self._offsets = int_column(offsets)
        self._file_offset = self._bytes.id.get_offset()  # None when chunked, compressed or empty
        self._fd = fd

    def __getitem__(self, i: int) -> bytes:
        if self._vlen is not None:
            return self._vlen[i].tobytes()
        start, end = self._offsets[i], self._offsets[i + 1]
        if self._file_offset is None:
            return self._bytes[start:end].tobytes()
        data = os.pread(self._fd, end - start, self._file_offset + start)
        if len(data) != end - start:
            raise OSError(f"short read: {len(data)} of {end - start} bytes")
        return data


def _contiguous_rows(dataset) -> tuple[int, tuple[int, ...], int] | None:
    """(file offset, row shape, row bytes) of a contiguous uint8 dataset, else None."""
    offset = dataset.id.get_offset()  # None when chunked, compressed or empty
    if offset is None or dataset.dtype != np.uint8:
        return None
    row_shape = tuple(dataset.shape[1:])
    return offset, row_shape, int(np.prod(row_shape))


class Hdf5ShardReader:
    """Random access to the rows of one HDF5 shard; the file opens lazily in each process. The
    index says how many ``rows`` it holds and, for decoded pixels, their ``pixel_shape``: every
    column is checked against them when first read, so row reads need no bounds checks."""

    def __init__(self, path: Path, rows: int, pixel_shape: tuple[int, ...] | None = None, cache_bytes: int = 1 << 20) -> None:
        self.path = path
        self.rows = rows
        self.pixel_shape = pixel_shape
        self.cache_bytes = cache_bytes  # h5py's chunk cache for this file
        self._file = None
        self._fd: int | None = None  # the same file opened plainly, for pread
        self._pid = -1
        self._cached: dict | None = None
        self._cached_pid = -1

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_file"], state["_fd"], state["_pid"], state["_cached"] = None, None, -1, None
        return state

    def _h5(self):
        if self._file is None or self._pid != this_process():
            import h5py

            try:
                fd = open_regular(self.path)  # first: h5py would wait on a FIFO
            except OSError as exc:
                raise ShardError(f"{self.path}: cannot open HDF5 shard ({exc.strerror})") from None
            try:
                self._file = h5py.File(self.path, "r", rdcc_nbytes=self.cache_bytes, rdcc_nslots=CHUNK_CACHE_SLOTS)
            except OSError:
                os.close(fd)
                raise ShardError(f"{self.path}: cannot open HDF5 shard (not an HDF5 file, or damaged)") from None
            self._fd = fd
            self._pid = this_process()
        return self._file

    def open(self) -> None:
        """Open the file in this process now."""
        self._h5()

    def __len__(self) -> int:
        return len(self._columns()["key"])

    def check(self) -> None:
        """Check every column against the index (row counts, byte offsets, pixel shape)."""
        self._columns()

    def _columns(self) -> dict:
        """Small per-row columns (keys, labels, image formats) read once; big ones as dataset handles."""
        if self._cached is None or self._cached_pid != this_process():
            try:
                self._cached = self._read_columns(self._h5())
            except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError, OSError) as exc:
                raise ShardError(f"{self.path}: not a readable fastload HDF5 shard ({type(exc).__name__})") from None
            self._cached_pid = this_process()
        return self._cached

    def _read_columns(self, f) -> dict:
        """Read and check the columns: each as many rows as the index says, labels integers,
        pixels of the index's shape (a ShardError naming the column otherwise)."""
        import h5py

        rows, where = self.rows, f"{self.path}: column"
        fd = cast(int, self._fd)  # opened beside the h5py file by _h5()
        decode = lambda values: [v.decode() if isinstance(v, bytes) else v for v in values]  # noqa: E731
        present = {name: f[name] for name in ("key", LABEL_FIELD, "image_format", "pixels") if name in f}
        for name, dataset in present.items():
            if not isinstance(dataset, h5py.Dataset) or dataset.shape[:1] != (rows,):
                raise ShardError(f"{where} {name}: not {rows} rows, as the index says")
        if "key" not in present:
            raise ShardError(f"{where} key: missing")
        labels = present.get(LABEL_FIELD)
        if labels is not None and (labels.dtype.kind not in "iu" or labels.ndim != 1):
            raise ShardError(f"{where} {LABEL_FIELD}: not integer labels")
        if "image" in f and "image_format" not in present:
            raise ShardError(f"{where} image_format: missing beside image")
        pixels = present.get("pixels")
        if self.pixel_shape is not None and (pixels is None or pixels.dtype != np.uint8 or pixels.shape[1:] != self.pixel_shape):
            raise ShardError(f"{where} pixels: not {rows} rows of uint8 pixels of shape {list(self.pixel_shape)}, as the index says")
        extra = f.get("extra", {})
        return {
            "key": PackedStrings(decode(present["key"][:])),
            "labels": labels[:] if labels is not None else None,
            "image_format": list(map(sys.intern, decode(present["image_format"][:]))) if "image_format" in present else None,  # a few shared strings
            "image": ByteColumn(f["image"], fd, rows, f"{where} image") if "image" in f else None,
            "pixels": pixels,
            "pixels_at": _contiguous_rows(pixels) if pixels is not None else None,
            "extra": {ext: ByteColumn(node, fd, rows, f"{where} extra/{ext}") for ext, node in extra.items()},
        }

    def key(self, i: int) -> str:
        """The key of row ``i``."""
        return self._columns()["key"][i]

    def sample_table(self, facts: Sequence[Facts] = ()) -> bytes:
        """The shard's sample table: keys and labels (its byte columns are found through h5py);
        HDF5 shards hold no videos, so ``facts`` must be empty."""
        from fastload.formats.table import encode_table

        if any(facts):
            raise ValueError(f"{self.path}: HDF5 shards hold no videos: no stream facts to record")
        columns = self._columns()
        labels = columns["labels"] if columns["labels"] is not None else np.full(self.rows, -1, np.int64)
        return encode_table([columns["key"][i] for i in range(self.rows)], [{}] * self.rows, labels)

    def stream_facts(self, i: int) -> Facts:
        """HDF5 shards hold no videos: no stream facts."""
        return {}

    @property
    def decoded(self) -> bool:
        """Whether the shard stores decoded pixels rather than encoded images."""
        return self._columns()["pixels"] is not None

    def pixels(self, i: int) -> np.ndarray:
        """Decoded HWC uint8 pixels of row ``i`` (decoded shards only): one ``pread`` when the
        dataset is contiguous (uncompressed), else through h5py (a chunk is decompressed)."""
        columns = self._columns()
        if columns["pixels_at"] is None:
            try:
                return columns["pixels"][i]
            except OSError:
                raise ShardError(f"{self.path}: cannot read row {i} (a damaged chunk?)") from None
        file_offset, row_shape, size = columns["pixels_at"]
        data = os.pread(cast(int, self._fd), size, file_offset + i * size)  # open: _columns() opened it
        if len(data) != size:
            raise ShardError(f"{self.path}: cannot read row {i} (short read; shard truncated?)")
        return np.frombuffer(data, dtype=np.uint8).reshape(row_shape)

    def read(self, i: int) -> dict[str, bytes]:
        """Encoded fields of row ``i``: the image under its format's extension, ``cls``, extras;
        a field the sample does not have is left out, as a tar shard leaves it out."""
        columns = self._columns()
        out: dict[str, bytes] = {}
        try:
            if columns["image"] is not None and columns["image_format"][i]:  # "": this sample has no image
                out[columns["image_format"][i]] = columns["image"][i]
            if columns["labels"] is not None and columns["labels"][i] >= 0:  # -1: this sample has no label
                out[LABEL_FIELD] = format_label(int(columns["labels"][i]))
            for ext, column in columns["extra"].items():
                if column.present is None or column.present[i]:  # absent, as from a tar without the member
                    out[ext] = column[i]
        except OSError as exc:
            raise ShardError(f"{self.path}: cannot read row {i} ({exc}; shard truncated?)") from None
        return out

    def close(self) -> None:
        """Close the file of this process."""
        self._cached = None
        if self._file is not None and self._pid == this_process():
            self._file.close()
            os.close(self._fd)
        self._file, self._fd = None, None
