"""MNIST-style IDX files (MNIST, Fashion-MNIST), gzipped or not."""

from __future__ import annotations

import functools
import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fastload.converters.sample import Sample, SourceItem, file_stamp
from fastload.converters.sources import SourceOptions, inside_source

_PREFIX = {"train": "train", "test": "t10k"}
_IDX_DTYPES: dict[int, str] = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    """Parse an IDX file (optionally .gz) into an array of its declared type and shape."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic {raw[:4]!r})")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    count = int(np.prod(shape))
    offset = 4 + 4 * ndim
    if len(raw) - offset < count * dtype.itemsize:
        raise ValueError(f"{path}: truncated IDX file ({len(raw) - offset} bytes for shape {shape})")
    return np.frombuffer(raw, dtype=dtype, count=count, offset=offset).reshape(shape)


@functools.lru_cache(maxsize=2)
def _load(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(f"{images_path}, {labels_path}: shapes {images.shape} and {labels.shape} do not match")
    return images.astype(np.uint8, copy=False), labels.astype(np.int64)


def _find(root: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (root / name).is_file():
            return root / name
    raise FileNotFoundError(f"{root}: no {stem}[.gz]")


@dataclass(frozen=True)
class MnistSource:
    """One split of an MNIST-like dataset; images are HxW grayscale arrays."""

    images_path: Path
    labels_path: Path
    split: str
    classes: tuple[str, ...] | None = None

    def items(self) -> list[SourceItem]:
        """One item per image, in file order."""
        images, _ = _load(self.images_path, self.labels_path)
        stamp = file_stamp(self.images_path, self.labels_path)
        return [
            SourceItem(key=f"{self.split}_{i:06d}", where=f"{self.images_path}#{i}", size_hint=400, ref=i, stamp=stamp)
            for i in range(len(images))
        ]

    def load(self, item: SourceItem) -> Sample:
        """The image's pixels (HxWx1) and label."""
        images, labels = _load(self.images_path, self.labels_path)
        return Sample(key=item.key, where=item.where, image=images[item.ref][:, :, None], label=int(labels[item.ref]))


def open_source(path: str, options: SourceOptions) -> MnistSource:
    """Open a directory holding ``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``."""
    root = Path(path)
    prefix = _PREFIX[options.split]
    return MnistSource(
        images_path=inside_source(root, _find(root, f"{prefix}-images-idx3-ubyte"), options.follow_symlinks),
        labels_path=inside_source(root, _find(root, f"{prefix}-labels-idx1-ubyte"), options.follow_symlinks),
        split=options.split,
    )
