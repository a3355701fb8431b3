"""The DALI backend's input: each batch read and planned (encoded bytes, crop boxes, flips, keys)
and its other fields made (labels, text, json, arrays; boxes mapped and masks cropped by the
same plan) by a picklable callable, which DALI's parallel external source runs in its own worker
processes so the training process's main thread only collects decoded batches."""

from __future__ import annotations

import functools
import gc
import io
import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from fastload.backends.dali.protocol import carried_fields, empty_feed_columns, encode_note, row_bytes, stored_form
from fastload.backends.dali.shares import DaliShares
from fastload.errors import SampleError
from fastload.fields import SampleSpec
from fastload.orders.balanced import ClassMembers
from fastload.orders.epoch_order import EpochOrder
from fastload.orders.mixture_order import MixtureOrder
from fastload.orders.rank_batches import RankBatches
from fastload.orders.spec import OrderSpec
from fastload.storage.dataset import ShardedDataset
from fastload.transforms import Transform
from fastload.workers.batch_fill import Substitutes
from fastload.workers.sample_decode import PlannedSample, fill_beside_primary
from fastload.workers.slots import Column

PLACEHOLDER_SIDE = 8


@dataclass
class DaliFeed:
    """Batch ``info.iteration`` of DALI epoch ``info.epoch_idx``. DALI's epoch 0 is ``first_epoch``
    from order position ``start``, skipping its first ``first_batch`` batches (already delivered);
    each later DALI epoch (after a reset) is the next epoch from its beginning. ``sample_spec``'s fields
    other than the primary image are carried beside it, the ``stacked`` ones as slot rows. With
``shares`` (the hybrid backend) a batch is its first samples only, as many as the training
process published for it; the CPU workers make the rest."""

    dataset: ShardedDataset
    sample_spec: SampleSpec
    stacked: tuple[Column, ...]  # the carried fields batched as fixed-shape rows (labels, masks, ...)
    transforms: tuple[Transform, ...]
    seed: int
    on_error: str
    skip_limit: int  # the most bad samples one search for a readable sample passes (fastload.workers.batch_fill.Substitutes)
    orders: OrderSpec | MixtureOrder
    first_epoch: int
    start: int = 0
    first_batch: int = 0
    shares: DaliShares | None = None  # the hybrid backend: DALI takes each batch's first shares.wait(batch) samples
    classes: ClassMembers | None = None  # the class-balanced order's samples by label
    home_pid: int = field(default_factory=os.getpid)  # the training process; DALI's workers are others
    _plans: dict[int, tuple[EpochOrder, RankBatches]] = field(default_factory=dict, repr=False, compare=False)

    def plan(self, epoch_idx: int) -> tuple[int, EpochOrder, RankBatches, int]:
        """(epoch, its order, this rank's batches, first batch to feed) of DALI epoch ``epoch_idx``."""
        if epoch_idx not in self._plans:
            order = self.orders.order(self.first_epoch + epoch_idx, self.classes)
            self._plans = {epoch_idx: (order, self.orders.batches(len(order), self.start if epoch_idx == 0 else 0))}
        order, batches = self._plans[epoch_idx]
        return self.first_epoch + epoch_idx, order, batches, self.first_batch if epoch_idx == 0 else 0

    def next_epoch(self, epochs_fed: int) -> DaliFeed:
        """The feed a fresh pipeline would need for the epoch after ``epochs_fed`` DALI epochs."""
        return replace(self, first_epoch=self.first_epoch + epochs_fed, start=0, first_batch=0, _plans={})

    def __call__(self, info: Any) -> tuple[list[np.ndarray], ...]:
        """The columns (:class:`~fastload.backends.dali.protocol.FeedColumns`, then the carried fields') of
        DALI's batch ``info``."""
        _freeze_inherited(self.home_pid)
        epoch, order, batches, first = self.plan(info.epoch_idx)
        batch_no = first + info.iteration
        if batch_no >= len(batches):
            raise StopIteration
        indices = order.indices(batches.positions(batch_no)).tolist()
        if self.shares is not None:
            indices = indices[: self.shares.wait(batch_no)]
        columns, carried = empty_feed_columns(carried_fields(self.sample_spec))
        stacked = {c.name: np.zeros((len(indices), *c.shape), c.dtype) for c in self.stacked}
        roles = {f.key: f.role for f in self.sample_spec.fields}
        substitutes = Substitutes(self.dataset, self.on_error, self.skip_limit)
        for j, index in enumerate(indices):
            rows = {name: column[j, ...] for name, column in stacked.items()}  # [j, ...]: a view even of a scalar row
            skipped_before = len(substitutes.skipped)
            try:
                key, planned, values = substitutes.first_readable(index, lambda i: fill_beside_primary(
                    self.dataset, i, self.sample_spec, self.transforms, self.seed, epoch, rows))  # noqa: B023 - called at once
            except SampleError as exc:  # DALI's workers cannot raise it intact: it travels as a note
                columns.jpegs.append(placeholder_jpeg())
                region = decode_region((0.0, 0.0, PLACEHOLDER_SIDE, PLACEHOLDER_SIDE), PLACEHOLDER_SIDE, PLACEHOLDER_SIDE, (1, 1))
                for column, value in zip((columns.anchors, columns.shapes, columns.roi_starts, columns.roi_ends), region, strict=True):
                    column.append(value)
                columns.mirror.append(np.array(0, dtype=np.int32))
                columns.keys.append(np.zeros(0, dtype=np.uint8))
                columns.notes.append(encode_note(error=exc))
                for name in carried.keys() - stacked.keys():
                    carried[name].append(np.zeros(0, dtype=np.uint8))
                continue
            sample = cast(PlannedSample, planned)  # dali_refusal(): every sample has an encoded primary image
            columns.jpegs.append(np.frombuffer(cast(bytes, sample.data), dtype=np.uint8))
            region = decode_region(sample.plan.box, sample.height, sample.width, sample.plan.size)
            for column, value in zip((columns.anchors, columns.shapes, columns.roi_starts, columns.roi_ends), region, strict=True):
                column.append(value)
            columns.mirror.append(np.array(int(sample.plan.flip), dtype=np.int32))
            columns.keys.append(np.frombuffer(key.encode(), dtype=np.uint8))
            columns.notes.append(encode_note(substitutes.skipped[skipped_before:]))
            for name, value in values.items():
                carried[name].append(stored_form(roles[name], value))
        for name, column in stacked.items():
            carried[name] = [row_bytes(row) for row in column]
        return (*columns, *carried.values())  # a plain tuple: DALI's worker processes rebuild tuples and lists by type(x)(...)


