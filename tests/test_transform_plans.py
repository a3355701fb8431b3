"""Transform specs at their edges and plans of chained specs (the mutation pass of transforms.py
found these unpinned): every validation bound on both sides, the fixed output size of a chain,
crop boxes composed through Resize and CenterCrop, torchvision's ten tries, flips that cancel,
the DCT scale asked for, masks and boxes through a plan, and the batch-level dtype conversions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastload import transforms as T
from fastload.transforms import (
    Plan,
    apply_plan,
    dct_min_size,
    map_boxes,
    nearest_into,
    output_size,
    plan,
    random_resized_crop_params,
    scaled_box,
)


class CountingDraws:
    """A numpy Generator that counts the draws a plan takes (torchvision draws 2 uniforms a try)."""

    def __init__(self, seed: int) -> None:
        self.rng, self.uniforms, self.integers_drawn = np.random.default_rng(seed), 0, 0

    def random(self) -> float:
        return float(self.rng.random())

    def uniform(self, low: float, high: float) -> float:
        self.uniforms += 1
        return float(self.rng.uniform(low, high))

    def integers(self, low: int, high: int) -> int:
        self.integers_drawn += 1
        return int(self.rng.integers(low, high))


@pytest.mark.parametrize(
    ("make", "valid"),
    [
        (lambda: T.RandomResizedCrop(8, scale=(1.0, 1.0), ratio=(1.0, 1.0)), True),
        (lambda: T.RandomResizedCrop(8, scale=(0.0, 1.0)), False),
        (lambda: T.RandomResizedCrop(8, scale=(0.5, 1.01)), False),
        (lambda: T.RandomResizedCrop(8, ratio=(0.0, 1.0)), False),
        (lambda: T.RandomResizedCrop(8, ratio=(2.0, 1.0)), False),
        (lambda: T.RandomResizedCrop((8, 8, 3)), False),
        (lambda: T.RandomHorizontalFlip(0.0), True),
        (lambda: T.RandomHorizontalFlip(1.0), True),
        (lambda: T.RandomHorizontalFlip(-0.01), False),
        (lambda: T.RandomHorizontalFlip(1.01), False),
        (lambda: T.Normalize(std=(0.2, 0.0, 0.2)), False),
        (lambda: T.Normalize(mean=(0.5, 0.5), std=(0.2, 0.2, 0.2)), False),
        (lambda: T.Normalize(dtype="uint8"), False),
        (lambda: T.Normalize(dtype="bfloat16"), True),
        (lambda: T.ToDtype("uint8"), True),
        (lambda: T.ToDtype("int32"), False),
        (lambda: T.CenterCrop((4, 6, 1)), False),
    ],
)
def test_spec_bounds_are_checked_on_both_sides(make, valid: bool) -> None:  # type: ignore[no-untyped-def]
    if valid:
        make()
    else:
        with pytest.raises(ValueError):
            make()


def test_normalize_names_the_dtypes_it_makes() -> None:
    with pytest.raises(ValueError, match=r"one of \('float32', 'float16', 'bfloat16'\), got 'uint8'"):
        T.Normalize(dtype="uint8")


def test_a_chain_has_a_fixed_output_size_only_when_its_last_geometry_fixes_one() -> None:
    assert output_size(T.train(32)) == (32, 32)
    assert output_size(T.val(16, normalize=True)) == (16, 16)
    assert output_size([T.Resize(20)]) is None
    assert output_size([T.Resize((20, 30)), T.RandomHorizontalFlip()]) == (20, 30)
    assert output_size([T.CenterCrop(8), T.Resize(12)]) is None
    assert output_size([T.Resize(12), T.CenterCrop((8, 10))]) == (8, 10)
    assert output_size([T.RandomHorizontalFlip()]) is None


def test_per_sample_specs_must_come_before_batch_level_ones() -> None:
    assert T.validate([T.CenterCrop(4), T.Normalize(), T.ToDtype("float16")])[1:] == (T.Normalize(), T.ToDtype("float16"))
    assert T.validate(None) == ()
    with pytest.raises(ValueError, match="RandomHorizontalFlip must come before Normalize/ToDtype"):
        T.validate([T.ToDtype(), T.RandomHorizontalFlip()])


def test_a_crop_after_resize_and_centre_crop_is_a_box_in_source_pixels() -> None:
    """Resize(50) of 100x200 is 50x100 (each output pixel 2 source pixels); CenterCrop(40) of that
    starts at (30, 5), i.e. source (60, 10); the random crop's offsets then scale by 2 too."""
    specs = [T.Resize(50), T.CenterCrop(40), T.RandomResizedCrop(20, scale=(0.2, 0.5))]
    for seed in range(20):
        top, left, h, w = random_resized_crop_params(40, 40, (0.2, 0.5), (3 / 4, 4 / 3), np.random.default_rng(seed))
        got = plan(specs, 100, 200, np.random.default_rng(seed))
        assert got.box == (60 + 2 * left, 10 + 2 * top, 60 + 2 * (left + w), 10 + 2 * (top + h)) and got.size == (20, 20)
    assert plan([T.Resize(50), T.CenterCrop(40)], 100, 200, np.random.default_rng(0)).box == (60, 10, 140, 90)
    assert plan([T.Resize(50), T.CenterCrop((50, 100))], 100, 200, np.random.default_rng(0)).box == (0, 0, 200, 100)
    assert plan([T.CenterCrop(40), T.CenterCrop(20)], 100, 200, np.random.default_rng(0)).box == (90, 40, 110, 60)


