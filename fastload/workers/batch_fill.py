"""A batch's samples made in place: each sample read, decoded and transformed into its rows of the
batch's stacked columns (shared slots, or plain arrays), the rest of its fields gathered as lists;
and the bad-sample policy applied on the way (``on_error="skip"``: the next readable sample takes a
bad one's place, so a batch keeps its size). The CPU workers, DALI's feed and a torch DataLoader of
the loader's parts all fill batches through here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from fastload.errors import SampleError
from fastload.fields import SampleSpec
from fastload.storage.dataset import ShardedDataset
from fastload.transforms import Transform
from fastload.workers.sample_decode import fill_sample
from fastload.workers.stage_clock import StageClock, untimed

Attempted = TypeVar("Attempted")


class Substitutes:
    """``on_error`` over one batch (or a worker's part of one). With ``"skip"`` a bad sample's place
    goes to the next readable sample in dataset order (:meth:`ShardedDataset.substitute`), so a
    batch keeps its size whatever the number of workers. Each bad sample is read and recorded in
    ``skipped`` (where, reason) once here, however many of its neighbours' searches pass it; one
    search passes at most ``limit`` bad samples (the loader's ``max_skipped`` of the dataset:
    the training process holds each epoch to its own budget)."""

    def __init__(self, ds: ShardedDataset, on_error: str, limit: int | None = None) -> None:
        self.ds, self.skip = ds, on_error == "skip"
        self.limit = len(ds) if limit is None else limit
        self.skipped: list[tuple[str, str]] = []
        self._bad: dict[int, str] = {}  # sample index -> where, of the bad samples met so far

    def first_readable(self, index: int, attempt: Callable[[int], Attempted]) -> Attempted:
        """``attempt(index)``, or with ``"skip"`` ``attempt`` of the first sample from ``index`` on
        that does not raise SampleError."""
        if not self.skip:
            return attempt(index)
        for offset in range(len(self.ds)):
            candidate = self.ds.substitute(index, offset)
            if candidate not in self._bad:
                try:
                    return attempt(candidate)
                except SampleError as exc:
                    self._bad[candidate] = exc.where
                    self.skipped.append((exc.where, exc.reason))
            if offset >= self.limit:  # offset + 1 bad samples passed
                raise SampleError(self._bad[index], f"{offset + 1} unreadable samples in a row from here: more than "
                                  f"max_skipped= lets on_error='skip' pass over ({self.limit})")
        raise SampleError(self._bad[index], "it and every sample after it are unreadable: nothing can stand in for it")


def fill_fields(
    ds: ShardedDataset,
    indices: np.ndarray,
    sample_spec: SampleSpec,
    transforms: Sequence[Transform],
    seed: int,
    epoch: int,
    on_error: str,
    columns: dict[str, np.ndarray],
    clock: StageClock | None = None,
    skip_limit: int | None = None,
) -> tuple[list[str], list[tuple[str, str]], dict[str, list]]:
    """Write the batch's stacked fields into ``columns`` (field key -> its rows); return keys,
    skips and the other fields' values as lists. With ``on_error="skip"`` a bad sample is replaced
    by the next readable one (:class:`Substitutes`, passing at most ``skip_limit`` bad samples).
    Stage times go to ``clock`` when given."""
    clock = clock or untimed()
    keys: list[str] = []
    substitutes = Substitutes(ds, on_error, skip_limit)
    values: dict[str, list] = {f.key: [] for f in sample_spec.fields if f.key not in columns}
    try:
        for j, index in enumerate(indices.tolist()):
            rows = {name: column[j, ...] for name, column in columns.items()}  # [j, ...]: a view even of a scalar row
            key, sample_values = substitutes.first_readable(
                index, lambda i: fill_sample(ds, i, sample_spec, transforms, seed, epoch, rows, clock)  # noqa: B023 - called at once
            )
            keys.append(key)
            for name, value in sample_values.items():
                values[name].append(value)
    finally:
        clock.flush()
    return keys, substitutes.skipped, values
