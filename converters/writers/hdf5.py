"""HDF5 shards: encoded images in a variable-length uint8 dataset (or fixed-size decoded pixels),
int64 labels, string keys, and the schema in attributes."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from converters.writers import PreparedSample, WriterOptions, publish, temp_path
from fastload.index import FORMAT_NAME, FORMAT_VERSION, ShardInfo, file_sha256

ENCODED_DATASET = "image"
DECODED_DATASET = "pixels"


class Hdf5ShardWriter:
    """Collects a shard's samples in memory (a shard is a few hundred MB at most), then writes once."""

    def __init__(self, path: Path, options: WriterOptions) -> None:
        self.path = path
        self.options = options
        self._samples: list[PreparedSample] = []

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
            f.create_dataset("cls", data=np.array([-1 if v is None else v for v in labels], dtype=np.int64))
        if self.options.hdf5_decoded:
            pixels = np.stack([s.image for s in self._samples]) if n else np.zeros((0, 0, 0, 0), np.uint8)
            chunks = (min(max(n, 1), 64),) + pixels.shape[1:] if n else None
            f.create_dataset(
                DECODED_DATASET, data=pixels, chunks=chunks, compression=self.options.hdf5_compression
            )
        else:
            images = f.create_dataset(ENCODED_DATASET, (n,), dtype=h5py.vlen_dtype(np.uint8))
            for i, s in enumerate(self._samples):
                images[i] = np.frombuffer(s.image, dtype=np.uint8)
            f.create_dataset(
                "image_format", data=np.array([s.image_field for s in self._samples], dtype=object),
                dtype=h5py.string_dtype(),
            )
        for ext in sorted({ext for s in self._samples for ext in s.extra}):
            column = f.create_dataset(f"extra/{ext}", (n,), dtype=h5py.vlen_dtype(np.uint8))
            for i, s in enumerate(self._samples):
                column[i] = np.frombuffer(s.extra.get(ext, b""), dtype=np.uint8)

    def finish(self) -> ShardInfo:
        """Write the file under a temporary name, then publish it."""
        tmp = temp_path(self.path)
        with h5py.File(tmp, "w") as f:
            self._write(f)
        publish(tmp, self.path)
        return ShardInfo(
            path=self.path.name, samples=len(self._samples), bytes=self.path.stat().st_size, sha256=file_sha256(self.path)
        )

    def abort(self) -> None:
        """Drop the queued samples and any temporary file."""
        self._samples.clear()
        temp_path(self.path).unlink(missing_ok=True)


def open_writer(path: Path, options: WriterOptions) -> Hdf5ShardWriter:
    """An HDF5 shard writer."""
    return Hdf5ShardWriter(path, options)
