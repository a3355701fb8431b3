"""Datasets from strangers (#17): every path an index names stays inside the dataset (checked when
the index is read; symlinks out refused; nothing outside the root is ever opened, by an audit
hook); cache names come only from checked digests; every bad value, count or span is an error
naming the file, shard, key or field (per-sample ones skippable), never the bytes of a file; and
``verify`` checks a tar's member headers and HDF5 columns against the index."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import h5py
import numpy as np
import pytest

import fastload
from fastload import transforms as T
from fastload.cli.command import main as cli_main
from fastload.converters import ConvertOptions, WriterOptions, convert
from fastload.errors import DatasetIndexError, SampleError, ShardError
from fastload.formats.idx import format_dali_index, parse_dali_index
from fastload.formats.index import INDEX_FILE, read_index
from fastload.storage.cache import RemoteFile
from tests.conftest import drop_tables, run_cli
from tests.storage.test_remote import DatasetServer
from tests.test_fuzz_readers import exercise

pytestmark = pytest.mark.timeout(120)
SECRET = "fastload-test-secret-0xC0FFEE"  # in the environment: it must never reach a message


@pytest.fixture()
def ds_root(clean: Path, tmp_path: Path) -> Path:
    """A private copy of the 30-sample, 4-shard tar dataset (8 samples a shard), without sample
    tables: positions come from the hostile .idx files (the tables built from them)."""
    root = tmp_path / "ds"
    shutil.copytree(clean, root)
    return drop_tables(root)


@pytest.fixture()
def h5_root(h5_clean: Path, tmp_path: Path) -> Path:
    root = tmp_path / "h5"
    shutil.copytree(h5_clean, root)
    return root


def edit_index(root: Path, change: Callable[[dict], None]) -> None:
    """Rewrite ROOT/index.json after ``change`` (which edits the parsed JSON in place)."""
    data = json.loads((root / INDEX_FILE).read_text())
    change(data)
    (root / INDEX_FILE).write_text(json.dumps(data))


def set_shard(number: int, **values: object) -> Callable[[dict], None]:
    def change(data: dict) -> None:
        data["shards"][number].update(values)
        data.pop("num_samples", None)

    return change


def rewrite_idx(root: Path, shard: int, edit: Callable[[list[list[list]]], None]) -> None:
    """Rewrite a shard's .idx from its parsed member lists after ``edit``; drop its checksum from the index."""
    info = read_index(root).shards[shard]
    members = parse_dali_index((root / info.offsets).read_text(), "idx")
    samples = [[[ext, offset, size, f"{members.key(i)}.{ext}"] for ext, (offset, size) in members.spans(i).items()] for i in range(len(members))]
    edit(samples)
    (root / info.offsets).write_bytes(format_dali_index([[tuple(m) for m in s] for s in samples]))
    edit_index(root, set_shard(shard, offsets_sha256=None))


def load(root: Path, **kwargs: object) -> tuple[list[str], fastload.DataLoader]:
    keys = []
    loader = fastload.DataLoader(root, batch_size=4, transform=T.val(16), return_keys=True, **kwargs)
    with loader:
        for _, _, k in loader:
            keys += k
    return keys, loader


# --- 1. paths the index names are confined to the dataset ---------------------------------------

BAD_PATHS = ["/etc/passwd", "/proc/self/environ", "../outside.idx", "a/../../b.idx", "a//b.idx", "a/", "./a.idx",
             "a\\..\\b.idx", "a\x00b.idx", "", "..", "%2e%2e/x.idx", "x.idx?y", "x#y", "C:x.idx", "x y.idx"]


@pytest.mark.parametrize("field", ["path", "offsets"])
@pytest.mark.parametrize("bad", BAD_PATHS)
def test_a_path_leaving_the_dataset_is_refused_when_the_index_is_read(ds_root: Path, field: str, bad: str) -> None:
    edit_index(ds_root, set_shard(2, **{field: bad}))
    with pytest.raises(DatasetIndexError, match=re.escape(f"shards[2].{field}: must be a relative path inside the dataset")) as info:
        fastload.open(ds_root)
    if len(bad) > 2:
        assert bad not in str(info.value).replace(str(ds_root), "")


