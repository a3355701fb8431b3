"""Parquet read in place (#40): a row group a shard, a row a sample, each column a field by its
role. Files written by Hugging Face ``datasets`` (image ``{bytes, path}`` structs, a ClassLabel)
and by pyarrow (plain binary images); read through ``fastload.open`` and ``fastload.DataLoader``
and compared with the same rows converted to shards; the index (beside the files, or kept in
the cache) and its change checks; orders, exact and elastic resume, describe; hostile files."""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload import transforms as T
from fastload.converters import ConvertOptions, convert
from fastload.errors import DatasetIndexError, SampleError
from tests.conftest import jpeg_bytes, png_bytes, run_cli, small_photo
from tests.hostile_data import PEAK_RSS, run_limited
from tests.test_resume_contract import BATCH, run_resume_contract

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytestmark = pytest.mark.timeout(240)
ROWS = 45  # in two files: 30 rows in row groups of 8, 15 in groups of 7


def hub_rows(start: int, count: int) -> dict:
    """Rows as a Hub dataset holds them (images as the JPEG bytes a {bytes, path} struct carries)."""
    return {
        "image": [{"bytes": jpeg_bytes(small_photo(i, i % 3)), "path": f"{i}.jpg"} for i in range(start, start + count)],
        "label": [i % 3 for i in range(start, start + count)],
        "caption": [f"photo {i}" for i in range(start, start + count)],
        "emb": [[float(i), float(-i)] for i in range(start, start + count)],
        "meta": [{"n": i, "tags": ["a"] * (i % 2)} for i in range(start, start + count)],
    }


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of two Parquet files written by ``datasets`` (Image and ClassLabel features)."""
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog", "owl"]),
                                  "caption": datasets.Value("string"), "emb": datasets.Sequence(datasets.Value("float32")),
                                  "meta": {"n": datasets.Value("int64"), "tags": datasets.Sequence(datasets.Value("string"))}})
    root = tmp_path_factory.mktemp("hub") / "data"
    root.mkdir()
    for name, start, count, group in (("train-00000-of-00002.parquet", 0, 30, 8), ("train-00001-of-00002.parquet", 30, 15, 7)):
        datasets.Dataset.from_dict(hub_rows(start, count), features=features).to_parquet(str(root / name), batch_size=group)
    return root


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_hub_files_are_read_in_place_row_by_row(hub: Path) -> None:
    ds = fastload.open(hub)
    assert len(ds) == ROWS and ds.classes == ["cat", "dog", "owl"] and ds.layout.in_place
    assert [(s.path[:11], s.row_group, s.samples) for s in ds.index.shards][:5] == [("train-00000", g, 8) for g in range(3)] + [
        ("train-00000", 3, 6), ("train-00001", 0, 7)]
    assert ds.index.columns == {"image": "image", "label": "label", "caption": "text", "emb": "array", "meta": "json"}
    import io

    from PIL import Image

    for i in (0, 7, 8, 29, 30, 44):
        sample = ds[i]
        want = np.asarray(Image.open(io.BytesIO(jpeg_bytes(small_photo(i, i % 3)))).convert("RGB"))
        assert np.abs(sample["image"].astype(int) - want).max() <= 2  # libjpeg-turbo and Pillow's libjpeg may round apart
        assert sample["label"] == i % 3 and sample["caption"] == f"photo {i}"
        assert sample["emb"].tolist() == [i, -i] and sample["meta"] == {"n": i, "tags": ["a"] * (i % 2)}
        assert ds.where(i) == f"{'train-00000-of-00002.parquet' if i < 30 else 'train-00001-of-00002.parquet'}:row{i % 30}"


def test_plain_binary_images_and_a_single_file_and_a_list(tmp_path: Path) -> None:
    images = [png_bytes(small_photo(i)) for i in range(12)]
    for name in ("a.parquet", "b.parquet"):
        pq.write_table(pa.table({"img": images, "y": list(range(12))}), tmp_path / name, row_group_size=5)
    one = fastload.open(tmp_path / "a.parquet")
    assert len(one) == 12 and [s.samples for s in one.index.shards] == [5, 5, 2] and one.index.columns == {"img": "image", "y": "label"}
    listed = fastload.open([str(tmp_path / "b.parquet"), str(tmp_path / "a.parquet")])
    assert len(listed) == 24 and listed.where(0) == "b.parquet:row0" and listed.key_of(12) == "a.parquet:row0"
    with fastload.DataLoader(str(tmp_path / "a.parquet"), batch_size=4, transform=T.val(16)) as loader:
        labels = torch.cat([y for _, y in loader]).tolist()
    assert labels == list(range(12))


def test_each_rows_bytes_are_exact_in_groups_with_and_without_nulls_and_large_binary(tmp_path: Path) -> None:
    # Row groups of 4: those holding a null are read a value at a time, the others from the batch's buffers.
    images = [png_bytes(small_photo(i)) + bytes(i) for i in range(10)]  # each a different length
    big = [None if i == 6 else image for i, image in enumerate(images)]
    labels = [None if i == 9 else i * 7 for i in range(10)]
    hub_images = [None if i == 1 else {"bytes": image, "path": f"{i}.png"} for i, image in enumerate(images)]
    table = pa.table({"big": pa.array(big, pa.large_binary()), "y": pa.array(labels, pa.int16()), "hub": hub_images})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=4)
    ds = fastload.open(tmp_path / "a.parquet")
    assert ds.index.columns == {"big": "image", "y": "label", "hub": "image"}
    for i in [*range(10), 5, 0, 9, 3]:
        want = {"big": big[i], "y": None if labels[i] is None else str(labels[i]).encode(), "hub": hub_images[i] and images[i]}
        assert ds.raw(i)[1] == {name: value for name, value in want.items() if value is not None}
        assert ds.raw(i, ["hub"])[1] == ({"hub": images[i]} if i != 1 else {})


def converted(hub: Path, out: Path) -> Path:
    convert(str(hub), str(out), ConvertOptions(source="parquet", samples_per_shard=8), quiet=True)
    return out


def test_batches_equal_those_of_the_same_rows_converted(hub: Path, tmp_path: Path) -> None:
    """The same pixels (fastload's decoder, crop-only, the same per-sample random crops) and labels
    as the rows converted to tar shards, in the same order."""
    shards = converted(hub, tmp_path / "wds")
    kwargs = dict(batch_size=6, transform=T.train(24), seed=3, num_workers=2)
    with fastload.DataLoader(str(hub), **kwargs) as in_place, fastload.DataLoader(str(shards), **kwargs) as shard_loader:
        got, want = list(in_place), list(shard_loader)
    assert len(got) == len(want) == 8
    for (x, y), (wx, wy) in zip(got, want):
        assert torch.equal(x, wx) and torch.equal(y, wy)


def test_fields_by_column_name(hub: Path) -> None:
    with fastload.DataLoader(str(hub), batch_size=5, fields=["image", "caption", "emb", "label"], transform=T.val(16),
                             num_workers=1) as loader:
        batches = list(loader)
    images, captions, emb, labels = batches[1]
    assert images.shape == (5, 3, 16, 16) and captions == [f"photo {i}" for i in range(5, 10)]
    assert emb.tolist() == [[i, -i] for i in range(5, 10)] and labels.tolist() == [i % 3 for i in range(5, 10)]
    with fastload.DataLoader(str(hub), batch_size=4, fields={"meta": "json", "caption": "bytes"}) as loader:
        meta, captions = next(iter(loader))
    assert meta[1] == {"n": 1, "tags": ["a"]} and captions[0] == b"photo 0"


def test_fastload_index_writes_the_index_beside_and_a_changed_file_is_named(hub: Path, tmp_path: Path, cache: Path) -> None:
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(hub, folder)
    fastload.open(folder)  # not indexed yet: built from the footers and kept in the cache
    kept = list((cache / "in-place").iterdir())
    assert len(kept) == 1
    out = run_cli("index", str(folder))
    assert "indexed 45 rows in 7 Parquet row groups of 2 file(s)" in out.stdout and "image (image), label (label)" in out.stdout
    index = json.loads((folder / "index.json").read_text())
    assert index["layout"] == "parquet" and index["version"] == 6 and index["num_samples"] == ROWS
    files, parts = index["shards"]["files"], index["shards"]["parts"]  # a file an entry; the row groups a compact table
    assert [f["path"] for f in files] == sorted(p.name for p in hub.iterdir()) and parts["count"] == 7
    assert all(set(f) == {"path", "file_bytes", "footer_bytes", "mtime_ns", "sha256", "version"} for f in files)
    assert len(fastload.open(folder)) == ROWS
    later = folder / "train-00001-of-00002.parquet"
    os.utime(later, ns=(later.stat().st_atime_ns, later.stat().st_mtime_ns + 10**9))
    with pytest.raises(DatasetIndexError, match=r"index.json: train-00001-of-00002.parquet changed since it was indexed.*fastload index"):
        fastload.open(folder)
    os.remove(folder / "index.json")
    pq.write_table(pq.read_table(later).slice(0, 1), later)  # one row now: the cached index is rebuilt
    assert len(fastload.open(folder)) == 31


def test_resume_in_place_equals_an_uninterrupted_run(hub: Path) -> None:
    for taken in (1, 4):
        run_resume_contract(lambda: fastload.DataLoader(str(hub), batch_size=BATCH, shuffle=True, seed=5, transform=T.train(16),
                                                        return_keys=True, num_workers=2), taken)


def delivered(loader: fastload.DataLoader, stop_after: int | None = None) -> list[list[str]]:
    return [list(keys) for _, _, keys in itertools.islice(iter(loader), stop_after)]


def test_shuffled_orders_ranks_elastic_resume_and_describe(hub: Path) -> None:
    """Shuffled: every row once an epoch, row groups read in a block-shuffled order (a window of
    groups at a time); two ranks get equal batch counts; resumed at another world size, the rest
    of the epoch is every row not yet seen, once; describe names each batch's file and rows."""
    def loader_of(**kwargs: object) -> fastload.DataLoader:
        return fastload.DataLoader(str(hub), batch_size=3, shuffle=True, seed=1, transform=T.val(16), return_keys=True,
                                   shuffle_buffer=10, **kwargs)  # type: ignore[arg-type]

    whole = delivered(loader_of())
    flat = [key for keys in whole for key in keys]
    assert sorted(flat) == sorted(fastload.open(hub).key_of(i) for i in range(ROWS)) and flat != sorted(flat)
    ds = fastload.open(hub)
    groups = [ds.locate(i)[0] for i in range(ROWS)]
    order = [groups[int(next(i for i in range(ROWS) if ds.key_of(i) == k))] for k in flat[:9]]
    assert len(set(order)) <= 3  # the first 9 rows come from one window of row groups holding >= 10 rows
    first = [loader_of(rank=r, world_size=2) for r in range(2)]
    assert len(first[0]) == len(first[1])
    before = [delivered(loader, stop_after=2) for loader in first]
    state = first[0].state_dict()
    resumed = loader_of(rank=0, world_size=1)
    resumed.load_state_dict(state)
    after = delivered(resumed)
    seen = [key for rank in before for keys in rank for key in keys] + [key for keys in after for key in keys]
    assert len(seen) == ROWS and len(set(seen)) == ROWS
    for step, keys in enumerate(after, start=2):
        description = resumed.describe(step, 0)
        assert description.keys == keys and all(s.shard.startswith("train-0000") for s in description.samples)
    assert first[1].describe(0, 0).keys == before[1][0]


def test_the_first_batch_reads_few_row_groups_and_later_windows_mix_many(hub: Path) -> None:
    """A lane's first windows are smaller (a sixteenth of the buffer, doubling): the first batch
    needs the rows of at most two row groups, not of every group a whole window spans, while the
    epoch still holds every row once and a full window later mixes many groups."""
    ds = fastload.open(hub)
    group_of = {ds.key_of(i): ds.locate(i)[0] for i in range(ROWS)}
    for seed in range(4):
        loader = fastload.DataLoader(str(hub), batch_size=6, shuffle=True, seed=seed, transform=T.val(16), return_keys=True,
                                     shuffle_buffer=32, num_workers=2)
        batches = delivered(loader)
        flat = [key for keys in batches for key in keys]
        assert sorted(flat) == sorted(group_of)
        assert len({group_of[key] for key in batches[0]}) <= 2, seed
        assert len({group_of[key] for key in flat[-12:]}) >= 3, seed  # the last window holds at least 32 rows' groups


def test_a_group_declaring_too_much_is_refused_by_name_and_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastload.formats.parquet import reader

    images = [jpeg_bytes(small_photo(i, size=(16, 16))) for i in range(3)] + [jpeg_bytes(small_photo(i, size=(96, 128))) for i in range(3)]
    pq.write_table(pa.table({"image": images, "label": list(range(6))}), tmp_path / "d.parquet", row_group_size=3)
    meta = pq.read_metadata(tmp_path / "d.parquet")
    small, big = (meta.row_group(g).total_byte_size for g in range(2))
    monkeypatch.setattr(reader, "MAX_ROW_GROUP_BYTES", (small + big) // 2)  # group 1 declares more
    ds = fastload.open(tmp_path / "d.parquet")
    with pytest.raises(SampleError, match=r"d.parquet:row4: row group 1 declares \d+ bytes uncompressed in columns image, label, over the"):
        ds[4]
    assert ds[1]["label"] == 1
    with fastload.DataLoader(ds, batch_size=2, transform=T.val(16), on_error="skip", max_skipped=None) as loader:
        labels = torch.cat([y for _, y in loader]).tolist()
        skipped = loader.stats.skipped.entries
    assert len(labels) == 6 and set(labels) <= {0, 1, 2}
    assert len(skipped) == 3 and all("row group 1 declares" in entry["reason"] for entry in skipped)


def test_two_files_of_one_name_and_footer_give_each_its_own_rows(tmp_path: Path) -> None:
    """``a/d.parquet`` and ``b/d.parquet`` with byte-identical footers (values of equal lengths, no
    statistics) read in one process: the batch cache names a row group by where its file is, not by
    its name and footer alone (it once gave the second file the first one's rows)."""
    for folder, word in (("a", "left"), ("b", "rite")):
        (tmp_path / folder).mkdir()
        pq.write_table(pa.table({"caption": [f"{word} {i}" for i in range(4)]}), tmp_path / folder / "d.parquet", write_statistics=False)
    first, second = (fastload.open(tmp_path / folder / "d.parquet") for folder in ("a", "b"))
    assert first.index.shards[0].sha256 == second.index.shards[0].sha256  # the footers are the same bytes
    assert [first[i]["caption"] for i in range(4)] == [f"left {i}" for i in range(4)]
    assert [second[i]["caption"] for i in range(4)] == [f"rite {i}" for i in range(4)]


@pytest.mark.parametrize("damage", ["footer length", "footer bytes", "chunks past the data"])
def test_a_lying_footer_is_one_line_naming_the_file(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"image": [jpeg_bytes(small_photo(i)) for i in range(4)]}), path, row_group_size=2)
    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[-8:-4], "little")
    if damage == "footer length":
        data[-8:-4] = (len(data) * 4).to_bytes(4, "little")
    elif damage == "footer bytes":
        data[-8 - length : -8] = bytes(length)
    else:  # the column chunks cut out, the footer kept: its offsets point past the data before it
        data = data[:100] + data[-8 - length :]
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError) as raised:
        fastload.open(path)
    message = str(raised.value)
    assert str(path) in message and "\n" not in message and len(message) < 300


