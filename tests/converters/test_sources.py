"""Round trip of every source into both writers, read back through fastload's shard readers."""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload.converters import ConvertOptions, SourceOptions, WriterOptions, convert
from fastload.converters.sources import open_source
from fastload.errors import SampleError
from fastload.formats.index import read_index
from fastload.formats.shard_files import open_shard
from tests.conftest import jpeg_bytes, run_cli, small_photo


def read_back(out: Path) -> list[tuple[str, dict[str, bytes]]]:
    """(key, fields) of every sample in shard order, through the public index and readers."""
    index = read_index(out)
    samples = []
    for shard in index.shards:
        reader = open_shard(out, index, shard)
        samples.extend((reader.key(i), reader.read(i)) for i in range(len(reader)))
        reader.close()
    return samples


def pixels_of(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)))


@pytest.mark.parametrize("layout", ["wds", "hdf5"])
def test_imagefolder_round_trip_keeps_bytes_and_labels(image_folder: Path, tmp_path: Path, layout: str) -> None:
    report = convert(str(image_folder), str(tmp_path), ConvertOptions(source="imagefolder", layout=layout, samples_per_shard=7))
    samples = read_back(tmp_path)
    files = sorted(image_folder.rglob("*.jpg"))
    assert len(samples) == len(files) == report.index.num_samples == 30
    assert len(report.index.shards) == 5  # 7+7+7+7+2
    classes = sorted(p.name for p in image_folder.iterdir())
    assert report.index.classes == tuple(classes)
    by_key = dict(samples)
    for path in files:
        key = path.relative_to(image_folder).with_suffix("").as_posix()
        assert by_key[key]["jpg"] == path.read_bytes()
        assert int(by_key[key]["cls"]) == classes.index(path.parent.name)
    assert report.index.class_counts == {name: len(list((image_folder / name).glob("*.jpg"))) for name in classes}


@pytest.mark.parametrize("layout", ["wds", "hdf5"])
def test_manifest_csv_with_string_labels(manifest_csv: Path, tmp_path: Path, layout: str) -> None:
    options = ConvertOptions(
        source="manifest", layout=layout, source_options=SourceOptions(path_column="file", label_column="category")
    )
    index = convert(str(manifest_csv), str(tmp_path), options).index
    samples = read_back(tmp_path)
    assert index.classes == ("circles", "squares", "stripes", "waves")
    rows = [line.split(",") for line in manifest_csv.read_text().splitlines()[1:]]
    assert [int(f["cls"]) for _, f in samples] == [index.classes.index(c) for _, c in rows]
    assert [f["jpg"] for _, f in samples] == [(manifest_csv.parent / p).read_bytes() for p, _ in rows]


def test_manifest_jsonl_with_int_labels(manifest_jsonl: Path, tmp_path: Path) -> None:
    index = convert(str(manifest_jsonl), str(tmp_path), ConvertOptions(source="manifest")).index
    rows = [json.loads(line) for line in manifest_jsonl.read_text().splitlines()]
    assert index.classes is None
    assert [int(f["cls"]) for _, f in read_back(tmp_path)] == [r["label"] for r in rows]


def test_manifest_names_missing_column(manifest_csv: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"list\.csv: no column 'path'.*category"):
        convert(str(manifest_csv), str(tmp_path), ConvertOptions(source="manifest"))


@pytest.mark.parametrize("layout", ["wds", "hdf5"])
def test_cifar_pixels_are_lossless(cifar10_dir: Path, tmp_path: Path, layout: str) -> None:
    index = convert(str(cifar10_dir), str(tmp_path), ConvertOptions(source="cifar", layout=layout)).index
    samples = read_back(tmp_path)
    assert index.num_samples == 20 and index.classes == tuple(f"class{i}" for i in range(10))
    source = open_source("cifar", str(cifar10_dir))
    for item, (key, fields) in zip(source.items(), samples):
        expected = source.load(item)
        assert key == item.key
        assert np.array_equal(pixels_of(fields["png"]), expected.image)
        assert int(fields["cls"]) == expected.label