@pytest.mark.parametrize("field", ["path", "offsets"])
def test_a_climbing_path_to_a_valid_twin_is_refused_by_the_loader_and_verify(ds_root: Path, tmp_path: Path, field: str) -> None:
    """An index whose shard 2 climbs out (``../twin/...``) to a byte-identical, checksum-valid copy
    of the dataset: neither the loader nor ``fastload verify`` may read it; both name the field."""
    shutil.copytree(ds_root, tmp_path / "twin")
    name = {"path": "shard-00002.tar", "offsets": "shard-00002.idx"}[field]
    edit_index(ds_root, set_shard(2, **{field: f"../twin/{name}"}))
    message = f"shards[2].{field}: must be a relative path inside the dataset"
    with pytest.raises(DatasetIndexError, match=re.escape(message)):
        load(ds_root)
    with pytest.raises(DatasetIndexError, match=re.escape(message)):
        fastload.verify_dataset(ds_root)
    result = run_cli("verify", str(ds_root), check=False)
    assert result.returncode == 2 and message in result.stderr and "BAD" not in result.stderr


def test_paths_inside_the_dataset_read_as_before(ds_root: Path) -> None:
    (ds_root / "sub").mkdir()
    (ds_root / "shard-00001.idx").rename(ds_root / "sub" / "one.idx")
    (ds_root / "shard-00002.tar").rename(ds_root / "sub" / "two.tar")
    (ds_root / "real-00002.tar").symlink_to("sub/two.tar")  # a link inside the root is fine
    edit_index(ds_root, lambda d: (d["shards"][1].update(offsets="sub/one.idx"), d["shards"][2].update(path="real-00002.tar")))
    keys, _ = load(ds_root)
    assert len(keys) == 30
    assert fastload.verify_dataset(ds_root).ok


@pytest.mark.parametrize("which", ["folder", "shard"])
def test_a_link_into_a_sibling_whose_name_extends_the_roots_is_refused(ds_root: Path, which: str) -> None:
    """``ds/sub -> ds-private`` (or ``ds/sub/x.tar -> ds-private/x.tar``): ``ds-private`` starts
    with the root's name, yet is outside it; paths are compared part by part, never as strings."""
    private = ds_root.parent / f"{ds_root.name}-private"
    private.mkdir()
    shutil.move(ds_root / "shard-00000.tar", private / "shard-00000.tar")
    if which == "folder":
        (ds_root / "sub").symlink_to(private)
    else:
        (ds_root / "sub").mkdir()
        (ds_root / "sub" / "shard-00000.tar").symlink_to(private / "shard-00000.tar")
    edit_index(ds_root, set_shard(0, path="sub/shard-00000.tar"))
    with pytest.raises(ShardError, match="a symlink leads outside the dataset root"):
        fastload.open(ds_root)[0]
    report = fastload.verify_dataset(ds_root)
    assert not report.ok and any("sub/shard-00000.tar: a symlink leads outside the dataset root" in p for p in report.problems)


@pytest.fixture()
def environ_in_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTLOAD_TEST_SECRET", SECRET)


@pytest.mark.parametrize("which", ["offsets", "shard", "folder"])
def test_a_symlink_out_of_the_root_is_refused(ds_root: Path, tmp_path: Path, which: str, environ_in_messages: None, capsys: pytest.CaptureFixture) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    if which == "offsets":  # the .idx beside shard 0 is a link to this process's environment
        (ds_root / "shard-00000.idx").unlink()
        (ds_root / "shard-00000.idx").symlink_to("/proc/self/environ")
    elif which == "shard":
        shutil.move(ds_root / "shard-00000.tar", outside / "shard-00000.tar")
        (ds_root / "shard-00000.tar").symlink_to(outside / "shard-00000.tar")
    else:  # a folder on the way is a link out
        shutil.move(ds_root / "shard-00000.tar", outside / "shard-00000.tar")
        (ds_root / "sub").symlink_to(outside)
        edit_index(ds_root, set_shard(0, path="sub/shard-00000.tar"))
    ds = fastload.open(ds_root)
    with pytest.raises(ShardError, match="a symlink leads outside the dataset root") as info:
        ds[0]
    assert SECRET not in str(info.value)
    report = fastload.verify_dataset(ds_root)
    assert not report.ok and any("symlink leads outside" in p for p in report.problems)
    assert cli_main(["verify", str(ds_root)]) == 1
    assert SECRET not in "".join(report.problems) + "".join(capsys.readouterr())


