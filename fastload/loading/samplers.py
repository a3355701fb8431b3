"""torch's sampling surface over the fast path: the ``sampler=`` values fastload can honour
exactly, ``Subset`` of a fastload dataset, and ``loader.sampler`` / ``loader.batch_sampler``
objects with torch's meanings that read the loader's own order (a pure function of seed, epoch,
rank and world size, so it resumes exactly).

``loader.sampler`` is a ``DistributedSampler``: Lightning then leaves the loader as it is (it
re-instantiates DataLoaders whose sampler is not one) and its ``set_epoch`` reaches the loader.
``loader.batch_sampler`` yields this rank's batches as :class:`BatchIndices`, lists of sample
indices that also say how the fast path plans them, so a torch DataLoader built from the
loader's parts (Accelerate's ``skip_first_batches``) yields the same pixels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler, Subset, SubsetRandomSampler
from torch.utils.data.distributed import DistributedSampler

from fastload.fields import SampleSpec
from fastload.loading.batch_outputs import BatchOutputs, samples_of
from fastload.loading.field_batch import as_tensor, shaped_batch
from fastload.loading.state import LoaderState
from fastload.storage.dataset import ShardedDataset
from fastload.workers.rng import batch_generator

if TYPE_CHECKING:
    from fastload.transforms import Transform


def checked_indices(indices: Any, size: int, what: str) -> np.ndarray:
    """``indices`` as int64, each in ``[0, size)``, else an IndexError naming the first one outside
    (torch would raise at that sample: the fast path must never read another in its place)."""
    array = np.asarray(list(indices) if not isinstance(indices, np.ndarray) else indices, dtype=np.int64).reshape(-1)
    bad = np.flatnonzero((array < 0) | (array >= size))
    if len(bad):
        raise IndexError(f"{what} index {int(array[bad[0]])} (position {int(bad[0])}) out of range for {size} samples")
    return array


def unwrap_subset(dataset: Any) -> tuple[ShardedDataset | None, np.ndarray | None]:
    """(the fastload dataset under ``dataset``, the indices a (nested) ``Subset`` selects, or None);
    (None, None) when ``dataset`` is no fastload dataset."""
    if isinstance(dataset, ShardedDataset):
        return dataset, None
    if isinstance(dataset, Subset):
        base, inner = unwrap_subset(dataset.dataset)
        if base is None:
            return None, None
        indices = checked_indices(dataset.indices, len(base) if inner is None else len(inner), "Subset")
        return base, indices if inner is None else inner[indices]
    return None, None


@dataclass(frozen=True)
class SamplerChoice:
    """What a ``sampler=`` argument asks of the fast path."""

    shuffle: bool | None = None  # None: the loader's shuffle= decides
    rank: int | None = None
    world_size: int | None = None
    seed: int | None = None
    drop_remainder: bool = False
    take: np.ndarray | None = None  # SubsetRandomSampler's indices
    distributed: DistributedSampler | None = None  # its epoch is read when each iteration starts


REFUSED_SAMPLER = (
    "fastload.DataLoader cannot honour sampler={name} on its fast path: the order there is a pure function of "
    "(seed, epoch, rank, world size), so it resumes exactly and deals samples to ranks itself. Use shuffle=True/False, "
    "a torch.utils.data.Subset of the dataset for a fixed list of samples, or a DistributedSampler for rank and "
    "world size; for another sampler wrap the samples in your own torch Dataset (then torch's loader runs)."
)


def adopt_sampler(sampler: Any, size: int) -> SamplerChoice:
    """The fast path's equivalent of a torch sampler over ``size`` samples, or a ValueError that
    says what to use instead."""
    if sampler is None:
        return SamplerChoice()
    name = type(sampler).__name__
    if isinstance(sampler, DistributedSampler):
        covered = len(cast(Sized, sampler.dataset))  # torch annotates Dataset without __len__
        if covered != size:
            raise ValueError(f"the DistributedSampler covers {covered} samples, the dataset has {size}")
        return SamplerChoice(sampler.shuffle, sampler.rank, sampler.num_replicas, sampler.seed, sampler.drop_last, None, sampler)
    if isinstance(sampler, SequentialSampler) and len(sampler) == size:
        return SamplerChoice(shuffle=False)
    if isinstance(sampler, RandomSampler) and not sampler.replacement and len(sampler) == size:
        return SamplerChoice(shuffle=True)
    if isinstance(sampler, SubsetRandomSampler):
        return SamplerChoice(shuffle=True, take=checked_indices(sampler.indices, size, "SubsetRandomSampler"))
    raise ValueError(REFUSED_SAMPLER.format(name=name))


class SamplingLoader(Protocol):
    """What the sampler views read from their loader (a fast-path ``fastload.DataLoader``, or a
    token rows' loader: its batches are lists of rows, fastload.text.token_samplers)."""

    dataset: Any
    batch_size: int
    drop_last: bool
    shuffle: bool
    seed: int
    sampler: Any
    state: LoaderState

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...

    def upcoming_batches(self, from_start: bool) -> Sequence[list[int]]: ...


class LoaderSampler(DistributedSampler):
    """``loader.sampler`` of a fast-path loader: this rank's sample indices of the current epoch,
    with DistributedSampler's attributes; ``set_epoch`` is the loader's."""

    def __init__(self, loader: SamplingLoader) -> None:  # no super().__init__: everything is read from the loader
        self._loader = loader

    def __iter__(self) -> Iterator[int]:
        for batch in self._loader.upcoming_batches(from_start=True):
            yield from batch

    def __len__(self) -> int:
        return sum(len(batch) for batch in self._loader.upcoming_batches(from_start=True))

    def set_epoch(self, epoch: int) -> None:
        """The loader's set_epoch: the next iteration yields that epoch's order."""
        self._loader.set_epoch(epoch)

    # Read-only views of what torch's DistributedSampler keeps as attributes: the loader's own values
    # (type: ignore[override] below: torch annotates them as plain, writable attributes).
    @property
    def epoch(self) -> int:  # type: ignore[override]
        return self._loader.state.epoch

    @property
    def num_replicas(self) -> int:  # type: ignore[override]
        return self._loader.world_size

    @property
    def rank(self) -> int:  # type: ignore[override]
        return self._loader.rank

    @property
    def shuffle(self) -> bool:  # type: ignore[override]
        return self._loader.shuffle

    @property
    def seed(self) -> int:  # type: ignore[override]
        return self._loader.seed

    @property
    def drop_last(self) -> bool:  # type: ignore[override]
        return self._loader.drop_last

    @property
    def dataset(self) -> Any:  # type: ignore[override]
        return self._loader.dataset

    @property
    def num_samples(self) -> int:  # type: ignore[override]
        return len(self)

    @property
    def total_size(self) -> int:  # type: ignore[override]
        return len(self) * self._loader.world_size


@dataclass(frozen=True)
class BatchRequest:
    """How the fast path makes the batches of one loader epoch: enough for any process that holds
    the dataset (a torch worker) to make the same batch."""

    transforms: tuple[Transform, ...]
    seed: int
    epoch: int
    on_error: str
    image_shape: tuple[int, int, int] | None  # None: the samples hold no image
    outputs: BatchOutputs
    sample_spec: SampleSpec  # the fields made of each sample (fields=, map=)
    rank: int  # seeds batch_map='s generator with the step


class BatchIndices(list):
    """One batch's sample indices (a list, as torch's batch samplers yield) that a fastload dataset's
    ``__getitems__`` turns into the fast path's batch (same plans, same pixels, same fields)."""

    def __init__(self, indices: Sequence[int], request: BatchRequest, valid: Sequence[bool], step: int) -> None:
        super().__init__(indices)
        self.request, self.valid, self.step = request, list(valid), step

    def __reduce__(self) -> tuple:
        return (BatchIndices, (list(self), self.request, self.valid, self.step))

    def fill(self, dataset: ShardedDataset) -> PlannedBatch:
        """Read, decode and transform this batch's fields as the loader's workers do."""
        from fastload.workers.batch_fill import fill_fields
        from fastload.workers.slots import spec_columns

        request = self.request
        columns = {c.name: np.empty((len(self), *c.shape), dtype=c.dtype)
                   for c in spec_columns(request.sample_spec, request.image_shape)}
        keys, _, values = fill_fields(dataset, np.asarray(self, dtype=np.int64), request.sample_spec, request.transforms,
                                      request.seed, request.epoch, request.on_error, columns)
        tensors = {name: as_tensor(column) for name, column in columns.items()}
        return PlannedBatch(tensors, values, keys, np.asarray(self.valid), request, self.step)


@dataclass
class PlannedBatch:
    """A batch :meth:`BatchIndices.fill` made, before :class:`LoaderCollate` shapes it as the loader does."""

    columns: dict[str, torch.Tensor | np.ndarray]  # the stacked fields
    values: dict[str, list]  # the fields batched as lists
    keys: list[str]
    valid: np.ndarray
    request: BatchRequest
    step: int  # the global step (batches every rank took this epoch)


@dataclass(frozen=True)
class LoaderCollate:
    """``loader.collate_fn``: a :class:`PlannedBatch` in the loader's batch outputs (Normalize/ToDtype
    applied here, on the CPU), then through the loader's ``collate_fn=`` as its samples and its
    ``batch_map=`` (with the generator the loader gives that step); a list of samples through
    ``collate_fn=``, else torch's default_collate."""

    user: Callable[[list], Any] | None = None  # the loader's collate_fn=
    batch_map: Callable[[Any, torch.Generator], Any] | None = None  # the loader's batch_map=

    def __call__(self, batch: Any) -> Any:
        if not isinstance(batch, PlannedBatch):
            return (self.user or torch.utils.data.default_collate)(batch)
        from fastload.transforms import batch_transform

        request = batch.request
        shaped = shaped_batch(request.sample_spec, request.outputs, batch.columns, batch.values, batch.keys, batch.valid,
                              None, batch_transform(request.transforms))
        if self.user is not None:
            shaped = self.user(samples_of(shaped))
        if self.batch_map is not None:
            shaped = self.batch_map(shaped, batch_generator(request.seed, request.epoch, batch.step, request.rank, None))
        return shaped


class LoaderBatchSampler(BatchSampler):
    """``loader.batch_sampler`` of a fast-path loader: the rest of this rank's batches of the
    current epoch (from a loaded state's position), as :class:`BatchIndices`."""

    def __init__(self, loader: SamplingLoader) -> None:  # no super().__init__: everything is read from the loader
        self._loader = loader

    def __iter__(self) -> Iterator[list[int]]:
        yield from self._loader.upcoming_batches(from_start=False)

    def __len__(self) -> int:
        return len(self._loader.upcoming_batches(from_start=False))

    # Read-only views of BatchSampler's attributes (type: ignore[override]: torch annotates them as writable).
    @property
    def sampler(self) -> Any:  # type: ignore[override]
        return self._loader.sampler

    @property
    def batch_size(self) -> int:  # type: ignore[override]
        return self._loader.batch_size

    @property
    def drop_last(self) -> bool:  # type: ignore[override]
        return self._loader.drop_last