BIG = {  # 16 rows of 8 MiB in one row group (128 MiB declared), in a file of a few hundred KB
    "plain": "pq.write_table(pa.table({'image': [bytes(8 << 20)] * 16}), sys.argv[1], compression='zstd', use_dictionary=False)",
    "dictionary": "pq.write_table(pa.table({'image': pa.DictionaryArray.from_arrays(pa.array([0] * 16, pa.int32()), "
                  "pa.array([bytes(8 << 20)]))}), sys.argv[1], compression='zstd')",
}


@pytest.mark.parametrize("encoding", sorted(BIG))
def test_a_large_row_group_is_read_in_bounded_batches(tmp_path: Path, encoding: str) -> None:
    """Every row of a 128 MiB group read in a process whose Parquet memory is 32 MiB: its peak grows
    by a few batches, never by the group (a dictionary's value held once, not once a row)."""
    path = tmp_path / "big.parquet"
    subprocess.run([sys.executable, "-c", "import sys\nimport pyarrow as pa, pyarrow.parquet as pq\n" + BIG[encoding], str(path)],
                   check=True, timeout=120)
    assert path.stat().st_size < 1_000_000
    got = run_limited(PEAK_RSS + f"""
import json
import fastload
ds = fastload.open({str(path)!r})
ds.raw(0, ["image"])  # the imports and the first batch
before = peak_rss()
sizes = [len(ds.raw(i, ["image"])[1]["image"]) for i in range(16)]
print(json.dumps({{"grown": peak_rss() - before, "sizes": sizes}}))
""", memory_bytes=2 << 30, env={"FASTLOAD_PARQUET_MEMORY": "32MiB", "FASTLOAD_CACHE_DIR": str(tmp_path / "cache")})
    assert got["sizes"] == [8 << 20] * 16
    assert got["grown"] < 72 << 20, got  # the budget, a batch being read and a row's copy; the group is 128 MiB


