"""What the feed hands DALI and what the pipeline hands back, by name (as DALI's own
``output_map``): DALI takes and gives columns by position, and these tuples are the one place
their order is written. Skip records and errors travel in a ``notes`` column, as JSON."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import numpy as np

from fastload.errors import SampleError


class FeedColumns(NamedTuple):
    """One batch from the feed, a list of numpy arrays per column (or, inside the pipeline
    definition, DALI's node per column)."""

    jpegs: Any  # the encoded image (uint8)
    anchors: Any  # the crop box's (x0, y0), float32
    shapes: Any  # the crop box's (width, height), float32
    mirror: Any  # flip horizontally: int32 0 / 1
    labels: Any  # int64, one value
    keys: Any  # the sample's key, UTF-8 (uint8)
    notes: Any  # see encode_note


class DecodedColumns(NamedTuple):
    """One batch out of the pipeline (DALI's tensor lists)."""

    images: Any  # uint8 CHW, resized to the transform's output size
    labels: Any
    keys: Any
    notes: Any


def empty_feed_columns() -> FeedColumns:
    """A batch of no samples, to append to column by column."""
    return FeedColumns(*([] for _ in FeedColumns._fields))


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