def test_no_message_repeats_what_a_bad_idx_holds(ds_root: Path, environ_in_messages: None, capsys: pytest.CaptureFixture) -> None:
    """The .idx inside the root holds what /proc/self/environ held (as a link to it used to
    show): neither the loader nor verify repeats any of it."""
    (ds_root / "shard-00000.idx").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in os.environ.items()))
    with pytest.raises(ShardError, match=r"shard-00000\.idx: expected a 'v1\.2 N' header") as info:
        fastload.open(ds_root)[0]
    report = fastload.verify_dataset(ds_root)
    assert cli_main(["verify", str(ds_root)]) == 1
    out = str(info.value) + "".join(report.problems) + "".join(capsys.readouterr())
    assert SECRET not in out and "FASTLOAD_TEST_SECRET" not in out


def test_a_non_utf8_index_is_named_without_its_bytes(ds_root: Path) -> None:
    original = (ds_root / INDEX_FILE).read_bytes()
    (ds_root / INDEX_FILE).write_bytes(b'{"layout": "\xff\xfe"}')
    with pytest.raises(DatasetIndexError, match=r"index\.json: not UTF-8 text \(at byte 12\)$"):
        fastload.open(ds_root)
    (ds_root / INDEX_FILE).write_bytes(original)
    edit_index(ds_root, lambda d: d.update(planted_secret=SECRET))
    with pytest.raises(DatasetIndexError, match=r"the index: 1 unknown field\(s\)") as info:
        fastload.open(ds_root)
    assert "planted" not in str(info.value)


@pytest.fixture()
def served_in_subfolder(ds_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[DatasetServer, str]]:
    """The dataset served at URL/data/, with a file beside that prefix that must stay unread."""
    monkeypatch.setenv("FASTLOAD_RETRIES", "1")
    site = tmp_path / "site"
    site.mkdir()
    shutil.move(ds_root, site / "data")
    shutil.copy(site / "data" / "shard-00000.idx", site / "outside.idx")
    server = DatasetServer(site)
    yield server, server.url + "data/"
    server.shutdown()
    server.server_close()


def test_a_url_dataset_never_reads_outside_its_prefix(served_in_subfolder: tuple[DatasetServer, str], tmp_path: Path) -> None:
    server, url = served_in_subfolder
    edit_index(tmp_path / "site" / "data", set_shard(0, offsets="../outside.idx"))
    with pytest.raises(DatasetIndexError, match=r"shards\[0\]\.offsets: must be a relative path inside the dataset"):
        fastload.open(url, cache_dir=tmp_path / "cache")
    assert cli_main(["verify", url]) == 2
    assert server.counts["outside.idx"] == 0 and set(server.counts) == {"data/index.json"}


# --- 2. cache names only from checked digests ---------------------------------------------------

@pytest.mark.parametrize("field", ["sha256", "offsets_sha256"])
@pytest.mark.parametrize("bad", ["../../planted", "/tmp/planted", "A" * 64, "a" * 63, "g" * 64, 1234, True])
def test_a_digest_that_is_not_hex_is_refused_before_any_cache_file(served_in_subfolder: tuple[DatasetServer, str], tmp_path: Path, field: str, bad: object) -> None:
    _server, url = served_in_subfolder
    edit_index(tmp_path / "site" / "data", set_shard(1, **{field: bad}))
    before = {p for p in tmp_path.rglob("*")}
    with pytest.raises(DatasetIndexError, match=re.escape(f"shards[1].{field}: must be a sha256 digest (64 lowercase hex digits)")):
        fastload.open(url, cache_dir=tmp_path / "cache")
    created = {p for p in tmp_path.rglob("*")} - before
    assert created <= {tmp_path / "cache"}  # at most the empty cache folder: no lock, reservation or part file
    assert not list(tmp_path.rglob("*planted*"))


def test_cache_entries_stay_in_the_cache_folder(tmp_path: Path) -> None:
    for name, digest in (("../../x.tar", "0" * 64), ("x.tar", "../../" + "0" * 58), ("x.tar", "0" * 64 + "/../y")):
        with pytest.raises(DatasetIndexError):
            RemoteFile("http://h/d/x.tar", name, digest, None)
    from fastload.storage.cache import ShardCache

    cache = ShardCache(tmp_path / "cache")
    for file in (RemoteFile("http://h/d/a/b.tar", "a/b.tar", "0" * 64, 1), RemoteFile("http://h/d/x.idx", "x.idx", None, None)):
        assert cache.entry(file).parent == cache.root


# --- 4. every bad value, count and span named (and skippable when it is one sample's) -------------

