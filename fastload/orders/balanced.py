"""The class-balanced order (``class_weights=`` / ``balanced=True``): each epoch gives class c a
share of its positions proportional to its weight, drawing its samples without replacement while
they last and in further shuffled cycles where the share is larger than the class (with
replacement, as evenly as possible: every sample of an over-sampled class appears ⌊s/n⌋ or ⌈s/n⌉
times). A pure function of (seed, epoch) evaluated per position like the global order, so it
resumes exactly and elastically; it holds every labelled sample's index grouped by class
(O(N) memory: 4 bytes a sample below 2**31 samples) and a few numbers per class present, so
memory follows the samples and classes there are, never the largest label value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fastload.orders.epoch_order import EpochOrder, Selection
from fastload.orders.permutation import Permutation, mix64, mix_key, permute

BALANCE_KEY = 0xBA1A


@dataclass(frozen=True, eq=False)
class ClassMembers:
    """The selected, labelled samples grouped by the labels present (``labels``, ascending): the
    sample indices of class ``labels[c]`` are ``members[starts[c]:starts[c + 1]]``."""

    members: np.ndarray
    starts: np.ndarray
    labels: np.ndarray

    @property
    def counts(self) -> np.ndarray:
        """Samples of each class."""
        return np.diff(self.starts)


def class_members(labels: np.ndarray, selection: Selection, num_classes: int | None = None) -> ClassMembers:
    """``selection``'s samples with a label (``labels``: one per dataset sample, -1 unlabelled) by
    class; ``num_classes``: the dataset's named classes, which every label must be one of."""
    chosen = selection.indices(np.arange(len(selection)))
    chosen_labels = np.asarray(labels)[chosen]
    labelled = chosen_labels >= 0
    chosen, chosen_labels = chosen[labelled], chosen_labels[labelled]
    if num_classes is not None and len(chosen_labels) and chosen_labels.max() >= num_classes:
        raise ValueError(f"a sample has label {int(chosen_labels.max())}, beyond the dataset's {num_classes} classes")
    by_class = np.argsort(chosen_labels, kind="stable")
    present, starts = np.unique(chosen_labels[by_class], return_index=True)
    dtype = np.int32 if len(labels) < 2**31 else np.int64
    return ClassMembers(chosen[by_class].astype(dtype), np.append(starts, len(chosen)).astype(np.int64), present.astype(np.int64))


def class_weight_vector(weights: Mapping[str | int, float] | None, counts: np.ndarray,
                        classes: Sequence[str] | None, labels: np.ndarray | None = None) -> tuple[float, ...]:
    """The weight of each class of ``counts`` (the samples of each of ``labels``; by default labels
    0, 1, ...): every class with samples weighs 1 (``balanced=True``: ``weights`` None), except
    those ``weights`` names (by name or label). A positive weight on a class without samples, an
    unknown class or a negative weight is refused."""
    vector = np.where(counts > 0, 1.0, 0.0)
    position = {int(label): i for i, label in enumerate(np.arange(len(counts)) if labels is None else labels)}
    names = {name: label for label, name in enumerate(classes or ())}
    for name, weight in (weights or {}).items():
        label = names.get(name, name) if isinstance(name, str) else int(name)
        if not isinstance(label, int) or label < 0 or (classes is not None and label >= len(classes)):
            raise ValueError(f"class_weights= names class {name!r}, which this dataset does not have")
        if not (isinstance(weight, (int, float, np.number)) and math.isfinite(weight) and weight >= 0):
            raise ValueError(f"class_weights= gives class {name!r} the weight {weight!r}: weights are finite numbers >= 0")
        if weight > 0 and (label not in position or counts[position[label]] == 0):
            raise ValueError(f"class_weights= gives class {name!r} a weight, but no sample the loader reads has it")
        if label in position:
            vector[position[label]] = weight
    if vector.max() <= 0:
        raise ValueError("class_weights= leaves no class to sample")
    return tuple(float(w) for w in vector)


def class_shares(weights: Sequence[float], length: int) -> np.ndarray:
    """Positions of an epoch of ``length`` given to each class: proportional to its weight, rounded
    by largest remainder (ties to the lower label)."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.max()  # relative to the largest: a sum of huge weights would overflow
    exact = w / w.sum() * length
    shares = np.floor(exact).astype(np.int64)
    missing = length - int(shares.sum())
    shares[np.argsort(-(exact - shares), kind="stable")[:missing]] += 1
    return shares


class BalancedOrder(EpochOrder):
    """Position p → a seeded permutation of the epoch's slots → (class, slot within its share) →
    that class's sample at the slot's place in a shuffled cycle of the class."""

    def __init__(self, classes: ClassMembers, weights: Sequence[float], seed: int, epoch: int, length: int) -> None:
        self.classes, self.length = classes, length
        self.share_starts = np.concatenate([[0], np.cumsum(class_shares(weights, length))])
        self.permutation = Permutation(length, mix_key(seed, epoch, BALANCE_KEY))
        self.cycle_key = np.uint64(mix_key(seed, epoch, BALANCE_KEY, 1))

    def indices(self, positions: np.ndarray) -> np.ndarray:
        """Sample index at each position."""
        slots = self.permutation(positions)
        which = np.searchsorted(self.share_starts, slots, side="right") - 1  # the class, by its place among those present
        size = self.classes.counts[which]
        cycle, offset = np.divmod(slots - self.share_starts[which], size)
        keys = mix64(mix64(self.cycle_key ^ self.classes.labels[which].astype(np.uint64)) ^ cycle.astype(np.uint64))
        return self.classes.members[self.classes.starts[which] + permute(offset, size, keys)].astype(np.int64)
