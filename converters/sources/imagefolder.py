"""A class-per-subfolder image tree (torchvision's ImageFolder layout)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from converters.sample import Sample, SourceItem, make_key, unique_keys
from converters.sources import SourceOptions
from fastload.errors import SampleError

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm"}
)


@dataclass(frozen=True)
class ImageFolderSource:
    """Images under ROOT/CLASS/...; class indices are the sorted folder names."""

    root: Path
    classes: tuple[str, ...]
    follow_symlinks: bool

    def items(self) -> list[SourceItem]:
        """Every image file, class by class, in sorted path order."""
        found: list[tuple[str, int, int]] = []  # (relative path, label, size)
        for label, name in enumerate(self.classes):
            for dirpath, dirnames, filenames in os.walk(self.root / name, followlinks=self.follow_symlinks):
                dirnames.sort()
                for filename in sorted(filenames):
                    if Path(filename).suffix.lower() not in IMAGE_EXTENSIONS:
                        continue
                    path = Path(dirpath) / filename
                    try:
                        size = path.stat().st_size
                    except OSError:
                        size = 0  # a dangling link: reported when loaded
                    found.append((path.relative_to(self.root).as_posix(), label, size))
        keys = unique_keys([make_key(rel) for rel, _, _ in found])
        return [
            SourceItem(key=key, where=str(self.root / rel), size_hint=size, ref=(rel, label))
            for key, (rel, label, size) in zip(keys, found)
        ]

    def load(self, item: SourceItem) -> Sample:
        """Read the file's bytes as they are."""
        rel, label = item.ref
        path = self.root / rel
        if not self.follow_symlinks and path.is_symlink():
            target = Path(os.path.realpath(path))
            if not target.is_relative_to(self.root):
                raise SampleError(item.where, f"symlink leaves the source root (-> {target}); pass --follow-symlinks")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise SampleError(item.where, f"unreadable: {exc.strerror or exc}") from None
        return Sample(key=item.key, where=item.where, image=data, label=label)


def open_source(path: str, options: SourceOptions) -> ImageFolderSource:
    """Open an image folder; its class folders are its immediate subdirectories."""
    root = Path(os.path.realpath(path))
    if not root.is_dir():
        raise FileNotFoundError(f"{path}: not a directory")
    classes = tuple(
        sorted(
            entry.name
            for entry in os.scandir(root)
            if entry.is_dir(follow_symlinks=options.follow_symlinks) and not entry.name.startswith(".")
        )
    )
    if not classes:
        raise ValueError(f"{path}: no class subfolders (expected ROOT/CLASS/IMAGE)")
    return ImageFolderSource(root=root, classes=classes, follow_symlinks=options.follow_symlinks)