@pytest.mark.parametrize(
    ("change", "field"),
    [
        (set_shard(1, samples=True), "shards[1].samples"),  # bool is not an int: this read 31 of 40 samples
        (set_shard(1, samples=10.5), "shards[1].samples"),  # a raw TypeError
        (set_shard(1, samples="8"), "shards[1].samples"),
        (set_shard(1, samples=-1), "shards[1].samples"),
        (set_shard(1, samples=2**64), "shards[1].samples"),
        (set_shard(1, bytes=None), "shards[1].bytes"),
        (set_shard(1, path=["shard-00001.tar"]), "shards[1].path"),
        (lambda d: d.update(decoded_shape=[32, 32, 3]), "decoded_shape: a wds dataset holds no decoded pixels"),  # an AttributeError
        (lambda d: d.update(version=True), "version"),
        (lambda d: d.update(layout=["wds"]), "layout"),
        (lambda d: d.update(fields="jpg"), "fields"),
        (lambda d: d.update(classes=[1, 2]), "classes"),
        (lambda d: d.update(class_counts={"a": "3"}), "class_counts"),
        (lambda d: d.update(skipped=[]), "skipped"),
        (lambda d: d.update(duplicates=False), "duplicates"),
        (lambda d: d.update(shards={}), "shards"),
        (lambda d: d["shards"].append(7), "shards[4]: must be an object"),
        (lambda d: d["shards"][0].pop("sha256"), "shards[0]: missing sha256"),
        (lambda d: d.update(num_samples=31), "num_samples: says 31, the shards hold 30"),
        (lambda d: d.update(format="other"), "format: not a fastload index"),
    ],
)
def test_index_values_are_checked_with_their_types(ds_root: Path, change: Callable[[dict], None], field: str) -> None:
    edit_index(ds_root, change)
    with pytest.raises(DatasetIndexError, match=re.escape(f"{ds_root / INDEX_FILE}: {field}")):
        fastload.open(ds_root)
    assert cli_main(["verify", str(ds_root)]) == 2  # one line, no traceback


def test_a_decoded_shape_must_be_three_positive_sides(h5_root: Path) -> None:
    for shape in ([32, 32], [0, 32, 3], [32, 32, 3.0], "32x32x3"):
        edit_index(h5_root, lambda d: d.update(decoded_shape=shape))  # noqa: B023
        with pytest.raises(DatasetIndexError, match="decoded_shape"):
            fastload.open(h5_root)


@pytest.mark.parametrize("samples", [7, 9])
def test_an_index_count_other_than_the_idx_is_a_shard_error(ds_root: Path, samples: int) -> None:
    """9 against 8 was a bare IndexError; 7 against 8 read one sample short, silently."""
    edit_index(ds_root, set_shard(0, samples=samples))
    ds = fastload.open(ds_root)
    with pytest.raises(ShardError, match=re.escape(f"shard-00000.idx: lists 8 samples, the index says shard-00000.tar holds {samples}")):
        ds[0]
    with pytest.raises(ShardError, match="lists 8 samples"):
        load(ds_root, on_error="skip")
    assert "shard-00000.tar: " in "".join(fastload.verify_dataset(ds_root).problems)


def cls_span(root: Path, shard: int, sample: int) -> tuple[Path, int, int, str]:
    info = read_index(root).shards[shard]
    members = parse_dali_index((root / info.offsets).read_text(), "idx")
    return root / info.path, *members.spans(sample)["cls"], members.key(sample)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_non_integer_label_is_a_skippable_sample_error(ds_root: Path, num_workers: int) -> None:
    path, offset, size, key = cls_span(ds_root, 1, 3)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"x" * size)
    with pytest.raises(SampleError, match=re.escape(f"shard-00001.tar:{key}: cls is not an integer label")):
        fastload.open(ds_root)[11]
    with pytest.raises(SampleError, match="cls is not an integer label"):
        load(ds_root, num_workers=num_workers)
    keys, loader = load(ds_root, num_workers=num_workers, on_error="skip")
    assert len(keys) == 30 and key not in keys  # a substitute keeps the batch full
    assert [e["where"] for e in loader.stats.skipped.entries] == [f"shard-00001.tar:{key}"]


