"""Finding signatures within a Hamming distance without comparing all pairs: multi-index hashing.

The 64 bits are cut into ``k`` bands; one table per band maps a band's value to the signatures
holding it (dicts in Python; buckets in C, fastload/near/_index.c, where it is built). Two signatures at most ``t`` bits apart differ in at most ``t // k`` bits of some
band (pigeonhole), so looking up, in every band, each value within ``t // k`` bits of the
query's finds every signature within ``t``: the search is exact, not approximate. Its cost is
the lookups (k x the values within the radius of a band) plus the signatures they turn up
(about size / 2**band_bits a lookup): ``k`` is chosen to make the sum smallest for the number
of signatures expected, a lookup weighed as one candidate's check in Python and as ~30 in C
(two cache misses). For 12 bits and 12,000 signatures: in Python 5 bands of 12-13 bits, radius
2, 447 lookups; in C 7 bands of 9-10 bits, radius 1, 71 lookups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fastload._util.extensions import load_extension
from fastload.near.signature import BITS, COLOUR_TOLERANCE, colour_bits, colours_match, hash_bits

native = load_extension("fastload.near._index", "near-duplicate index extension", "the search runs in Python (190x slower at 100,000 images)")
_NATIVE_COSTS = (30.0, 16)  # C: a lookup (two cache misses) ~30 candidate checks (measured at 12k-1.28M signatures); bands of at most 16 bits (_index.c)
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


def choose_bands(threshold: int, size: int, lookup_cost: float = 1.0, max_width: int = BITS) -> int:
    """The number of bands that makes a query cheapest: lookups (each ``lookup_cost`` times a
    candidate's check) plus the candidates they find, no band wider than ``max_width`` bits."""

    def cost(bands: int) -> float:
        radius = threshold // bands
        return sum(_lookups(w, radius) * (lookup_cost + size / 2**w) for w in _widths(bands))

    return min((b for b in range(1, min(threshold + 1, BITS) + 1) if max(_widths(b)) <= max_width), key=cost, default=-(-BITS // max_width))


def _flips(width: int, radius: int) -> list[int]:
    """Every mask of ``width`` bits with at most ``radius`` bits set, fewest bits first."""
    masks = [0]
    frontier = [0]
    for _ in range(radius):
        frontier = sorted({m | 1 << b for m in frontier for b in range(width) if not m >> b & 1})
        masks += frontier
    return masks


class MultiIndex:
    """Signatures by band, answering "which stored signature lies closest, within ``threshold``
    bits"; ``size`` (how many will be stored, roughly) chooses the bands. In C where the
    extension (fastload/near/_index.c) is built, else in Python: the same answers."""

    def __init__(self, threshold: int, size: int) -> None:
        self.threshold = check_threshold(threshold)
        widths = _widths(choose_bands(threshold, size, *_NATIVE_COSTS) if native else choose_bands(threshold, size))
        self.radius = threshold // len(widths)  # bits a band's lookups reach
        self.bands = tuple((sum(widths[:b]), w) for b, w in enumerate(widths))  # (first hash bit, width) of each band
        flips = [_flips(w, self.radius) for _, w in self.bands]
        self._bands = [(shift, (1 << w) - 1, f) for (shift, w), f in zip(self.bands, flips, strict=True)]
        self._native = native.Index(threshold, COLOUR_TOLERANCE, [(*band, f) for band, f in zip(self.bands, flips, strict=True)]) if native else None
        self._tables: list[dict[int, list[int]]] = [{} for _ in widths]
        self._signatures: dict[int, int] = {}
        self._hashes: dict[int, int] = {}  # the hash bits of each stored signature

    def add(self, signature: int, ident: int) -> None:
        """Store ``signature`` under the caller's ``ident`` (one signature per ident)."""
        bits = hash_bits(signature)
        if self._native is not None:
            self._native.add(bits, colour_bits(signature), ident)
            return
        self._signatures[ident] = signature
        self._hashes[ident] = bits
        for (shift, mask, _), table in zip(self._bands, self._tables, strict=True):
            table.setdefault(bits >> shift & mask, []).append(ident)

    def closest(self, signature: int) -> tuple[int, int] | None:
        """(distance, ident) of the stored signature whose hash lies closest, within the
        threshold, among those whose colours match (signature.colours_match); ties: the smaller
        ident. None when there is none."""
        bits = hash_bits(signature)
        if self._native is not None:
            return self._native.closest(bits, colour_bits(signature))
        seen: set[int] = set()
        for (shift, mask, flips), table in zip(self._bands, self._tables, strict=True):
            value, get = bits >> shift & mask, table.get
            for flip in flips:
                bucket = get(value ^ flip)
                if bucket:
                    seen.update(bucket)
        hashes, threshold, stored = self._hashes, self.threshold, self._signatures
        within = sorted((d, ident) for ident in seen if (d := (bits ^ hashes[ident]).bit_count()) <= threshold)
        return next(((d, ident) for d, ident in within if colours_match(signature, stored[ident])), None)


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
        match = self._index.closest(signature)
        if match is not None:
            return match[1], match[0]
        self._index.add(signature, position)
        return None


def first_occurrences(signatures: Sequence[int | None], threshold: int) -> list[tuple[int, int, int]]:
    """(position, position of the kept one it duplicates, distance) of every signature within
    ``threshold`` bits of one kept before it, in order (FirstOccurrences decides)."""
    decide = FirstOccurrences(threshold, len(signatures))
    found = ((position, decide.check(position, signature)) for position, signature in enumerate(signatures))
    return [(position, *match) for position, match in found if match is not None]
