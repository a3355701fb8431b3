"""NumPy arrays: a ``.npz`` with images (NHWC or NHW uint8) and labels, or a folder of ``.npy`` files."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fastload.converters.sample import Sample, SourceItem, file_stamp
from fastload.converters.sources import SourceOptions

IMAGE_NAMES = ("images", "x", "data", "X", "x_train")
LABEL_NAMES = ("labels", "y", "targets", "Y", "y_train")


def _pick(names: list[str], wanted: tuple[str, ...], path: Path, what: str) -> str | None:
    for name in wanted:
        if name in names:
            return name
    if what == "images":
        raise ValueError(f"{path}: no images array; expected one of {wanted}, found {sorted(names)}")
    return None


@functools.lru_cache(maxsize=2)
def _load(path: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """Images and labels; .npy files are memory-mapped, .npz members read once per process."""
    if path.is_dir():
        names = [p.stem for p in path.glob("*.npy")]
        image_name = _pick(names, IMAGE_NAMES, path, "images")
        label_name = _pick(names, LABEL_NAMES, path, "labels")
        images = np.load(path / f"{image_name}.npy", mmap_mode="r", allow_pickle=False)
        labels = np.load(path / f"{label_name}.npy", allow_pickle=False) if label_name else None
    elif path.suffix == ".npy":
        images, labels = np.load(path, mmap_mode="r", allow_pickle=False), None
    else:
        with np.load(path, allow_pickle=False) as archive:
            image_name = _pick(archive.files, IMAGE_NAMES, path, "images")
            label_name = _pick(archive.files, LABEL_NAMES, path, "labels")
            images = archive[image_name]
            labels = archive[label_name] if label_name else None
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise ValueError(f"{path}: images must be uint8 NHWC or NHW, got {images.dtype} {images.shape}")
    if labels is not None and (labels.ndim != 1 or len(labels) != len(images)):
        raise ValueError(f"{path}: labels shape {labels.shape} does not match {len(images)} images")
    return images, labels


@dataclass(frozen=True)
class ArraySource:
    """Rows of an image array, with optional integer labels."""

    path: Path
    classes: tuple[str, ...] | None = None

    def items(self) -> list[SourceItem]:
        """One item per row."""
        images, _ = _load(self.path)
        hint = int(np.prod(images.shape[1:])) // 2
        stamp = file_stamp(*(sorted(self.path.iterdir()) if self.path.is_dir() else [self.path]))
        return [SourceItem(key=f"{i:08d}", where=f"{self.path}#{i}", size_hint=hint, ref=i, stamp=stamp) for i in range(len(images))]

    def load(self, item: SourceItem) -> Sample:
        """The row's pixels (HWC) and label."""
        images, labels = _load(self.path)
        pixels = np.asarray(images[item.ref])
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]
        label = None if labels is None else int(labels[item.ref])
        return Sample(key=item.key, where=item.where, image=pixels, label=label)


def open_source(path: str, options: SourceOptions) -> ArraySource:
    """Open a .npz / .npy file or a folder of .npy files."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    _load(p)  # validate now, in the driver, with a clear message
    return ArraySource(path=p)