@pytest.mark.parametrize(
    "span", [(-512, None), (None, -1), (None, 10**15), (10**18, None), (2**62, 2**62)], ids=["neg-offset", "neg-size", "huge-size", "huge-offset", "sum-past-int64"]
)
def test_an_idx_span_outside_the_shard_is_a_skippable_sample_error(ds_root: Path, span: tuple[int | None, int | None]) -> None:
    """Was an OSError (negative) or a bare MemoryError (huge)."""
    offset, size = span

    def edit(samples: list[list[list]]) -> None:
        jpg = next(m for m in samples[2] if m[0] == "jpg")
        jpg[1], jpg[2] = offset if offset is not None else jpg[1], size if size is not None else jpg[2]

    rewrite_idx(ds_root, 1, edit)
    ds = fastload.open(ds_root)
    key = ds.reader(1).key(2)
    with pytest.raises(SampleError, match=re.escape(f"shard-00001.tar:{key}: its offset index entry gives a negative offset or size, or one past the end")):
        ds[10]
    keys, loader = load(ds_root, on_error="skip")
    assert len(keys) == 30 and key not in keys and len(loader.stats.skipped) == 1
    problems = fastload.verify_dataset(ds_root).problems
    assert len(problems) == 1 and "member 5 disagrees with the .idx" in problems[0]


def test_an_idx_number_beyond_int64_names_the_file(ds_root: Path) -> None:
    rewrite_idx(ds_root, 1, lambda samples: samples[0][0].__setitem__(1, 2**70))
    with pytest.raises(ShardError, match=r"shard-00001\.idx: a member's offset or size is beyond the int64 range"):
        fastload.open(ds_root)[8]


def test_a_shard_that_is_a_directory_is_a_shard_error(ds_root: Path, h5_root: Path) -> None:
    for root, name in ((ds_root, "shard-00000.tar"), (ds_root, "shard-00001.idx"), (h5_root, "shard-00000.h5")):
        (root / name).unlink()
        (root / name).mkdir()
        ds = fastload.open(root)
        with pytest.raises(ShardError, match=re.escape(f"{root / name}: cannot")):
            ds[0 if "00000" in name else 8]
        assert any(p.startswith(f"{name.replace('.idx', '.tar')}: ") for p in fastload.verify_dataset(root).problems)


def test_a_fifo_is_refused_without_waiting(ds_root: Path) -> None:
    (ds_root / "shard-00000.idx").unlink()
    os.mkfifo(ds_root / "shard-00000.idx")
    with pytest.raises(ShardError, match=r"shard-00000\.idx: cannot read the shard's offset index \(not a regular file\)"):
        fastload.open(ds_root)[0]


def rewrite_h5_column(path: Path, name: str, values: np.ndarray) -> None:
    with h5py.File(path, "r+") as f:
        del f[name]
        f.create_dataset(name, data=values, dtype=h5py.string_dtype() if values.dtype == object else values.dtype)


@pytest.mark.parametrize(
    ("column", "values", "message"),
    [
        ("cls", np.zeros(7, np.int64), "column cls: not 8 rows"),  # was an IndexError at row 7
        ("key", np.array([b"k"] * 9, dtype=object), "column key: not 8 rows"),
        ("cls", np.zeros(8, np.float32), "column cls: not integer labels"),
        ("image_format", np.array([b"jpg"] * 7, dtype=object), "column image_format: not 8 rows"),
    ],
)
def test_hdf5_columns_other_than_the_index_says_are_a_shard_error(h5_root: Path, column: str, values: np.ndarray, message: str) -> None:
    shard = h5_root / "shard-00000.h5"
    rewrite_h5_column(shard, column, values)
    edit_index(h5_root, set_shard(0, bytes=shard.stat().st_size, sha256=hashlib.sha256(shard.read_bytes()).hexdigest()))
    with pytest.raises(ShardError, match=re.escape(message)):
        fastload.open(h5_root)[7]
    problems = fastload.verify_dataset(h5_root).problems
    assert len(problems) == 1 and message in problems[0]


def test_decoded_pixels_of_another_shape_than_the_index_says_are_a_shard_error(npz_file: Path, tmp_path: Path) -> None:
    root = tmp_path / "px"
    convert(str(npz_file), str(root), ConvertOptions(source="npz", layout="hdf5", writer_options=WriterOptions(hdf5_decoded=True)))
    height, width, channels = read_index(root).decoded_shape
    assert fastload.open(root)[0]["image"].shape == (height, width, channels)
    edit_index(root, lambda d: d.update(decoded_shape=[height + 1, width, channels]))
    with pytest.raises(ShardError, match=re.escape(f"column pixels: not {read_index(root).shards[0].samples} rows of uint8 pixels of shape [{height + 1}, {width}, {channels}]")):
        fastload.open(root)[0]


