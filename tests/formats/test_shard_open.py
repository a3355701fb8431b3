"""A shard's first open in a process (an ``open`` and ``fstat`` per file, one table header read,
the ``.idx`` left alone where a table is read): the same errors as before for a truncated or
replaced shard and a damaged table, long field names read past the first header read, the
descriptor table grown once, and a mixture's members splitting the open-shard cap."""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload.errors import SampleError, ShardError
from fastload.formats.table import HEAD_READ, SampleTable, encode_table
from tests.conftest import cli_env

pytestmark = pytest.mark.timeout(120)


@pytest.fixture()
def ds_root(clean: Path, tmp_path: Path) -> Path:
    """A writable copy of the 30-sample, 4-shard tar dataset, with its tables."""
    return Path(shutil.copytree(clean, tmp_path / "ds"))


def keys_of(root: Path) -> list[str]:
    return list(fastload.open(root).sample_keys())


def first_sample_end(root: Path, shard: int) -> int:
    """Where the first sample of shard ``shard`` ends in its tar."""
    return max(offset + size for offset, size in fastload.open(root).reader(shard).spans(0).values())


def test_a_shard_truncated_before_its_first_open_names_shard_and_key(ds_root: Path) -> None:
    keys = keys_of(ds_root)
    shard = ds_root / "shard-00001.tar"
    os.truncate(shard, first_sample_end(ds_root, 1))  # sample 8 (the shard's first) still fits, the rest do not
    ds = fastload.open(ds_root)
    assert ds[8]["key"] == keys[8]
    with pytest.raises(SampleError, match=re.escape(f"{shard}:{keys[12]}") + ".*past the end of the shard"):
        ds[12]


def test_a_shard_truncated_while_open_is_cut_short(ds_root: Path) -> None:
    keys = keys_of(ds_root)
    shard = ds_root / "shard-00001.tar"
    ds = fastload.open(ds_root)
    ds[8]  # opened: its size is known
    os.truncate(shard, first_sample_end(ds_root, 1))
    with pytest.raises(ShardError, match=re.escape(f"{shard}: sample {keys[12]!r} field ") + r"\w+ is cut short"):
        ds[12]


def test_a_shard_replaced_while_evicted_is_read_at_its_new_size(ds_root: Path) -> None:
    """One shard open at a time: shard 1 closes when shard 2 is read, is replaced by a shorter
    file, and its reopen checks spans against the file now there."""
    keys = keys_of(ds_root)
    shard = ds_root / "shard-00001.tar"
    ds = fastload.open(ds_root, max_open_shards=1)
    ds[8]
    ds[16]  # shard 1 evicted
    replacement = shard.read_bytes()[: first_sample_end(ds_root, 1)]
    shard.unlink()
    shard.write_bytes(replacement)
    with pytest.raises(SampleError, match=re.escape(f"{shard}:{keys[12]}") + ".*past the end of the shard"):
        ds[12]


@pytest.mark.parametrize(
    ("name", "sample", "removed", "a_directory"),
    [
        ("shard-00002.tar", 16, "cannot open shard (No such file or directory)", "cannot open shard (not a regular file)"),
        ("shard-00000.table", 0, "missing, though index.json lists it", "cannot open the sample table (not a regular file)"),
    ],
)
def test_a_removed_file_or_a_directory_in_its_place_is_named(ds_root: Path, name: str, sample: int, removed: str, a_directory: str) -> None:
    path = ds_root / name
    path.unlink()
    with pytest.raises(ShardError, match=re.escape(f"{path}: {removed}")):
        fastload.open(ds_root)[sample]
    path.mkdir()
    with pytest.raises(ShardError, match=re.escape(f"{path}: {a_directory}")):
        fastload.open(ds_root)[sample]


def test_a_table_opened_without_its_idx_never_reads_it(ds_root: Path) -> None:
    """With a table the ``.idx`` is not even looked up: a missing one does not matter to
    reading; ``verify``, which compares them, still names it."""
    keys = keys_of(ds_root)
    (ds_root / "shard-00003.idx").unlink()
    ds = fastload.open(ds_root)
    assert [ds[i]["key"] for i in range(24, 30)] == keys[24:30]
    assert any(p.startswith("shard-00003.idx: ") for p in fastload.verify_dataset(ds_root).problems)


def test_field_names_longer_than_the_first_header_read(tmp_path: Path) -> None:
    names = [f"field-number-{c:03d}.with-a-long-extension" for c in range(24)]  # names past HEAD_READ bytes
    spans = [{name: (512 * (i * len(names) + c), 7) for c, name in enumerate(names)} for i in range(3)]
    data = encode_table(["a", "b", "c"], spans, [1, -1, 2])
    assert len(data) > 64 + sum(len(n) + 1 for n in names) > HEAD_READ
    path = tmp_path / "long.table"
    path.write_bytes(data)
    table = SampleTable(path, 3)
    assert table.schema.names == tuple(sorted(names))
    assert [table.key(i) for i in range(3)] == ["a", "b", "c"]
    assert table.spans(2) == spans[2] and table.labels().tolist() == [1, -1, 2]
    damaged = bytearray(data)
    damaged[64 + 600] = 0xFF  # inside the names, past the first read: not UTF-8
    path.write_bytes(bytes(damaged))
    with pytest.raises(ShardError, match=re.escape(f"{path}: its field names are not UTF-8")):
        SampleTable(path, 3)