def test_a_row_group_read_to_its_end_holds_nothing_beyond_its_cached_batches(tmp_path: Path) -> None:
    """Twelve row groups of one 4 MiB row read in turn with 8 MiB of Parquet memory: the process
    grows by its budget and a group being read, not by the column chunks that the readers of the
    groups already read to their end would keep buffered (eight of them: 32 MiB)."""
    path = tmp_path / "groups.parquet"
    pq.write_table(pa.table({"image": [os.urandom(4 << 20) for _ in range(12)]}), path, row_group_size=1, compression="none")
    got = run_limited(PEAK_RSS + f"""
import json
import fastload
ds = fastload.open({str(path)!r})
ds.raw(0, ["image"])  # the imports and the first group
before = peak_rss()
sizes = [len(ds.raw(i, ["image"])[1]["image"]) for i in range(1, 12)]
print(json.dumps({{"grown": peak_rss() - before, "sizes": sizes}}))
""", memory_bytes=2 << 30, env={"FASTLOAD_PARQUET_MEMORY": "8MiB", "FASTLOAD_CACHE_DIR": str(tmp_path / "cache")})
    assert got["sizes"] == [4 << 20] * 11
    assert got["grown"] < 24 << 20, got  # the budget, a group being read (its chunk and its batch) and a row's copy


