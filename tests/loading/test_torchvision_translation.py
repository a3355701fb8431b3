"""torchvision pipelines translated into fastload specs; the steps that are not run by torchvision in
the workers. Needs torchvision, which loads only beside its own torch build: run by
scripts/test_torchvision.sh in a venv of its own (the default venv skips this file)."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
from torchvision import transforms as v1  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fastload.loading.torchvision_translation import TorchvisionSteps, is_torchvision_pipeline, steps_as_map, translate  # noqa: E402

pytestmark = pytest.mark.torchvision
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def test_v1_and_v2_imagenet_recipes_translate_whole() -> None:
    want = (T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.Normalize(MEAN, STD))
    recipe_v1 = v1.Compose([v1.RandomResizedCrop(224), v1.RandomHorizontalFlip(), v1.ToTensor(), v1.Normalize(MEAN, STD)])
    recipe_v2 = v2.Compose([v2.ToImage(), v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                            v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    for recipe in (recipe_v1, recipe_v2):
        assert is_torchvision_pipeline(recipe)
        got = translate(recipe)
        assert got.specs == want and got.rest is None
    val = translate(v2.Compose([v2.PILToTensor(), v2.Resize(256), v2.CenterCrop(224), v2.ToDtype(torch.float16, scale=True)]))
    assert val.specs == (T.Resize(256), T.CenterCrop(224), T.ToDtype("float16", True)) and val.rest is None
    assert translate(v1.Resize((100, 50))).specs == (T.Resize((100, 50)),)
    assert translate(v2.RandomResizedCrop(160, scale=(0.35, 1), ratio=(0.5, 2.0))).specs == (
        T.RandomResizedCrop(160, (0.35, 1), (0.5, 2.0)),)
    assert not is_torchvision_pipeline(T.train(224)) and not is_torchvision_pipeline(lambda x: x)
    steps = [v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    assert is_torchvision_pipeline(steps) and translate(steps).specs == want  # a list, as Compose takes it
    assert not is_torchvision_pipeline([]) and not is_torchvision_pipeline([T.Resize(8)])
    with pytest.raises(TypeError, match=r"mixes torchvision steps \(RandomHorizontalFlip\) with fastload specs"):
        is_torchvision_pipeline([v2.RandomHorizontalFlip(), T.Resize(8)])


def test_untranslated_steps_and_all_after_them_stay_with_torchvision(caplog: pytest.LogCaptureFixture) -> None:
    jitter = v2.ColorJitter(0.4, 0.4, 0.4)
    recipe = v2.Compose([v2.RandomResizedCrop(224), jitter, v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True)])
    with caplog.at_level(logging.WARNING, logger="fastload"):
        got = translate(recipe)
    assert got.specs == (T.RandomResizedCrop(224), T.ToDtype("float32", True))
    assert got.rest is not None and got.rest.v2 and [type(s).__name__ for s in got.rest.steps] == ["ColorJitter", "RandomHorizontalFlip"]
    assert "ColorJitter, RandomHorizontalFlip run by torchvision" in caplog.text
    nearest = translate(v1.Compose([v1.Resize(64, interpolation=v1.InterpolationMode.NEAREST), v1.CenterCrop(32)]))
    assert nearest.specs == () and len(nearest.rest.steps) == 2 and not nearest.rest.v2
    # bicubic is stood in for by fastload's antialiased resample (as for bilinear); unscaled floats normalize on 0..255
    bicubic = translate(v2.Compose([v2.Resize(64, interpolation=v2.InterpolationMode.BICUBIC),
                                    v2.ToDtype(torch.float32), v2.Normalize((127.5,), (63.75,))]))
    assert bicubic.specs == (T.Resize(64), T.Normalize((0.5,), (0.25,), "float32"))


def test_untranslatable_value_steps_are_refused_with_the_fix() -> None:
    with pytest.raises(TypeError, match="Normalize needs float images"):
        translate(v2.Compose([v2.Resize(64), v2.Normalize(MEAN, STD)]))
    with pytest.raises(TypeError, match="one torch dtype"):
        translate(v2.Compose([v2.ToDtype({v2.PILToTensor: torch.float32}, scale=True)]))  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="nested"):
        translate(v2.Compose([v2.Compose([v2.Resize(64)])]))


def _sample(seed: int = 0) -> dict:
    """A sample as the loader's map sees it: the image CHW uint8, the mask HW uint8."""
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (3, 40, 60), dtype=np.uint8)
    mask = np.zeros((40, 60), dtype=np.uint8)
    mask[:, :20] = 7  # the left third is class 7
    return {"jpg": image, "seg.png": mask, "cls": 3}