def test_tables_of_shards_sharing_field_names_keep_their_own_schema(clean: Path) -> None:
    ds = fastload.open(clean)
    schemas = [ds.table(s).schema for s in range(len(ds.index.shards))]
    assert len({schema.names for schema in schemas}) == 1  # the names section parsed once, shared
    assert [schema.samples for schema in schemas] == [s.samples for s in ds.index.shards]
    sizes = [(clean / s.table).stat().st_size for s in ds.index.shards if s.table is not None]
    assert [schema.keys_at + schema.keys_bytes for schema in schemas] == sizes


FD_TABLE_CHILD = """
import os, sys
import fastload
ds = fastload.open(sys.argv[1])
def fd_size():
    return int(open("/proc/self/status").read().split("FDSize:")[1].split()[0])
before, opened_before = fd_size(), len(os.listdir("/proc/self/fd"))
ds[0]
after, opened_after = fd_size(), len(os.listdir("/proc/self/fd"))
for i in range(len(ds)):
    ds[i]
print(before, after, fd_size(), opened_after - opened_before, ds.max_open_shards)
"""


def linked_copies(clean: Path, out: Path, copies: int) -> Path:
    """``clean``'s shard files hard-linked ``copies`` times under one index (as bench_scale does)."""
    out.mkdir()
    index = json.loads((clean / "index.json").read_text())
    shards = []
    for k in range(copies):
        for shard in index["shards"]:
            entry = dict(shard)
            for field in ("path", "offsets", "table"):
                entry[field] = f"c{k:04d}-{shard[field]}"
                os.link(clean / shard[field], out / entry[field])
            shards.append(entry)
    index["shards"] = shards
    index["class_counts"] = {label: count * copies for label, count in index["class_counts"].items()}
    index.pop("num_samples", None)
    (out / "index.json").write_text(json.dumps(index))
    return out


# A child's descriptor table starts as large as its parent's highest open descriptor needs (and
# this test process may hold hundreds): a launcher holding only a few starts it small.
LAUNCHER = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"


def test_the_descriptor_table_grows_once_for_the_shards(clean: Path, tmp_path: Path) -> None:
    """400 shards: the first read grows this process's descriptor table for every shard it may
    hold open (2 descriptors each), so opening the other 399 grows it no more; only the shard's
    own 2 stay open after the first read."""
    root = linked_copies(clean, tmp_path / "ds", 100)
    env = {**cli_env(), "FASTLOAD_MAX_OPEN_SHARDS": "1000"}
    child = [sys.executable, "-c", FD_TABLE_CHILD, str(root)]
    proc = subprocess.run([sys.executable, "-c", LAUNCHER, *child], capture_output=True, text=True, env=env, check=True)
    before, after, final, opened, cap = map(int, proc.stdout.split())
    assert cap == 1000 and opened == 2
    assert before < 800 <= after and final == after, proc.stdout


def test_a_mixtures_members_split_the_open_shard_cap(clean: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "other"
    shutil.copytree(clean, other)
    monkeypatch.setenv("FASTLOAD_MAX_OPEN_SHARDS", "40")
    mixture = fastload.mix({clean: 1.0, other: 1.0})
    assert [m.max_open_shards for m in mixture.members] == [20, 20]
    given = fastload.open(clean, max_open_shards=7)
    assert [m.max_open_shards for m in fastload.mix({given: 1.0, other: 3.0}).members] == [7, 20]


def test_a_table_shorter_than_its_header_is_refused_by_name(ds_root: Path) -> None:
    (ds_root / "shard-00000.table").write_bytes(b"x" * 10)
    with pytest.raises(ShardError, match=re.escape(f"{ds_root / 'shard-00000.table'}: not a fastload sample table")):
        fastload.open(ds_root)[0]


def test_samples_are_located_in_shards_of_one_size_and_of_mixed_sizes(clean: Path, tmp_path: Path) -> None:
    """The converters' shards (8, 8, 8, 6: one size, the last smaller) and twice them (8, 8, 8, 6,
    8, 8, 8, 6: mixed sizes) put every sample where the shard counts say, and read it back."""
    keys = keys_of(clean)
    for root, copies in ((clean, 1), (linked_copies(clean, tmp_path / "twice", 2), 2)):
        ds = fastload.open(root)
        starts = np.cumsum([0] + [s.samples for s in ds.index.shards])
        expected = [(int(s), i - int(starts[s])) for i in range(len(ds)) for s in [int(np.searchsorted(starts, i, side="right")) - 1]]
        assert [ds.locate(i) for i in range(len(ds))] == expected
        assert [ds[i]["key"] for i in range(len(ds))] == keys * copies
        with pytest.raises(IndexError):
            ds.locate(len(ds))


def open_descriptors() -> int:
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("layout", ["wds", "hdf5"])
def test_a_dataset_dropped_without_close_leaves_no_descriptor_open(clean: Path, h5_clean: Path, layout: str) -> None:
    """``fastload.open(path)[i]`` in a loop (a notebook's way) closes each dropped dataset's shard,
    table and HDF5 files with it, as ``close()`` would; a closed one closes them at once."""
    root = clean if layout == "wds" else h5_clean
    fastload.open(root)[0]  # first use (imports, caches) outside the count
    before = open_descriptors()
    for _ in range(20):
        ds = fastload.open(root)
        for i in range(0, len(ds), 7):  # samples of every shard
            ds[i]
        del ds
    assert open_descriptors() == before
    ds = fastload.open(root)
    ds[0]
    assert open_descriptors() > before
    ds.close()
    assert open_descriptors() == before