class RangeHandler(SimpleHTTPRequestHandler):
    """Serves files and byte ranges (``Range: bytes=A-B``), recording each GET's path and range."""

    def do_GET(self) -> None:
        server: RangeServer = self.server  # type: ignore[assignment]
        path = Path(self.directory) / self.path.split("?")[0].lstrip("/")
        asked = self.headers.get("Range")
        server.gets.append((path.name, asked))
        if asked is None or not path.is_file():
            return super().do_GET()
        start, _, end = asked.removeprefix("bytes=").partition("-")
        data = path.read_bytes()
        first, last = int(start), min(int(end) if end else len(data) - 1, len(data) - 1)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        self.send_header("Content-Length", str(last + 1 - first))
        self.end_headers()
        self.wfile.write(data[first : last + 1])

    def log_message(self, *args: object) -> None:
        pass


class RangeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, directory: Path, handler: type[SimpleHTTPRequestHandler] = RangeHandler) -> None:
        super().__init__(("127.0.0.1", 0), functools.partial(handler, directory=str(directory)))
        self.gets: list[tuple[str, str | None]] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def test_parquet_over_http_is_read_by_ranges_through_the_cache(tmp_path: Path) -> None:
    """The files' URLs (a loopback server answering range requests): the same batches as the local
    files, every byte fetched by a range request (never a whole file), under a cache limit of a third
    of the data (four row groups with their footers)."""
    folder = tmp_path / "served"
    folder.mkdir()
    for n in range(2):
        rows = range(60 * n, 60 * n + 60)
        pq.write_table(pa.table({"image": [jpeg_bytes(small_photo(i, i % 3)) for i in rows], "label": [i % 3 for i in rows]}),
                       folder / f"part-{n}.parquet", row_group_size=5, write_statistics=False)  # a small footer
    server = RangeServer(folder)
    try:
        urls = [f"{server.url}/part-{n}.parquet" for n in range(2)]
        largest = max(s.bytes + (s.footer_bytes or 0) for s in fastload.open(folder).index.shards)
        limit = largest * 4
        assert limit * 3 < sum(p.stat().st_size for p in folder.iterdir()) * 2  # a third of the data at most
        remote = fastload.open(urls, cache_dir=tmp_path / "cache", cache_size=limit)
        assert len(remote) == 120 and remote.downloads and remote.where(61) == "part-1.parquet:row1"
        kwargs = dict(batch_size=6, transform=T.train(24), seed=3, shuffle=True, return_keys=True)
        with fastload.DataLoader(remote, num_workers=2, **kwargs) as loader:  # type: ignore[arg-type]
            got = list(loader)
        with fastload.DataLoader(str(folder), **kwargs) as loader:  # type: ignore[arg-type]
            want = list(loader)
    finally:
        server.shutdown()
        server.server_close()
    assert [k for *_, k in got] == [k for *_, k in want] and len(got) == 20
    assert all(torch.equal(x, wx) for (x, *_), (wx, *_) in zip(got, want))
    gets = [(name, asked) for name, asked in server.gets if name.endswith(".parquet")]
    assert gets and all(asked is not None for _, asked in gets), gets  # ranges only


