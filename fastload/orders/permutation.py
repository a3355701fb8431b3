"""A seeded bijection on ``[0, n)`` evaluated at any positions without materialising ``n`` values:
a balanced Feistel network over the smallest even-bit power of two >= n, cycle-walked back into
range. It stands in for ``rng.permutation(n)`` wherever an epoch's order is needed: building it
costs nothing, evaluating it ~80 vectorised numpy operations a pass, a few passes a call (0.3-0.7
ms for a batch of 256), so an order's start-up no longer grows with the dataset.

Small domains are the exception: a Feistel network over a few bits reaches few of the ``n!``
orders and favours some (each of its rounds is an even permutation of ``4**h`` values; over 16
values, cycle-walked to 5, one order came 2.3x as often as another, and the gap between two
consecutive values was far from uniform up to n ~ 300). Up to ``SMALL`` values the permutation
is numpy's Fisher-Yates (``Generator.permutation``, uniform) seeded by the key, made once per
(n, key) and kept in a small cache.

Every parameter may be an array (one domain and one key per position), so many permutations of
different sizes (one per class and cycle, fastload.orders.balanced) are evaluated in one vectorised call.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

ROUNDS = 6  # Luby-Rackoff: 4 rounds of a pseudo-random function already give a pseudo-random permutation
SMALL = 4096  # up to this many values a permutation is materialised (uniform; 32 KiB at most)
SMALL_CACHE = 1024  # small permutations kept (LRU): at most 32 MiB
_MASK64 = (1 << 64) - 1
_ROUND_KEYS = np.array([(r + 1) * 0x9E3779B97F4A7C15 & _MASK64 for r in range(ROUNDS)], dtype=np.uint64)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 arrays: a bijective hash with full avalanche (wraps mod 2**64)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def mix_key(*parts: int) -> int:
    """One 64-bit key hashed from integers (seed, epoch, ...), order-sensitive."""
    key = np.array([0x5EED], dtype=np.uint64)  # arrays: numpy wraps their arithmetic silently
    for part in parts:
        key = mix64(key ^ np.uint64(part & _MASK64))
    return int(key[0])


def half_bits(n: np.ndarray | int) -> np.ndarray:
    """Bits of each half of the Feistel domain for a permutation of ``n``: the smallest h with 4**h >= n."""
    bit_length = np.frexp(np.maximum(np.asarray(n, dtype=np.int64) - 1, 0).astype(np.float64))[1]  # exact below 2**53
    return ((bit_length + 1) // 2).astype(np.uint64)


def _round_keys(keys: np.ndarray) -> list[np.ndarray]:
    """The network's key of each round, for each key."""
    return [mix64(keys + _ROUND_KEYS[r]) for r in range(ROUNDS)]


def _feistel(x: np.ndarray, half: np.ndarray, round_keys: list[np.ndarray]) -> np.ndarray:
    """One pass of the network over ``[0, 4**half)``: ROUNDS rounds of L, R = R, L ^ F(R, key)
    (``half`` and the round keys: one per element, or one for all)."""
    mask = (np.uint64(1) << half) - np.uint64(1)
    left, right = x >> half, x & mask
    for round_key in round_keys:
        left, right = right, left ^ (mix64(right ^ round_key) & mask)
    return (left << half) | right


@lru_cache(maxsize=SMALL_CACHE)
def small_permutation(n: int, key: int) -> np.ndarray:
    """The uniform permutation of ``[0, n)`` (n <= SMALL) seeded by ``key`` (read-only)."""
    table = np.random.Generator(np.random.PCG64(key)).permutation(n)
    table.flags.writeable = False
    return table


def permute(positions: np.ndarray, n: np.ndarray | int, key: np.ndarray | int) -> np.ndarray:
    """The seeded bijection on ``[0, n)`` keyed by ``key``, at ``positions`` (each in ``[0, n)``).
    ``n`` and ``key`` are scalars or arrays aligned with ``positions``."""
    positions = np.asarray(positions, dtype=np.int64)
    count = len(positions)
    n_arr = np.broadcast_to(np.asarray(n, dtype=np.int64), (count,))
    keys = np.broadcast_to(np.asarray(key, dtype=np.uint64), (count,))
    small = n_arr <= SMALL
    if small.all():
        return _permute_small(positions, n_arr, keys)
    out = _permute_feistel(positions, n_arr, keys)
    if small.any():
        out[small] = _permute_small(positions[small], n_arr[small], keys[small])
    return out


def _permute_small(positions: np.ndarray, n: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """:func:`permute` where every ``n`` is at most SMALL: each (n, key)'s table, looked up."""
    if len(positions) and (n == n[0]).all() and (keys == keys[0]).all():  # one permutation (the usual case)
        return small_permutation(int(n[0]), int(keys[0]))[positions]
    out = np.empty(len(positions), dtype=np.int64)
    pairs, which = np.unique(np.stack([n.astype(np.uint64), keys]), axis=1, return_inverse=True)
    for p, (size, key) in enumerate(pairs.T.tolist()):
        at = np.flatnonzero(which.reshape(-1) == p)
        out[at] = small_permutation(int(size), int(key))[positions[at]]
    return out


def _permute_feistel(positions: np.ndarray, n_arr: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """:func:`permute` by the Feistel network, cycle-walked into range."""
    x = positions.astype(np.uint64)
    if (n_arr == n_arr[0]).all() and (keys == keys[0]).all():  # one permutation (the usual case): scalars broadcast
        n_arr, keys = n_arr[:1], keys[:1]
    half, limit, round_keys = half_bits(n_arr), n_arr.astype(np.uint64), _round_keys(keys)
    x = _feistel(x, half, round_keys)
    out_of_range = np.flatnonzero(x >= limit)
    while len(out_of_range):  # cycle walking: a value outside [0, n) is sent through again (~<4 passes)
        if len(limit) == 1:
            again = _feistel(x[out_of_range], half, round_keys)
        else:
            again = _feistel(x[out_of_range], half[out_of_range], [k[out_of_range] for k in round_keys])
        x[out_of_range] = again
        out_of_range = out_of_range[again >= (limit if len(limit) == 1 else limit[out_of_range])]
    return x.astype(np.int64)


class Permutation:
    """``rng.permutation(n)``'s stand-in: ``perm(positions)`` is the value at those positions of a
    seeded permutation of ``[0, n)`` (the identity when not shuffling)."""

    __slots__ = ("key", "n", "shuffle")

    def __init__(self, n: int, key: int, shuffle: bool = True) -> None:
        self.n, self.key, self.shuffle = int(n), int(key) & _MASK64, shuffle

    def __len__(self) -> int:
        return self.n

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The permuted values at ``positions`` (int64)."""
        positions = np.asarray(positions, dtype=np.int64)
        if not self.shuffle or self.n <= 1:
            return positions.copy()
        return permute(positions, self.n, self.key)
