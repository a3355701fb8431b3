"""HDF5 shards read by row: encoded images (``image``) or fixed-size pixels (``pixels``), labels
(the label field's column, ``cls``), keys, and extra fields (``extra/EXT``).

Byte columns written by this version are flat (a group of contiguous ``bytes`` + ``offsets``):
a value is one ``pread`` at the dataset's file offset. Older shards' variable-length columns are
read through h5py.

An HDF5 file can point outside itself (a soft or external link, a dataset stored in an external
file, a virtual dataset mapped from others) and can declare sizes its bytes do not hold (a chunk
of gigabytes compressed into kilobytes): every column is reached through a hard link and stored in
the shard itself, or the shard is refused by name before any column is read; what one read may
allocate is checked against :data:`MAX_DECOMPRESSED_BYTES` and the one pixel limit before it
happens (a refusal is a SampleError naming the sample and field, which ``on_error="skip"`` skips);
and a sample's fields are read only when asked for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from fastload._util.files import close_when_dropped, open_regular_sized, this_process
from fastload.decode.header import check_pixels
from fastload.errors import SampleError, ShardError
from fastload.fields import LABEL_FIELD, format_label
from fastload.formats.columns import PackedStrings, int_column

if TYPE_CHECKING:
    from fastload.formats.table import Facts

# Decompressed chunks kept per process over its open files (h5py's default is 1 MB a file, a
# handful of 64-row chunks, so shuffled reading of a compressed shard decompressed a chunk for
# nearly every row). Only chunked (compressed) datasets use it, and only as chunks are read.
CHUNK_CACHE_BUDGET = 256 << 20
CHUNK_CACHE_SLOTS = 10007  # a prime well above the chunks that fit
# The most one read of a column may decompress or allocate through h5py: a chunk, or one value of
# a chunked byte column (fastload writes byte columns contiguous, pixels in chunks of at most this).
MAX_DECOMPRESSED_BYTES = 256 << 20
MAX_CHANNELS = 4  # decoded pixels: grey, RGB or RGBA


def chunk_cache_bytes(open_files: int) -> int:
    """Each open file's share of the budget, between h5py's default 1 MB and 32 MB."""
    return max(1 << 20, min(32 << 20, CHUNK_CACHE_BUDGET // max(open_files, 1)))


def child(group, name: str, where: str):
    """Member ``name`` of an HDF5 ``group``, or None where there is none; a ShardError naming it
    (``where``) unless it is reached by a hard link and, a dataset, stored in this file: a soft or
    external link, external storage or a virtual dataset would read other files (an external link
    is never followed: its kind is read from the link itself)."""
    import h5py

    link = name.encode()
    if not group.id.links.exists(link):
        return None
    kind = group.id.links.get_info(link).type
    if kind != h5py.h5l.TYPE_HARD:
        raise ShardError(f"{where}: a {'soft' if kind == h5py.h5l.TYPE_SOFT else 'external'} link; a fastload shard holds its columns itself, refusing it")
    node = group[name]
    if isinstance(node, h5py.Dataset):
        plist = node.id.get_create_plist()
        if plist.get_layout() == h5py.h5d.VIRTUAL:
            raise ShardError(f"{where}: a virtual dataset (mapped from other files); refusing it")
        if plist.get_external_count():
            raise ShardError(f"{where}: stored in a file outside the shard; refusing it")
    return node


def chunk_bytes(dataset) -> int:
    """Bytes one chunk of ``dataset`` decompresses to, as its layout declares (0: not chunked)."""
    chunks = dataset.chunks
    return int(np.prod(chunks, dtype=np.int64)) * dataset.dtype.itemsize if chunks else 0


def _small_column(dataset, where: str):
    """``dataset``, read whole once (keys, labels, formats, offsets): a ShardError naming it where
    a chunk or the whole would decompress more than MAX_DECOMPRESSED_BYTES."""
    if max(chunk_bytes(dataset), dataset.size * dataset.dtype.itemsize) > MAX_DECOMPRESSED_BYTES:
        raise ShardError(f"{where}: declares more than {MAX_DECOMPRESSED_BYTES} bytes to read at once; refusing it")
    return dataset


class ByteColumn:
    """Row access to a column of byte strings: flat (one ``pread`` a value when the bytes are
    stored contiguously, else an h5py slice) or a variable-length uint8 dataset (older shards).
    Its shape is checked against ``rows`` once, here: ``where`` names the column in the error;
    ``size``: the shard file's, which contiguous bytes must lie within."""

    def __init__(self, node, fd: int, size: int, rows: int, where: str) -> None:
        import h5py

        self._vlen = None if isinstance(node, h5py.Group) else node
        self.present: np.ndarray | None = None  # which rows hold a value (None: all of them)
        self._chunk = 0  # the bytes a chunk of it decompresses to (0: contiguous)
        if self._vlen is not None:
            if not isinstance(node, h5py.Dataset) or h5py.check_vlen_dtype(node.dtype) != np.uint8 or node.shape != (rows,):
                raise ShardError(f"{where}: not {rows} rows of bytes, as the index says")
            self._chunk = chunk_bytes(node)
            return
        present = child(node, "present", f"{where}/present")
        if present is not None:
            if not isinstance(present, h5py.Dataset) or present.shape != (rows,) or present.dtype.kind not in "iub":
                raise ShardError(f"{where}: its present column is not {rows} rows, as the index says")
            self.present = _small_column(present, f"{where}/present")[:].astype(bool)
        offsets_node, self._bytes = child(node, "offsets", f"{where}/offsets"), child(node, "bytes", f"{where}/bytes")
        if not isinstance(offsets_node, h5py.Dataset) or not isinstance(self._bytes, h5py.Dataset):
            raise ShardError(f"{where}: no offsets and bytes datasets")
        offsets = _small_column(offsets_node, f"{where}/offsets")[:]
        if (
            offsets.shape != (rows + 1,) or offsets.dtype.kind not in "iu"
            or self._bytes.dtype != np.uint8 or self._bytes.ndim != 1
            or offsets[0] < 0 or np.any(offsets[1:] < offsets[:-1]) or offsets[-1] > self._bytes.shape[0]
        ):
            raise ShardError(f"{where}: its offsets do not describe {rows} rows of its bytes, as the index says")
        self._offsets = int_column(offsets)
        self._file_offset = self._bytes.id.get_offset()  # None when chunked, compressed or empty
        if self._file_offset is not None and self._file_offset + int(offsets[-1]) > size:
            raise ShardError(f"{where}: its bytes run past the end of the file")
        self._chunk = chunk_bytes(self._bytes)
        self._fd = fd

    def get(self, i: int, field: str, where: Callable[[int], str]) -> bytes:
        """Value ``i`` of field ``field``; a SampleError naming the sample (``where(i)``) and the
        field where reading it would decompress more than MAX_DECOMPRESSED_BYTES (a chunk of its
        column, or itself)."""
        if self._vlen is not None:
            _check_decompressed(self._chunk, where(i), field)
            return self._vlen[i].tobytes()
        start, end = self._offsets[i], self._offsets[i + 1]
        if self._file_offset is None:
            _check_decompressed(max(self._chunk, end - start), where(i), field)
            return self._bytes[start:end].tobytes()
        data = os.pread(self._fd, end - start, self._file_offset + start)
        if len(data) != end - start:
            raise OSError(f"short read: {len(data)} of {end - start} bytes")
        return data