def test_resize_scales_the_long_side_of_portrait_and_landscape_images() -> None:
    assert plan([T.Resize(10)], 45, 20, np.random.default_rng(0)).size == (22, 10)
    assert plan([T.Resize(10)], 20, 45, np.random.default_rng(0)).size == (10, 22)
    assert plan([T.Resize(10)], 30, 30, np.random.default_rng(0)).size == (10, 10)
    assert plan([T.Resize((12, 7))], 45, 20, np.random.default_rng(0)).size == (12, 7)


def test_crops_of_tiny_images_are_never_empty_and_reach_one_pixel() -> None:
    sizes = {random_resized_crop_params(2, 3, (0.08, 1.0), (3 / 4, 4 / 3), np.random.default_rng(i))[2:] for i in range(3000)}
    assert min(h for h, _ in sizes) == 1 and min(w for _, w in sizes) == 1
    assert all(1 <= h <= 2 and 1 <= w <= 3 for h, w in sizes)
    for height, width in ((1, 2), (2, 1), (1, 1)):  # a small area draws a side that rounds to 0: never taken
        crops = [random_resized_crop_params(height, width, (0.08, 1.0), (3 / 4, 4 / 3), np.random.default_rng(i)) for i in range(500)]
        assert all(h >= 1 and w >= 1 and top + h <= height and left + w <= width for top, left, h, w in crops)


def test_specs_and_plans_are_immutable_values() -> None:
    """Specs travel to worker processes and key the loader's cached orders: equal ones hash alike."""
    specs = (*T.train(32, normalize=True), T.Resize(40), T.CenterCrop(32), T.ToDtype("float16"))
    again = (*T.train(32, normalize=True), T.Resize(40), T.CenterCrop(32), T.ToDtype("float16"))
    assert specs == again and hash(specs) == hash(again)
    planned = plan(T.train(8), 50, 60, np.random.default_rng(1))
    assert hash(planned) == hash(plan(T.train(8), 50, 60, np.random.default_rng(1)))
    for value, name in [*((spec, next(iter(vars(spec)))) for spec in specs), (planned, "flip")]:
        with pytest.raises(AttributeError):
            setattr(value, name, None)


def test_the_presets_default_to_imagenet_at_224() -> None:
    assert T.train() == (T.RandomResizedCrop(224), T.RandomHorizontalFlip(0.5))
    assert T.val() == (T.Resize(256), T.CenterCrop(224))
    assert T.val(224, normalize=True)[-1] == T.Normalize() and T.train(normalize=True)[-1] == T.Normalize()


def test_a_centre_crop_larger_than_its_input_on_either_side_is_refused() -> None:
    for size in ((51, 10), (10, 101), (60, 120)):
        with pytest.raises(ValueError, match=r"is larger than its 50x100 input"):
            plan([T.Resize(50), T.CenterCrop(size)], 100, 200, np.random.default_rng(0))