def test_hdf5_byte_offsets_past_their_bytes_are_a_shard_error(h5_root: Path) -> None:
    path = h5_root / "shard-00001.h5"
    with h5py.File(path, "r+") as f:
        offsets = f["image/offsets"][:]
        offsets[-1] += 10**6
        f["image/offsets"][:] = offsets
    with pytest.raises(ShardError, match=r"column image: its offsets do not describe 8 rows"):
        fastload.open(h5_root)[8]


# --- 6. verify checks tar headers and HDF5 columns, never ends in a traceback ---------------------

def test_verify_fails_an_empty_tar_whose_idx_lists_samples(ds_root: Path) -> None:
    empty = hashlib.sha256(b"").hexdigest()
    (ds_root / "shard-00000.tar").write_bytes(b"")
    edit_index(ds_root, set_shard(0, bytes=0, sha256=empty))
    result = run_cli("verify", str(ds_root), check=False)
    assert result.returncode == 1, result.stdout
    assert "BAD shard-00000.tar: " in result.stderr and "not a readable tar (empty file) though its .idx lists 16 members" in result.stderr
    assert "Traceback" not in result.stderr


def test_verify_compares_every_member_header_with_the_idx(ds_root: Path) -> None:
    def shift(samples: list[list[list]]) -> None:  # sample 5's image said to start a block later
        next(m for m in samples[5] if m[0] == "jpg")[1] += 512

    rewrite_idx(ds_root, 2, shift)
    result = run_cli("verify", str(ds_root), check=False)
    assert result.returncode == 1
    assert "BAD shard-00002.tar: " in result.stderr and "member 11 disagrees with the .idx" in result.stderr
    rewrite_idx(ds_root, 2, lambda samples: samples.pop())  # one sample fewer, the index count to match
    edit_index(ds_root, set_shard(2, samples=7))
    assert "the tar holds 16 members, its .idx lists 14" in run_cli("verify", str(ds_root), check=False).stderr


# --- confinement: nothing outside the root is opened, whatever the index says -------------------

_opened: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _opened is not None and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])  # recorded as where it leads, resolved now (links change between variants)
        if isinstance(args[2], int) and args[2] & os.O_NOFOLLOW:  # refuses a link at its end: the link itself is what it may open
            _opened.append(os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path)))
        else:
            _opened.append(os.path.realpath(path))


sys.addaudithook(_audit)  # hooks cannot be removed: this one records only while watching


@contextmanager
def opened_files() -> Iterator[list[str]]:
    """Where each open this process makes (``open``, ``os.open``) inside the block leads."""
    global _opened
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


def hostile_variants(root: Path, sentinel: Path) -> Iterator[str]:
    """Turn ``root`` into one hostile dataset after another (yielding each's name)."""
    original = (root / INDEX_FILE).read_text()
    for target in ("/proc/self/environ", str(sentinel), "../sentinel.idx", "../../" + sentinel.name):
        for field in ("offsets", "path"):
            (root / INDEX_FILE).write_text(original)
            edit_index(root, set_shard(0, **{field: target}))
            yield f"{field} = {target}"
    (root / INDEX_FILE).write_text(original)
    for name, target in (("shard-00001.idx", sentinel), ("shard-00002.idx", Path("/proc/self/environ")), ("shard-00003.tar", sentinel)):
        (root / name).unlink()
        (root / name).symlink_to(target)
    (root / "sub").symlink_to(sentinel.parent)
    edit_index(root, set_shard(0, path="sub/" + sentinel.name, offsets="sub/" + sentinel.name))
    yield "symlinks out"


def test_nothing_outside_the_root_is_opened(clean: Path, tmp_path: Path, environ_in_messages: None, capsys: pytest.CaptureFixture) -> None:
    root = tmp_path / "ds"
    shutil.copytree(clean, root)
    sentinel = tmp_path / "sentinel.idx"
    sentinel.write_text((root / "shard-00000.idx").read_text())  # a valid .idx: only confinement keeps it out
    def use() -> None:
        exercise(root)  # open, read every sample, load, verify
        cli_main(["verify", str(root)])

    use()  # imports and first-use set-up happen outside the watch
    outside = []
    for variant in hostile_variants(root, sentinel):
        with opened_files() as paths:
            use()
        assert paths, "the audit hook saw no open at all"
        outside += [(variant, p) for p in paths if not Path(p).is_relative_to(os.path.realpath(root))]
    assert not outside
    assert SECRET not in "".join(capsys.readouterr())
