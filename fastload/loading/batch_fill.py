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
from fastload.loading.sample_decode import fill_sample
from fastload.loading.stats import StageClock, untimed
from fastload.storage.dataset import ShardedDataset
from fastload.transforms import Transform

Attempted = TypeVar("Attempted")
MAX_SUBSTITUTES = 64  # with on_error="skip": how many following samples to try in place of a bad one


def with_substitutes(
    ds: ShardedDataset, index: int, on_error: str, skipped: list[tuple[str, str]], attempt: Callable[[int], Attempted]
) -> Attempted:
    """``attempt(index)``, or with ``on_error="skip"`` ``attempt`` of the next sample in dataset
    order (:meth:`ShardedDataset.substitute`) that does not raise SampleError (each one passed over is appended to ``skipped`` as
    (where, reason)), so a batch keeps its size whatever the number of workers."""
    for offset in range(MAX_SUBSTITUTES + 1):
        try:
            return attempt(ds.substitute(index, offset))
        except SampleError as exc:
            if on_error == "raise":
                raise
            skipped.append((exc.where, exc.reason))
    raise SampleError(ds.where(index), f"it and the {MAX_SUBSTITUTES} samples after it are all unreadable")


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
) -> tuple[list[str], list[tuple[str, str]], dict[str, list]]:
    """Write the batch's stacked fields into ``columns`` (field key -> its rows); return keys,
    skips and the other fields' values as lists. With ``on_error="skip"`` a bad sample is replaced
    by the next readable one (:func:`with_substitutes`). Stage times go to ``clock`` when given."""
    clock = clock or untimed()
    keys: list[str] = []
    skipped: list[tuple[str, str]] = []
    values: dict[str, list] = {f.key: [] for f in sample_spec.fields if f.key not in columns}
    try:
        for j, index in enumerate(indices.tolist()):
            rows = {name: column[j, ...] for name, column in columns.items()}  # [j, ...]: a view even of a scalar row
            key, sample_values = with_substitutes(
                ds, index, on_error, skipped, lambda i: fill_sample(ds, i, sample_spec, transforms, seed, epoch, rows, clock)  # noqa: B023 - called at once
            )
            keys.append(key)
            for name, value in sample_values.items():
                values[name].append(value)
    finally:
        clock.flush()
    return keys, skipped, values
