"""HDF5 shards: encoded images (or fixed-size decoded pixels, or none), int64 labels, string keys,
extra fields (text, json, .npy arrays, ...) and the schema in attributes.

Byte strings (encoded images, extra fields) are stored flat: a group holding ``bytes``, every
value concatenated in one contiguous uint8 dataset, and ``offsets`` (int64, n + 1), value i being
``bytes[offsets[i]:offsets[i + 1]]``. A reader can then fetch a value with one ``pread`` at the
dataset's file offset; h5py's variable-length rows cost ~150 us each to read.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import h5py
import numpy as np

from fastload._util.files import file_sha256, temporary_beside
from fastload.fields import LABEL_FIELD
from fastload.formats.hdf5.reader import MAX_DECOMPRESSED_BYTES
from fastload.formats.index import FORMAT_NAME, FORMAT_VERSION
from fastload.formats.shard_info import ShardInfo
from fastload.formats.table import TABLE_SUFFIX, encode_table
from fastload.formats.writing import PreparedSample, WriterOptions, publish, write_beside

CHUNK_ROWS = 64  # rows of decoded pixels a compressed chunk holds
ENCODED_DATASET = "image"
DECODED_DATASET = "pixels"


def write_byte_column(f: h5py.File, name: str, values: list[bytes | None]) -> None:
    """Store byte strings flat as group ``name``: contiguous uint8 ``bytes`` and int64 ``offsets``;
    where a sample has none (None), a uint8 ``present`` column tells it from an empty value."""
    group = f.create_group(name)
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum([len(v or b"") for v in values], out=offsets[1:])
    group.create_dataset("bytes", data=np.frombuffer(b"".join(v or b"" for v in values), dtype=np.uint8))  # contiguous: no chunks
    group.create_dataset("offsets", data=offsets)
    if any(v is None for v in values):
        group.create_dataset("present", data=np.array([v is not None for v in values], dtype=np.uint8))


class Hdf5ShardWriter:
    """Collects a shard's samples in memory (a shard is a few hundred MB at most), then writes once."""

    def __init__(self, path: Path, options: WriterOptions) -> None:
        self.path = path
        self.options = options
        self._samples: list[PreparedSample] = []
        self._tmp: Path | None = None

    def add(self, sample: PreparedSample) -> None:
        """Queue one sample; decoded pixels must all share one shape."""
        if self.options.hdf5_decoded != isinstance(sample.image, np.ndarray):
            raise TypeError(f"{sample.key}: hdf5_decoded={self.options.hdf5_decoded} but got {type(sample.image).__name__}")
        self._samples.append(sample)

    def _write(self, f: h5py.File) -> None:
        n = len(self._samples)
        f.attrs["format"] = FORMAT_NAME
        f.attrs["version"] = FORMAT_VERSION
        f.create_dataset("key", data=np.array([s.key for s in self._samples], dtype=object), dtype=h5py.string_dtype())
        labels = [s.label for s in self._samples]
        if any(label is not None for label in labels):
            f.create_dataset(LABEL_FIELD, data=np.array([-1 if v is None else v for v in labels], dtype=np.int64))
        if self.options.hdf5_decoded:
            pixels = np.stack([np.asarray(s.image) for s in self._samples]) if n else np.zeros((0, 0, 0, 0), np.uint8)
            compression = self.options.hdf5_compression
            # compressed: chunks of 64 rows, fewer where that would pass what a reader decompresses at once;
            # else contiguous, so a row is one pread at a known offset
            rows = min(n, CHUNK_ROWS, max(1, MAX_DECOMPRESSED_BYTES // max(1, pixels[0].nbytes))) if n else 0
            chunks = (rows, *pixels.shape[1:]) if n and compression else None
            f.create_dataset(DECODED_DATASET, data=pixels, chunks=chunks, compression=compression)
        elif any(s.image is not None for s in self._samples):  # a sample without one: empty bytes, format ""
            write_byte_column(f, ENCODED_DATASET, [s.image if isinstance(s.image, bytes) else b"" for s in self._samples])
            f.create_dataset(
                "image_format", data=np.array([s.image_field or "" for s in self._samples], dtype=object),
                dtype=h5py.string_dtype(),
            )
        for ext in sorted({ext for s in self._samples for ext in s.extra}):
            write_byte_column(f, f"extra/{ext}", [s.extra.get(ext) for s in self._samples])

    def finish(self) -> ShardInfo:
        """Write the file and its sample table under temporary names, then publish both."""
        fd, self._tmp = temporary_beside(self.path)
        os.close(fd)  # created new (never through a link), then opened by name: h5py takes no descriptor
        with h5py.File(self._tmp, "w") as f:
            self._write(f)
        table_path = self.path.with_suffix(TABLE_SUFFIX)
        labels = [-1 if s.label is None else s.label for s in self._samples]
        table_bytes = encode_table([s.key for s in self._samples], [{}] * len(self._samples), labels)
        publish(write_beside(table_path, table_bytes), table_path)
        publish(self._tmp, self.path)
        self._tmp = None
        return ShardInfo(
            path=self.path.name, samples=len(self._samples), bytes=self.path.stat().st_size, sha256=file_sha256(self.path),
            table=table_path.name, table_sha256=hashlib.sha256(table_bytes).hexdigest(),
        )

    def abort(self) -> None:
        """Drop the queued samples and any temporary file."""
        self._samples.clear()
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
            self._tmp = None


def open_writer(path: Path, options: WriterOptions) -> Hdf5ShardWriter:
    """An HDF5 shard writer."""
    return Hdf5ShardWriter(path, options)