def test_random_resized_crop_takes_ten_tries_then_the_centre() -> None:
    """A 1 x 1000 strip fits no crop: exactly ten tries (twenty uniform draws), then the centre crop
    at the nearest allowed ratio; a crop of the whole (square) image fits at the first try."""
    draws = CountingDraws(0)
    assert random_resized_crop_params(1, 1000, (0.08, 1.0), (3 / 4, 4 / 3), draws) == (0, 499, 1, 1)
    assert (draws.uniforms, draws.integers_drawn) == (20, 0)
    draws = CountingDraws(0)
    assert random_resized_crop_params(40, 40, (1.0, 1.0), (1.0, 1.0), draws) == (0, 0, 40, 40)
    assert (draws.uniforms, draws.integers_drawn) == (2, 2)
    draws = CountingDraws(0)  # a crop as wide as a 40 x 20 image, placed anywhere from top 0 to 20
    tops = {random_resized_crop_params(40, 20, (0.5, 0.5), (1.0, 1.0), draws)[0] for _ in range(400)}
    assert tops == set(range(21)) and draws.uniforms == 800


def test_two_flips_cancel() -> None:
    twice = (T.RandomResizedCrop(8), T.RandomHorizontalFlip(1.0), T.RandomHorizontalFlip(1.0))
    assert not any(plan(twice, 50, 60, np.random.default_rng(i)).flip for i in range(50))


def test_the_dct_scale_asked_for_keeps_the_output_resolution() -> None:
    """A 600 x 800 image to 75 x 100 needs only an eighth of its pixels each way; an output larger
    than the crop needs the full-size decode (0, 0)."""
    assert dct_min_size(Plan((0.0, 0.0, 800.0, 600.0), (75, 100), False), 600, 800) == (75, 100)
    assert dct_min_size(Plan((0.0, 0.0, 800.0, 600.0), (76, 100), False), 600, 800) == (76, 102)
    assert dct_min_size(Plan((100.0, 0.0, 300.0, 600.0), (300, 50), False), 600, 800) == (300, 400)
    assert dct_min_size(Plan((100.0, 200.0, 300.0, 400.0), (50, 100), False), 600, 800) == (300, 400)  # the width decides
    assert dct_min_size(Plan((100.0, 200.0, 300.0, 400.0), (100, 50), False), 600, 800) == (300, 400)  # the height decides
    assert dct_min_size(Plan((0.0, 0.0, 80.0, 60.0), (120, 160), False), 600, 800) == (0, 0)
    assert dct_min_size(Plan((0.0, 0.0, 800.0, 600.0), (900, 1200), False), 600, 800) == (0, 0)


def test_a_mask_takes_the_value_under_each_output_pixel_centre() -> None:
    values = np.arange(6 * 8, dtype=np.uint8).reshape(6, 8)
    out = np.zeros((6, 8), np.uint8)
    nearest_into(values, Plan((0.0, 0.0, 8.0, 6.0), (6, 8), False), out)
    assert np.array_equal(out, values)
    nearest_into(values, Plan((0.0, 0.0, 8.0, 6.0), (6, 8), True), out)
    assert np.array_equal(out, values[:, ::-1])
    half = np.zeros((3, 2), np.uint8)
    nearest_into(values, Plan((4.0, 3.0, 8.0, 6.0), (3, 2), False), half)  # the bottom-right quarter, halved across
    assert np.array_equal(half, values[3:6, [5, 7]])


def test_boxes_follow_the_crop_scale_and_flip_and_empty_ones_are_dropped() -> None:
    crop = Plan((10.0, 20.0, 50.0, 60.0), (20, 20), False)  # 40 x 40 source pixels to 20 x 20
    boxes = np.array([[10, 20, 30, 40], [0, 0, 20, 30], [60, 60, 70, 70], [40, 50, 90, 90]], np.float32)
    assert map_boxes(boxes, crop).tolist() == [[0, 0, 10, 10], [0, 0, 5, 5], [15, 15, 20, 20]]
    flipped = map_boxes(boxes, Plan(crop.box, crop.size, True))
    assert flipped.tolist() == [[10, 0, 20, 10], [15, 0, 20, 5], [0, 15, 5, 20]]
    assert map_boxes(np.zeros((0, 4), np.float32), crop).shape == (0, 4)
    wide = Plan((10.0, 20.0, 50.0, 60.0), (20, 40), True)  # 40 x 40 source pixels to 20 high, 40 wide, flipped
    assert map_boxes(boxes[:1], wide).tolist() == [[20, 0, 40, 10]]  # x mirrored about the width (40), y as it was


