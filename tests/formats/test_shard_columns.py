"""What every reading process holds per shard: the tar shards' offset index (DALI's v1.2 .idx) parsed
back as written, with damage named by file and line, and both layouts' per-sample columns (keys,
offsets) small enough for every worker to hold."""

from __future__ import annotations

import gc
import re
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload.converters import ConvertOptions, convert
from fastload.errors import DatasetIndexError, ShardError
from fastload.formats.idx import format_dali_index, parse_dali_index
from fastload.formats.index import read_index
from tests.conftest import drop_tables


def test_members_round_trip_with_different_fields_per_sample() -> None:
    samples = [
        [("cls", 512, 1, "a/0001.cls"), ("jpg", 1536, 19351, "a/0001.jpg")],
        [("jpg", 22016, 40448, "b/x.y.jpg")],  # the key ends at the first dot of the last path part
        [("cls", 63488, 2, "c.cls"), ("json", 64512, 30, "c.json"), ("png", 65536, 7, "c.png")],
    ]
    members = parse_dali_index(format_dali_index(samples).decode(), "s.idx")
    assert len(members) == 3
    assert [members.key(i) for i in range(3)] == ["a/0001", "b/x", "c"]
    assert [members.spans(i) for i in range(3)] == [
        {"cls": (512, 1), "jpg": (1536, 19351)},
        {"jpg": (22016, 40448)},
        {"cls": (63488, 2), "json": (64512, 30), "png": (65536, 7)},
    ]
    assert len(parse_dali_index("v1.2 0\n", "empty.idx")) == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "s.idx: empty DALI index"),
        ("v1.1 1\njpg 0 1 a.jpg\n", "s.idx: expected a 'v1.2 N' header"),
        ("v1.2 2\njpg 0 1 a.jpg\njpg 5 1\n", "s.idx:3: malformed sample line"),
        ("v1.2 2\njpg 0 1 a.jpg\n\njpg 5 1 b.jpg\n", "s.idx:3: malformed sample line"),
        ("v1.2 2\njpg 0 1 a.jpg\n", "s.idx: header says 2 samples, found 1"),
        ("v1.2 1\njpg 0 ten a.jpg\n", "s.idx: a member's offset or size is not an integer"),
    ],
)
def test_a_damaged_index_is_named_by_file_and_line(text: str, message: str) -> None:
    with pytest.raises(DatasetIndexError, match=re.escape(message)):
        parse_dali_index(text, "s.idx")


def test_a_damaged_shard_index_names_the_file_when_read(clean: Path, tmp_path: Path) -> None:
    root = tmp_path / "ds"
    shutil.copytree(clean, root)
    drop_tables(root)  # a dataset converted before tables: the .idx is what the loader reads
    idx = root / read_index(root).shards[0].offsets
    lines = idx.read_text().splitlines()
    idx.write_text("\n".join([*lines[:2], "jpg 10 20", *lines[3:]]) + "\n")
    ds = fastload.open(root)
    with pytest.raises(ShardError, match=re.escape(f"{idx}:3: malformed sample line")):
        ds[0]


def test_the_parsed_index_is_compact() -> None:
    """~70 bytes a sample (ImageNet's 1.28M samples: ~90 MB in each worker, not 0.8 GB)."""
    count = 20_000
    samples = [
        [("cls", 1024 * i, 1, f"n01440764/n01440764_{i:05d}.cls"), ("jpg", 1024 * i + 512, 110_000 + i, f"n01440764/n01440764_{i:05d}.jpg")]
        for i in range(count)
    ]
    text = format_dali_index(samples).decode()
    tracemalloc.start()
    try:
        members = parse_dali_index(text, "big.idx")
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert members.spans(count - 1) == {"cls": (1024 * (count - 1), 1), "jpg": (1024 * (count - 1) + 512, 110_000 + count - 1)}
    assert held / count < 120, f"{held / count:.0f} bytes a sample"


def test_hdf5_rows_are_held_compactly(tmp_path: Path) -> None:
    """Keys packed into one string, byte offsets in an int array, image formats shared: ~50 bytes a
    row in each process (a list of str and a list of ints took ~185)."""
    count = 20_000
    images = np.random.default_rng(0).integers(0, 256, (count, 2, 2, 3), dtype=np.uint8)
    np.savez(tmp_path / "tiny.npz", images=images, labels=np.arange(count) % 10)
    convert(str(tmp_path / "tiny.npz"), str(tmp_path / "h5"), ConvertOptions(source="npz", layout="hdf5", samples_per_shard=5_000))
    ds = fastload.open(tmp_path / "h5")
    tracemalloc.start()
    try:
        keys = [ds.reader(shard).key(0) for shard in range(len(ds.index.shards))]
        gc.collect()
        held = sum(stat.size for stat in tracemalloc.take_snapshot().statistics("filename"))
    finally:
        tracemalloc.stop()
    assert len(set(keys)) == 4 and ds[count - 1]["label"] == (count - 1) % 10
    assert held / count < 80, f"{held / count:.0f} bytes a row"
