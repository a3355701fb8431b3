"""Samples of any shape through the public API: fields=, roles, masks and boxes that follow the
crop, arrays, text, map=, `fastload index` on foreign WebDataset tars, HDF5 with the same fields."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload import transforms as T
from fastload.converters import ConvertOptions, convert
from fastload.errors import SampleError
from fastload.fields import MAX_JSON_DEPTH
from fastload.formats.index import read_index
from tests.conftest import jpeg_bytes, png_bytes, run_cli, small_photo

wds = pytest.importorskip("webdataset")

# colours of the mask's four classes (2 * below + right of the boundary point)
QUADRANT_COLOURS = np.array([[220, 30, 30], [30, 220, 30], [30, 30, 220], [230, 230, 230]])


def write_tars(root: Path, samples: list[dict], per_tar: int = 5) -> Path:
    """``samples`` (webdataset dicts with ``__key__``) into ``root/NNNNN.tar`` with webdataset's TarWriter."""
    root.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(samples), per_tar):
        with wds.TarWriter(str(root / f"{start // per_tar:05d}.tar")) as writer:
            for sample in samples[start : start + per_tar]:
                writer.write(sample)
    return root


def loader(path: Path | str, **kwargs) -> fastload.DataLoader:
    kwargs.setdefault("backend", "cpu")
    return fastload.DataLoader(str(path), **kwargs)


