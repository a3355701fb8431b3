"""Best-fit decreasing, packed piece by piece and counted without packing: the same rows as a plain
reference on runs of equal, row-long, half-row and mixed pieces."""

from __future__ import annotations

import numpy as np
import pytest

from fastload.text.packing import best_fit_decreasing, best_fit_rows
from tests.text.test_token_loader import offline_best_fit_decreasing


def piece_lists(capacity: int, seed: int) -> list[np.ndarray]:
    """Pieces of every shape that matters to best fit: any length, short ones of a few lengths
    (long runs of equals), row-long, half-row and just-over-a-third pieces, and empty ones."""
    rng = np.random.default_rng(seed)
    few = [capacity, capacity // 2, capacity // 3 + 1, capacity - 1, 1]
    return [
        rng.integers(1, capacity + 1, 300),
        np.minimum(rng.geometric(min(8 / capacity, 1.0), 500), capacity),
        rng.choice([max(x, 1) for x in few], 400),
        rng.choice([3, 5, 7], 600),
        np.concatenate([rng.integers(0, capacity + 1, 100), np.zeros(5, dtype=np.int64)]),
        np.full(37, capacity),
        np.zeros(3, dtype=np.int64),
        np.zeros(0, dtype=np.int64),
    ]


@pytest.mark.parametrize("capacity", [1, 2, 7, 64, 129, 2048])
def test_counting_gives_the_rows_of_packing(capacity: int) -> None:
    for seed in range(4):
        for lengths in piece_lists(capacity, seed):
            lengths = np.minimum(lengths, capacity)
            packed = best_fit_decreasing(lengths, capacity)
            assert best_fit_rows(lengths, capacity) == len(packed), (capacity, seed, lengths.tolist()[:20])
            assert sorted(i for row in packed for i in row) == list(range(len(lengths)))
            assert all(lengths[row].sum() <= capacity for row in packed)
            if len(lengths) and lengths.min() > 0:  # the plain reference places an empty piece into a full row
                assert len(packed) == offline_best_fit_decreasing(lengths.tolist(), capacity)