class HubHandler(RangeHandler):
    """The Hub endpoints huggingface_hub's HfFileSystem calls, for the one dataset ``server.repo_id``
    held in ``directory``: its info, its tree (recursive or not) and its files by ``resolve`` (ranges)."""

    def do_GET(self) -> None:
        server: RangeServer = self.server  # type: ignore[assignment]
        root, repo = Path(self.directory), server.repo_id  # type: ignore[attr-defined]
        path, _, query = self.path.partition("?")
        api = f"/api/datasets/{repo}"
        if path == api or path.startswith(f"{api}/revision/"):
            return self.reply({"id": repo, "sha": "0" * 40, "private": False, "siblings": []})
        if path.startswith(f"{api}/tree/"):
            folder = path[len(f"{api}/tree/"):].partition("/")[2].strip("/")
            base = root / folder
            entries = sorted(base.rglob("*") if "recursive=true" in query.lower() else base.iterdir())
            return self.reply([{"type": "file" if e.is_file() else "directory", "oid": "1" * 40, "size": e.stat().st_size if e.is_file() else 0,
                                "path": str(e.relative_to(root))} for e in entries])
        prefix = f"/datasets/{repo}/resolve/"
        if path.startswith(prefix):
            self.path = "/" + path[len(prefix):].partition("/")[2]
            return super().do_GET()
        self.send_error(404)

    def do_HEAD(self) -> None:
        prefix = f"/datasets/{self.server.repo_id}/resolve/"  # type: ignore[attr-defined]
        if self.path.startswith(prefix):
            self.path = "/" + self.path[len(prefix):].partition("/")[2]
        super().do_HEAD()

    def reply(self, value: object) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_a_hub_dataset_is_read_by_the_real_huggingface_hub_client(hub: Path, tmp_path: Path) -> None:
    """``hf://datasets/ORG/NAME`` through huggingface_hub's HfFileSystem, against a loopback server
    answering the Hub's endpoints (HF_ENDPOINT): its Parquet files found by the tree listing, read by
    ranges of ``resolve``; the same rows as the local files."""
    pytest.importorskip("huggingface_hub")
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    for file in hub.iterdir():
        (repo / "data" / file.name).write_bytes(file.read_bytes())
    (repo / "README.md").write_text("a dataset card\n")
    server = RangeServer(repo, HubHandler)
    server.repo_id = "someone/photos"  # type: ignore[attr-defined]
    try:
        got = run_limited("""
import json
import fastload
ds = fastload.open("hf://datasets/someone/photos")
with fastload.DataLoader(ds, batch_size=9, fields=["caption", "label"], num_workers=1) as loader:
    rows = [(c, int(y)) for captions, labels in loader for c, y in zip(captions, labels)]
print(json.dumps({"names": sorted({s.path for s in ds.index.shards}), "rows": rows, "where": ds.where(44)}))
""", env={"HF_ENDPOINT": server.url, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": "",
          "FASTLOAD_CACHE_DIR": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "hf")})
    finally:
        server.shutdown()
        server.server_close()
    assert got["names"] == [f"data/{p.name}" for p in sorted(hub.iterdir())]
    assert got["rows"] == [[f"photo {i}", i % 3] for i in range(ROWS)] and got["where"] == "data/train-00001-of-00002.parquet:row14"
    files = [(name, asked) for name, asked in server.gets if name.endswith(".parquet")]
    assert files and all(asked is not None for _, asked in files)