def decode_region(
    box: tuple[float, float, float, float], height: int, width: int, out_hw: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What DALI decodes for a crop ``box`` (fractional source pixels) of a ``height`` x ``width``
    image resized to ``out_hw``: the whole-pixel region (anchor (x, y), shape (w, h)) holding the box
    and the resampling filter's reach around it, and the box inside that region as fn.resize's
    ``roi_start`` / ``roi_end`` (y, x). ``decoders.image_slice`` rounds a fractional box to whole
    pixels, which moved textured photos' crops by up to half a pixel: 4-5 levels mean |diff|."""
    x0, y0, x1, y1 = box
    reach = math.ceil(max(1.0, (x1 - x0) / out_hw[1], (y1 - y0) / out_hw[0])) + 1  # antialiasing's support, plus one
    left, top = max(0, math.floor(x0) - reach), max(0, math.floor(y0) - reach)
    right, bottom = min(width, math.ceil(x1) + reach), min(height, math.ceil(y1) + reach)
    return (np.array([left, top], dtype=np.float32), np.array([right - left, bottom - top], dtype=np.float32),
            np.array([y0 - top, x0 - left], dtype=np.float32), np.array([y1 - top, x1 - left], dtype=np.float32))


_frozen_in = -1


def _freeze_inherited(home_pid: int) -> None:
    """In a DALI worker, once: the objects it inherited go to the permanent generation, so that its
    collections don't write to them all and copy the training process's heap (fastload.workers.pool does
    the same). Never in the training process itself (``num_workers=0``): its garbage must go."""
    global _frozen_in
    pid = os.getpid()
    if pid != home_pid and _frozen_in != pid:
        gc.freeze()
        _frozen_in = pid


@functools.cache
def placeholder_jpeg() -> np.ndarray:
    """A small black JPEG standing in for a sample that could not be planned."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (PLACEHOLDER_SIDE, PLACEHOLDER_SIDE)).save(out, "JPEG")
    return np.frombuffer(out.getvalue(), dtype=np.uint8)
