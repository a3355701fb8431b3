"""The fast path over converted shards: every sample exactly once, determinism whatever the worker
count, exact resume, transforms against reference implementations, both shard layouts."""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload import transforms as T
from fastload.converters import ConvertOptions, WriterOptions, convert
from fastload.decode.cpu import turbo as _turbo
from fastload.transforms import Plan, apply_plan, plan, random_resized_crop_params
from fastload.workers.rng import sample_rng
from tests.conftest import jpeg_bytes, small_photo


@pytest.fixture(scope="module")
def wds(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("loader-wds")
    convert(str(image_folder), str(out), ConvertOptions(source="imagefolder", samples_per_shard=7))
    return out


@pytest.fixture(scope="module")
def hdf5(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("loader-h5")
    convert(str(image_folder), str(out), ConvertOptions(source="imagefolder", layout="hdf5", samples_per_shard=9))
    return out


def epoch_keys(loader) -> list[str]:
    return [k for _, _, keys in loader for k in keys]


def test_batches_kept_by_the_caller_stay_intact(wds: Path) -> None:
    """Batches are lent from the shared slots without a copy; a slot is refilled only once no
    tensor views it, so batches kept across the epoch, the next epoch and close() stay intact."""
    kwargs = dict(batch_size=4, num_workers=2, transform=T.val(16), shuffle=True)
    with fastload.DataLoader(wds, **kwargs) as loader:
        first = [x.clone() for x, _ in loader]
        second = [x.clone() for x, _ in loader]
    with fastload.DataLoader(wds, **kwargs) as loader:
        kept_first = [x for x, _ in loader]
        kept_second = [x[1:] for x, _ in loader]  # views of lent batches keep their slots too
    assert len(kept_first) == len(first) == 8
    assert all(torch.equal(a, b) for a, b in zip(first, kept_first))
    assert all(torch.equal(a[1:], b) for a, b in zip(second, kept_second))


@pytest.mark.parametrize("num_workers", [0, 1, 3])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_sample_exactly_once(wds: Path, num_workers: int, shuffle: bool, drop_last: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fastload.backends.cpu.cpu_epoch.MIN_PART", 1)  # every worker gets a part of every batch
    ds = fastload.open(wds)
    all_keys = [ds.raw(i)[0] for i in range(len(ds))]
    with fastload.DataLoader(
        ds, batch_size=4, shuffle=shuffle, num_workers=num_workers, drop_last=drop_last,
        transform=T.val(16), return_keys=True,
    ) as loader:
        batches = list(loader)
        assert len(batches) == len(loader) == (7 if drop_last else 8)
        keys = [k for _, _, ks in batches for k in ks]
        assert len(keys) == len(set(keys))
        if drop_last:
            assert len(keys) == 28 and set(keys) <= set(all_keys)
        else:
            assert Counter(keys) == Counter(all_keys)
        if not shuffle:
            assert keys == all_keys[: len(keys)]
        images, labels, _ = batches[0]
        assert images.shape == (4, 3, 16, 16) and images.dtype == torch.uint8
        assert labels.dtype == torch.int64


def test_same_seed_same_batches_whatever_the_worker_count(wds: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fastload.backends.cpu.cpu_epoch.MIN_PART", 1)  # batches of 5 in 3 parts with 3 workers
    def run(num_workers: int, seed: int = 3) -> list[tuple]:
        with fastload.DataLoader(wds, batch_size=5, shuffle=True, num_workers=num_workers, transform=T.train(24), seed=seed, return_keys=True) as loader:
            return [(x.clone(), y.clone(), k) for x, y, k in loader]

    reference = run(0)
    for other in (run(1), run(3)):
        assert [k for *_, k in other] == [k for *_, k in reference]
        for (a, la, _), (b, lb, _) in zip(reference, other):
            assert torch.equal(a, b) and torch.equal(la, lb)
    different = run(2, seed=4)
    assert [k for *_, k in different] != [k for *_, k in reference]


def test_epochs_differ_and_set_epoch_replays(wds: Path) -> None:
    with fastload.DataLoader(wds, batch_size=30, shuffle=True, transform=T.train(24), return_keys=True) as loader:
        (x0, _, k0), = list(loader)
        (_x1, _, k1), = list(loader)  # the epoch advances by itself
        assert k0 != k1
        loader.set_epoch(0)
        (again, _, k_again), = list(loader)
        assert k_again == k0 and torch.equal(again, x0)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_dict_resumes_exactly(wds: Path, num_workers: int) -> None:
    kwargs = dict(batch_size=4, shuffle=True, num_workers=num_workers, transform=T.train(16), seed=9, return_keys=True)
    with fastload.DataLoader(wds, **kwargs) as full:
        full.set_epoch(2)
        uninterrupted = [(x.clone(), k) for x, _, k in full]
    with fastload.DataLoader(wds, **kwargs) as first:
        first.set_epoch(2)
        it = iter(first)
        before = [(x.clone(), k) for x, _, k in itertools.islice(it, 3)]
        state = first.state_dict()
    assert state == {"version": 3, "seed": 9, "epoch": 2, "samples_consumed": 12, "dataset": first.identity,
                     "order": "global", "shuffle": True, "world_size": 1, "batch_size": 4, "resumed_from": []}
    with fastload.DataLoader(wds, **kwargs) as resumed:
        resumed.load_state_dict(state)
        after = [(x.clone(), k) for x, _, k in resumed]
        assert resumed.state_dict()["epoch"] == 3
    combined = before + after
    assert [k for _, k in combined] == [k for _, k in uninterrupted]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(combined, uninterrupted))
    with fastload.DataLoader(wds, **kwargs) as reused:  # a loader left mid-epoch by a break, then loaded
        list(itertools.islice(iter(reused), 5))
        reused.load_state_dict(state)
        assert [k for _, _, k in reused] == [k for _, k in after]


def test_a_dataset_in_spawned_torch_workers_reads_like_in_process(wds: Path) -> None:
    """A fastload dataset pickled into spawned workers (torch's DataLoader, DALI's parallel source)
    opens its own files there and keeps reading them."""
    ds = fastload.open(wds)
    picks = list(range(0, len(ds), 3))
    loader = torch.utils.data.DataLoader(
        torch.utils.data.Subset(ds, picks), batch_size=None, num_workers=2, multiprocessing_context="spawn"
    )
    got = {sample["key"]: sample["image"] for sample in loader}
    assert len(got) == len(picks)
    for i in picks:
        assert np.array_equal(got[ds[i]["key"]], ds[i]["image"])


def test_hdf5_encoded_and_decoded(wds: Path, hdf5: Path, npz_file: Path, tmp_path: Path) -> None:
    def epoch(path, **kw):
        with fastload.DataLoader(path, batch_size=8, transform=T.val(16), return_keys=True, **kw) as loader:
            return {k: x for xs, _, ks in loader for x, k in zip(xs, ks)}

    from_tar, from_h5 = epoch(wds), epoch(hdf5)
    assert from_tar.keys() == from_h5.keys()
    assert all(torch.equal(from_tar[k], from_h5[k]) for k in from_tar)

    data = np.load(npz_file)
    expected = torch.from_numpy(data["images"]).permute(0, 3, 1, 2)
    for compression in (None, "lzf"):  # contiguous rows read with pread; compressed chunks through h5py
        decoded = tmp_path / f"dec-{compression}"
        options = WriterOptions(hdf5_decoded=True, hdf5_compression=compression)
        convert(str(npz_file), str(decoded), ConvertOptions(source="npz", layout="hdf5", writer_options=options))
        with fastload.DataLoader(decoded, batch_size=4, num_workers=2) as loader:
            images, labels = next(iter(loader))
        assert torch.equal(images, expected[:4])
        assert labels.tolist() == data["labels"][:4].tolist()
        with fastload.DataLoader(decoded, batch_size=len(expected), transform=[T.RandomHorizontalFlip(p=1.0)]) as loader:
            mirrored, _ = next(iter(loader))
        assert torch.equal(mirrored, expected.flip(3))


def test_hdf5_shards_of_the_earlier_layout_still_load(hdf5: Path, tmp_path: Path) -> None:
    """Index version 1 wrote byte columns as variable-length uint8 datasets; they still read,
    sample for sample as the flat layout."""
    import shutil

    import h5py

    legacy = tmp_path / "legacy"
    shutil.copytree(hdf5, legacy)
    for shard in sorted(legacy.glob("*.h5")):
        with h5py.File(shard, "r+") as f:
            flat = f["image"]
            values = [flat["bytes"][a:b] for a, b in zip(flat["offsets"][:-1], flat["offsets"][1:])]
            del f["image"]
            column = f.create_dataset("image", (len(values),), dtype=h5py.vlen_dtype(np.uint8))
            for i, value in enumerate(values):
                column[i] = value
            f.attrs["version"] = 1
    index = json.loads((legacy / "index.json").read_text())
    index["version"] = 1
    (legacy / "index.json").write_text(json.dumps(index))

    new, old = fastload.open(hdf5), fastload.open(legacy)
    assert len(new) == len(old) == 30
    assert all(new.raw(i)[1] == old.raw(i)[1] for i in range(len(new)))


def reference_val(data: bytes, size: int) -> np.ndarray:
    """torchvision's val recipe on a PIL image: Resize(size/0.875) (short side, bilinear, antialias) + CenterCrop."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    short = int(size / 0.875)
    w, h = image.size
    new = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    image = image.resize(new, Image.Resampling.BILINEAR)
    left, top = round((new[0] - size) / 2.0), round((new[1] - size) / 2.0)
    return np.asarray(image.crop((left, top, left + size, top + size))).transpose(2, 0, 1)


def test_val_preset_matches_reference_recipe(image_folder: Path, wds: Path) -> None:
    ds = fastload.open(wds)
    with fastload.DataLoader(ds, batch_size=30, transform=T.val(32), return_keys=True) as loader:
        images, _, keys = next(iter(loader))
    scores = [psnr(image.numpy(), reference_val((image_folder / f"{key}.jpg").read_bytes(), 32)) for image, key in zip(images, keys)]
    # DCT-domain downscaling differs from a full decode + resample by a little blur, most at the
    # sharp edges of these tiny synthetic images (on real photos: PSNR ~40 dB)
    assert np.mean(scores) > 30 and min(scores) > 24, scores


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


def test_center_crop_without_scaling_is_exact(image_folder: Path, wds: Path) -> None:
    """With no resampling needed, the crop equals Pillow's pixels (both are libjpeg-turbo, islow)."""
    with fastload.DataLoader(wds, batch_size=30, transform=[T.CenterCrop(24)], return_keys=True) as loader:
        images, _, keys = next(iter(loader))
    for image, key in zip(images, keys):
        full = np.asarray(Image.open(image_folder / f"{key}.jpg").convert("RGB"))
        top, left = round((full.shape[0] - 24) / 2.0), round((full.shape[1] - 24) / 2.0)
        expected = full[top : top + 24, left : left + 24].transpose(2, 0, 1)
        assert np.abs(image.numpy().astype(int) - expected.astype(int)).max() <= 1, key


@pytest.mark.skipif(_turbo is None, reason="the libjpeg-turbo extension is not built")
@pytest.mark.parametrize("kernels", ["best", "sse2"])
def test_crop_decoder_matches_pillow_resampling(kernels: str) -> None:
    """Where the crop needs the full-size decode, the extension's output is Pillow's antialiased
    bilinear resize of the same box, within rounding, with the kernels this CPU picks and with
    the SSE2 ones (in a process started with FASTLOAD_NO_AVX2=1)."""
    if kernels == "best":
        check_crop_decoder_against_pillow()
        return
    code = "from tests.loading.test_fast_path import check_crop_decoder_against_pillow as c; c()"
    env = {**os.environ, "FASTLOAD_NO_AVX2": "1"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=Path(__file__).resolve().parents[2])


def check_crop_decoder_against_pillow() -> None:
    """Downscales (few and many taps: the fixed-point and float AVX2 passes), upscales, odd
    output widths, flips, boxes touching the border, colour and greyscale JPEGs; the same
    crops of already decoded pixels (resample_into)."""
    for mode in ("RGB", "L"):
        check_crop_decoder_mode(mode)


def check_crop_decoder_mode(mode: str) -> None:
    image = small_photo(7, size=(181, 243)).convert(mode)
    data = jpeg_bytes(image, quality=95)
    full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    cases = [
        ((10.0, 20.0, 190.5, 160.0), (97, 131)),  # down by ~1.4-1.9 (DCT scale stays 1)
        ((0.0, 0.0, 243.0, 181.0), (181, 129)),  # whole image, width only
        ((100.2, 50.7, 140.9, 80.3), (64, 61)),  # up by ~1.5-2
        ((200.0, 150.0, 243.0, 181.0), (33, 47)),  # bottom-right corner
        ((3.0, 4.0, 5.0, 6.0), (8, 8)),  # a tiny box, blown up
        ((1.5, 30.0, 241.5, 130.0), (99, 80)),  # down by 3 across (height decides the scale): 6 taps
        ((0.0, 100.0, 243.0, 120.0), (16, 8)),  # down by 30 across (height decides the scale): many taps
    ]
    for box, size in cases:
        for flip in (False, True):
            out = np.zeros((3, *size), np.uint8)
            assert _turbo.decode_crop_into(data, box, out, size[0], size[1], flip, 10**8) == 8, box
            expected = apply_plan(full, Plan(box=box, size=size, flip=flip), 181, 243).transpose(2, 0, 1)
            assert np.abs(out.astype(int) - expected.astype(int)).max() <= 1, (box, size, flip)
            # decoded pixels (PNG, decoded datasets) go through the same resampler
            out[:] = 0
            _turbo.resample_into(full, 181, 243, box, out, size[0], size[1], flip)
            assert np.abs(out.astype(int) - expected.astype(int)).max() <= 1, ("pixels", box, size, flip)
    out = np.zeros((3, 181, 243), np.uint8)  # nothing to resample: an exact copy
    _turbo.resample_into(full, 181, 243, (0.0, 0.0, 243.0, 181.0), out, 181, 243, False)
    assert np.array_equal(out, full.transpose(2, 0, 1))


def torchvision_get_params(height: int, width: int, g: torch.Generator) -> tuple[int, int, int, int]:
    """A literal port of torchvision.transforms.RandomResizedCrop.get_params (scale 0.08-1, ratio
    3/4-4/3), drawing from torch's RNG: the reference distribution."""
    import math

    area = height * width
    log_ratio = torch.log(torch.tensor([3 / 4, 4 / 3]))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(0.08, 1.0, generator=g).item()
        aspect_ratio = math.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=g).item())
        w = round(math.sqrt(target_area * aspect_ratio))
        h = round(math.sqrt(target_area / aspect_ratio))
        if 0 < w <= width and 0 < h <= height:
            i = torch.randint(0, height - h + 1, size=(1,), generator=g).item()
            j = torch.randint(0, width - w + 1, size=(1,), generator=g).item()
            return i, j, h, w
    return 0, 0, height, width


def test_train_crop_follows_torchvision_semantics() -> None:
    areas, ratios = [], []
    for i in range(2000):  # each sample's own stream, as the loader draws them
        top, left, h, w = random_resized_crop_params(300, 400, (0.08, 1.0), (3 / 4, 4 / 3), sample_rng(0, 0, i))
        assert top >= 0 and top + h <= 300 and left >= 0 and left + w <= 400
        areas.append(h * w / 120000)
        ratios.append(w / h)
    assert min(areas) >= 0.075 and max(areas) <= 1.0
    assert min(ratios) >= 0.73 and max(ratios) <= 1.36  # 3/4..4/3, give or take the rounding to pixels
    reference = [torchvision_get_params(300, 400, torch.Generator().manual_seed(i)) for i in range(2000)]
    ref_areas = [h * w / 120000 for _, _, h, w in reference]
    ref_ratios = [w / h for _, _, h, w in reference]
    assert abs(np.mean(areas) - np.mean(ref_areas)) < 0.02
    assert abs(np.mean(ratios) - np.mean(ref_ratios)) < 0.02
    # a crop of a tall, narrow image falls back to the centre crop at the nearest allowed ratio
    assert random_resized_crop_params(1000, 10, (0.9, 1.0), (3 / 4, 4 / 3), sample_rng(0, 0, 0)) == (493, 0, 13, 10)


def test_train_crop_offsets_cover_every_position() -> None:
    """Offsets are uniform over every valid position, edges included: given the crop sizes drawn,
    the count of crops touching each edge is a sum of known probabilities 1 / (room + 1), and the
    observed count must lie within 5 standard deviations of it (torchvision's port alike)."""
    height, width = 300, 400

    def edge_counts(crops: list[tuple[int, int, int, int]]) -> tuple[dict[str, int], dict[str, float], dict[str, float]]:
        tops, lefts, hs, ws = (np.array(v) for v in zip(*crops))
        p_rows, p_cols = 1 / (height - hs + 1), 1 / (width - ws + 1)
        observed = {"top": int((tops == 0).sum()), "bottom": int((tops + hs == height).sum()),
                    "left": int((lefts == 0).sum()), "right": int((lefts + ws == width).sum())}
        probabilities = {"top": p_rows, "bottom": p_rows, "left": p_cols, "right": p_cols}
        expected = {k: float(p.sum()) for k, p in probabilities.items()}
        sigma = {k: float(np.sqrt((p * (1 - p)).sum())) for k, p in probabilities.items()}
        return observed, expected, sigma

    ours = [random_resized_crop_params(height, width, (0.08, 1.0), (3 / 4, 4 / 3), sample_rng(0, 0, i)) for i in range(20000)]
    reference = [torchvision_get_params(height, width, torch.Generator().manual_seed(i)) for i in range(4000)]
    for crops in (ours, reference):
        observed, expected, sigma = edge_counts(crops)
        for edge in observed:
            assert expected[edge] > 20 * len(crops) / 20000  # enough crops near each edge to tell
            assert abs(observed[edge] - expected[edge]) < 5 * sigma[edge], (edge, observed, expected)
    # and uniform in between: the relative position top / room in ten bins (chi-square, 99.9%: 27.9)
    tops, lefts, hs, ws = (np.array(v) for v in zip(*ours))
    for offset, room in ((tops, height - hs), (lefts, width - ws)):
        roomy = room >= 50
        bins = np.minimum((offset[roomy] / (room[roomy] + 1) * 10).astype(int), 9)
        counts = np.bincount(bins, minlength=10)
        assert ((counts - counts.mean()) ** 2 / counts.mean()).sum() < 27.9


def test_sample_streams_are_uniform_and_unrelated() -> None:
    """Per-sample streams: uniform within a stream and across neighbouring samples, epochs and
    seeds, and no two neighbours alike (chi-square over 16 bins, 99.9% level: 37.7)."""
    def chi2(values: np.ndarray) -> float:
        counts = np.bincount((values * 16).astype(int), minlength=16)
        return float(((counts - len(values) / 16) ** 2 / (len(values) / 16)).sum())

    firsts = np.array([sample_rng(0, 0, i).random() for i in range(16000)])
    stream = sample_rng(1, 2, 3)
    within = np.array([stream.random() for _ in range(16000)])
    by_epoch = np.array([sample_rng(0, e, 5).random() for e in range(16000)])
    by_seed = np.array([sample_rng(s, 0, 5).random() for s in range(16000)])
    for values in (firsts, within, by_epoch, by_seed):
        assert chi2(values) < 37.7 and values.min() >= 0 and values.max() < 1
    assert abs(np.corrcoef(firsts[:-1], firsts[1:])[0, 1]) < 0.05
    assert len(set(firsts.tolist())) == len(firsts)
    assert all(0 <= sample_rng(0, 0, i).integers(3, 10) - 3 < 7 for i in range(1000))


def test_flip_probability_and_per_sample_determinism() -> None:
    """Each sample flips with probability p, independently of its neighbours, of its other epochs
    and seeds, and of its crop; p = 0 and p = 1 are never / always."""
    specs = T.train(8)
    plans = [plan(specs, 50, 60, sample_rng(5, 1, i)) for i in range(4000)]
    flips = np.array([p.flip for p in plans])
    assert 0.47 < flips.mean() < 0.53
    other_epoch = np.array([plan(specs, 50, 60, sample_rng(5, 2, i)).flip for i in range(4000)])
    other_seed = np.array([plan(specs, 50, 60, sample_rng(6, 1, i)).flip for i in range(4000)])
    for other in (other_epoch, other_seed, np.roll(flips, 1)):
        assert 0.46 < (flips == other).mean() < 0.54  # agreeing by chance only
    lefts = np.array([p.box[0] for p in plans])
    assert abs(np.corrcoef(flips, lefts)[0, 1]) < 0.05
    never = (T.RandomResizedCrop(8), T.RandomHorizontalFlip(0.0))
    always = (T.RandomResizedCrop(8), T.RandomHorizontalFlip(1.0))
    assert not any(plan(never, 50, 60, sample_rng(0, 0, i)).flip for i in range(500))
    assert all(plan(always, 50, 60, sample_rng(0, 0, i)).flip for i in range(500))


def test_augmentation_follows_the_sample_not_its_position(wds: Path) -> None:
    """A sample's crop and flip depend on (seed, epoch, its index) only: shuffled or not, in
    whatever batch and worker, each key comes out with the same pixels for the same seed and epoch."""
    def images(shuffle: bool, num_workers: int, seed: int = 7, epoch: int = 0) -> dict[str, torch.Tensor]:
        with fastload.DataLoader(wds, batch_size=4, shuffle=shuffle, num_workers=num_workers, transform=T.train(24), seed=seed, return_keys=True) as loader:
            loader.set_epoch(epoch)
            return {k: x[j].clone() for x, _, keys in loader for j, k in enumerate(keys)}

    in_order, shuffled = images(False, 0), images(True, 2)
    assert set(in_order) == set(shuffled) and len(in_order) == 30
    assert all(torch.equal(in_order[k], shuffled[k]) for k in in_order)
    for other in (images(False, 0, seed=8), images(False, 0, epoch=1)):  # a new draw for (almost) every sample
        assert sum(not torch.equal(in_order[k], other[k]) for k in in_order) >= 25


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_normalize_on_batches(wds: Path, dtype: str) -> None:
    with fastload.DataLoader(wds, batch_size=6, transform=T.val(16)) as raw_loader:
        raw, _ = next(iter(raw_loader))
    specs = (*T.val(16), T.Normalize(dtype=dtype))
    with fastload.DataLoader(wds, batch_size=6, transform=specs) as loader:
        normalized, _ = next(iter(loader))
    assert normalized.dtype == getattr(torch, dtype) and normalized.shape == raw.shape
    mean = torch.tensor(T.IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(T.IMAGENET_STD).view(1, 3, 1, 1)
    expected = (raw.float() / 255 - mean) / std
    assert torch.allclose(normalized.float(), expected, atol=0.05 if dtype != "float32" else 1e-5)


def test_to_dtype_scales() -> None:
    run = T.batch_transform([T.ToDtype("float32")])
    assert torch.equal(run(torch.tensor([[0, 255]], dtype=torch.uint8)), torch.tensor([[0.0, 1.0]]))


def test_transform_spec_validation() -> None:
    with pytest.raises(ValueError, match="scale must satisfy"):
        T.RandomResizedCrop(8, scale=(0.5, 0.1))
    with pytest.raises(ValueError, match="must come before Normalize"):
        T.validate([T.Normalize(), T.CenterCrop(4)])
    with pytest.raises(TypeError, match="not a fastload transform spec"):
        T.validate([lambda x: x])
    assert T.validate(T.CenterCrop(4)) == (T.CenterCrop(4),) == T.validate([T.CenterCrop(4)])  # one spec, as a list of one


def test_varying_sizes_need_a_fixed_size_transform(wds: Path) -> None:
    with pytest.raises(ValueError, match="vary in size"):
        fastload.DataLoader(wds, batch_size=2)


def test_dataset_random_access(image_folder: Path, wds: Path) -> None:
    ds = fastload.open(wds)
    assert len(ds) == 30 and ds.classes == sorted(p.name for p in image_folder.iterdir())
    sample = ds[5]
    expected = np.asarray(Image.open(image_folder / f"{sample['key']}.jpg").convert("RGB"))
    assert sample["image"].shape == expected.shape
    assert np.abs(sample["image"].astype(int) - expected.astype(int)).max() <= 1
    assert ds.classes[sample["label"]] == sample["key"].split("/")[0]
    with pytest.raises(IndexError):
        ds[30]


def test_streaming_order_through_the_loader_resumes(wds: Path) -> None:
    kwargs = dict(batch_size=4, shuffle=True, shuffle_buffer=6, transform=T.val(16), return_keys=True)
    with fastload.DataLoader(wds, **kwargs) as loader:
        whole = epoch_keys(loader)
    ds = fastload.open(wds)
    assert sorted(whole) == sorted(ds.raw(i)[0] for i in range(len(ds)))
    with fastload.DataLoader(wds, **kwargs) as loader:
        it = iter(loader)
        before = [k for _, _, ks in itertools.islice(it, 3) for k in ks]
        state = loader.state_dict()
    with fastload.DataLoader(wds, **kwargs) as loader:
        loader.load_state_dict(state)
        assert before + epoch_keys(loader) == whole
