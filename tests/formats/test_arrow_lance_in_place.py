"""``datasets.save_to_disk`` folders (Arrow stream files: a record batch a shard) and Lance datasets
(a slice of a fragment a shard) read in place (#40), row for row the same as the Parquet files of
the same rows; their orders and resume are those of every dataset; changes are seen."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload import transforms as T
from tests.formats.test_parquet_in_place import ROWS, cache, hub, hub_rows  # noqa: F401  # cache: every test reads with a cache folder of its own; hub: the module fixture of the same rows as Parquet
from tests.hostile_data import run_limited
from tests.test_resume_contract import BATCH, run_resume_contract

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def saved(hub: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The Parquet rows loaded by ``datasets`` and saved to disk in two Arrow files."""
    out = tmp_path_factory.mktemp("saved") / "photos"
    ds = datasets.load_dataset("parquet", data_files=sorted(str(p) for p in hub.iterdir()), split="train",
                               cache_dir=str(tmp_path_factory.mktemp("hf-cache")))
    ds.save_to_disk(str(out), num_shards=2)
    return out


@pytest.fixture(scope="module")
def lanced(hub: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The same rows as a Lance dataset of fragments of 20 rows."""
    lance = pytest.importorskip("lance")
    import pyarrow.parquet as pq

    table = pa.concat_tables([pq.read_table(p) for p in sorted(hub.iterdir())])
    path = tmp_path_factory.mktemp("lance") / "photos.lance"
    lance.write_dataset(table, str(path), max_rows_per_file=20)
    return path


def rows_of(location: object) -> list[tuple[str, int, list[float]]]:
    with fastload.DataLoader(location, batch_size=8, fields=["caption", "label", "emb"], num_workers=1) as loader:
        return [(c, int(y), e.tolist()) for captions, labels, emb in loader for c, y, e in zip(captions, labels, emb)]


@pytest.mark.parametrize("kind", ["arrow", "lance"])
def test_rows_equal_those_of_the_parquet_files(kind: str, hub: Path, saved: Path, lanced: Path) -> None:  # noqa: F811
    location = saved if kind == "arrow" else lanced
    ds = fastload.open(location)
    assert ds.index.layout == kind and ds.layout.in_place
    assert len(ds) == ROWS and ds.index.columns == {"image": "image", "label": "label", "caption": "text", "emb": "array", "meta": "json"}
    if kind == "arrow":
        assert ds.classes == ["cat", "dog", "owl"] and ds.index.shards[0].path == "data-00000-of-00002.arrow"
        assert ds.where(40) == "data-00001-of-00002.arrow:row" + str(40 - len(datasets.load_from_disk(str(saved)).shard(2, 0)))
    else:
        assert [(s.row_group, s.samples) for s in ds.index.shards] == [(0, 20), (1, 20), (2, 5)]
        assert ds.where(21) == "photos.lance:fragment1:row1"
    assert rows_of(location) == rows_of(hub)
    parquet = fastload.open(hub)
    for i in (0, 21, 44):
        assert np.array_equal(ds[i]["image"], parquet[i]["image"]) and ds[i]["meta"] == parquet[i]["meta"]
    with fastload.DataLoader(location, batch_size=5, transform=T.train(16), seed=2, num_workers=2) as loader, \
            fastload.DataLoader(str(hub), batch_size=5, transform=T.train(16), seed=2) as parquet_loader:
        assert all(torch.equal(x, px) and torch.equal(y, py) for (x, y), (px, py) in zip(loader, parquet_loader, strict=True))


@pytest.mark.parametrize("kind", ["arrow", "lance"])
def test_resume_equals_an_uninterrupted_run(kind: str, saved: Path, lanced: Path) -> None:
    location = str(saved if kind == "arrow" else lanced)
    run_resume_contract(lambda: fastload.DataLoader(location, batch_size=BATCH, shuffle=True, seed=5, transform=T.train(16),
                                                    return_keys=True, num_workers=2, shuffle_buffer=12), 3)


def test_a_lance_dataset_written_to_is_indexed_again(lanced: Path, tmp_path: Path) -> None:
    import shutil

    import lance

    copy = tmp_path / "photos.lance"
    shutil.copytree(lanced, copy)
    assert len(fastload.open(copy)) == ROWS
    lance.write_dataset(lance.dataset(str(copy)).to_table().slice(0, 3), str(copy), mode="append")
    again = fastload.open(copy)
    assert len(again) == ROWS + 3 and again.index.shards[-1].version == lance.dataset(str(copy)).version


@pytest.mark.parametrize("v2_names", [True, False])
def test_a_lance_dataset_indexed_before_opens_without_a_spawned_process(v2_names: bool, lanced: Path, tmp_path: Path) -> None:
    """Its version is read from its manifests' names (either naming scheme), so opening it again
    spawns no process for pylance (which imports the caller's script again); written to since, it is
    indexed again."""
    import lance

    path = tmp_path / "photos.lance"
    lance.write_dataset(lance.dataset(str(lanced)).to_table(), str(path), enable_v2_manifest_paths=v2_names)
    got = run_limited(f"""
import json, resource
import fastload
def children_cpu():
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime
first = len(fastload.open({str(path)!r}))  # indexed: pylance in a spawned process
before = children_cpu()
again = len(fastload.open({str(path)!r}))
print(json.dumps({{"rows": [first, again], "children_cpu": children_cpu() - before}}))
""", env={"FASTLOAD_CACHE_DIR": str(tmp_path / "cache")})
    assert got == {"rows": [ROWS, ROWS], "children_cpu": 0}
    lance.write_dataset(lance.dataset(str(path)).to_table().slice(0, 3), str(path), mode="append")
    assert len(fastload.open(path)) == ROWS + 3


def test_pylance_runs_in_no_process_of_fastloads_so_its_workers_fork_safely(lanced: Path, tmp_path: Path) -> None:
    """pylance is not fork-safe: a process forked after it ran may hang in it. Every pylance call runs
    in a fresh interpreter of each process's own, so a training process that reads rows itself
    (``ds[i]``, the array field's shape probed) and then forks workers imports no lance, nor do its
    workers, and every row comes."""
    got = run_limited(f"""
import json, os, sys
import fastload
def seen(sample, rng):
    sample["caption"] += "|" + str(os.getpid()) + ("|lance" if "lance" in sys.modules else "|none")
    return sample
first = fastload.open({str(lanced)!r})[0]["caption"]
with fastload.DataLoader({str(lanced)!r}, batch_size=8, fields=["caption", "label", "emb"], num_workers=2, map=seen) as loader:
    captions = [c for captions, labels, emb in loader for c in captions]
print(json.dumps({{"first": first, "rows": len(captions), "main": "lance" in sys.modules,
                  "workers": sorted({{c.split("|")[1] for c in captions}} - {{str(os.getpid())}}),
                  "imported": sorted({{c.split("|")[2] for c in captions}})}}))
""", env={"FASTLOAD_CACHE_DIR": str(tmp_path / "cache")})
    assert got["first"] == fastload.open(lanced)[0]["caption"] and got["rows"] == ROWS
    assert got["main"] is False and len(got["workers"]) == 2 and got["imported"] == ["none"]


def test_the_lance_process_exits_with_the_process_it_serves(lanced: Path, tmp_path: Path) -> None:
    """Killed by SIGKILL mid-run, the process leaves no Lance process behind."""
    import signal
    import subprocess
    import sys
    import time

    script = f"""
import os, sys, time
import fastload
from fastload.formats.lance.reader import lance_process
fastload.open({str(lanced)!r})[0]
print(lance_process().process.pid, flush=True)
time.sleep(60)
"""
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "FASTLOAD_CACHE_DIR": str(tmp_path / "cache")})
    try:
        helper = int(owner.stdout.readline())
        os.kill(helper, 0)  # alive while its process is
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        deadline = time.monotonic() + 30
        while Path(f"/proc/{helper}").exists() and Path(f"/proc/{helper}/stat").read_text().split()[2] != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{helper}").exists() or Path(f"/proc/{helper}/stat").read_text().split()[2] == "Z"
    finally:
        owner.kill()
        owner.wait()


def test_a_damaged_lance_fragment_is_a_sample_error_naming_its_rows(lanced: Path, tmp_path: Path) -> None:
    """A fragment's data file cut short: its rows are sample errors naming the fragment and row (as
    the Lance process reports them), skipped with their reason under ``on_error="skip"``; the other
    fragments read on."""
    import lance

    from fastload.errors import SampleError

    copy = tmp_path / "photos.lance"  # written anew: files of new names (pylance's caches know a copy's files by name)
    lance.write_dataset(lance.dataset(str(lanced)).to_table(), str(copy), max_rows_per_file=20)
    ds = fastload.open(copy)
    last = ds.index.shards[-1]
    # which file holds the last fragment is pylance's to say
    files = {fragment.fragment_id: fragment.data_files()[0].path for fragment in lance.dataset(str(copy)).get_fragments()}
    damaged = copy / "data" / Path(files[last.row_group]).name
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    first_damaged = ROWS - last.samples
    with pytest.raises(SampleError, match=rf"photos.lance:fragment{last.row_group}:row0: damaged Lance data in fragment {last.row_group} \("):
        ds[first_damaged]
    assert ds[0]["label"] == fastload.open(lanced)[0]["label"]
    with fastload.DataLoader(copy, batch_size=8, fields=["caption", "label"], num_workers=2, on_error="skip", max_skipped=None) as loader:
        rows = sum(len(captions) for captions, _ in loader)
        skipped = loader.stats.skipped.entries
    assert rows == ROWS and len(skipped) == last.samples
    assert all(entry["where"].startswith(f"photos.lance:fragment{last.row_group}:row") and "damaged Lance data" in entry["reason"]
               and "\n" not in entry["reason"] for entry in skipped)


def test_two_lance_datasets_of_one_name_and_version_give_each_its_own_rows(tmp_path: Path) -> None:
    """``a/photos.lance`` and ``b/photos.lance``, both at version 1, read in one process: the batch
    cache names a slice by where the dataset is, not by its name and version alone (it once gave
    the second dataset the first one's rows)."""
    import lance

    for folder, word in (("a", "left"), ("b", "right")):
        (tmp_path / folder).mkdir()
        lance.write_dataset(pa.table({"caption": [f"{word} {i}" for i in range(6)], "label": list(range(6))}), str(tmp_path / folder / "photos.lance"))
    first, second = (fastload.open(tmp_path / folder / "photos.lance") for folder in ("a", "b"))
    assert first.index.shards[0].version == second.index.shards[0].version == 1
    assert [first[i]["caption"] for i in range(6)] == [f"left {i}" for i in range(6)]
    assert [second[i]["caption"] for i in range(6)] == [f"right {i}" for i in range(6)]


def test_a_damaged_arrow_file_is_one_line_naming_it(saved: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "saved"
    shutil.copytree(saved, copy)
    state = json.loads((copy / "state.json").read_text())
    damaged = copy / state["_data_files"][1]["filename"]
    damaged.write_bytes(damaged.read_bytes()[:-5000])  # its last record batch cut short
    with pytest.raises(ValueError) as raised:
        fastload.open(copy)
    assert str(damaged) in str(raised.value) and "\n" not in str(raised.value)