def test_torchvision_steps_move_masks_with_geometry_and_replay_from_the_sample_generator() -> None:
    rest = translate(v2.Compose([v2.ColorJitter(0.5, 0.5, 0.5), v2.RandomHorizontalFlip(p=1.0)])).rest
    assert rest is not None
    fn = pickle.loads(pickle.dumps(steps_as_map(rest, "jpg", ["seg.png"])))  # it travels to the workers
    sample = _sample()
    out = fn(sample, np.random.default_rng(5))
    assert out["cls"] == 3 and out["jpg"].shape == (3, 40, 60) and out["jpg"].dtype == np.uint8
    assert out["seg.png"].shape == (40, 60)
    assert (out["seg.png"][:, -20:] == 7).all() and (out["seg.png"][:, :-20] == 0).all()  # flipped, values kept
    assert not np.array_equal(out["jpg"], sample["jpg"][:, :, ::-1])  # jittered, not only flipped
    again = fn(_sample(), np.random.default_rng(5))
    assert np.array_equal(again["jpg"], out["jpg"])
    other = fn(_sample(), np.random.default_rng(6))
    assert not np.array_equal(other["jpg"], out["jpg"])
    before = torch.random.get_rng_state()
    fn(_sample(), np.random.default_rng(7))
    assert torch.equal(torch.random.get_rng_state(), before)  # inline, the caller's torch generator is left alone


def test_v1_steps_see_the_image_only() -> None:
    rest = TorchvisionSteps((v1.RandomHorizontalFlip(p=1.0),), v2=False)
    sample = _sample()
    out = rest(sample, np.random.default_rng(0), "jpg", ())
    assert np.array_equal(out["jpg"], sample["jpg"][:, :, ::-1]) and out["seg.png"] is sample["seg.png"]


def test_steps_that_change_the_dtype_are_named() -> None:
    rest = TorchvisionSteps((v2.ToDtype(torch.float32, scale=True),), v2=True)
    with pytest.raises(TypeError, match="keep field 'jpg' uint8"):
        rest(_sample(), np.random.default_rng(0), "jpg", ())


def test_translated_val_pipeline_matches_torchvision_on_the_same_images(image_folder: Path, tmp_path: Path) -> None:
    """The deterministic recipe through fastload's fast path vs torchvision on the same decoded images."""
    from fastload.converters import ConvertOptions, convert

    convert(str(image_folder), str(tmp_path / "wds"), ConvertOptions(source="imagefolder", samples_per_shard=8))
    recipe = v2.Compose([v2.ToImage(), v2.Resize(32), v2.CenterCrop(32)])
    ds = fastload.open(tmp_path / "wds")
    loader = fastload.DataLoader(ds, batch_size=len(ds), transform=translate(recipe).specs, num_workers=0)
    images, _ = next(iter(loader))
    errors = []
    for i, image in enumerate(images):
        theirs = recipe(torch.from_numpy(ds[i]["image"]).permute(2, 0, 1))
        assert image.shape == theirs.shape == (3, 32, 32)
        errors.append(float((image.float() - theirs.float()).abs().mean()))
    # the same pixels up to resampling: ~0.1 levels typically; fine stripes, downscaled in the DCT, up to ~5
    assert np.median(errors) < 0.5 and max(errors) < 8, errors
