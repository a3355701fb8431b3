"""Packing pieces of documents into rows of a fixed length, as pure functions of the pieces.

``best_fit_decreasing``: the pieces, those longer than a row first cut into row-long parts (and
the rest), sorted longest first, each placed in the row whose free space it fills best, a new row
where none has room (Grain's best-fit packer, over one packing window at once: its padding is
that of an offline best-fit decreasing over the same window, by construction).
"""

from __future__ import annotations

import bisect

import numpy as np


def split_long(starts: np.ndarray, lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Pieces no longer than ``capacity``: each longer one cut into ``capacity``-long parts and the rest, in order."""
    parts = -(-lengths // capacity)
    if (parts <= 1).all():
        return starts, lengths
    owner = np.repeat(np.arange(len(lengths)), parts)
    within = np.arange(len(owner)) - np.repeat(np.cumsum(parts) - parts, parts)
    new_starts = starts[owner] + within * capacity
    new_lengths = np.minimum(lengths[owner] - within * capacity, capacity)
    return new_starts, new_lengths


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Rows of piece indices (each piece at most ``capacity`` long): longest first, each into the
    row with the least free space that still holds it (ties: the earliest row), else a new row."""
    order = np.argsort(-np.asarray(lengths), kind="stable").tolist()
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (free space, row number), sorted
    for piece in order:
        size = int(lengths[piece])
        at = bisect.bisect_left(free, (size, -1))
        if at < len(free):
            space, row = free.pop(at)
        else:
            space, row = capacity, len(rows)
            rows.append([])
        rows[row].append(piece)
        if space - size > 0:
            bisect.insort(free, (space - size, row))
    return rows


def padding_fraction(rows: list[list[int]], lengths: np.ndarray, capacity: int) -> float:
    """The share of the rows' tokens that is padding."""
    if not rows:
        return 0.0
    return 1 - float(np.asarray(lengths).sum()) / (len(rows) * capacity)
