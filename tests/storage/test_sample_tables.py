"""Per-sample tables: written by the converters and ``fastload index`` as the .idx / HDF5
columns say, built on first open for datasets converted without them (also by racing
processes), a read-only folder falling back to the .idx with a warning, tampered tables refused
by name; labels and keys by global index without reading shards; open shards bounded per process."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload import transforms as T
from fastload.converters import ConvertOptions, convert
from fastload.converters.index_tars import index_tars
from fastload.errors import RemoteError, ShardError
from fastload.formats.idx import parse_dali_index
from fastload.formats.index import read_index
from fastload.formats.table import SampleTable
from tests.conftest import cli_env, drop_tables
from tests.storage.test_remote import DatasetServer

pytestmark = pytest.mark.timeout(180)


@pytest.fixture()
def ds_root(clean: Path, tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(clean, root)
    return root


def tables(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.glob("*.table"))}


def test_the_converters_tables_equal_the_idx_parse(clean: Path) -> None:
    index = read_index(clean)
    for info in index.shards:
        assert info.table is not None and info.table_sha256 is not None
        members = parse_dali_index((clean / str(info.offsets)).read_text(), "idx")
        table = SampleTable(clean / info.table, info.samples)
        assert [table.key(i) for i in range(info.samples)] == [members.key(i) for i in range(info.samples)]
        assert [table.spans(i) for i in range(info.samples)] == [members.spans(i) for i in range(info.samples)]
        assert table.keys() == [members.key(i) for i in range(info.samples)]
        data = (clean / info.path).read_bytes()
        labels = [int(data[o : o + s]) for o, s in (members.spans(i)["cls"] for i in range(info.samples))]
        assert table.labels().tolist() == labels
        table.close()
    ds = fastload.open(clean)
    assert ds.sample_labels().tolist() == [ds[i]["label"] for i in range(len(ds))]


def test_fastload_index_writes_the_same_tables_as_the_converter(clean: Path, tmp_path: Path) -> None:
    root = tmp_path / "tars"
    root.mkdir()
    for tar in clean.glob("*.tar"):
        shutil.copy(tar, root / tar.name)
    index, _ = index_tars(root)
    assert all(info.table for info in index.shards)
    assert tables(root) == tables(clean)


def test_hdf5_tables_hold_the_columns_keys_and_labels(h5_clean: Path) -> None:
    ds = fastload.open(h5_clean)
    for shard, info in enumerate(ds.index.shards):
        assert info.table is not None
        table = SampleTable(h5_clean / info.table, info.samples)
        reader = ds.reader(shard)
        assert table.keys() == [reader.key(i) for i in range(info.samples)]
        assert table.labels().tolist() == [int(reader.read(i)["cls"]) for i in range(info.samples)]
        assert all(table.spans(i) == {} for i in range(info.samples))
        table.close()
    assert ds.sample_labels().tolist() == [ds[i]["label"] for i in range(len(ds))]
    assert list(ds.sample_keys()) == [ds[i]["key"] for i in range(len(ds))]


def test_labels_and_keys_by_global_index(clean: Path) -> None:
    ds = fastload.open(clean)
    labels = ds.sample_labels()
    assert labels.dtype == np.int64 and len(labels) == len(ds) and not labels.flags.writeable
    keys = ds.sample_keys()
    assert len(keys) == len(ds) and list(keys) == [ds[i]["key"] for i in range(len(ds))]
    assert keys[-1] == ds.key_of(len(ds) - 1) == ds[len(ds) - 1]["key"]
    wanted = [keys[17], keys[0], keys[29], keys[17]]
    assert ds.indices_of(wanted).tolist() == [17, 0, 29, 17]
    assert ds.indices_of([]).tolist() == []
    with pytest.raises(KeyError, match=re.escape("no sample has the key 'no/such-key'")):
        ds.indices_of([keys[3], "no/such-key", "another/missing"])


def test_a_key_repeated_across_tars_is_excluded_everywhere_and_names_no_one_sample(tmp_path: Path) -> None:
    """Foreign WebDataset writers may restart keys in each tar: exclude= leaves out every sample
    holding the key (an overlap's exclude list must not leak one), indices_of refuses to pick one."""
    pytest.importorskip("webdataset")
    from tests.conftest import jpeg_bytes, run_cli, small_photo
    from tests.test_fields import write_tars

    samples = [{"__key__": f"{k:03d}", "jpg": jpeg_bytes(small_photo(3 * t + k)), "cls": str(t)} for t in range(3) for k in range(3)]
    root = write_tars(tmp_path / "repeated", samples, per_tar=3)
    run_cli("index", str(root))
    ds = fastload.open(root)
    assert [ds.key_of(i) for i in range(len(ds))] == ["000", "001", "002"] * 3
    assert ds.indices_holding(["001", "002"]).tolist() == [1, 2, 4, 5, 7, 8]
    with pytest.raises(ValueError, match="3 samples have the key '001'"):
        ds.indices_of(["001"])
    loader = fastload.DataLoader(ds, batch_size=9, exclude=["001"], return_keys=True, transform=[T.CenterCrop(8)])
    (keys,) = [batch[2] for batch in loader]
    assert sorted(keys) == ["000", "000", "000", "002", "002", "002"]


def test_unlabelled_samples_are_minus_one(clean: Path, tmp_path: Path) -> None:
    """Tars of images without ``cls`` (some with, some without), indexed in place."""
    root = tmp_path / "mixed"
    root.mkdir()
    members = parse_dali_index((clean / "shard-00000.idx").read_text(), "idx")
    data = (clean / "shard-00000.tar").read_bytes()
    with tarfile.open(root / "a.tar", "w") as tar:
        for i in range(4):
            fields = members.spans(i) if i % 2 else {"jpg": members.spans(i)["jpg"]}
            for ext, (offset, size) in fields.items():
                info = tarfile.TarInfo(f"s{i}.{ext}")
                info.size = size
                tar.addfile(info, io.BytesIO(data[offset : offset + size]))
    index_tars(root)
    labels = fastload.open(root).sample_labels()
    assert labels[0::2].tolist() == [-1, -1] and labels[1::2].tolist() == [int(fastload.open(clean)[i]["label"]) for i in (1, 3)]


def test_an_older_dataset_gets_its_tables_on_first_open(clean: Path, tmp_path: Path) -> None:
    root = drop_tables(shutil.copytree(clean, tmp_path / "old"))
    assert tables(root) == {}
    keys, _ = load(root, num_workers=2)
    assert tables(root) == tables(clean)  # built by the workers as they read, byte for byte the converter's
    assert keys == load(clean, num_workers=2)[0]
    assert not [p for p in root.iterdir() if ".tmp-" in p.name]


def test_hdf5_older_dataset_gets_its_tables(h5_clean: Path, tmp_path: Path) -> None:
    root = drop_tables(shutil.copytree(h5_clean, tmp_path / "old-h5"))
    assert fastload.open(root).sample_labels().tolist() == fastload.open(h5_clean).sample_labels().tolist()
    assert tables(root) == tables(h5_clean)


def _read_everything(root: str) -> list[str]:
    ds = fastload.open(root)
    return [ds[i]["key"] for i in range(len(ds))]


def test_processes_racing_to_build_the_tables_agree(clean: Path, tmp_path: Path) -> None:
    root = drop_tables(shutil.copytree(clean, tmp_path / "race"))
    with multiprocessing.get_context("fork").Pool(4) as pool:
        results = pool.map(_read_everything, [str(root)] * 8)
    assert all(keys == results[0] for keys in results) and results[0] == _read_everything(str(clean))
    assert tables(root) == tables(clean)
    assert not [p for p in root.iterdir() if ".tmp-" in p.name]


READ_ONLY_CHILD = """
import logging, sys
import fastload
from fastload import transforms as T
logging.basicConfig(level=logging.WARNING)
ds = fastload.open(sys.argv[1])
keys = []
with fastload.DataLoader(ds, batch_size=4, transform=T.val(16), return_keys=True, num_workers=2) as loader:
    for _, _, k in loader:
        keys += k
print(len(keys), ds.sample_labels().tolist() == [ds[i]["label"] for i in range(len(ds))], ",".join(ds.sample_keys()))
"""


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` where no file can be created, for root too (immutable), else by its mode bits."""
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
            pytest.skip("cannot make a folder immutable here (chattr)")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
    else:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)


def test_a_read_only_older_dataset_loads_from_its_idx_with_one_warning(clean: Path, tmp_path: Path) -> None:
    root = drop_tables(shutil.copytree(clean, tmp_path / "ro"))
    with read_only(root):
        proc = subprocess.run([sys.executable, "-c", READ_ONLY_CHILD, str(root)], capture_output=True, text=True, env=cli_env())
    assert proc.returncode == 0, proc.stderr
    count, labels_match, keys = proc.stdout.split()
    assert count == "30" and labels_match == "True" and keys.split(",") == list(fastload.open(clean).sample_keys())
    assert proc.stderr.count("have no sample table and the folder is read-only") == 1, proc.stderr
    assert tables(root) == {}


@pytest.mark.parametrize("layout", ["wds", "hdf5"])
def test_tables_built_in_memory_close_the_shards_they_read(clean: Path, h5_clean: Path, tmp_path: Path, layout: str) -> None:
    """In a read-only older dataset each table is built from its shard in memory: the shard's file
    is closed after (it leaked a descriptor a shard per call)."""
    root = drop_tables(shutil.copytree(clean if layout == "wds" else h5_clean, tmp_path / "ro"))
    with read_only(root):
        ds = fastload.open(root)
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(5):
            labels = ds.sample_labels()
        assert len(os.listdir("/proc/self/fd")) == before and len(labels) == len(ds)


def test_a_tampered_table_is_refused_naming_the_file(ds_root: Path) -> None:
    table = ds_root / "shard-00001.table"
    data = bytearray(table.read_bytes())
    table.write_bytes(bytes(data[:-3]))
    with pytest.raises(ShardError, match=re.escape(f"{table}: its header describes {len(data)} bytes, the file holds {len(data) - 3}")):
        fastload.open(ds_root)[9]
    data[8] += 1  # the sample count
    table.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=re.escape(f"{table}: lists 9 samples, the index says its shard holds 8")):
        fastload.open(ds_root)[9]
    table.write_bytes(b"not a table at all, but long enough to hold a header........................")
    with pytest.raises(ShardError, match=re.escape(f"{table}: not a fastload sample table")):
        fastload.open(ds_root)[9]
    problems = fastload.verify_dataset(ds_root).problems
    assert problems == ["shard-00001.table: missing or sha256 mismatch (the shard's sample table is corrupted)"]


def test_verify_compares_an_unlisted_table_with_its_shard(ds_root: Path) -> None:
    drop_tables(ds_root)
    fastload.open(ds_root).sample_labels()  # builds them
    assert fastload.verify_dataset(ds_root).ok
    table = ds_root / "shard-00002.table"
    data = bytearray(table.read_bytes())
    schema = SampleTable(table, 8).schema
    data[schema.labels_at] ^= 1  # sample 0's label
    table.write_bytes(bytes(data))
    assert fastload.verify_dataset(ds_root).problems == ["shard-00002.table: disagrees with its shard (keys, labels or offsets)"]


def test_a_tampered_remote_table_is_refused_by_its_checksum(ds_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTLOAD_RETRIES", "2")
    monkeypatch.setenv("FASTLOAD_RETRY_DELAY", "0.05")
    server = DatasetServer(ds_root)
    try:
        remote = fastload.open(server.url, cache_dir=tmp_path / "cache")
        assert remote.sample_labels().tolist() == fastload.open(ds_root).sample_labels().tolist()
        assert all(server.counts[f"shard-{k:05d}.table"] == 1 for k in range(4))
        table = ds_root / "shard-00003.table"
        data = bytearray(table.read_bytes())
        data[-1] ^= 1
        table.write_bytes(bytes(data))
        with pytest.raises(RemoteError, match=r"shard-00003\.table: cannot download it after 2 attempts.*sha256"):
            fastload.open(server.url, cache_dir=tmp_path / "fresh")[29]
    finally:
        server.shutdown()
        server.server_close()


def load(root: Path, **kwargs: object) -> tuple[list[str], fastload.DataLoader]:
    keys: list[str] = []
    loader = fastload.DataLoader(root, batch_size=4, transform=T.val(16), return_keys=True, **kwargs)
    with loader:
        for _, _, k in loader:
            keys += k
    return keys, loader


FD_CHILD = """
import os, resource, sys
import fastload
from fastload import transforms as T
root, limit = sys.argv[1], int(sys.argv[2])
def shard_fds():
    links = [os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")]
    return sum(link.startswith(root) for link in links)
ds = fastload.open(root)
peak = 0
for i in range(len(ds)):  # in this process: at most max_open_shards shards (two descriptors each) at a time
    ds[i]
    peak = max(peak, shard_fds())
ds.close()
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
keys = []
with fastload.DataLoader(root, batch_size=5, shuffle=True, transform=T.val(16), return_keys=True, num_workers=2) as loader:
    for epoch in range(2):
        for _, _, k in loader:
            keys += k
print(peak, len(keys), len(set(keys)))
"""


@pytest.mark.parametrize("layout", ["wds", "hdf5"])
def test_more_shards_than_the_open_file_limit(image_folder: Path, tmp_path: Path, layout: str) -> None:
    """30 one-sample shards under a descriptor limit that cannot hold them all open; the cap
    (FASTLOAD_MAX_OPEN_SHARDS=3) keeps every process under it. Without the cap it fails."""
    root = tmp_path / layout
    convert(str(image_folder), str(root), ConvertOptions(source="imagefolder", layout=layout, samples_per_shard=1))
    env = {**cli_env(), "FASTLOAD_MAX_OPEN_SHARDS": "3"}
    run = lambda env: subprocess.run([sys.executable, "-c", FD_CHILD, str(root), "40"], capture_output=True, text=True, env=env)  # noqa: E731
    proc = run(env)
    assert proc.returncode == 0, proc.stderr
    peak, count, distinct = map(int, proc.stdout.split())
    assert 3 <= peak <= 6 and count == 60 and distinct == 30
    uncapped = run({**env, "FASTLOAD_MAX_OPEN_SHARDS": "1000"})
    assert uncapped.returncode != 0 and "Too many open files" in uncapped.stderr


LIMIT_CHILD = """
import resource, sys
import fastload
from fastload import transforms as T
root, limit = sys.argv[1], int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
keys = []
with fastload.DataLoader(root, batch_size=5, shuffle=True, transform=T.val(16), return_keys=True, num_workers=2) as loader:
    for _, _, k in loader:
        keys += k
print(fastload.open(root).max_open_shards, len(set(keys)))
"""


def test_the_default_cap_is_half_the_descriptor_limit(image_folder: Path, tmp_path: Path) -> None:
    """Without FASTLOAD_MAX_OPEN_SHARDS the cap follows the process's own limit: 30 one-sample
    shards load under a limit of 48 descriptors (12 shards open), all are kept open under 1024."""
    root = tmp_path / "wds"
    convert(str(image_folder), str(root), ConvertOptions(source="imagefolder", samples_per_shard=1))
    env = {k: v for k, v in cli_env().items() if k != "FASTLOAD_MAX_OPEN_SHARDS"}
    for limit, cap in ((48, 12), (1024, 256)):
        proc = subprocess.run([sys.executable, "-c", LIMIT_CHILD, str(root), str(limit)], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == [str(cap), "30"]


def test_max_open_shards_is_checked(clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert fastload.open(clean, max_open_shards=2).max_open_shards == 2
    with pytest.raises(ValueError, match="max_open_shards: must be a whole number of shards, at least 1"):
        fastload.open(clean, max_open_shards=0)
    monkeypatch.setenv("FASTLOAD_MAX_OPEN_SHARDS", "many")
    with pytest.raises(ValueError, match="FASTLOAD_MAX_OPEN_SHARDS='many'"):
        fastload.open(clean)


def test_the_index_lists_each_table_with_its_checksum(clean: Path) -> None:
    for shard in json.loads((clean / "index.json").read_text())["shards"]:
        assert hashlib.sha256((clean / shard["table"]).read_bytes()).hexdigest() == shard["table_sha256"]


def test_a_table_row_listing_no_field_is_a_sample_error(ds_root: Path) -> None:
    """A tampered row with no member: a SampleError naming the sample (skipped with on_error="skip"),
    never a crash past it (min() of nothing)."""
    from fastload.errors import SampleError
    from fastload.formats.table import encode_table

    table = SampleTable(ds_root / "shard-00000.table", 8)
    keys, spans, labels = table.keys(), [table.spans(i) for i in range(8)], table.labels().tolist()
    table.close()
    (ds_root / "shard-00000.table").write_bytes(encode_table(keys, [{}, *spans[1:]], labels))
    with pytest.raises(SampleError, match=re.escape(f"shard-00000.tar:{keys[0]}") + ".*lists no field"):
        fastload.open(ds_root)[0]
    loader = fastload.DataLoader(str(ds_root), batch_size=30, on_error="skip", return_keys=True, transform=T.val(8))
    (delivered,) = [batch[2] for batch in loader]
    assert keys[0] not in delivered and len(delivered) == 30


def test_keys_of_a_tar_without_samples(tmp_path: Path) -> None:
    """A tar holding no sample (only a README, as some WebDataset shards do) has an empty table: its
    keys are none (reshaping them failed)."""
    root = tmp_path / "sparse"
    root.mkdir()
    for name, members in (("a.tar", {"000.jpg": b"\xff\xd8\xff"}), ("b.tar", {"README": b"hi"})):
        with tarfile.open(root / name, "w") as tar:
            for member, data in members.items():
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    index_tars(root)
    ds = fastload.open(root)
    assert [s.samples for s in ds.index.shards] == [1, 0] and list(ds.sample_keys()) == ["000"]
    assert ds.table(1).keys() == []
