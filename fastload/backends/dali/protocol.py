"""What the feed hands DALI and what the pipeline hands back, by name (as DALI's own
``output_map``): DALI takes and gives columns by position, and these tuples are the one place
their order is written. Skip records and errors travel in a ``notes`` column, as JSON.

Every field but the primary image is *carried*: after the fixed columns comes one column per
carried field, in the fields' order, named by the field's key. A stacked field (label, mask,
a second image, a fixed-shape array) travels as each sample's row's raw bytes, of one length,
so DALI hands the batch back dense; the others (text, json, boxes, bytes, ragged arrays) in
their stored form (UTF-8, JSON, ``.npy``), read back by :mod:`fastload.fields`' codecs.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from fastload.errors import SampleError
from fastload.fields import SampleSpec, decode_field
from fastload.workers.slots import Column, spec_columns


class FeedColumns(NamedTuple):
    """One batch from the feed, a list of numpy arrays per column (or, inside the pipeline
    definition, DALI's node per column); the carried fields' columns follow."""

    jpegs: Any  # the encoded image (uint8)
    anchors: Any  # the region decoded: (x0, y0) of whole pixels, float32 (see fastload.backends.dali.feed.decode_region)
    shapes: Any  # its (width, height), whole pixels, float32
    roi_starts: Any  # the crop box's (y0, x0) inside the region, fractional, float32: fn.resize's roi_start
    roi_ends: Any  # the crop box's (y1, x1) inside the region
    mirror: Any  # flip horizontally: int32 0 / 1
    keys: Any  # the sample's key, UTF-8 (uint8)
    notes: Any  # see encode_note


class DecodedColumns(NamedTuple):
    """One batch out of the pipeline (DALI's tensor lists); the carried fields' columns follow."""

    images: Any  # uint8 CHW, resized to the transform's output size
    keys: Any
    notes: Any


def carried_fields(spec: SampleSpec) -> tuple[str, ...]:
    """The keys of the fields that travel beside the primary image, in the fields' order."""
    return tuple(f.key for f in spec.fields if f is not spec.primary)


def carried_stacked(spec: SampleSpec, image_shape: tuple[int, int, int] | None) -> tuple[Column, ...]:
    """The slot columns of the carried fields batched as fixed-shape rows (labels, masks, ...)."""
    return tuple(c for c in spec_columns(spec, image_shape) if spec.primary is None or c.name != spec.primary.key)


def empty_feed_columns(carried: Sequence[str]) -> tuple[FeedColumns, dict[str, list[np.ndarray]]]:
    """A batch of no samples, to append to column by column: the fixed columns and the carried ones."""
    return FeedColumns(*([] for _ in FeedColumns._fields)), {name: [] for name in carried}


def row_bytes(row: np.ndarray) -> np.ndarray:
    """A stacked field's row as the uint8 bytes it travels as."""
    return np.ascontiguousarray(row).reshape(-1).view(np.uint8)


def stored_form(role: str, value: Any) -> np.ndarray:
    """A list-batched field's value as the bytes it is stored as (read back by its role's codec)."""
    if role == "text":
        data = value.encode()
    elif role == "json":
        data = json.dumps(value).encode()
    elif role in ("array", "boxes"):
        out = io.BytesIO()
        np.lib.format.write_array(out, np.asarray(value), allow_pickle=False)
        data = out.getvalue()
    else:
        data = value
    return np.frombuffer(data, dtype=np.uint8)


def read_carried(
    outputs: Sequence[Any], spec: SampleSpec, stacked: Sequence[Column], keys: list[str]
) -> tuple[dict[str, np.ndarray], dict[str, list]]:
    """A decoded batch's carried fields (DALI's CPU tensor lists, in the fields' order): the
    stacked ones as (N, *shape) arrays by field key, the others as lists of values (read back by
    their role's codec: the feed has checked them)."""
    layouts = {c.name: c for c in stacked}
    roles = {f.key: f.role for f in spec.fields}
    columns: dict[str, np.ndarray] = {}
    values: dict[str, list] = {}
    for name, tensors in zip(carried_fields(spec), outputs, strict=True):
        if name in layouts:
            dense = np.array(tensors.as_tensor())  # (N, row bytes), copied out of DALI's memory
            columns[name] = dense.view(np.dtype(layouts[name].dtype)).reshape(len(dense), *layouts[name].shape)
        else:
            values[name] = [decode_field(roles[name], tensors.at(i).tobytes(), key, name) for i, key in enumerate(keys)]
    return columns, values


def encode_note(skipped: list[tuple[str, str]] | None = None, error: SampleError | None = None) -> np.ndarray:
    """A sample's note: the skip records (where, reason) of the samples it stands in for, or the
    error of a sample that could not be planned (DALI's workers cannot raise it intact); empty if
    neither."""
    note: dict[str, Any] = {"error": [error.where, error.reason]} if error is not None else {}
    if skipped:
        note["skipped"] = skipped
    return np.frombuffer(json.dumps(note).encode() if note else b"", dtype=np.uint8)


def read_notes(notes: list[bytes]) -> tuple[list[tuple[str, str]], SampleError | None]:
    """A batch's skip records (where, reason) and the first unreadable sample's error, if any."""
    skipped: list[tuple[str, str]] = []
    error = None
    for note in notes:
        if note:
            fields = json.loads(note)
            skipped += [(where, reason) for where, reason in fields.get("skipped", [])]
            if "error" in fields and error is None:
                error = SampleError(*fields["error"])
    return skipped, error
