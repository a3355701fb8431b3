"""backend="dali" with fields=: DALI decodes the primary image, every other field (labels, text,
json, arrays, bytes, boxes, masks) is made in the feed with the same plan and travels beside it,
so a batch equals the CPU backend's, field for field, in order and after a mid-epoch resume."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload import transforms as T
from fastload.errors import SampleError
from tests.conftest import jpeg_bytes, run_cli, small_photo
from tests.test_fields import QUADRANT_COLOURS, away_from_boundaries, nested, npy, quadrant_sample, write_tars

pytest.importorskip("nvidia.dali")

FIELDS = {"jpg": "image", "cls": "label", "txt": "text", "json": "json", "seg.png": "mask", "boxes.json": "boxes",
          "emb.npy": "array", "tokens.npy": "array", "raw.bin": "bytes"}


def rich_sample(i: int, rng: np.random.Generator) -> dict:
    """A quadrant image and its mask, with a label, a caption, metadata, boxes, a fixed-shape and a
    ragged array and opaque bytes."""
    sample = quadrant_sample(i, rng)
    with Image.open(io.BytesIO(sample["jpg"])) as im:
        height, width = im.height, im.width
    sample.update({
        "cls": str(i % 5).encode(), "txt": f"caption {i} ✓", "json": {"i": i, "tags": ["a", "b"][: i % 3]},
        "boxes.json": json.dumps([[2, 3, width - 5, height - 4], [0, 0, 4, 4]]).encode(),
        "emb.npy": npy(rng.standard_normal(6).astype(np.float32)), "tokens.npy": npy(np.arange(i % 4 + 1, dtype=np.int16)),
        "raw.bin": bytes([i, 0, 255, i]),
    })
    return sample


@pytest.fixture(scope="module")
def rich_tars(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(5)
    root = write_tars(tmp_path_factory.mktemp("dali-fields"), [rich_sample(i, rng) for i in range(22)], per_tar=6)
    run_cli("index", str(root))
    return root


def by_key(batches: list[tuple], names: list[str]) -> dict[str, dict[str, object]]:
    """Each sample's fields (tensors as numpy) by key, from batches ending with their keys."""
    out = {}
    for batch in batches:
        *values, keys = batch
        for j, key in enumerate(keys):
            out[key] = {name: (v[j].cpu().numpy() if isinstance(v[j], torch.Tensor) else v[j]) for name, v in zip(names, values, strict=True)}
    return out


def assert_same_fields(dali: dict, cpu: dict) -> None:
    """Every field but the image equal, key for key; the images as close as two decoders are."""
    assert list(dali) == list(cpu)
    for key in cpu:
        for name, want in cpu[key].items():
            have = dali[key][name]
            if name == "jpg":
                assert have.shape == want.shape and np.abs(have.astype(int) - want.astype(int)).mean() < 3, key
            elif isinstance(want, np.ndarray):
                assert have.dtype == want.dtype and np.array_equal(have, want), (key, name)
            else:
                assert type(have) is type(want) and have == want, (key, name)


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "parallel-source"])
def test_dali_fields_equal_the_cpu_backend_and_resume(rich_tars: Path, workers: int) -> None:
    names = list(FIELDS)
    kwargs = dict(batch_size=4, shuffle=True, seed=3, transform=(T.RandomResizedCrop(32, scale=(0.3, 1.0)), T.RandomHorizontalFlip()),
                  fields=FIELDS, return_keys=True, num_workers=workers)
    with fastload.DataLoader(rich_tars, backend="cpu", **kwargs) as loader:
        cpu = by_key(list(loader), names)
    with fastload.DataLoader(rich_tars, backend="dali", **kwargs) as loader:
        assert loader.backend == "dali-cpu"
        dali = by_key(list(loader), names)
        assert loader.stats.redone_on_cpu == 0
    assert len(cpu) == 22
    assert_same_fields(dali, cpu)
    first = next(iter(cpu.values()))
    assert first["seg.png"].shape == (32, 32) and first["emb.npy"].shape == (6,) and isinstance(first["txt"], str)
    with fastload.DataLoader(rich_tars, backend="dali", **kwargs) as loader:
        before = by_key(list(itertools.islice(iter(loader), 2)), names)
        state = loader.state_dict()
    with fastload.DataLoader(rich_tars, backend="dali", **kwargs) as loader:
        loader.load_state_dict(state)  # DALI's feed starts mid-epoch
        after = by_key(list(loader), names)
    assert len(before) == 8
    assert_same_fields({**before, **after}, cpu)