def test_cifar_test_split(cifar10_dir: Path, tmp_path: Path) -> None:
    """--split test reads test_batch: its file names, pixels and labels (checked against the fixture's
    own pickle, read here with the standard unpickler since the test wrote it)."""
    import pickle

    options = ConvertOptions(source="cifar", source_options=SourceOptions(split="test"))
    assert convert(str(cifar10_dir), str(tmp_path), options).index.num_samples == 4
    with open(cifar10_dir / "test_batch", "rb") as f:
        batch = pickle.load(f)
    pixels = batch[b"data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    samples = read_back(tmp_path)
    assert [key for key, _ in samples] == [f"test_batch_img{i}" for i in range(4)]
    assert np.array_equal(np.stack([pixels_of(f["png"]) for _, f in samples]), pixels)
    assert [int(f["cls"]) for _, f in samples] == batch[b"labels"]


def test_cifar_refuses_code_in_pickles(tmp_path: Path) -> None:
    """A pickle that would run code is rejected, never executed."""
    import pickle

    from fastload.converters.sources.cifar import read_cifar_pickle

    class Evil:
        def __reduce__(self):
            return (open, (str(tmp_path / "pwned"), "w"))

    bad = tmp_path / "data_batch_1"
    bad.write_bytes(pickle.dumps({b"data": Evil()}, protocol=2))
    with pytest.raises(ValueError, match=r"data_batch_1: refusing to load io\.open from a CIFAR file$"):
        read_cifar_pickle(bad)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("split,count", [("train", 12), ("test", 5)])
def test_mnist_gz_and_plain(mnist_dir: Path, tmp_path: Path, split: str, count: int) -> None:
    options = ConvertOptions(source="mnist", layout="hdf5", source_options=SourceOptions(split=split), writer_options=WriterOptions(hdf5_decoded=True))
    index = convert(str(mnist_dir), str(tmp_path), options).index
    assert index.num_samples == count and index.decoded_shape == (28, 28, 1)
    from fastload.converters.sources.mnist import read_idx

    prefix = "train" if split == "train" else "t10k"
    suffix = ".gz" if split == "train" else ""
    images = read_idx(mnist_dir / f"{prefix}-images-idx3-ubyte{suffix}")
    labels = read_idx(mnist_dir / f"{prefix}-labels-idx1-ubyte{suffix}")
    import h5py

    with h5py.File(tmp_path / index.shards[0].path) as f:
        assert np.array_equal(f["pixels"][:, :, :, 0], images)
        assert np.array_equal(f["cls"][:], labels)


def test_mnist_to_wds_png(mnist_dir: Path, tmp_path: Path) -> None:
    convert(str(mnist_dir), str(tmp_path), ConvertOptions(source="mnist"))
    from fastload.converters.sources.mnist import read_idx

    images = read_idx(mnist_dir / "train-images-idx3-ubyte.gz")
    decoded = [pixels_of(f["png"]) for _, f in read_back(tmp_path)]
    assert np.array_equal(np.stack(decoded), images)


@pytest.mark.parametrize("layout", ["wds", "hdf5"])
def test_npz(npz_file: Path, tmp_path: Path, layout: str) -> None:
    convert(str(npz_file), str(tmp_path), ConvertOptions(source="npz", layout=layout, samples_per_shard=4))
    data = np.load(npz_file)
    samples = read_back(tmp_path)
    assert np.array_equal(np.stack([pixels_of(f["png"]) for _, f in samples]), data["images"])
    assert [int(f["cls"]) for _, f in samples] == list(data["labels"])


def test_npy_folder_is_memory_mapped(tmp_path: Path) -> None:
    folder = tmp_path / "arrays"
    folder.mkdir()
    images = np.random.default_rng(3).integers(0, 256, (6, 8, 8), dtype=np.uint8)
    np.save(folder / "images.npy", images)
    np.save(folder / "labels.npy", np.arange(6))
    source = open_source("npz", str(folder))
    mapped = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if len(line.split()) == 6}
    assert str(folder / "images.npy") in mapped, "images.npy is not memory-mapped"
    assert np.array_equal(source.load(source.items()[4]).image, images[4][:, :, None])
    index = convert(str(folder), str(tmp_path / "out"), ConvertOptions(source="npz", layout="hdf5", writer_options=WriterOptions(hdf5_decoded=True))).index
    assert index.decoded_shape == (8, 8, 1)
    import h5py

    with h5py.File(tmp_path / "out" / index.shards[0].path) as f:
        assert np.array_equal(f["pixels"][:, :, :, 0], images)
        assert np.array_equal(f["cls"][:], np.arange(6))


