"""Raw dataset sources. Each lists cheap item references, then loads one sample per reference.

A source must be picklable (it is sent to worker processes) and deterministic: the same input
gives the same items in the same order.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fastload.converters.sample import Sample, SourceItem
from fastload.files import resolved_inside

SOURCE_MODULES: dict[str, str] = {
    "imagefolder": "fastload.converters.sources.imagefolder",
    "manifest": "fastload.converters.sources.manifest",
    "cifar": "fastload.converters.sources.cifar",
    "mnist": "fastload.converters.sources.mnist",
    "npz": "fastload.converters.sources.arrays",
    "parquet": "fastload.converters.sources.parquet",
    "wds": "fastload.converters.sources.wds",
    "videos": "fastload.converters.sources.videos",
}


@dataclass(frozen=True)
class SourceOptions:
    """Options of the raw sources; each source reads the ones that concern it."""

    follow_symlinks: bool = False  # read files outside the source root (links leading out, manifest paths): inside_source
    path_column: str = "path"  # manifest
    label_column: str = "label"  # manifest, parquet
    image_column: str = "image"  # parquet
    caption_column: str = "caption"  # videos (a manifest): stored as each sample's txt, where the column exists
    split: str = "train"  # cifar, mnist: "train" or "test"

    def __post_init__(self) -> None:
        if self.split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {self.split!r}")


class Source(Protocol):
    """What every source module's ``open_source`` returns."""

    classes: tuple[str, ...] | None

    def items(self) -> list[SourceItem]:
        """Every sample's reference, in the source's canonical order."""

    def load(self, item: SourceItem) -> Sample:
        """Read one sample; raises SampleError naming ``item.where`` when it cannot."""


def open_source(kind: str, path: str, options: SourceOptions = SourceOptions()) -> Source:
    """Open a raw dataset of the given kind (a key of ``SOURCE_MODULES``)."""
    if kind not in SOURCE_MODULES:
        raise ValueError(f"unknown source {kind!r}; expected one of {sorted(SOURCE_MODULES)}")
    module = importlib.import_module(SOURCE_MODULES[kind])
    return module.open_source(path, options)


def inside_source(root: str | os.PathLike[str], path: Path, follow_symlinks: bool) -> Path:
    """``path``, a file a source reads under its ``root``, where it stays inside ``root`` once
    symlinks are resolved (compared part by part: ``ds-private`` is not inside ``ds``), or
    anywhere with ``follow_symlinks``; else a ValueError naming it. Every source reads through it."""
    if not follow_symlinks and resolved_inside(root, path) is None:
        raise ValueError(f"{path}: leads outside the source root (-> {os.path.realpath(path)}); pass --follow-symlinks to read it")
    return path
