"""Finding signatures within a Hamming distance without comparing all pairs: multi-index hashing.

The 64 bits are cut into ``k`` bands; one dict per band maps a band's value to the signatures
holding it. Two signatures at most ``t`` bits apart differ in at most ``t // k`` bits of some
band (pigeonhole), so looking up, in every band, each value within ``t // k`` bits of the
query's finds every signature within ``t``: the search is exact, not approximate. Its cost is
the lookups (k x the values within the radius of a band) plus the signatures they turn up
(about size / 2**band_bits a lookup): ``k`` is chosen to make the sum smallest for the number
of signatures expected (for 12 bits and 12,000 signatures: 5 bands of 12-13 bits, radius 2,
447 lookups; 4 bands of 16 would need radius 3, 2,788 lookups).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fastload.near.signature import BITS, colours_match, hash_bits

MAX_THRESHOLD = 24  # bits of 64: far past the useful range (16 already drops 1-2% of distinct photos: bench_near_dupes.py)


def check_threshold(threshold: int) -> int:
    """``threshold`` if it is a usable Hamming distance (0..MAX_THRESHOLD bits), else ValueError."""
    if not 0 <= threshold <= MAX_THRESHOLD:
        raise ValueError(f"the near-duplicate threshold must be 0..{MAX_THRESHOLD} bits of {BITS}, got {threshold}")
    return threshold


def _widths(bands: int) -> list[int]:
    """Band widths in bits, as equal as they can be, summing to BITS."""
    return [BITS // bands + (1 if b < BITS % bands else 0) for b in range(bands)]


def _lookups(width: int, radius: int) -> int:
    """How many values lie within ``radius`` bits of one value of ``width`` bits."""
    return sum(math.comb(width, r) for r in range(radius + 1))


def choose_bands(threshold: int, size: int) -> int:
    """The number of bands that makes a query cheapest: lookups plus the candidates they find."""

    def cost(bands: int) -> float:
        radius = threshold // bands
        return sum(_lookups(w, radius) * (1 + size / 2**w) for w in _widths(bands))

    return min(range(1, min(threshold + 1, BITS) + 1), key=cost)


def _flips(width: int, radius: int) -> list[int]:
    """Every mask of ``width`` bits with at most ``radius`` bits set, fewest bits first."""
    masks = [0]
    frontier = [0]
    for _ in range(radius):
        frontier = sorted({m | 1 << b for m in frontier for b in range(width) if not m >> b & 1})
        masks += frontier
    return masks


class MultiIndex:
    """Signatures by band, answering "which stored signatures lie within ``threshold`` bits";
    ``size`` (how many will be stored, roughly) chooses the bands."""

    def __init__(self, threshold: int, size: int) -> None:
        self.threshold = check_threshold(threshold)
        widths = _widths(choose_bands(threshold, size))
        radius = threshold // len(widths)
        self._bands = [(sum(widths[:b]), (1 << w) - 1, _flips(w, radius)) for b, w in enumerate(widths)]
        self._tables: list[dict[int, list[int]]] = [{} for _ in widths]
        self._signatures: dict[int, int] = {}
        self._hashes: dict[int, int] = {}  # the hash bits of each stored signature

    def add(self, signature: int, ident: int) -> None:
        """Store ``signature`` under the caller's ``ident`` (one signature per ident)."""
        self._signatures[ident] = signature
        self._hashes[ident] = bits = hash_bits(signature)
        for (shift, mask, _), table in zip(self._bands, self._tables, strict=True):
            table.setdefault(bits >> shift & mask, []).append(ident)

    def near(self, signature: int) -> list[tuple[int, int]]:
        """(distance, ident) of every stored signature whose hash lies within the threshold and
        whose colours match (signature.colours_match), closest first (ties: the smaller ident)."""
        seen: set[int] = set()
        bits = hash_bits(signature)
        for (shift, mask, flips), table in zip(self._bands, self._tables, strict=True):
            value, get = bits >> shift & mask, table.get
            for flip in flips:
                bucket = get(value ^ flip)
                if bucket:
                    seen.update(bucket)
        hashes, threshold, stored = self._hashes, self.threshold, self._signatures
        within = [(d, ident) for ident in seen if (d := (bits ^ hashes[ident]).bit_count()) <= threshold]
        return sorted((d, ident) for d, ident in within if colours_match(signature, stored[ident]))


class FirstOccurrences:
    """Decides, signature by signature in order, which are near duplicates of one kept before:
    the first of each group is kept; a later one is compared with the kept ones only (to the
    representative, not transitively: a chain a~b~c with a and c further apart than the
    threshold keeps c), and names the closest (ties: the earliest). ``size``: how many to expect."""

    def __init__(self, threshold: int, size: int) -> None:
        self._index = MultiIndex(threshold, size)

    def check(self, position: int, signature: int | None) -> tuple[int, int] | None:
        """(position of the kept one, distance) if ``signature`` duplicates one kept before;
        otherwise None, and it is kept. None (no signature: not an image, not decodable) is
        never compared, nor kept for comparison."""
        if signature is None:
            return None
        matches = self._index.near(signature)
        if matches:
            distance, kept = matches[0]
            return kept, distance
        self._index.add(signature, position)
        return None


def first_occurrences(signatures: Sequence[int | None], threshold: int) -> list[tuple[int, int, int]]:
    """(position, position of the kept one it duplicates, distance) of every signature within
    ``threshold`` bits of one kept before it, in order (FirstOccurrences decides)."""
    decide = FirstOccurrences(threshold, len(signatures))
    found = ((position, decide.check(position, signature)) for position, signature in enumerate(signatures))
    return [(position, *match) for position, match in found if match is not None]