@pytest.mark.parametrize("layout", ["wds", "hdf5"])
def test_parquet_hugging_face_export(parquet_dir: Path, tmp_path: Path, layout: str) -> None:
    index = convert(str(parquet_dir), str(tmp_path), ConvertOptions(source="parquet", layout=layout)).index
    import pyarrow.parquet as pq

    expected = []
    for path in sorted(parquet_dir.glob("*.parquet")):
        table = pq.read_table(path).to_pydict()
        expected += list(zip([img["bytes"] for img in table["image"]], table["label"]))
    samples = read_back(tmp_path)
    assert index.classes == ("cat", "dog")
    assert [(f["jpg"], int(f["cls"])) for _, f in samples] == expected


def test_wds_reshard_and_to_hdf5(image_folder: Path, tmp_path: Path) -> None:
    """Existing tars (ours, with a json extra added by the webdataset library) reshard losslessly."""
    import webdataset as wds

    tars = tmp_path / "tars"
    tars.mkdir()
    files = sorted(image_folder.rglob("*.jpg"))
    with wds.TarWriter(str(tars / "part-0.tar")) as sink:
        for i, path in enumerate(files):
            sink.write({"__key__": f"s{i:04d}", "jpg": path.read_bytes(), "cls": i % 4, "json": {"i": i}})
    convert(str(tars), str(tmp_path / "re"), ConvertOptions(source="wds", samples_per_shard=8))
    convert(str(tmp_path / "re"), str(tmp_path / "h5"), ConvertOptions(source="wds", layout="hdf5"))
    for out in ("re", "h5"):
        samples = read_back(tmp_path / out)
        assert [k for k, _ in samples] == [f"s{i:04d}" for i in range(len(files))]
        assert [f["jpg"] for _, f in samples] == [p.read_bytes() for p in files]
        assert [int(f["cls"]) for _, f in samples] == [i % 4 for i in range(len(files))]
        assert [json.loads(f["json"]) for _, f in samples] == [{"i": i} for i in range(len(files))]


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A tar holding ``members`` (name, bytes) in order, as any WebDataset writer's."""
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize(
    ("members", "reason"),
    [
        ([("my caption.txt", b"a"), ("my caption.cls", b"1")], "member name 'my caption.txt' holds whitespace, which the .idx format cannot hold"),
        ([("s0.txt", b"first"), ("s0.txt", b"second")], "member 's0.txt' repeats field 'txt' of its sample"),
        ([("caf\udce9.txt", b"latin-1 name")], "member name 'caf\\udce9.txt' is not UTF-8, which the .idx format needs"),
    ],
)
def test_wds_source_refuses_names_the_idx_cannot_hold_and_repeated_fields(tmp_path: Path, members: list, reason: str) -> None:
    """Such a sample stops the conversion naming the tar and member (as `fastload index` refuses
    the tar), or is skipped and reported; what is written is a dataset `fastload verify` accepts.
    (A name that is not UTF-8, 0xE9 here, is read by tarfile with a surrogate escape.)"""
    src = write_tar(tmp_path / "src.tar", [*members, ("b.txt", b"kept")])
    with pytest.raises(SampleError, match=rf"src\.tar:[^:]+: rejected: {re.escape(reason)}"):
        convert(str(src), str(tmp_path / "raised"), ConvertOptions(source="wds"), quiet=True)
    index = convert(str(src), str(tmp_path / "out"), ConvertOptions(source="wds", on_error="skip"), quiet=True).index
    assert index.skipped == {"rejected": 1}
    assert [(key, fields["txt"]) for key, fields in read_back(tmp_path / "out")] == [("b", b"kept")]
    (skipped,) = [json.loads(line) for line in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()]
    assert skipped["where"] == f"{src}:{skipped['key']}"
    assert skipped["reason"].startswith(f"rejected: {reason}")
    run_cli("verify", str(tmp_path / "out"))


