"""NumPy arrays: a ``.npz``, a ``.npy``, or a folder of ``.npy`` files, one row a sample.

uint8 images (NHWC or NHW) under one of ``IMAGE_NAMES`` (any uint8 NHWC/NHW array in a lone
``.npy``) become the sample's image; integer labels under one of ``LABEL_NAMES`` become ``cls``;
every other array, of any dtype but Python objects (float features, embeddings, audio, float
targets, ...), becomes a ``NAME.npy`` field per row, stored with ``allow_pickle=False``.
"""

from __future__ import annotations

import functools
import io
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fastload.converters.sample import Sample, SourceItem, file_stamp
from fastload.converters.sources import SourceOptions, inside_source
from fastload.fields import ARRAY_FIELD

IMAGE_NAMES = ("images", "x", "data", "X", "x_train")
LABEL_NAMES = ("labels", "y", "targets", "Y", "y_train")
_FIELD_NAME = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class ArraySet:
    """The rows' parts: images (or None), labels (or None), and the other arrays by field name."""

    images: np.ndarray | None
    labels: np.ndarray | None
    arrays: dict[str, np.ndarray]

    def __len__(self) -> int:
        first = next(a for a in (self.images, self.labels, *self.arrays.values()) if a is not None)
        return len(first)


def _is_image_stack(array: np.ndarray) -> bool:
    return array.dtype == np.uint8 and (array.ndim == 3 or (array.ndim == 4 and array.shape[3] in (1, 3, 4)))


def _arrays_of(path: Path) -> dict[str, np.ndarray]:
    """Every array by name; .npy files memory-mapped, .npz members read once per process."""
    if path.is_dir():
        return {p.stem: np.load(p, mmap_mode="r", allow_pickle=False) for p in sorted(path.glob("*.npy"))}
    if path.suffix == ".npy":
        return {path.stem: np.load(path, mmap_mode="r", allow_pickle=False)}
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


@functools.lru_cache(maxsize=2)
def _load(path: Path) -> ArraySet:
    """The images, labels and other arrays of ``path``, checked to have one row per sample."""
    try:
        arrays = _arrays_of(path)
    except (ValueError, EOFError, zipfile.BadZipFile) as exc:  # an object array (allow_pickle=False refuses it), a cut file
        raise ValueError(f"{path}: cannot read its arrays ({type(exc).__name__}: {str(exc)[:100]})") from None
    if not arrays:
        raise ValueError(f"{path}: no arrays (.npy files or .npz members)")
    lone = path.suffix == ".npy"
    image_name = next((n for n in arrays if lone and _is_image_stack(arrays[n])), None) or next(
        (n for n in IMAGE_NAMES if n in arrays and _is_image_stack(arrays[n])), None
    )
    label_name = next((n for n in LABEL_NAMES if n in arrays and arrays[n].dtype.kind in "iu" and arrays[n].ndim == 1), None)
    images = arrays.pop(image_name) if image_name else None
    labels = arrays.pop(label_name) if label_name else None
    for name, array in arrays.items():
        if not _FIELD_NAME.fullmatch(name):
            raise ValueError(f"{path}: array {name!r} needs a name of letters, digits, _ and - to be a field")
        if array.ndim == 0:
            raise ValueError(f"{path}: array {name} is a scalar, not one row per sample")
    found = ArraySet(images, labels, {f"{name}.{ARRAY_FIELD}": array for name, array in arrays.items()})
    rows = len(found)
    for name, column in (("images", images), ("labels", labels), *found.arrays.items()):
        if column is not None and len(column) != rows:
            raise ValueError(f"{path}: {name} has {len(column)} rows, the other arrays {rows}")
    return found


def npy_bytes(array: np.ndarray) -> bytes:
    """``array`` as the bytes of a .npy file (reproducible: a fixed header, never pickled)."""
    out = io.BytesIO()
    np.lib.format.write_array(out, np.asarray(array), allow_pickle=False)  # a row of a 1-D array stays 0-d
    return out.getvalue()


@dataclass(frozen=True)
class ArraySource:
    """Rows of the arrays of a .npz / .npy file or a folder of .npy files."""

    path: Path
    classes: tuple[str, ...] | None = None

    def items(self) -> list[SourceItem]:
        """One item per row."""
        found = _load(self.path)
        parts = [a for a in (found.images, *found.arrays.values()) if a is not None]
        hint = sum(int(np.prod(a.shape[1:])) * a.dtype.itemsize for a in parts) // (2 if found.images is not None else 1)
        stamp = file_stamp(*(sorted(self.path.iterdir()) if self.path.is_dir() else [self.path]))
        return [SourceItem(key=f"{i:08d}", where=f"{self.path}#{i}", size_hint=hint, ref=i, stamp=stamp) for i in range(len(found))]

    def load(self, item: SourceItem) -> Sample:
        """The row's pixels (HWC) if it has an image, its label, and its other arrays as .npy fields."""
        found = _load(self.path)
        pixels = None
        if found.images is not None:
            pixels = np.asarray(found.images[item.ref])
            if pixels.ndim == 2:
                pixels = pixels[:, :, None]
        label = None if found.labels is None else int(found.labels[item.ref])
        extra = {name: npy_bytes(array[item.ref]) for name, array in found.arrays.items()}
        return Sample(key=item.key, where=item.where, image=pixels, label=label, extra=extra)


def open_source(path: str, options: SourceOptions) -> ArraySource:
    """Open a .npz / .npy file or a folder of .npy files."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    for f in sorted(p.glob("*.npy")) if p.is_dir() else ():
        inside_source(p, f, options.follow_symlinks)
    _load(p)  # validate now, in the driver, with a clear message
    return ArraySource(path=p)