def test_batch_dtypes_scale_only_uint8_to_floats() -> None:
    batch = torch.tensor([[0, 51, 255]], dtype=torch.uint8)
    assert T.batch_transform([T.CenterCrop(4)]) is None
    assert torch.equal(T.batch_transform([T.ToDtype("float16")])(batch), torch.tensor([[0.0, 0.2, 1.0]], dtype=torch.float16))
    assert torch.equal(T.batch_transform([T.ToDtype("float32", scale=False)])(batch), torch.tensor([[0.0, 51.0, 255.0]]))
    assert torch.equal(T.batch_transform([T.ToDtype("uint8")])(batch), batch)
    scaled_twice = T.batch_transform([T.ToDtype("float32"), T.ToDtype("float16")])(batch)  # a float batch is not rescaled
    assert torch.equal(scaled_twice, torch.tensor([[0.0, 0.2, 1.0]], dtype=torch.float16))
    normalized = T.batch_transform([T.Normalize(mean=(0.2,), std=(0.5,), dtype="float32")])(batch.view(1, 1, 1, 3))
    assert torch.allclose(normalized, ((batch.float() / 255 - 0.2) / 0.5).view(1, 1, 1, 3))


def gradient(height: int, width: int) -> np.ndarray:
    """A smooth RGB image: resampling it at another scale changes values by a level or two."""
    rows, cols = np.mgrid[0:height, 0:width]
    return np.stack([rows * 255 // height, cols * 255 // width, (rows + cols) * 255 // (height + width)], axis=-1).astype(np.uint8)


def test_a_plan_applied_to_a_dct_scaled_decode_crops_the_same_region() -> None:
    pixels, half = gradient(600, 800), gradient(300, 400)
    crop = Plan((100.0, 200.0, 300.0, 400.0), (50, 50), False)
    assert scaled_box(crop, half, 600, 800) == (50.0, 100.0, 150.0, 200.0)
    from_full, from_half = apply_plan(pixels, crop, 600, 800), apply_plan(half, crop, 600, 800)
    assert from_full.shape == from_half.shape == (50, 50, 3)
    assert np.abs(from_full.astype(int) - from_half.astype(int)).max() <= 3


def test_a_whole_image_plan_resizes_or_returns_the_pixels_as_they_are() -> None:
    pixels = gradient(60, 80)
    whole = (0.0, 0.0, 80.0, 60.0)
    smaller = apply_plan(pixels, Plan(whole, (30, 40), False), 60, 80)
    assert smaller.shape == (30, 40, 3) and np.abs(smaller.astype(int) - pixels[::2, ::2].astype(int)).max() <= 4
    same = apply_plan(pixels, Plan(whole, (60, 80), False), 60, 80)
    assert same is pixels  # nothing to resample: no copy
    mirrored = apply_plan(pixels, Plan(whole, (60, 80), True), 60, 80)
    assert np.shares_memory(mirrored, pixels) and np.array_equal(mirrored, pixels[:, ::-1])
    gray = pixels[:, :, :1]
    assert apply_plan(gray, Plan(whole, (30, 40), True), 60, 80).shape == (30, 40, 1)


def test_a_crop_resized_back_to_the_image_size_is_a_zoom() -> None:
    pixels = gradient(60, 80)
    zoom = apply_plan(pixels, Plan((20.0, 15.0, 60.0, 45.0), (60, 80), False), 60, 80)
    assert zoom.shape == pixels.shape
    from PIL import Image

    expected = np.asarray(Image.fromarray(pixels[15:45, 20:60]).resize((80, 60), Image.Resampling.BILINEAR))
    assert np.abs(zoom.astype(int) - expected.astype(int)).max() <= 2
    assert np.abs(zoom.astype(int) - pixels.astype(int)).max() > 30