def test_inspect_and_verify_read_in_place(hub: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(hub, folder)
    summary = json.loads(run_cli("inspect", str(folder), "--json").stdout)
    assert (summary["layout"], summary["samples"], summary["shards"]) == ("parquet", ROWS, 7)
    assert "7 shards, 45 samples verified and decoded: OK" in run_cli("verify", str(folder), "--decode").stdout
    described = run_cli("describe", str(folder), "--step", "1", "--batch-size", "4", "--transform", "val").stdout
    assert len(re.findall(r" train-0000[01]-of-00002\.parquet:row\d+ 48x64 crop", described)) == 4 and "parquet:train" not in described
    damaged = folder / "train-00001-of-00002.parquet"
    data = bytearray(damaged.read_bytes())
    data[1000:1400] = bytes(400)  # inside the first row group's image chunk
    damaged.write_bytes(bytes(data))
    out = run_cli("verify", str(folder), "--decode", check=False)
    assert out.returncode != 0 and "train-00001-of-00002.parquet (part 0)" in out.stdout + out.stderr


def test_parquet_in_s3_by_a_glob(hub: Path, s3_endpoint, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``s3://bucket/prefix/*.parquet`` (moto's S3 server on loopback): the files matching, read by ranges."""
    for file in hub.iterdir():
        s3_endpoint.put(str(file), f"fastload-test/inplace/data/{file.name}")
    ds = fastload.open("s3://fastload-test/inplace/data/*.parquet", cache_dir=tmp_path / "cache")
    assert len(ds) == ROWS and ds.where(44) == "train-00001-of-00002.parquet:row14"
    with fastload.DataLoader(ds, batch_size=9, fields=["caption"], num_workers=1) as loader:
        captions = [c for (batch,) in loader for c in batch]
    assert captions == [f"photo {i}" for i in range(ROWS)]


def test_the_index_of_many_row_groups_is_compact_and_opens_without_a_shard_object_each(tmp_path: Path) -> None:
    """index.json holds a file an entry and the row groups as a compressed table (tens of bytes a
    group, not hundreds); opening it makes no ShardInfo per row group, and a process reading every
    row group keeps the readers of its open ones only."""
    import gc

    from fastload.formats.shard_info import ShardInfo

    folder = tmp_path / "many"
    folder.mkdir()
    for n in range(3):
        pq.write_table(pa.table({"y": pa.array(range(400), pa.int64())}), folder / f"part-{n}.parquet", row_group_size=1, write_statistics=False)
    run_cli("index", str(folder))
    assert (folder / "index.json").stat().st_size < 20 * 1200  # 1,200 row groups (was about 400 bytes each)
    gc.collect()
    made = sum(type(o) is ShardInfo for o in gc.get_objects())
    ds = fastload.ShardedDataset(folder, max_open_shards=16)
    with fastload.DataLoader(ds, batch_size=100, shuffle=True, fields=["y"]) as loader:  # in this process (no workers)
        ys = sorted(int(y) for (batch,) in loader for y in batch)
    assert ys == sorted(list(range(400)) * 3) and len(ds.index.shards) == 1200
    assert ds.index.shards[401].path == "part-1.parquet" and ds.index.shards[401].row_group == 1 and ds.index.shards[401].first_row == 1
    gc.collect()
    assert sum(type(o) is ShardInfo for o in gc.get_objects()) - made <= 16 + 3  # the open readers' and those asked for, not 1,200


@pytest.mark.parametrize("damage", ["count", "file", "span"])
def test_a_damaged_row_group_table_is_one_line_naming_the_index(hub: Path, tmp_path: Path, damage: str) -> None:
    import base64
    import shutil
    import zlib

    folder = tmp_path / "copy"
    shutil.copytree(hub, folder)
    run_cli("index", str(folder))
    index = json.loads((folder / "index.json").read_text())
    parts = np.frombuffer(zlib.decompress(base64.b64decode(index["shards"]["parts"]["data"])), dtype="<i8").reshape(-1, 6).copy()
    if damage == "count":
        index["shards"]["parts"]["count"] += 1
    elif damage == "file":
        parts[3, 0] = 2  # a third file, not listed
    else:
        parts[3, 4] = index["shards"]["files"][0]["file_bytes"]  # its bytes past the footer
    index["shards"]["parts"]["data"] = base64.b64encode(zlib.compress(parts.tobytes())).decode()
    (folder / "index.json").write_text(json.dumps(index))
    want = {"count": "data holds 336 bytes, not the 8 parts' 384", "file": "names a file that is not listed",
            "span": "bytes must lie before its file's footer"}[damage]
    with pytest.raises(DatasetIndexError, match=rf"^{re.escape(str(folder / 'index.json'))}: parts: .*{re.escape(want)}"):
        fastload.open(folder)


def test_an_index_listing_each_row_group_is_still_read(hub: Path, tmp_path: Path) -> None:
    """The first version-6 indexes listed a shard object per row group: read as the compact form."""
    import base64
    import shutil
    import zlib

    folder = tmp_path / "copy"
    shutil.copytree(hub, folder)
    run_cli("index", str(folder))
    index = json.loads((folder / "index.json").read_text())
    files = index["shards"]["files"]
    parts = np.frombuffer(zlib.decompress(base64.b64decode(index["shards"]["parts"]["data"])), dtype="<i8").reshape(-1, 6)
    index["shards"] = [{**files[f], "row_group": g, "samples": n, "first_row": r, "span_start": s, "bytes": b,
                        "offsets": None, "offsets_sha256": None, "table": None, "table_sha256": None}
                       for f, g, n, r, s, b in parts.tolist()]
    (folder / "index.json").write_text(json.dumps(index))
    listed = fastload.open(folder)
    assert len(listed) == ROWS and [s.samples for s in listed.index.shards] == [8, 8, 8, 6, 7, 7, 1]
    assert listed[31]["caption"] == "photo 31"
