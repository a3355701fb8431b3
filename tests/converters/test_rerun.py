"""A conversion's bytes depend on its input and options only: a rerun after a kill redoes exactly
the shards whose sources changed since (even when a changed image keeps its pixel shape), and the
output is the same whatever order the file system lists a folder in (os.scandir reversed at the
boundary, in the driver and in the workers it forks)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastload.converters import ConvertOptions, conversion, convert
from tests.conftest import jpeg_bytes, photo_folder, small_photo, tree_bytes


def killed_before_the_index(*args: object) -> None:
    raise KeyboardInterrupt("killed before index.json")


@pytest.mark.parametrize("layout", ["wds", "hdf5"])
def test_a_rerun_redoes_the_shard_whose_image_changed_in_place(tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kill a conversion before its index, replace one image by another of the same pixel shape
    (and byte size unchecked), rerun: that image's shard is written again, the others kept, and the
    output equals a fresh conversion's, byte for byte."""
    src = photo_folder(tmp_path / "src", 6, (24, 32))
    options = ConvertOptions(source="imagefolder", layout=layout, samples_per_shard=2)
    with monkeypatch.context() as patch:
        patch.setattr(conversion, "write_index", killed_before_the_index)
        with pytest.raises(KeyboardInterrupt):
            convert(str(src), str(tmp_path / "out"), options, quiet=True)
    changed = src / "c1" / "0004.jpg"  # sorted: c0/0000 c0/0003 | c1/0001 c1/0004 | c2/...: the second shard
    before = os.stat(changed)
    changed.write_bytes(jpeg_bytes(small_photo(99, 1, (24, 32))))
    os.utime(changed, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    with Image.open(changed) as image:
        assert image.size == (32, 24)
    report = convert(str(src), str(tmp_path / "out"), options, quiet=True)
    assert (report.shards_written, report.shards_reused, report.shards_changed) == (1, 2, 1)
    convert(str(src), str(tmp_path / "fresh"), options, quiet=True)
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "fresh")


class ReversedListing:
    """An os.scandir iterator listing its folder's entries in the reverse of the real order."""

    def __init__(self, real: Iterator[os.DirEntry]) -> None:
        self.entries = list(real)[::-1]
        real.close()  # type: ignore[attr-defined]

    def __enter__(self) -> ReversedListing:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def __iter__(self) -> Iterator[os.DirEntry]:
        return iter(self.entries)

    def close(self) -> None:
        pass


def folders(tmp: Path) -> dict[str, Path]:
    """Sources whose files a folder listing finds: class folders of images, .npy arrays, tars."""
    images = photo_folder(tmp / "images", 9, (24, 32))
    arrays = tmp / "arrays"
    arrays.mkdir()
    rng = np.random.default_rng(1)
    for name in ("images", "labels", "extra", "weights"):
        np.save(arrays / f"{name}.npy", rng.integers(0, 255, (6, 4, 4, 3) if name == "images" else (6,), dtype=np.uint8))
    tars = tmp / "tars"
    convert(str(images), str(tmp / "converted"), ConvertOptions(source="imagefolder", samples_per_shard=2))
    tars.mkdir()
    for shard in (tmp / "converted").glob("*.tar"):
        shutil.copy(shard, tars / shard.name)
    return {"imagefolder": images, "npz": arrays, "wds": tars}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_conversion_is_the_same_whatever_order_a_folder_is_listed_in(tmp_path: Path, workers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    sources = folders(tmp_path / "src")
    outputs: dict[str, list[dict[str, bytes]]] = {}
    for listing in ("as listed", "reversed"):
        with monkeypatch.context() as patch:
            if listing == "reversed":
                real = os.scandir
                patch.setattr(os, "scandir", lambda path=".", real=real: ReversedListing(real(path)))
                natural = [entry.name for entry in real(sources["imagefolder"] / "c0")]
                assert [entry.name for entry in os.scandir(sources["imagefolder"] / "c0")] == natural[::-1] != natural
            for name, src in sources.items():
                for shuffle in (False, True):
                    out = tmp_path / f"{listing}-{name}-{shuffle}"
                    convert(str(src), str(out), ConvertOptions(source=name, samples_per_shard=2, shuffle=shuffle, workers=workers), quiet=True)
                    outputs.setdefault(listing, []).append(tree_bytes(out))
    assert outputs["as listed"] == outputs["reversed"]