def test_parquet_files_of_one_name_in_two_folders_get_distinct_keys(parquet_dir: Path, tmp_path: Path) -> None:
    """Same-named files in sub-folders: the later ones' keys get _N suffixes; a flat folder's keys are as before."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for split, label in (("a", 0), ("b", 1)):
        (tmp_path / "src" / split).mkdir(parents=True)
        images = [{"bytes": jpeg_bytes(small_photo(label * 10 + i)), "path": None} for i in range(2)]
        pq.write_table(pa.table({"image": images, "label": [label, label]}), tmp_path / "src" / split / "data.parquet")
    convert(str(tmp_path / "src"), str(tmp_path / "nested"), ConvertOptions(source="parquet"), quiet=True)
    nested = fastload.open(str(tmp_path / "nested"))
    assert list(nested.sample_keys()) == ["data_0000_000000", "data_0000_000001", "data_0000_000000_1", "data_0000_000001_1"]
    assert [int(i) for i in nested.indices_of(["data_0000_000000_1"])] == [2]
    assert [int(v) for v in nested.sample_labels()] == [0, 0, 1, 1]
    convert(str(parquet_dir), str(tmp_path / "flat"), ConvertOptions(source="parquet"), quiet=True)
    flat = fastload.open(str(tmp_path / "flat"))
    assert list(flat.sample_keys()) == [f"train-{part:05d}-of-00002_{row // 3:04d}_{row % 3:06d}" for part in range(2) for row in range(7)]


def test_parquet_file_name_with_spaces_and_a_null_label(tmp_path: Path) -> None:
    """Whitespace in a file name becomes _ in its keys (the .idx cannot hold it); a null label is none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "src").mkdir()
    images = [{"bytes": jpeg_bytes(small_photo(i)), "path": None} for i in range(2)]
    pq.write_table(pa.table({"image": images, "label": pa.array([1, None], pa.int64())}), tmp_path / "src" / "my data.parquet")
    convert(str(tmp_path / "src"), str(tmp_path / "out"), ConvertOptions(source="parquet"), quiet=True)
    ds = fastload.open(str(tmp_path / "out"))
    assert list(ds.sample_keys()) == ["my_data_0000_000000", "my_data_0000_000001"]
    assert [int(v) for v in ds.sample_labels()] == [1, -1]
    run_cli("verify", str(tmp_path / "out"))


def test_parquet_float_labels_are_whole_class_indices_or_refused(tmp_path: Path) -> None:
    """A float label column (an export's 3.0) gives the indices it spells; 2.5 names its row
    rather than becoming class 2."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fastload.errors import SampleError

    (tmp_path / "src").mkdir()
    images = [{"bytes": jpeg_bytes(small_photo(i)), "path": None} for i in range(3)]
    pq.write_table(pa.table({"image": images, "label": pa.array([3.0, 0.0, 2.5])}), tmp_path / "src" / "data.parquet")
    with pytest.raises(SampleError, match=r"data.parquet.*label 2.5 in column 'label' is not a whole class index"):
        convert(str(tmp_path / "src"), str(tmp_path / "out"), ConvertOptions(source="parquet"), quiet=True)
    index = convert(str(tmp_path / "src"), str(tmp_path / "skip"), ConvertOptions(source="parquet", on_error="skip"), quiet=True).index
    assert index.num_samples == 2 and [int(v) for v in fastload.open(str(tmp_path / "skip")).sample_labels()] == [3, 0]


def test_shard_size_by_bytes(image_folder: Path, tmp_path: Path) -> None:
    index = convert(str(image_folder), str(tmp_path), ConvertOptions(source="imagefolder", shard_bytes=20_000)).index
    assert len(index.shards) > 3
    assert all(s.bytes < 20_000 + 12_000 for s in index.shards)  # a shard overshoots by at most one sample
    assert index.num_samples == 30


def test_shards_by_bytes_fill_up_to_the_budget_and_no_further() -> None:
    """Planning by bytes: each item costs its size hint plus two tar members' overhead; a shard
    takes items while the sum stays within the budget (a tie fits), and an item larger than the
    budget gets a shard of its own."""
    from fastload.converters.plan import TAR_OVERHEAD_PER_MEMBER, assign_shards
    from fastload.converters.sample import SourceItem

    cost = 1000 + 2 * TAR_OVERHEAD_PER_MEMBER
    items = [SourceItem(key=f"k{i}", where="", size_hint=1000) for i in range(7)]
    assert [len(p.items) for p in assign_shards(items, "wds", 3 * cost, None)] == [3, 3, 1]
    assert [len(p.items) for p in assign_shards(items, "wds", 3 * cost - 1, None)] == [2, 2, 2, 1]
    assert [len(p.items) for p in assign_shards(items, "wds", cost // 2, None)] == [1] * 7
    plans = assign_shards(items, "hdf5", None, 3)
    assert [p.name for p in plans] == ["shard-00000.h5", "shard-00001.h5", "shard-00002.h5"]
    assert [i.key for p in plans for i in p.items] == [i.key for i in items] and [p.number for p in plans] == [0, 1, 2]


def test_shuffle_and_limit_are_deterministic(image_folder: Path, tmp_path: Path) -> None:
    def keys(seed: int, name: str) -> list[str]:
        convert(str(image_folder), str(tmp_path / name), ConvertOptions(source="imagefolder", shuffle=True, seed=seed, limit=10))
        return [k for k, _ in read_back(tmp_path / name)]

    first, again, other = keys(1, "a"), keys(1, "b"), keys(2, "c")
    assert first == again and len(first) == 10
    assert first != other
    assert first != sorted(first)


def test_dedupe_drops_exact_duplicates(image_folder: Path, tmp_path: Path) -> None:
    """The first occurrence (in source order) is kept with its own label; the later copy, filed
    under another class, is dropped and reported as a duplicate of it."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(image_folder, src)
    (src / "stripes" / "zz_copy_a.jpg").write_bytes((src / "circles" / "img_000.jpg").read_bytes())
    (src / "waves" / "zz_copy_b.jpg").write_bytes((src / "squares" / "img_002.jpg").read_bytes())
    index = convert(str(src), str(tmp_path / "out"), ConvertOptions(source="imagefolder", dedupe=True)).index
    assert index.num_samples == 30 and index.duplicates == 2
    kept = dict(read_back(tmp_path / "out"))
    expected = {p.relative_to(image_folder).with_suffix("").as_posix(): p for p in image_folder.rglob("*.jpg")}
    assert set(kept) == set(expected)
    for key, path in expected.items():
        assert kept[key]["jpg"] == path.read_bytes()
        assert index.classes[int(kept[key]["cls"])] == path.parent.name
    report = [json.loads(line) for line in (tmp_path / "out" / "duplicates.jsonl").read_text().splitlines()]
    assert [(r["key"], r["duplicate_of"]) for r in report] == [
        ("stripes/zz_copy_a", "circles/img_000"), ("waves/zz_copy_b", "squares/img_002")]
    assert report[0]["where"].endswith("stripes/zz_copy_a.jpg")


