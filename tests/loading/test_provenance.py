"""loader.describe / fastload describe: the described batches are the delivered ones, key for key
and (re-rendered with Pillow from the source JPEG) pixel for pixel within a measured bound."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload import transforms as T
from fastload.converters import ConvertOptions, convert
from fastload.decode.cpu import turbo
from fastload.loading.provenance import HEAD_BYTES, SampleDescription
from tests.conftest import photo_folder, run_cli

PIXEL_BOUND = 1  # measured: delivered crops differ from Pillow's re-render (same DCT scale) by at most 1 level


@pytest.fixture(scope="module")
def photo_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """27 JPEGs of 120x150 to 146x176 (so crops to 16x16 decode at DCT scales 1/4 to 1) in 3 class folders."""
    return photo_folder(tmp_path_factory.mktemp("describe-src"), 27, (120, 150), grow=1)


@pytest.fixture(scope="module")
def photos(photo_source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The photos as tar shards of 5."""
    root = photo_source
    out = tmp_path_factory.mktemp("describe-wds")
    convert(str(root), str(out), ConvertOptions(source="imagefolder", samples_per_shard=5))
    return out


def loader_of(data: Path | str | fastload.ShardedDataset, **kwargs) -> fastload.DataLoader:
    options = dict(batch_size=4, shuffle=True, seed=5, transform=T.train(32), return_keys=True, backend="cpu")
    return fastload.DataLoader(str(data) if isinstance(data, Path) else data, **{**options, **kwargs})


def delivered(loader: fastload.DataLoader, stop_after: int | None = None) -> list[tuple]:
    out = []
    for step, (images, _labels, keys) in enumerate(loader):
        out.append((images.clone(), list(keys)))
        if stop_after is not None and step + 1 == stop_after:
            break
    return out


@pytest.mark.parametrize("kwargs", [dict(num_workers=0), dict(num_workers=2), dict(num_workers=2, shuffle_buffer=6),
                                    dict(num_workers=1, drop_last=True, rank=1, world_size=2)])
def test_described_keys_are_the_delivered_ones(photos: Path, kwargs: dict) -> None:
    loader = loader_of(photos, **kwargs)
    for epoch in (0, 1):
        batches = delivered(loader)
        assert batches and all(loader.describe(step, epoch).keys == keys for step, (_, keys) in enumerate(batches))
        with pytest.raises(IndexError, match=f"step {len(batches)} is past the end of epoch {epoch}"):
            loader.describe(len(batches), epoch)
    loader.close()


def test_padding_is_marked_as_the_loader_marks_it(photos: Path) -> None:
    loader = loader_of(photos, batch_size=5, world_size=2, rank=1, evaluation=True)
    last = len(loader) - 1
    *_, (_images, _labels, _keys, valid) = iter(loader)
    described = loader.describe(last, 0)
    assert [s.valid for s in described.samples] == valid.tolist() and not all(valid.tolist())


