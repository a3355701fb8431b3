"""Benchmark-only entry points into the loading stages: one sample read and planned, and a
classification batch filled into plain arrays, without a loader around them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fastload.errors import SampleError
from fastload.fields import LABEL_FIELD, classic_spec, image_field, parse_label
from fastload.storage.dataset import ShardedDataset
from fastload.transforms import Transform
from fastload.workers.batch_fill import fill_fields
from fastload.workers.rng import sample_rng
from fastload.workers.sample_decode import PlannedSample, plan_image


def plan_sample(ds: ShardedDataset, index: int, transforms: Sequence[Transform], seed: int, epoch: int) -> PlannedSample:
    """Read sample ``index`` and plan its transforms from the image header (nothing decoded yet)."""
    key, fields, pixels = ds.raw(index)
    where = f"{ds.index.shards[ds.locate(index)[0]].path}:{key}"
    label = parse_label(fields[LABEL_FIELD], where) if LABEL_FIELD in fields else -1
    if pixels is None:
        ext = image_field(fields)
        if ext is None:
            raise SampleError(where, f"no image field among {sorted(fields)}")
        pixels_or_bytes: np.ndarray | bytes = fields[ext]
    else:
        pixels_or_bytes = pixels
    return plan_image(key, where, label, pixels_or_bytes, transforms, sample_rng(seed, epoch, index))


def fill_batch(
    ds: ShardedDataset,
    indices: np.ndarray,
    transforms: Sequence[Transform],
    seed: int,
    epoch: int,
    on_error: str,
    images: np.ndarray,
    labels: np.ndarray,
) -> tuple[list[str], list[tuple[str, str]]]:
    """A classification batch: the samples' images into ``images`` (N,C,H,W), labels (-1 where
    none) into ``labels``; return keys and skips (:func:`fill_fields` of the classic sample_spec)."""
    sample_spec = classic_spec(ds.decoded)
    image, label = sample_spec.fields
    keys, skipped, _ = fill_fields(ds, indices, sample_spec, transforms, seed, epoch, on_error, {image.key: images, label.key: labels})
    return keys, skipped