def test_hybrid_fields_equal_the_cpu_backend(rich_tars: Path) -> None:
    """The hybrid joins DALI's part and the CPU workers' part field by field: stacked ones (labels,
    masks, the fixed-shape array) row by row, listed ones (text, json, boxes, ragged arrays) in order."""
    names = list(FIELDS)
    kwargs = dict(batch_size=8, shuffle=True, seed=4, transform=(T.RandomResizedCrop(32, scale=(0.3, 1.0)), T.RandomHorizontalFlip()),
                  fields=FIELDS, return_keys=True, num_workers=2)
    with fastload.DataLoader(rich_tars, backend="cpu", **kwargs) as loader:
        cpu = by_key(list(loader), names)
    with fastload.DataLoader(rich_tars, backend="hybrid", **kwargs) as loader:
        assert loader.backend == "hybrid-cpu"
        hybrid = by_key(list(loader), names)
    assert len(cpu) == 22
    assert_same_fields(hybrid, cpu)


def test_dali_masks_stay_aligned_with_the_image(rich_tars: Path) -> None:
    transform = (T.RandomResizedCrop(32, scale=(0.3, 1.0)), T.RandomHorizontalFlip())
    checked = flipped = 0
    for seed in range(2):
        with fastload.DataLoader(rich_tars, backend="dali", batch_size=8, transform=transform, shuffle=True, seed=seed,
                                 fields={"jpg": "image", "seg.png": "mask"}, num_workers=2) as loader:
            for images, masks in loader:
                assert masks.dtype == torch.uint8 and masks.shape == (len(images), 32, 32)
                assert set(torch.unique(masks).tolist()) <= {0, 1, 2, 3}  # nearest neighbour: class ids only
                for image, mask in zip(images.numpy(), masks.numpy(), strict=True):
                    inner = away_from_boundaries(mask, 2)
                    assert np.abs(image.transpose(1, 2, 0)[inner].astype(int) - QUADRANT_COLOURS[mask[inner]]).max() < 60
                    checked += int(inner.sum())
                    flipped += int(mask[:, 0].max() > mask[:, -1].max())
    assert checked > 22 * 2 * 32 * 32 * 0.5 and flipped > 0


def test_dali_field_errors_name_the_key_and_field_or_are_skipped(tmp_path: Path) -> None:
    samples = [{"__key__": f"s{i:03d}", "jpg": jpeg_bytes(small_photo(i, size=(32, 40))), "json": json.dumps({"i": i}).encode()}
               for i in range(9)]
    samples[4]["json"] = b"{'not': json,"
    root = write_tars(tmp_path / "bad", samples, per_tar=5)
    run_cli("index", str(root))
    kwargs = dict(batch_size=3, backend="dali", transform=T.val(24), fields=["jpg", "json"], num_workers=2)
    with fastload.DataLoader(root, **kwargs) as loader, pytest.raises(SampleError) as caught:
        list(loader)
    assert caught.value.where.endswith(":s004") and "field json: bad JSON" in caught.value.reason
    with fastload.DataLoader(root, on_error="skip", return_keys=True, **kwargs) as loader:
        got = [(key, meta) for _, metas, keys in loader for meta, key in zip(metas, keys, strict=True)]
        assert len(loader.stats.skipped) == 1
    assert [k for k, _ in got] == [f"s{i:03d}" for i in (0, 1, 2, 3, 5, 5, 6, 7, 8)]  # replaced by the next readable one
    assert all(meta == {"i": int(key[1:])} for key, meta in got)


def test_dali_json_nested_too_deep_is_named_or_skipped_never_a_hang(tmp_path: Path) -> None:
    """The feed parses fields in DALI's worker processes and hands them back as bytes: a JSON field
    too deep to travel is a SampleError there too (with two feed workers and inline)."""
    samples = [{"__key__": f"s{i:03d}", "jpg": jpeg_bytes(small_photo(i, size=(32, 40))), "json": json.dumps({"i": i}).encode()}
               for i in range(6)]
    samples[3]["json"] = nested(700)
    root = write_tars(tmp_path / "deep", samples, per_tar=6)
    run_cli("index", str(root))
    for workers in (0, 2):
        kwargs = dict(batch_size=3, backend="dali", transform=T.val(24), fields=["jpg", "json"], num_workers=workers, timeout=60)
        with fastload.DataLoader(root, **kwargs) as loader, pytest.raises(SampleError) as caught:
            list(loader)
        assert caught.value.where.endswith(":s003") and "nested deeper than" in caught.value.reason
        with fastload.DataLoader(root, on_error="skip", return_keys=True, **kwargs) as loader:
            keys = [key for _, _, keys in loader for key in keys]
            assert [entry["key"] for entry in loader.stats.skipped.entries] == ["s003"]
        assert keys == ["s000", "s001", "s002", "s004", "s004", "s005"]


def test_dali_refuses_map_and_imageless_fields(rich_tars: Path) -> None:
    with pytest.raises(ValueError, match="map= cannot see it"):
        fastload.DataLoader(rich_tars, batch_size=4, transform=T.val(24), backend="dali", fields=["jpg", "txt"], map=lambda s, rng: s)
    with pytest.raises(ValueError, match="the fields asked for hold none"):
        fastload.DataLoader(rich_tars, batch_size=4, backend="dali", fields=["txt", "cls"])
