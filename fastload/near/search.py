"""Finding signatures within a Hamming distance without comparing all pairs: multi-index hashing.

The 64 bits are cut into ``BANDS`` bands of 16; one dict per band maps a band's value to the
signatures holding it. Two signatures at most ``t`` bits apart differ in at most ``t // BANDS``
bits of some band (pigeonhole), so looking up, in every band, each value within ``t // BANDS``
bits of the query's (1 value for t <= 3, 17 for t <= 7, 137 for t <= 11, 697 for t <= 15) finds
every signature within ``t``: the search is exact, not approximate, and costs lookups, not a
pass over the signatures stored.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from fastload.near.signature import BITS, hamming

BANDS = 4
BAND_BITS = BITS // BANDS
MAX_THRESHOLD = BANDS * 4 - 1  # a band radius of 3 at most: 697 lookups per band


def _flips(bits: int, radius: int) -> tuple[int, ...]:
    """Every mask of ``bits`` bits with at most ``radius`` bits set."""
    return tuple(sum(1 << b for b in chosen) for r in range(radius + 1) for chosen in itertools.combinations(range(bits), r))


def check_threshold(threshold: int) -> int:
    """``threshold`` if it is a usable Hamming distance (0..MAX_THRESHOLD bits), else ValueError."""
    if not 0 <= threshold <= MAX_THRESHOLD:
        raise ValueError(f"the near-duplicate threshold must be 0..{MAX_THRESHOLD} bits of {BITS}, got {threshold}")
    return threshold


class MultiIndex:
    """Signatures by band, answering "which stored signatures lie within ``threshold`` bits"."""

    def __init__(self, threshold: int) -> None:
        self.threshold = check_threshold(threshold)
        self._flips = _flips(BAND_BITS, threshold // BANDS)
        self._bands: list[dict[int, list[tuple[int, int]]]] = [{} for _ in range(BANDS)]

    def add(self, signature: int, ident: int) -> None:
        """Store ``signature`` under the caller's ``ident``."""
        for band, table in enumerate(self._bands):
            table.setdefault(_band(signature, band), []).append((signature, ident))

    def near(self, signature: int) -> list[tuple[int, int]]:
        """(distance, ident) of every stored signature within the threshold, closest first (ties:
        the smaller ident first)."""
        found: dict[int, int] = {}
        for band, table in enumerate(self._bands):
            value = _band(signature, band)
            for flip in self._flips:
                for stored, ident in table.get(value ^ flip, ()):
                    if ident not in found:
                        distance = hamming(signature, stored)
                        if distance <= self.threshold:
                            found[ident] = distance
        return sorted((distance, ident) for ident, distance in found.items())


def _band(signature: int, band: int) -> int:
    return (signature >> (band * BAND_BITS)) & ((1 << BAND_BITS) - 1)


def first_occurrences(signatures: Sequence[int | None], threshold: int) -> list[tuple[int, int, int]]:
    """(position, position of the kept one it duplicates, distance) of every signature within
    ``threshold`` bits of one kept before it, in order. Kept: the first of each group, in order;
    a later one is compared with the kept ones only (to the representative, not transitively: a
    chain a~b~c with a and c further apart than the threshold keeps c), and names the closest
    (ties: the earliest). None (no signature: not an image, not decodable) is never compared."""
    index = MultiIndex(threshold)
    dropped = []
    for position, signature in enumerate(signatures):
        if signature is None:
            continue
        matches = index.near(signature)
        if matches:
            distance, kept = matches[0]
            dropped.append((position, kept, distance))
        else:
            index.add(signature, position)
    return dropped