@pytest.fixture(scope="module")
def clip_tars(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CLIP-style tars as img2dataset writes them (KEY.jpg, KEY.txt, KEY.json), indexed in place."""
    samples = [
        {"__key__": f"{i:09d}", "jpg": jpeg_bytes(small_photo(i, size=(40 + i, 56))), "txt": f"a photo number {i} ✓",
         "json": {"url": f"https://example.com/{i}.jpg", "width": 56, "i": i}}
        for i in range(13)
    ]
    root = write_tars(tmp_path_factory.mktemp("clip"), samples)
    run_cli("index", str(root))
    return root


def test_index_in_place_then_load_every_field(clip_tars: Path) -> None:
    before = {p.name: p.read_bytes() for p in clip_tars.glob("*.tar")}
    index = read_index(clip_tars)
    assert index.fields == ("jpg", "json", "txt") and index.image_fields == ("jpg",) and index.num_samples == 13
    assert run_cli("verify", str(clip_tars)).returncode == 0  # sha256, counts and .idx against the tar headers
    for workers in (0, 2):
        seen = {}
        with loader(clip_tars, batch_size=4, num_workers=workers, transform=T.train(24), shuffle=True,
                    fields=["jpg", "txt", "json"], return_keys=True) as dl:
            for images, texts, metas, keys in dl:
                assert images.shape[1:] == (3, 24, 24) and images.dtype == torch.uint8
                assert len(texts) == len(metas) == len(keys) == len(images)
                for text, meta, key in zip(texts, metas, keys):
                    seen[key] = (text, meta)
        assert seen == {f"{i:09d}": (f"a photo number {i} ✓", {"url": f"https://example.com/{i}.jpg", "width": 56, "i": i}) for i in range(13)}
    assert {p.name: p.read_bytes() for p in clip_tars.glob("*.tar")} == before  # never rewritten
    batch = next(iter(loader(clip_tars, batch_size=4, transform=T.val(24))))
    assert set(batch) == {"image"}  # without fields=: today's layout (no cls in these tars)


def test_index_refuses_to_replace_an_index_unless_forced(clip_tars: Path, tmp_path: Path) -> None:
    proc = run_cli("index", str(clip_tars), check=False)
    assert proc.returncode == 2 and "index.json exists: pass --force" in proc.stderr
    copy = write_tars(tmp_path / "copy", [{"__key__": "a", "txt": "x"}, {"__key__": "b", "txt": "y"}])
    (copy / "index.json").write_text("{}")
    run_cli("index", str(copy), "--force")
    assert read_index(copy).num_samples == 2


@pytest.mark.parametrize("tar_format", ["gnu", "pax", "ustar"])
def test_index_reads_the_headers_tarfile_writes(tmp_path: Path, tar_format: str) -> None:
    import tarfile

    root = tmp_path / tar_format
    root.mkdir()
    long_dir = "d" * 60 + "/" + "e" * 50  # a long name: GNU long-name member, pax path record, or ustar prefix
    entries = [("dir/", None), (f"{long_dir}/k1.txt", b"one"), (f"{long_dir}/k1.cls", b"3"), (".hidden.txt", b"x"),
               ("__meta__.json", b"{}"), ("noext", b"z"), ("k2.txt", "två".encode()), ("k2.seg.png", b"p" * 700)]
    with tarfile.open(root / "a.tar", "w", format={"gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT, "ustar": tarfile.USTAR_FORMAT}[tar_format]) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name.rstrip("/"))
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        if tar_format == "pax":  # a non-ASCII name and a size given by a pax record
            info = tarfile.TarInfo("k3.txt")
            info.size, info.pax_headers = 4, {"size": "4", "comment": "ünïcode"}
            tar.addfile(info, io.BytesIO(b"four"))
    run_cli("index", str(root))
    assert run_cli("verify", str(root)).returncode == 0  # its .idx agrees with tarfile's reading of every header
    ds = fastload.open(root)
    samples = {ds[i]["key"]: {k: v for k, v in ds[i].items() if k != "key"} for i in range(len(ds))}
    expected = {f"{long_dir}/k1": {"txt": b"one", "label": 3}, "k2": {"txt": "två".encode(), "seg.png": b"p" * 700}}
    if tar_format == "pax":
        expected["k3"] = {"txt": b"four"}
    assert samples == expected
    assert read_index(root).class_counts == {"3": 1}


def test_text_only_tars_need_no_transform(tmp_path: Path) -> None:
    root = write_tars(tmp_path / "text", [{"__key__": f"k{i:03d}", "txt": f"line {i}"} for i in range(7)], per_tar=3)
    run_cli("index", str(root))
    texts = [t for (batch,) in loader(root, batch_size=3, num_workers=1) for t in batch]  # every field, none an image
    assert texts == [f"line {i}" for i in range(7)]
    with pytest.raises(ValueError, match="hold none"):
        loader(root, batch_size=3, transform=T.train(24), fields=["txt"])
    with pytest.raises(SampleError, match="no image field among"):  # a transform expects images: the classic layout
        next(iter(loader(root, batch_size=3, transform=T.train(24))))


def quadrant_sample(i: int, rng: np.random.Generator) -> dict:
    """An image of four colour regions split at a random point, its P-mode class mask (0..3)."""
    height, width = int(rng.integers(48, 80)), int(rng.integers(48, 80))
    by, bx = int(rng.integers(12, height - 12)), int(rng.integers(12, width - 12))
    classes = 2 * (np.arange(height)[:, None] >= by) + (np.arange(width)[None, :] >= bx)
    image = Image.fromarray(QUADRANT_COLOURS[classes].astype(np.uint8))
    mask = Image.fromarray(classes.astype(np.uint8), mode="L").convert("P")
    return {"__key__": f"q{i:04d}", "jpg": jpeg_bytes(image, quality=97, subsampling=0), "seg.png": png_bytes(mask)}


@pytest.fixture(scope="module")
def mask_tars(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(7)
    root = write_tars(tmp_path_factory.mktemp("masks"), [quadrant_sample(i, rng) for i in range(24)], per_tar=8)
    run_cli("index", str(root))
    return root


def away_from_boundaries(mask: np.ndarray, margin: int) -> np.ndarray:
    """Pixels whose ``margin``-neighbourhood holds one class only."""
    padded = np.pad(mask, margin, mode="edge")
    same = np.ones(mask.shape, dtype=bool)
    for dy in range(-margin, margin + 1):
        for dx in range(-margin, margin + 1):
            same &= padded[margin + dy : margin + dy + mask.shape[0], margin + dx : margin + dx + mask.shape[1]] == mask
    return same


@pytest.mark.parametrize("workers", [0, 2])
def test_mask_stays_aligned_after_crop_and_flip(mask_tars: Path, workers: int) -> None:
    transform = (T.RandomResizedCrop(32, scale=(0.3, 1.0)), T.RandomHorizontalFlip())
    checked = flipped_regions = 0
    for epoch in range(2):
        dl = loader(mask_tars, batch_size=8, num_workers=workers, transform=transform, shuffle=True, seed=epoch,
                    fields={"jpg": "image", "seg.png": "mask"})
        for images, masks in dl:
            assert masks.shape == (len(images), 32, 32) and masks.dtype == torch.uint8
            assert set(torch.unique(masks).tolist()) <= {0, 1, 2, 3}  # class ids, never interpolated
            for image, mask in zip(images.numpy(), masks.numpy()):
                inner = away_from_boundaries(mask, 2)
                expected = QUADRANT_COLOURS[mask[inner]]
                assert np.abs(image.transpose(1, 2, 0)[inner].astype(int) - expected).max() < 60
                checked += int(inner.sum())
                flipped_regions += int(mask[:, 0].max() > mask[:, -1].max())  # a right-hand class at the left: a flip
    assert checked > 24 * 2 * 32 * 32 * 0.5 and flipped_regions > 0


def rectangle_sample(i: int, rng: np.random.Generator) -> dict:
    height, width = int(rng.integers(50, 90)), int(rng.integers(50, 90))
    x0, y0 = int(rng.integers(0, width - 20)), int(rng.integers(0, height - 20))
    x1, y1 = x0 + int(rng.integers(8, 20)), y0 + int(rng.integers(8, 20))
    pixels = np.full((height, width, 3), 20, np.uint8)
    pixels[y0:y1, x0:x1] = 250
    boxes = [[x0, y0, x1, y1], [0, 0, 3, 3]]  # a tiny corner box that most crops drop
    return {"__key__": f"r{i:04d}", "png": png_bytes(Image.fromarray(pixels)), "boxes.json": json.dumps(boxes).encode()}


@pytest.mark.parametrize(("size", "backend"), [((40, 40), "cpu"), ((24, 56), "cpu"), ((56, 24), "cpu"), ((24, 56), "dali")])
def test_boxes_enclose_their_rectangle_after_crop_and_flip(tmp_path: Path, size: tuple[int, int], backend: str) -> None:
    """Square and non-square outputs (height, width): a flipped box is mirrored about the output's width."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    rng = np.random.default_rng(11)
    root = write_tars(tmp_path / "boxes", [rectangle_sample(i, rng) for i in range(20)])
    run_cli("index", str(root))
    transform = (T.RandomResizedCrop(size, scale=(0.2, 1.0)), T.RandomHorizontalFlip())
    visible = dropped = 0
    for epoch in range(3):
        dl = loader(root, batch_size=5, num_workers=2, transform=transform, shuffle=True, seed=epoch, fields={"png": "image", "boxes.json": "boxes"},
                    backend=backend)
        for images, boxes in dl:
            assert isinstance(boxes, list) and len(boxes) == len(images) and images.shape[2:] == size
            for image, sample_boxes in zip(images.numpy(), boxes):
                assert sample_boxes.dtype == torch.float32 and sample_boxes.ndim == 2 and sample_boxes.shape[1] == 4
                assert ((sample_boxes[:, 2] > sample_boxes[:, 0]) & (sample_boxes[:, 3] > sample_boxes[:, 1])).all()
                assert (sample_boxes >= 0).all() and (sample_boxes[:, [0, 2]] <= size[1]).all() and (sample_boxes[:, [1, 3]] <= size[0]).all()
                dropped += 2 - len(sample_boxes)
                ys, xs = np.nonzero(image.min(axis=0) > 200)  # the rectangle's clearly bright pixels
                if len(xs) == 0:
                    continue
                visible += 1
                enclosing = [b for b in sample_boxes.tolist() if b[0] - 1 <= xs.min() and xs.max() + 1 <= b[2] + 1
                             and b[1] - 1 <= ys.min() and ys.max() + 1 <= b[3] + 1]
                assert enclosing, (sample_boxes, xs.min(), xs.max(), ys.min(), ys.max())
    assert visible > 20 and dropped > 0


def test_float_arrays_from_npz_and_npy_folder_convert_and_load(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    features, labels = rng.standard_normal((30, 5)).astype(np.float32), np.arange(30) % 4
    np.savez(tmp_path / "data.npz", x=features, y=labels)
    folder = tmp_path / "npy"
    folder.mkdir()
    embeddings, targets = rng.standard_normal((30, 2, 3)), rng.random(30).astype(np.float16)
    np.save(folder / "embedding.npy", embeddings)
    np.save(folder / "target.npy", targets)  # float targets: an array field, not labels
    for layout in ("wds", "hdf5"):
        npz_out, npy_out = tmp_path / f"npz-{layout}", tmp_path / f"npy-{layout}"
        convert(str(tmp_path / "data.npz"), str(npz_out), ConvertOptions(source="npz", layout=layout, samples_per_shard=7, shuffle=True))
        convert(str(folder), str(npy_out), ConvertOptions(source="npz", layout=layout, samples_per_shard=7))
        assert read_index(npz_out).fields == ("cls", "x.npy") and read_index(npy_out).fields == ("embedding.npy", "target.npy")
        rows = {}
        for x, cls, keys in loader(npz_out, batch_size=8, num_workers=2, shuffle=True, fields=["x.npy", "cls"], return_keys=True):
            assert x.dtype == torch.float32 and x.shape[1:] == (5,)
            rows.update({int(k): (xi.numpy(), int(c)) for k, xi, c in zip(keys, x, cls)})
        assert sorted(rows) == list(range(30))
        assert all(np.array_equal(rows[i][0], features[i]) and rows[i][1] == labels[i] for i in range(30))
        emb, target = torch.cat([e for e, _ in loader(npy_out, batch_size=8)]), torch.cat([t for _, t in loader(npy_out, batch_size=8)])
        assert emb.dtype == torch.float64 and np.array_equal(emb.numpy(), embeddings)
        assert target.dtype == torch.float16 and np.array_equal(target.numpy(), targets)


def npy(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=allow_pickle)
    return out.getvalue()


def test_ragged_arrays_come_as_lists(tmp_path: Path) -> None:
    lengths = [3, 5, 2, 7, 1, 4, 6, 8, 2, 3]
    root = write_tars(tmp_path / "ragged", [{"__key__": f"a{i:03d}", "npy": npy(np.arange(n, dtype=np.int16)), "cls": str(i).encode()}
                                            for i, n in enumerate(lengths)])
    run_cli("index", str(root))
    got = [(a.tolist(), int(c)) for arrays, cls in loader(root, batch_size=4, num_workers=2, fields=["npy", "cls"]) for a, c in zip(arrays, cls)]
    assert got == [(list(range(n)), i) for i, n in enumerate(lengths)]


@pytest.fixture()
def bad_tars(tmp_path: Path) -> Path:
    """Ten image + text + json + mask + npy samples; three are bad in one field each."""
    samples = []
    for i in range(10):
        photo = small_photo(i, size=(32, 40))
        mask = Image.fromarray(np.zeros((32, 40), np.uint8))
        samples.append({"__key__": f"s{i:03d}", "jpg": jpeg_bytes(photo), "txt": f"t{i}", "json": json.dumps({"i": i}).encode(),
                        "seg.png": png_bytes(mask), "npy": npy(np.full(3, i, np.float32))})
    samples[2]["json"] = b"{'not': json,"
    samples[5]["npy"] = npy(np.array([{"a": 1}], dtype=object), allow_pickle=True)
    samples[7]["seg.png"] = png_bytes(Image.fromarray(np.zeros((16, 40), np.uint8)))
    root = write_tars(tmp_path / "bad", samples)
    run_cli("index", str(root))
    return root


@pytest.mark.parametrize(("fields", "key", "reason"), [
    (["jpg", "json"], "s002", "field json: bad JSON"),
    (["jpg", "npy"], "s005", "field npy: a .npy of Python objects"),
    ({"jpg": "image", "seg.png": "mask"}, "s007", "field seg.png: 16x40, its image is 32x40"),
])
def test_bad_field_bytes_are_sample_errors_naming_key_and_field(bad_tars: Path, fields, key: str, reason: str) -> None:
    for workers in (0, 2):
        with pytest.raises(SampleError) as caught:
            list(loader(bad_tars, batch_size=5, num_workers=workers, transform=T.val(24), fields=fields))
        assert caught.value.where.endswith(f":{key}") and reason in caught.value.reason
        assert "{'not'" not in str(caught.value)  # never the bytes
        kept = [k for batch in loader(bad_tars, batch_size=5, num_workers=workers, transform=T.val(24), fields=fields,
                                      on_error="skip", return_keys=True) for k in batch[-1]]
        assert len(kept) == 10 and key not in kept  # replaced by the next readable sample: batches keep their size


def test_verify_decode_parses_every_field_by_its_role(bad_tars: Path, clip_tars: Path) -> None:
    assert run_cli("verify", str(clip_tars), "--decode").returncode == 0
    proc = run_cli("verify", str(bad_tars), "--decode", check=False)
    assert proc.returncode == 1
    assert ":s002: field json: bad JSON" in proc.stderr and ":s005: field npy: a .npy of Python objects" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 2  # the wrong-size mask is a mask only once declared


def nested(depth: int) -> bytes:
    """A JSON value of lists and an object nested ``depth`` levels deep."""
    return b"[" * (depth - 1) + b'{"a": 1}' + b"]" * (depth - 1)


def beside_many(depth: int) -> bytes:
    """A list holding a value ``depth - 1`` deep and 150 small lists: ``depth`` deep, more
    brackets than MAX_JSON_DEPTH (so the depth is walked, not told by the bracket count)."""
    return b"[" + nested(depth - 1) + b"," + b",".join(b"[%d]" % i for i in range(150)) + b"]"


@pytest.fixture(scope="module")
def deep_json_tars(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six text + json samples; s002's json is nested 700 deep (it parses, but cannot be pickled
    back from a worker), s003's one level deeper than MAX_JSON_DEPTH, s004's exactly that deep,
    s001's two deep with 151 lists (all three among many brackets)."""
    samples = [{"__key__": f"s{i:03d}", "txt": f"t{i}", "json": json.dumps({"i": i}).encode()} for i in range(6)]
    samples[1]["json"] = beside_many(2)
    samples[2]["json"] = nested(700)
    samples[3]["json"] = beside_many(MAX_JSON_DEPTH + 1)
    samples[4]["json"] = beside_many(MAX_JSON_DEPTH)
    root = write_tars(tmp_path_factory.mktemp("deep-json"), samples, per_tar=6)
    run_cli("index", str(root))
    return root


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_json_nested_too_deep_is_a_sample_error_never_a_hang(deep_json_tars: Path, workers: int) -> None:
    kwargs = dict(batch_size=3, num_workers=workers, fields=["txt", "json"], timeout=30)  # a hang would time out, failing the test
    with pytest.raises(SampleError) as caught:
        list(loader(deep_json_tars, **kwargs))
    assert caught.value.where[-5:] in (":s002", ":s003")  # the workers' first error, whichever batch it is in
    assert caught.value.reason == f"field json: JSON nested deeper than {MAX_JSON_DEPTH} levels"
    with loader(deep_json_tars, on_error="skip", max_skipped=None, return_keys=True, **kwargs) as dl:
        got = {key: meta for _, metas, keys in dl for meta, key in zip(metas, keys, strict=True)}
        assert sorted(entry["key"] for entry in dl.stats.skipped.entries) == ["s002", "s003"]
        assert dl.stats.skipped.entries[-1]["reason"] == f"field json: JSON nested deeper than {MAX_JSON_DEPTH} levels"
    assert sorted(got) == ["s000", "s001", "s004", "s005"]
    for key, value in (("s001", beside_many(2)), ("s004", beside_many(MAX_JSON_DEPTH))):
        assert json.dumps(got[key]).encode().replace(b" ", b"") == value.replace(b" ", b"")


def unpicklable(sample: dict, rng: np.random.Generator) -> dict:
    """A user map that gives one sample's caption a value pickle cannot send (a generator)."""
    if sample["txt"] == "t3":
        sample["txt"] = (c for c in "t3")
    return sample


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_value_a_worker_cannot_send_back_is_an_error_naming_the_sample(tmp_path: Path, workers: int, on_error: str) -> None:
    root = write_tars(tmp_path / "tars", [{"__key__": f"s{i:03d}", "txt": f"t{i}"} for i in range(6)], per_tar=3)
    run_cli("index", str(root))
    with pytest.raises(SampleError) as caught:  # not skippable: the sample was read; map='s value is the user's
        list(loader(root, batch_size=3, num_workers=workers, fields=["txt"], map=unpicklable, on_error=on_error, timeout=30))
    assert caught.value.where == "00001.tar:s003"
    assert caught.value.reason.startswith("field txt: its value cannot be sent from the worker (TypeError:")
def npy_header(descr: str, shape: tuple, body: bytes = b"") -> bytes:
    """A .npy whose header says exactly this (numpy's own header layout), followed by ``body``."""
    text = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    text += b" " * (-(10 + len(text) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + body


LYING_NPY = {  # headers numpy reads without complaint, whose arrays numpy then refuses to make
    "itemsize 0": npy_header("|V0", (5,)),
    "shape (2**62, 0)": npy_header("<f4", (2**62, 0)),
    "negative sides": npy_header("<f4", (-2, -4), bytes(32)),
    "a side past int64": npy_header("<f4", (2**64, 0)),
    "sub-array items": npy_header("(2,3)<f4", (2,), bytes(48)),
}


@pytest.mark.parametrize("lie", sorted(LYING_NPY))
def test_npy_headers_that_look_valid_are_skippable_sample_errors_and_verify_names_them(tmp_path: Path, lie: str) -> None:
    samples = [{"__key__": f"s{i:03d}", "npy": npy(np.full(3, i, np.float32)), "cls": str(i).encode()} for i in range(6)]
    samples[3]["npy"] = LYING_NPY[lie]
    root = write_tars(tmp_path / "npy", samples)
    run_cli("index", str(root))
    for workers in (0, 2):
        with pytest.raises(SampleError) as caught:
            list(loader(root, batch_size=3, num_workers=workers, fields=["npy", "cls"]))
        assert caught.value.where.endswith(":s003") and caught.value.reason.startswith("field npy: ")
        kept = [k for batch in loader(root, batch_size=3, num_workers=workers, fields=["npy", "cls"], on_error="skip", return_keys=True)
                for k in batch[-1]]
        assert len(kept) == 6 and "s003" not in kept
    proc = run_cli("verify", str(root), "--decode", check=False)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and ":s003: field npy: " in proc.stderr, proc.stderr


def jitter(sample: dict, rng: np.random.Generator) -> dict:
    """A user augmentation: random brightness on the image, a random tag on the text."""
    sample["jpg"] = np.clip(sample["jpg"].astype(np.int16) + int(rng.integers(-40, 40)), 0, 255).astype(np.uint8)
    sample["txt"] = f"{sample['txt']} #{int(rng.integers(0, 10**6))}"
    return sample


def broken(sample: dict, rng: np.random.Generator) -> dict:
    if sample["txt"].endswith("4 ✓"):
        raise ZeroDivisionError("user code failed")
    return sample


def run_epoch(clip_tars: Path, workers: int, state: dict | None = None, stop_after: int | None = None) -> tuple[list, dict]:
    dl = loader(clip_tars, batch_size=3, num_workers=workers, transform=T.train(24), shuffle=True, seed=5,
                fields=["jpg", "txt"], map=jitter)
    if state is not None:
        dl.load_state_dict(state)
    batches = []
    for images, texts in dl:
        batches.append((images.clone(), list(texts)))
        if stop_after is not None and len(batches) == stop_after:
            return batches, dl.state_dict()
    return batches, dl.state_dict()


def test_map_is_deterministic_across_runs_worker_counts_and_resume(clip_tars: Path) -> None:
    first, _ = run_epoch(clip_tars, 2)
    again, _ = run_epoch(clip_tars, 1)
    assert len(first) == 5
    for (a, ta), (b, tb) in zip(first, again):
        assert torch.equal(a, b) and ta == tb
    assert any("#" in t for _, texts in first for t in texts)
    head, state = run_epoch(clip_tars, 2, stop_after=2)
    tail, _ = run_epoch(clip_tars, 0, state=state)
    for (a, ta), (b, tb) in zip(head + tail, first):
        assert torch.equal(a, b) and ta == tb
    plain = loader(clip_tars, batch_size=3, transform=T.train(24), shuffle=True, seed=5, fields=["jpg", "txt"])
    assert not torch.equal(next(iter(plain))[0], first[0][0])  # the map did change the pixels


def test_map_errors_name_the_key_and_keep_the_traceback(clip_tars: Path) -> None:
    for workers in (0, 2):
        with pytest.raises(SampleError) as caught:
            list(loader(clip_tars, batch_size=4, num_workers=workers, transform=T.val(24), fields=["jpg", "txt"], map=broken))
        assert caught.value.where.endswith(":000000004") and "map= raised ZeroDivisionError: user code failed" in caught.value.reason
        cause = caught.value.__cause__
        text = str(cause) if workers else "".join(__import__("traceback").format_exception(cause))
        assert "in broken" in text and 'raise ZeroDivisionError("user code failed")' in text


def test_hdf5_carries_the_same_fields(clip_tars: Path, tmp_path: Path) -> None:
    out = tmp_path / "clip-h5"
    convert(str(clip_tars), str(out), ConvertOptions(source="wds", layout="hdf5"))
    def rows(path: Path) -> dict:
        dl = loader(path, batch_size=4, num_workers=2, transform=T.val(24), fields=["jpg", "txt", "json"], return_keys=True)
        return {k: (img.numpy().tobytes(), t, m) for images, texts, metas, keys in dl for k, img, t, m in zip(keys, images, texts, metas)}
    assert rows(out) == rows(clip_tars)


def test_classic_layout_unchanged_with_return_keys_and_evaluation(tmp_path: Path, image_folder: Path) -> None:
    out = tmp_path / "wds"
    convert(str(image_folder), str(out), ConvertOptions(source="imagefolder", samples_per_shard=8))
    classic = list(loader(out, batch_size=7, num_workers=2, transform=T.val(24), return_keys=True, evaluation=True))
    fields = list(loader(out, batch_size=7, num_workers=2, transform=T.val(24), fields=["jpg", "cls"], return_keys=True, evaluation=True))
    for (images, labels, keys, valid), (f_images, f_labels, f_keys, f_valid) in zip(classic, fields):
        assert torch.equal(images, f_images) and torch.equal(labels, f_labels) and keys == f_keys and torch.equal(valid, f_valid)
