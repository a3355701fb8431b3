"""Packing pieces of documents into rows of a fixed length, as pure functions of the pieces.

``best_fit_decreasing``: the pieces, those longer than a row first cut into row-long parts (and
the rest), sorted longest first, each placed in the row whose free space it fills best, a new row
where none has room (Grain's best-fit packer, over one packing window at once: its padding is
that of an offline best-fit decreasing over the same window, by construction).
"""

from __future__ import annotations

import bisect

import numpy as np


def split_long(starts: np.ndarray, lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pieces no longer than ``capacity``: each longer one cut into ``capacity``-long parts and the
    rest, in order; with, for each part, the piece it was cut from."""
    parts = -(-lengths // capacity)
    if (parts <= 1).all():
        return starts, lengths, np.arange(len(lengths))
    owner = np.repeat(np.arange(len(lengths)), parts)
    within = np.arange(len(owner)) - np.repeat(np.cumsum(parts) - parts, parts)
    new_starts = starts[owner] + within * capacity
    new_lengths = np.minimum(lengths[owner] - within * capacity, capacity)
    return new_starts, new_lengths, owner


def split_lengths(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """The lengths of the parts :func:`split_long` cuts ``lengths`` into, in no order (what
    counting rows needs, without the parts' starts)."""
    full, rest = np.divmod(np.asarray(lengths, dtype=np.int64), capacity)
    return np.concatenate([np.full(int(full.sum()), capacity, dtype=np.int64), rest[rest > 0]])


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Rows of piece indices (each piece at most ``capacity`` long): longest first, each into the
    row with the least free space that still holds it (ties: the earliest row), else a new row."""
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, kind="stable")
    rows: list[list[int]] = []
    base = len(lengths) + 1  # a row's free space and number in one sortable int: space * base + row
    free: list[int] = []
    for piece, size in zip(order.tolist(), lengths[order].tolist()):
        at = bisect.bisect_left(free, size * base)
        if at < len(free):
            space, row = divmod(free.pop(at), base)
        else:
            space, row = capacity, len(rows)
            rows.append([])
        rows[row].append(piece)
        if space > size:
            bisect.insort(free, (space - size) * base + row)
    return rows


def best_fit_rows(lengths: np.ndarray, capacity: int) -> int:
    """How many rows :func:`best_fit_decreasing` packs ``lengths`` (each at most ``capacity``) into,
    without placing piece by piece: rows are tracked only as how many have each free space, and a
    run of equal pieces fills the rows of one free space ``f`` ``f // size`` pieces a row (best fit
    puts the next equal piece back into the row it just shrank while that row still holds one)."""
    sizes = np.bincount(np.asarray(lengths, dtype=np.int64), minlength=capacity + 1)
    rows_with: dict[int, int] = {}  # free space (> 0) -> rows with exactly that much free
    frees: list[int] = []  # the keys of rows_with, ascending

    def add(free: int, rows: int) -> None:
        if rows and free > 0:
            if free not in rows_with:
                bisect.insort(frees, free)
                rows_with[free] = 0
            rows_with[free] += rows

    def take(free: int, rows: int) -> None:
        rows_with[free] -= rows
        if not rows_with[free]:
            del rows_with[free]
            frees.pop(bisect.bisect_left(frees, free))

    count = 0
    for size in np.flatnonzero(sizes[1:])[::-1].tolist():
        size += 1
        left = int(sizes[size])
        while left and (at := bisect.bisect_left(frees, size)) < len(frees):
            free = frees[at]
            each = free // size
            rows = rows_with[free]
            if rows * each <= left:  # every row of this free space filled as far as it goes
                take(free, rows)
                add(free - each * size, rows)
                left -= rows * each
            else:
                full, rest = divmod(left, each)
                take(free, full + (rest > 0))
                add(free - each * size, full)
                add(free - rest * size, int(rest > 0))
                left = 0
        if left:  # new rows, each filled as far as it goes
            each = capacity // size
            full, rest = divmod(left, each)
            count += full + (rest > 0)
            add(capacity - each * size, full)
            add(capacity - rest * size, int(rest > 0))
    if sizes[0] and not frees:  # empty pieces go into the fullest row with room, else one new row
        count += 1
    return count


def padding_fraction(rows: list[list[int]], lengths: np.ndarray, capacity: int) -> float:
    """The share of the rows' tokens that is padding."""
    if not rows:
        return 0.0
    return 1 - float(np.asarray(lengths).sum()) / (len(rows) * capacity)
