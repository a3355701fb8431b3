"""Transforms as data: frozen dataclass specs with torchvision's semantics, and their CPU
implementation.

Geometric specs (RandomResizedCrop, Resize, CenterCrop) compose into one crop box in source
coordinates plus an output size, decided from the image header before decoding. The decoder can
then scale by 1/8, 1/4 or 1/2 in the DCT (libjpeg-turbo) when the output needs fewer pixels, and one
antialiased bilinear resample produces the output. Pixel specs (flip) follow; value specs
(Normalize, ToDtype) run on whole batches, on the target device.

Differences from torchvision, by design: the crop is resampled from a DCT-downscaled decode when
that still has at least the output's resolution (visually equivalent, slightly different
values); CenterCrop larger than its input is an error instead of zero padding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DTYPES = ("float32", "float16", "bfloat16", "uint8")


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return (size, size)
    if len(size) != 2:
        raise ValueError(f"size must be an int or (height, width), got {size!r}")
    return (int(size[0]), int(size[1]))


CROP_SCALE = (0.08, 1.0)  # RandomResizedCrop's defaults, as torchvision's
CROP_RATIO = (3 / 4, 4 / 3)


@dataclass(frozen=True, init=False)
class RandomResizedCrop:
    """Crop a random area (``scale`` of the image) and aspect (``ratio``), resize to ``size``."""

    size: tuple[int, int]  # given as an int or (height, width)
    scale: tuple[float, float] = CROP_SCALE
    ratio: tuple[float, float] = CROP_RATIO

    def __init__(self, size: int | tuple[int, int], scale: tuple[float, float] = CROP_SCALE,
                 ratio: tuple[float, float] = CROP_RATIO) -> None:
        object.__setattr__(self, "size", _pair(size))
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "ratio", ratio)
        if not (0 < self.scale[0] <= self.scale[1] <= 1):
            raise ValueError(f"scale must satisfy 0 < min <= max <= 1, got {self.scale}")
        if not (0 < self.ratio[0] <= self.ratio[1]):
            raise ValueError(f"ratio must satisfy 0 < min <= max, got {self.ratio}")


@dataclass(frozen=True)
class Resize:
    """Resize so the shorter side is ``size`` (an int), or to exactly (height, width)."""

    size: int | tuple[int, int]

    def __post_init__(self) -> None:
        if not isinstance(self.size, int):
            object.__setattr__(self, "size", _pair(self.size))


@dataclass(frozen=True, init=False)
class CenterCrop:
    """Crop the centre ``size`` (int or (height, width))."""

    size: tuple[int, int]  # given as an int or (height, width)

    def __init__(self, size: int | tuple[int, int]) -> None:
        object.__setattr__(self, "size", _pair(size))


@dataclass(frozen=True)
class RandomHorizontalFlip:
    """Mirror left-right with probability ``p``."""

    p: float = 0.5

    def __post_init__(self) -> None:
        if not 0 <= self.p <= 1:
            raise ValueError(f"p must be in [0, 1], got {self.p}")


@dataclass(frozen=True)
class Normalize:
    """``(x / 255 - mean) / std`` per channel (mean and std on torchvision's 0..1 scale);
    the batch becomes ``dtype`` (float32, float16 or bfloat16)."""

    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))
        if len(self.mean) != len(self.std) or any(s <= 0 for s in self.std):
            raise ValueError("mean and std need the same length and std > 0")
        if self.dtype not in DTYPES[:3]:
            raise ValueError(f"Normalize dtype must be one of {DTYPES[:3]}, got {self.dtype!r}")


@dataclass(frozen=True)
class ToDtype:
    """Convert the batch to ``dtype``; with ``scale`` uint8 0..255 becomes 0..1."""

    dtype: str = "float32"
    scale: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")


Transform = RandomResizedCrop | Resize | CenterCrop | RandomHorizontalFlip | Normalize | ToDtype
GEOMETRIC = (RandomResizedCrop, Resize, CenterCrop)
BATCH_LEVEL = (Normalize, ToDtype)


def train(size: int = 224, normalize: bool = False) -> tuple[Transform, ...]:
    """The usual ImageNet training recipe: RandomResizedCrop(size) and a random flip."""
    specs: tuple[Transform, ...] = (RandomResizedCrop(size), RandomHorizontalFlip())
    return specs + ((Normalize(),) if normalize else ())


def val(size: int = 224, normalize: bool = False) -> tuple[Transform, ...]:
    """The usual ImageNet evaluation recipe: resize the short side to size/0.875, centre crop."""
    specs: tuple[Transform, ...] = (Resize(int(size / 0.875)), CenterCrop(size))
    return specs + ((Normalize(),) if normalize else ())


def validate(transform: Sequence[Transform] | Transform | None) -> tuple[Transform, ...]:
    """Check a transform list (or one spec): known specs, per-sample ones before batch-level ones."""
    specs: tuple = (transform,) if isinstance(transform, (*GEOMETRIC, RandomHorizontalFlip, *BATCH_LEVEL)) else tuple(transform or ())
    seen_batch_level = False
    for spec in specs:
        if not isinstance(spec, (*GEOMETRIC, RandomHorizontalFlip, *BATCH_LEVEL)):
            raise TypeError(f"{spec!r} is not a fastload transform spec (see fastload.transforms)")
        if isinstance(spec, BATCH_LEVEL):
            seen_batch_level = True
        elif seen_batch_level:
            raise ValueError(f"{type(spec).__name__} must come before Normalize/ToDtype")
    return specs


def output_size(specs: Sequence[Transform]) -> tuple[int, int] | None:
    """The fixed (height, width) the specs produce, or None when it depends on the image."""
    size: tuple[int, int] | None = None
    for spec in specs:
        if isinstance(spec, (RandomResizedCrop, CenterCrop)):
            size = spec.size
        elif isinstance(spec, Resize):
            size = spec.size if isinstance(spec.size, tuple) else None
    return size


# --- geometry planned from the header ------------------------------------------------------


class RandomSource(Protocol):
    """The draws a plan needs: fastload.workers.rng.SampleRandom, or a numpy Generator."""

    def random(self) -> float: ...

    def uniform(self, low: float, high: float) -> float: ...

    def integers(self, low: int, high: int) -> int: ...


@dataclass(frozen=True)
class Plan:
    """What to do with one image: crop ``box`` (x0, y0, x1, y1 in source pixels, floats), resize
    to ``size`` (height, width), then mirror if ``flip``."""

    box: tuple[float, float, float, float]
    size: tuple[int, int]
    flip: bool


def random_resized_crop_params(
    height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float], rng: RandomSource
) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params: (top, left, h, w), 10 tries then a centre crop."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        h, w = height, round(height * max(ratio))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def resize_size(size: int | tuple[int, int], height: int, width: int) -> tuple[int, int]:
    """torchvision's Resize output size: the short side to ``size``, the long side scaled (floor)."""
    if isinstance(size, tuple):
        return size
    if height <= width:
        return size, int(size * width / height)
    return int(size * height / width), size


def plan(specs: Sequence[Transform], height: int, width: int, rng: RandomSource) -> Plan:
    """Compose the per-sample specs for an image of ``height`` x ``width`` into one Plan."""
    x0, y0, x1, y1 = 0.0, 0.0, float(width), float(height)
    cur_h, cur_w = height, width
    flip = False
    for spec in specs:
        if isinstance(spec, RandomResizedCrop):
            top, left, h, w = random_resized_crop_params(cur_h, cur_w, spec.scale, spec.ratio, rng)
            sx, sy = (x1 - x0) / cur_w, (y1 - y0) / cur_h
            x0, y0, x1, y1 = x0 + left * sx, y0 + top * sy, x0 + (left + w) * sx, y0 + (top + h) * sy
            cur_h, cur_w = spec.size
        elif isinstance(spec, Resize):
            cur_h, cur_w = resize_size(spec.size, cur_h, cur_w)
        elif isinstance(spec, CenterCrop):
            crop_h, crop_w = spec.size
            if crop_h > cur_h or crop_w > cur_w:
                raise ValueError(f"CenterCrop{spec.size} is larger than its {cur_h}x{cur_w} input")
            top, left = round((cur_h - crop_h) / 2.0), round((cur_w - crop_w) / 2.0)
            sx, sy = (x1 - x0) / cur_w, (y1 - y0) / cur_h
            x0, y0, x1, y1 = x0 + left * sx, y0 + top * sy, x0 + (left + crop_w) * sx, y0 + (top + crop_h) * sy
            cur_h, cur_w = crop_h, crop_w
        elif isinstance(spec, RandomHorizontalFlip) and rng.random() < spec.p:
            flip = not flip
    return Plan(box=(x0, y0, x1, y1), size=(cur_h, cur_w), flip=flip)


def dct_min_size(plan_: Plan, height: int, width: int) -> tuple[int, int]:
    """The smallest full-image decode size that still gives the crop at least the output's
    resolution: what to ask libjpeg-turbo's DCT scaling for."""
    x0, y0, x1, y1 = plan_.box
    need = max(plan_.size[0] / max(y1 - y0, 1e-9), plan_.size[1] / max(x1 - x0, 1e-9))
    if need >= 1:
        return 0, 0  # full size
    return math.ceil(height * need), math.ceil(width * need)


def scaled_box(plan_: Plan, pixels: np.ndarray, source_height: int, source_width: int) -> tuple[float, float, float, float]:
    """The plan's crop box in the coordinates of ``pixels``, which may be a DCT-scaled (smaller)
    decode of a ``source_height`` x ``source_width`` image."""
    sy, sx = pixels.shape[0] / source_height, pixels.shape[1] / source_width
    x0, y0, x1, y1 = plan_.box
    return (x0 * sx, y0 * sy, x1 * sx, y1 * sy)


def apply_plan(pixels: np.ndarray, plan_: Plan, source_height: int, source_width: int) -> np.ndarray:
    """Crop, resize (antialiased bilinear) and flip decoded HWC pixels, which may be a DCT-scaled
    decode of a ``source_height`` x ``source_width`` image. Returns HWC uint8."""
    box = scaled_box(plan_, pixels, source_height, source_width)
    out_h, out_w = plan_.size
    if box == (0.0, 0.0, float(pixels.shape[1]), float(pixels.shape[0])) and (out_h, out_w) == pixels.shape[:2]:
        return pixels[:, ::-1] if plan_.flip else pixels  # nothing to resample: no round trip through Pillow
    from PIL import Image

    squeeze = pixels.ndim == 3 and pixels.shape[2] == 1
    image = Image.fromarray(pixels[:, :, 0] if squeeze else pixels)
    full = box == (0.0, 0.0, float(pixels.shape[1]), float(pixels.shape[0]))
    if (out_w, out_h) != image.size or not full:
        image = image.resize((out_w, out_h), Image.Resampling.BILINEAR, box=box)
    if plan_.flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    out = np.asarray(image)
    return out[:, :, None] if out.ndim == 2 else out


def resample_into(pixels: np.ndarray, plan_: Plan, source_height: int, source_width: int, out: np.ndarray) -> None:
    """Crop, resize and flip decoded HWC pixels (of a ``source_height`` x ``source_width`` image,
    or a scaled decode of one) into ``out`` (C, H, W uint8): by the libjpeg-turbo extension's
    resampler for RGB where it is built, else by :func:`apply_plan`."""
    from fastload.decode.cpu import turbo

    if turbo is not None and pixels.shape[2] == 3 == out.shape[0]:
        box = scaled_box(plan_, pixels, source_height, source_width)
        turbo.resample_into(np.ascontiguousarray(pixels), pixels.shape[0], pixels.shape[1], box, out, out.shape[1], out.shape[2], plan_.flip)
        return
    result = apply_plan(pixels, plan_, source_height, source_width)
    if result.shape[2] != out.shape[0]:
        raise ValueError(f"{result.shape[2]} channels, the batch holds {out.shape[0]}")
    np.copyto(out, result.transpose(2, 0, 1))


def nearest_into(values: np.ndarray, plan_: Plan, out: np.ndarray) -> None:
    """Crop, resize and flip an HxW array (a mask's class ids) of the plan's source size into
    ``out`` by nearest neighbour: each output pixel takes the value under its centre, so no value
    is ever interpolated. Aligned with :func:`apply_plan`'s image, which samples the same centres."""
    x0, y0, x1, y1 = plan_.box
    out_h, out_w = plan_.size
    cols = np.clip(np.floor(x0 + (np.arange(out_w) + 0.5) * ((x1 - x0) / out_w)).astype(np.intp), 0, values.shape[1] - 1)
    rows = np.clip(np.floor(y0 + (np.arange(out_h) + 0.5) * ((y1 - y0) / out_h)).astype(np.intp), 0, values.shape[0] - 1)
    if plan_.flip:
        cols = cols[::-1]
    np.copyto(out, values[rows[:, None], cols[None, :]])


def map_boxes(boxes: np.ndarray, plan_: Plan) -> np.ndarray:
    """Boxes (K x 4 float32, x0 y0 x1 y1 in source pixels) through the plan's crop, resize and
    flip: in output pixels, clipped to the output, boxes left empty dropped."""
    x0, y0, x1, y1 = plan_.box
    out_h, out_w = plan_.size
    scale = np.array([out_w / (x1 - x0), out_h / (y1 - y0)] * 2, dtype=np.float64)
    mapped = (boxes.astype(np.float64) - np.array([x0, y0, x0, y0])) * scale
    mapped = np.clip(mapped, 0, [out_w, out_h, out_w, out_h])
    if plan_.flip:
        mapped[:, [0, 2]] = out_w - mapped[:, [2, 0]]
    kept = (mapped[:, 2] > mapped[:, 0]) & (mapped[:, 3] > mapped[:, 1])
    return mapped[kept].astype(np.float32)


def batch_transform(specs: Sequence[Transform]):
    """A function applying the batch-level specs (Normalize, ToDtype) to a uint8 NCHW tensor."""
    import torch

    steps = [s for s in specs if isinstance(s, BATCH_LEVEL)]
    if not steps:
        return None
    dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "uint8": torch.uint8}

    def run(batch: torch.Tensor) -> torch.Tensor:
        for step in steps:
            if isinstance(step, Normalize):
                shape = (len(step.mean), 1, 1)  # the channels' axis third from last: NCHW images, NTCHW clips
                mean = torch.tensor(step.mean, device=batch.device).view(shape) * 255
                inv_std = 1 / (torch.tensor(step.std, device=batch.device).view(shape) * 255)
                batch = ((batch.float() - mean) * inv_std).to(dtypes[step.dtype])
            else:
                target = dtypes[step.dtype]
                if step.scale and batch.dtype == torch.uint8 and target != torch.uint8:
                    batch = (batch.float() / 255).to(target)
                else:
                    batch = batch.to(target)
        return batch

    return run