@pytest.mark.parametrize(("dedupe", "workers"), [("exact", 1), ("exact", 2), ("near", 2)])
def test_every_dropped_copy_names_the_kept_first_one(image_folder: Path, tmp_path: Path, dedupe: str, workers: int) -> None:
    """Three and two further copies of two images, under other classes: each dropped copy's
    report line names the first occurrence (never an earlier copy), and the report draws two groups."""
    import shutil

    from PIL import Image

    from fastload.near.duplicate_report import GROUPS_CHUNK

    src = tmp_path / "src"
    shutil.copytree(image_folder, src)
    copies = {"stripes/zz_a1": "circles/img_000", "waves/zz_a2": "circles/img_000", "squares/zz_a3": "circles/img_000",
              "stripes/zz_b1": "squares/img_002", "waves/zz_b2": "squares/img_002"}
    for copy, original in copies.items():
        (src / f"{copy}.jpg").write_bytes((src / f"{original}.jpg").read_bytes())
    options = ConvertOptions(source="imagefolder", workers=workers, **({"dedupe": True} if dedupe == "exact" else {"near_threshold": 4}))
    index = convert(str(src), str(tmp_path / "out"), options, report_png=str(tmp_path / "dups.png")).index
    assert index.num_samples == 30 and index.duplicates == len(copies)
    report = [json.loads(line) for line in (tmp_path / "out" / "duplicates.jsonl").read_text().splitlines()]
    assert {r["key"]: r["duplicate_of"] for r in report} == copies
    with Image.open(tmp_path / "dups.png") as drawn:
        assert int(drawn.text[GROUPS_CHUNK]) == 2


def test_reencode_and_max_size(image_folder: Path, tmp_path: Path) -> None:
    """--max-size shrinks the longer side to the limit and keeps the aspect ratio (to the pixel)."""
    options = ConvertOptions(source="imagefolder", reencode_quality=75, max_size=32)
    convert(str(image_folder), str(tmp_path), options)
    samples = read_back(tmp_path)
    assert len(samples) == 30
    for key, fields in samples:
        image = Image.open(io.BytesIO(fields["jpg"]))
        width, height = Image.open(image_folder / f"{key}.jpg").size
        scale = 32 / max(width, height)
        assert image.format == "JPEG" and max(image.size) == 32
        assert image.size == (round(width * scale), round(height * scale)), key