def render_with_pillow(source: bytes, sample: SampleDescription) -> np.ndarray:
    """The described crop, made from the source JPEG by Pillow alone: decoded at the described DCT
    scale (Pillow's draft), cropped and resized by the box (antialiased bilinear), flipped."""
    image = Image.open(io.BytesIO(source))
    height, width = sample.source_size
    denominator = int(sample.dct_scale.split("/")[1]) if "/" in sample.dct_scale else 1
    image.draft("RGB", (width // denominator, height // denominator))  # Pillow picks the scale by floor division
    image = image.convert("RGB")
    assert image.size == (math.ceil(width / denominator), math.ceil(height / denominator))  # libjpeg's scaled size
    sx, sy = image.size[0] / width, image.size[1] / height
    x0, y0, x1, y1 = sample.box
    out = image.resize(sample.size[::-1], Image.Resampling.BILINEAR, box=(x0 * sx, y0 * sy, x1 * sx, y1 * sy))
    if sample.flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(out).transpose(2, 0, 1)


@pytest.mark.skipif(turbo is None, reason="the libjpeg-turbo extension is not built")
def test_a_described_crop_rerendered_by_pillow_matches_the_delivered_pixels(photos: Path) -> None:
    loader = loader_of(photos, num_workers=2, transform=T.train(16))
    ds = fastload.open(photos)
    scales, worst = set(), 0
    for step, (images, keys) in enumerate(delivered(loader)):
        for row, sample in enumerate(loader.describe(step, 0).samples):
            source = ds.raw(sample.index)[1]["jpg"]
            assert sample.key == keys[row] and sample.bytes_read == min(HEAD_BYTES, len(source))  # one header read
            expected = render_with_pillow(source, sample)
            worst = max(worst, int(np.abs(images[row].numpy().astype(int) - expected).max()))
            scales.add(sample.dct_scale)
            # the scale named is the one libjpeg-turbo decodes at
            m = turbo.decode_crop_into(source, sample.box, np.empty((3, 16, 16), np.uint8), 16, 16, sample.flip, 1 << 30)
            assert sample.dct_scale == ("1" if m == 8 else f"1/{8 // m}")
    assert {"1/4", "1/2"} <= scales  # the bound holds at reduced DCT scales too
    print(f"largest difference from Pillow's re-render: {worst} levels")
    assert worst <= PIXEL_BOUND


@pytest.mark.parametrize("streaming", [False, True])
def test_after_an_elastic_resume_each_step_is_described_at_the_topology_it_ran_at(photos: Path, streaming: bool) -> None:
    extra = dict(shuffle_buffer=6) if streaming else {}
    first = [loader_of(photos, batch_size=2, rank=r, world_size=3, **extra) for r in range(3)]
    before = [delivered(loader, stop_after=2) for loader in first]
    state = first[0].state_dict()
    assert state["world_size"] == 3 and state["samples_consumed"] == 12
    second = [loader_of(photos, batch_size=3, rank=r, world_size=2, **extra) for r in range(2)]
    for loader in second:
        loader.load_state_dict(state)
    after = [delivered(loader) for loader in second]
    for rank, loader in enumerate(second):
        for step, (_, keys) in enumerate(before[rank]):  # ran at world size 3, batch size 2
            description = loader.describe(step, 0)
            assert (description.keys, description.world_size, description.batch_size) == (keys, 3, 2)
        for step, (_, keys) in enumerate(after[rank], start=2):
            description = loader.describe(step, 0)
            assert (description.keys, description.world_size, description.batch_size) == (keys, 2, 3)
    wider = loader_of(photos, batch_size=3, rank=3, world_size=4, **extra)  # a rank the old topology did not have
    wider.load_state_dict(state)
    with pytest.raises(ValueError, match="rank 3 did not exist at steps 0.. of epoch 0 .world size 3."):
        wider.describe(0)
    assert wider.describe(2).world_size == 4
    assert loader_of(photos, batch_size=2, rank=0, world_size=3, **extra).describe(0, 1).world_size == 3  # another epoch: one topology


def test_a_torch_dataloader_of_the_loaders_parts_delivers_the_described_batches(photos: Path) -> None:
    loader = loader_of(photos)
    parts = torch.utils.data.DataLoader(loader.dataset, batch_sampler=loader.batch_sampler, collate_fn=loader.collate_fn, num_workers=2)
    batches = [keys for _, _, keys in parts]
    assert batches and all(loader.describe(step).keys == list(keys) for step, keys in enumerate(batches))


def test_hdf5_samples_are_described_from_their_fields(photo_source: Path, tmp_path: Path) -> None:
    h5 = tmp_path / "h5"
    convert(str(photo_source), str(h5), ConvertOptions(source="imagefolder", layout="hdf5", samples_per_shard=7))
    loader = loader_of(h5, num_workers=1)
    batches = delivered(loader)
    assert all(loader.describe(step, 0).keys == keys for step, (_, keys) in enumerate(batches))
    first = loader.describe(0, 0).samples[0]
    assert first.bytes_read == sum(map(len, fastload.open(h5).raw(first.index)[1].values()))  # HDF5: the fields read whole


def test_the_command_reads_a_saved_state(photos: Path, tmp_path: Path) -> None:
    loader = loader_of(photos, batch_size=3, world_size=2, rank=1, seed=9)
    delivered(loader, stop_after=2)
    state = tmp_path / "state.json"
    state.write_text(json.dumps(loader.state_dict()))
    out = run_cli("describe", str(photos), "--state", str(state), "--rank", "1", "--step", "1", "--size", "32", "--json").stdout
    described = json.loads(out)
    assert [s["key"] for s in described["samples"]] == loader.describe(1).keys
    assert (described["world_size"], described["batch_size"], described["epoch"]) == (2, 3, 0)
    text = run_cli("describe", str(photos), "--seed", "9", "--world", "2", "--rank", "1", "--batch-size", "3", "--step", "1", "--size", "32").stdout
    assert all(key in text for key in loader.describe(1).keys) and "crop (" in text


def test_the_dali_backend_delivers_the_described_batches(photos: Path) -> None:
    pytest.importorskip("nvidia.dali")
    loader = loader_of(photos, backend="dali")
    batches = delivered(loader)
    described = [loader.describe(step, 0) for step in range(len(batches))]
    assert [d.keys for d in described] == [keys for _, keys in batches]
    assert all(s.dct_scale is None and s.box is not None for d in described for s in d.samples)  # DALI decodes whole images
    loader.close()


def test_a_loader_over_a_torch_dataset_says_it_cannot_describe() -> None:
    loader = fastload.DataLoader(torch.utils.data.TensorDataset(torch.arange(8)), batch_size=2, num_workers=2)
    assert [len(batch[0]) for batch in loader] == [2, 2, 2, 2]
    with pytest.raises(TypeError, match="over a torch Dataset the dataset's own code decides them"):
        loader.describe(0)


def test_the_command_describes_a_subset(photos: Path, tmp_path: Path) -> None:
    chosen = [3, 20, 7, 11, 0, 18, 25]
    subset = torch.utils.data.Subset(fastload.open(photos), chosen)
    loader = fastload.DataLoader(subset, batch_size=2, shuffle=True, seed=4, transform=T.train(32), return_keys=True)
    delivered_keys = [list(keys) for _, _, keys in loader]
    take = tmp_path / "take.txt"
    take.write_text("\n".join(map(str, chosen)))
    for step, keys in enumerate(delivered_keys):
        out = run_cli("describe", str(photos), "--take", str(take), "--seed", "4", "--batch-size", "2", "--step", str(step),
                      "--size", "32", "--json").stdout
        assert [s["key"] for s in json.loads(out)["samples"]] == keys


def test_a_mixture_is_described_step_for_step_also_after_an_elastic_resume(photos: Path, photo_source: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    convert(str(photo_source), str(again), ConvertOptions(source="imagefolder", samples_per_shard=7))
    mixture = fastload.mix({photos: 2, again: 1}, samples_per_epoch=30)
    loader = loader_of(mixture, num_workers=2)
    for epoch in (0, 1):
        batches = delivered(loader)
        descriptions = [loader.describe(step, epoch) for step in range(len(batches))]
        assert [d.keys for d in descriptions] == [keys for _, keys in batches]
    sample = descriptions[0].samples[0]
    member = int(sample.key.partition("/")[0])
    assert sample.shard.startswith(f"{mixture.members[member].location}/") and sample.box is not None
    first = [loader_of(mixture, rank=r, world_size=2) for r in range(2)]
    before = [delivered(one, stop_after=2) for one in first]
    resumed = loader_of(mixture, batch_size=3, world_size=1, rank=0)
    resumed.load_state_dict(first[0].state_dict())
    after = delivered(resumed)
    assert [resumed.describe(step, 0).keys for step in range(2)] == [keys for _, keys in before[0]]
    assert [resumed.describe(step, 0).keys for step in range(2, 2 + len(after))] == [keys for _, keys in after]
    assert resumed.describe(0, 0).world_size == 2 and resumed.describe(2, 0).batch_size == 3


def test_the_command_takes_exclude_and_class_weights_with_a_saved_state(photos: Path, tmp_path: Path) -> None:
    ds = fastload.open(photos)
    excluded = tmp_path / "exclude.txt"
    excluded.write_text("\n".join(ds.key_of(i) for i in (0, 5, 9)) + "\n")
    weights = {ds.classes[0]: 3, ds.classes[1]: 1, ds.classes[2]: 1}
    loader = loader_of(photos, batch_size=3, seed=2, exclude=excluded, class_weights=weights)
    batches = delivered(loader, stop_after=2)
    state = tmp_path / "state.json"
    state.write_text(json.dumps(loader.state_dict()))
    for step, (_, keys) in enumerate(batches):
        out = run_cli("describe", str(photos), "--state", str(state), "--exclude", str(excluded), "--class-weights",
                      json.dumps(weights), "--step", str(step), "--size", "32", "--json").stdout
        assert [s["key"] for s in json.loads(out)["samples"]] == keys
    refused = run_cli("describe", str(photos), "--state", str(state), "--step", "0", "--size", "32", check=False)
    assert refused.returncode != 0 and "another dataset" in refused.stderr  # without them: not the run's order