def _check_decompressed(size: int, sample: str, field: str) -> None:
    """A SampleError naming ``sample`` and ``field`` when one read would decompress ``size`` bytes,
    more than MAX_DECOMPRESSED_BYTES (a tiny shard can declare gigabytes)."""
    if size > MAX_DECOMPRESSED_BYTES:
        raise SampleError(sample, f"field {field}: its column declares {size} bytes to decompress at once, over {MAX_DECOMPRESSED_BYTES}")


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
        self._size = 0  # its size when opened: contiguous columns must lie within it
        self._pid = -1
        self._cached: dict | None = None
        self._cached_pid = -1

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_file"], state["_fd"], state["_pid"], state["_cached"], state["_closer"] = None, None, -1, None, None
        return state

    def _h5(self):
        if self._file is None or self._pid != this_process():
            import h5py

            try:
                fd, self._size = open_regular_sized(self.path)  # first: h5py would wait on a FIFO
            except OSError as exc:
                raise ShardError(f"{self.path}: cannot open HDF5 shard ({exc.strerror})") from None
            try:
                self._file = h5py.File(self.path, "r", rdcc_nbytes=self.cache_bytes, rdcc_nslots=CHUNK_CACHE_SLOTS)
            except OSError:
                os.close(fd)
                raise ShardError(f"{self.path}: cannot open HDF5 shard (not an HDF5 file, or damaged)") from None
            self._fd, self._closer = fd, close_when_dropped(self, fd)
            self._pid = this_process()
        return self._file

    def open(self) -> None:
        """Open the file in this process now."""
        self._h5()

    def __len__(self) -> int:
        return len(self._columns()["key"])

    def check(self) -> None:
        """Check every column against the index (row counts, byte offsets, pixel shape) and where
        it is stored (in this file, reached by hard links)."""
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
        """Reach and check the columns: each through a hard link and stored in this file (else the
        shard is refused, before any is read), as many rows as the index says, labels integers,
        pixels of the index's shape (a ShardError naming the column otherwise); then read the small
        ones (keys, labels, image formats, byte offsets)."""
        import h5py

        rows, where = self.rows, f"{self.path}: column"
        fd = cast(int, self._fd)  # opened beside the h5py file by _h5()
        decode = lambda values: [v.decode() if isinstance(v, bytes) else v for v in values]  # noqa: E731
        present = {name: node for name in ("key", LABEL_FIELD, "image_format", "pixels") if (node := child(f, name, f"{where} {name}")) is not None}
        for name, dataset in present.items():
            if not isinstance(dataset, h5py.Dataset) or dataset.shape[:1] != (rows,):
                raise ShardError(f"{where} {name}: not {rows} rows, as the index says")
        if "key" not in present:
            raise ShardError(f"{where} key: missing")
        labels = present.get(LABEL_FIELD)
        if labels is not None and (labels.dtype.kind not in "iu" or labels.ndim != 1):
            raise ShardError(f"{where} {LABEL_FIELD}: not integer labels")
        image = child(f, "image", f"{where} image")
        if image is not None and "image_format" not in present:
            raise ShardError(f"{where} image_format: missing beside image")
        pixels = present.get("pixels")
        if self.pixel_shape is not None and (pixels is None or pixels.dtype != np.uint8 or pixels.shape[1:] != self.pixel_shape):
            raise ShardError(f"{where} pixels: not {rows} rows of uint8 pixels of shape {list(self.pixel_shape)}, as the index says")
        pixels_at = _contiguous_rows(pixels) if pixels is not None else None
        if pixels_at is not None and pixels_at[0] + rows * pixels_at[2] > self._size:
            raise ShardError(f"{where} pixels: its rows run past the end of the file")
        extra = child(f, "extra", f"{where} extra")
        if extra is not None and not isinstance(extra, h5py.Group):
            raise ShardError(f"{where} extra: not a group of columns")
        extras = {ext: child(extra, ext, f"{where} extra/{ext}") for ext in extra} if extra is not None else {}
        return {
            "key": PackedStrings(decode(_small_column(present["key"], f"{where} key")[:])),
            "labels": _small_column(labels, f"{where} {LABEL_FIELD}")[:] if labels is not None else None,
            "image_format": list(map(sys.intern, decode(_small_column(present["image_format"], f"{where} image_format")[:])))
            if "image_format" in present else None,  # a few shared strings
            "image": ByteColumn(image, fd, self._size, rows, f"{where} image") if image is not None else None,
            "pixels": pixels,
            "pixels_at": pixels_at,
            "extra": {ext: ByteColumn(node, fd, self._size, rows, f"{where} extra/{ext}") for ext, node in extras.items()},
        }

    def key(self, i: int) -> str:
        """The key of row ``i``."""
        return self._columns()["key"][i]

    def where(self, i: int) -> str:
        """'path:key' of row ``i``, as errors name a sample."""
        return f"{self.path}:{self.key(i)}"

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
        dataset is contiguous (uncompressed), else through h5py (a chunk is decompressed). A
        SampleError naming the sample where a row is over the one pixel limit or of more than
        MAX_CHANNELS channels, or a chunk of them decompresses to more than MAX_DECOMPRESSED_BYTES."""
        columns = self._columns()
        dataset = columns["pixels"]
        sample = self.where(i)
        if dataset.ndim != 4 or dataset.shape[3] > MAX_CHANNELS:
            raise SampleError(sample, f"field pixels: rows of shape {list(dataset.shape[1:])}, not height x width x 1 to {MAX_CHANNELS} channels")
        check_pixels(dataset.shape[2], dataset.shape[1], sample)
        if columns["pixels_at"] is None:
            _check_decompressed(chunk_bytes(dataset), sample, "pixels")
            try:
                return dataset[i]
            except OSError:
                raise ShardError(f"{self.path}: cannot read row {i} (a damaged chunk?)") from None
        file_offset, row_shape, size = columns["pixels_at"]
        data = os.pread(cast(int, self._fd), size, file_offset + i * size)  # open: _columns() opened it
        if len(data) != size:
            raise ShardError(f"{self.path}: cannot read row {i} (short read; shard truncated?)")
        return np.frombuffer(data, dtype=np.uint8).reshape(row_shape)

    def read(self, i: int, fields: Collection[str] | None = None) -> dict[str, bytes]:
        """Encoded fields of row ``i``: the image under its format's extension, ``cls``, extras;
        only those named in ``fields`` when given (the others' columns are not touched); a field
        the sample does not have is left out, as a tar shard leaves it out."""
        columns = self._columns()
        out: dict[str, bytes] = {}
        try:
            image_format = columns["image_format"][i] if columns["image"] is not None else ""
            if image_format and (fields is None or image_format in fields):  # "": this sample has no image
                out[image_format] = columns["image"].get(i, image_format, self.where)
            if columns["labels"] is not None and columns["labels"][i] >= 0 and (fields is None or LABEL_FIELD in fields):  # -1: no label
                out[LABEL_FIELD] = format_label(int(columns["labels"][i]))
            for ext, column in columns["extra"].items():
                if (fields is None or ext in fields) and (column.present is None or column.present[i]):  # absent, as from a tar without the member
                    out[ext] = column.get(i, ext, self.where)
        except OSError as exc:
            raise ShardError(f"{self.path}: cannot read row {i} ({exc}; shard truncated?)") from None
        return out

    def close(self) -> None:
        """Close the file of this process."""
        self._cached = None
        if self._file is not None and self._pid == this_process():
            self._file.close()
            self._closer()
        self._file, self._fd = None, None