def gradients(height: int, width: int) -> Image.Image:
    """Red rising left to right, green top to bottom, blue their mean: any stretch shows."""
    x, y = np.meshgrid(np.linspace(0, 255, width), np.linspace(0, 255, height))
    return Image.fromarray(np.stack([x, y, (x + y) / 2], axis=2).astype(np.uint8))


@pytest.mark.parametrize("image,max_size,decoded,out,within", [
    (lambda: small_photo(3, size=(900, 1200)), 150, (225, 300), (150, 112), 2.0),
    (lambda: gradients(601, 1001), 60, (76, 126), (60, 36), 1.0),  # the whole 126 px, not the 125.1 covered: 1.46 off
])
def test_max_size_far_below_the_photo_decodes_at_a_dct_scale_and_looks_like_a_full_lanczos(
    monkeypatch: pytest.MonkeyPatch, image: Callable[[], Image.Image], max_size: int, decoded: tuple[int, int],
    out: tuple[int, int], within: float,
) -> None:
    """A photo shrunk to well under half is decoded at a DCT scale (1200x900 at 1/4: 300x225,
    twice the output; 1001x601 at 1/8, rounded up to 126x76 pixels) before the Lanczos resize: the
    same size as from the full decode, and the same picture within rounding (the resize takes the
    box the scaled picture covers, not the rounded-up pixels)."""
    from fastload.converters.clean import reencode_jpeg
    from fastload.decode import cpu

    shapes: list[tuple[int, int]] = []
    decode = cpu.decode_image
    monkeypatch.setattr(cpu, "decode_image", lambda *args: shapes.append(decode(*args).shape[:2]) or decode(*args))
    data = jpeg_bytes(image(), quality=95)
    shrunk = Image.open(io.BytesIO(reencode_jpeg(data, "big.jpg", 95, max_size)))
    assert shapes == [decoded]
    full = Image.open(io.BytesIO(data)).convert("RGB").resize(out, Image.Resampling.LANCZOS)
    assert shrunk.size == out
    assert np.abs(np.asarray(shrunk, dtype=int) - np.asarray(full, dtype=int)).mean() < within


def test_a_field_or_label_a_sample_lacks_is_absent_in_hdf5_as_in_tar(tmp_path: Path) -> None:
    """A caption one sample lacks and a label another lacks: HDF5 shards leave them out as tar
    shards do (they read as an empty caption and label -1 before), and an empty caption stays an
    empty caption; fields= asking for one names the sample, whichever layout."""
    import tarfile

    import fastload
    from fastload.errors import SampleError

    members = {"s0.txt": b"a caption", "s0.cls": b"3", "s1.cls": b"4", "s2.txt": b"", "s2.cls": b"5", "s3.txt": b"unlabelled"}
    with tarfile.open(tmp_path / "src.tar", "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    read = {}
    for layout in ("wds", "hdf5"):
        convert(str(tmp_path / "src.tar"), str(tmp_path / layout), ConvertOptions(source="wds", layout=layout, samples_per_shard=10))
        ds = fastload.open(tmp_path / layout)
        read[layout] = [ds.raw(i)[:2] for i in range(len(ds))]
        with pytest.raises(SampleError, match=r":s1: no field txt"):
            list(fastload.DataLoader(ds, batch_size=4, num_workers=0, fields=["txt", "cls"]))
    assert read["hdf5"] == read["wds"] == [
        ("s0", {"txt": b"a caption", "cls": b"3"}), ("s1", {"cls": b"4"}), ("s2", {"txt": b"", "cls": b"5"}), ("s3", {"txt": b"unlabelled"}),
    ]


def test_rerun_of_finished_conversion_is_a_no_op_and_other_options_conflict(image_folder: Path, tmp_path: Path) -> None:
    from fastload.converters.conversion import ConversionConflict

    options = ConvertOptions(source="imagefolder", samples_per_shard=10)
    convert(str(image_folder), str(tmp_path), options)
    assert convert(str(image_folder), str(tmp_path), options).already_complete
    with pytest.raises(ConversionConflict, match="other options"):
        convert(str(image_folder), str(tmp_path), ConvertOptions(source="imagefolder", samples_per_shard=5))
