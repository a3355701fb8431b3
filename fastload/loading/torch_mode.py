"""``fastload.DataLoader`` over any torch Dataset: torch's DataLoader itself (same arguments, same
batches), with the rest of fastload's loader surface: ``set_epoch``, a resumable ``state_dict``,
``close`` and ``stats``. :class:`TorchMode` is that behaviour; ``fastload.loader`` joins it to
``fastload.DataLoader`` (so the object is one, context manager included) without this module
importing the loader.

A resume skips the consumed batches' *indices* (nothing is loaded for them) when the order can be
replayed: a map-style dataset whose sampler is sequential, a DistributedSampler (its epoch is
recorded), or shuffling drawn from ``seed`` and the epoch (``shuffle=True`` without a
``generator``: fastload seeds torch's RandomSampler per epoch so the order is reproducible). An
iterable dataset is resumed by reading and dropping the consumed batches.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset, RandomSampler

from fastload.loading.loader_options import fast_path_defaults
from fastload.loading.state import STATE_VERSION
from fastload.loading.stats import LoaderStats
from fastload.orders.epoch_order import epoch_seed

FAST_PATH_ONLY = fast_path_defaults()


class _SkipFirst:
    """A sampler's iteration without its first ``skip`` items (indices only: nothing is loaded)."""

    def __init__(self, sampler: Any, skip: int) -> None:
        self.sampler, self.skip = sampler, skip

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.sampler), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.skip)


class TorchMode(torch.utils.data.DataLoader):
    """What ``fastload.DataLoader(torch_dataset, ...)`` does; see the module docstring."""

    _is_accelerate_prepared = False  # Accelerate prepares it like any torch DataLoader
    use_stateful_dataloader = False

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        generator: torch.Generator | None = None,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        *,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        torch_only = {k: kwargs.pop(k) for k in ("multiprocessing_context", "pin_memory_device", "in_order") if k in kwargs}
        for name, value in kwargs.items():
            if name not in FAST_PATH_ONLY:
                raise TypeError(f"DataLoader got an unexpected keyword argument {name!r}")
            if value != FAST_PATH_ONLY[name]:
                raise ValueError(f"{name}= applies to fastload datasets; with a torch Dataset, do it inside the dataset")
        self._seeds_shuffle = bool(shuffle) and sampler is None and batch_sampler is None and generator is None
        torch.utils.data.DataLoader.__init__(
            self, dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
            num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory, drop_last=drop_last,
            timeout=timeout, worker_init_fn=worker_init_fn, generator=generator, prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers, **torch_only,
        )
        self.seed = seed
        self.stats = LoaderStats()
        self._epoch = 0
        self._skip = 0  # batches of the current epoch a loaded state says were consumed
        self._consumed = 0  # batches of the running epoch handed out
        self._running_epoch: int | None = None

    @property
    def _index_sampler(self) -> Any:  # torch's: what its iterators draw indices from
        sampler = torch.utils.data.DataLoader._index_sampler.fget(self)  # type: ignore[attr-defined]
        return _SkipFirst(sampler, self._skip) if self._skip and self._map_style else sampler

    @property
    def _map_style(self) -> bool:
        return not isinstance(self.dataset, IterableDataset)

    def _seed_order(self) -> None:
        """The epoch's order from (seed, epoch): torch's samplers get it through their hooks."""
        for sampler in (self.sampler, getattr(self.batch_sampler, "sampler", None)):
            set_epoch = getattr(sampler, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(self._epoch)
        if self._seeds_shuffle and isinstance(self.sampler, RandomSampler):
            self.sampler.generator = torch.Generator().manual_seed(epoch_seed(self.seed, self._epoch))

    def _full_length(self) -> int | None:
        """Batches in a whole epoch, or None for a dataset without a length."""
        try:
            return torch.utils.data.DataLoader.__len__(self)
        except TypeError:
            return None

    def __len__(self) -> int:
        return torch.utils.data.DataLoader.__len__(self)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # torch annotates its own iterator class
        self._seed_order()
        skip, epoch = self._skip, self._epoch
        total = self._full_length()
        try:
            batches: Iterator[Any] = torch.utils.data.DataLoader.__iter__(self)  # draws from _index_sampler, past `skip` batches
        finally:
            self._skip = 0
        if skip and not self._map_style:
            batches = itertools.islice(batches, skip, None)  # an iterable dataset can only be read past
        self._running_epoch, self._consumed = epoch, skip
        return self._count(batches, epoch, total)

    def _count(self, batches: Iterator[Any], epoch: int, total: int | None) -> Iterator[Any]:
        """Yield the batches; the epoch is over once all are handed out (or at StopIteration)."""
        for batch in batches:
            self._consumed += 1
            self.stats.record_batch(len(batch) if isinstance(batch, torch.Tensor) else 1)
            if self._consumed == total and self._running_epoch == epoch:
                self._epoch, self._running_epoch = epoch + 1, None
            yield batch
        if self._running_epoch == epoch:
            self._epoch, self._running_epoch = epoch + 1, None

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration yields (also given to a sampler's own set_epoch)."""
        self._epoch, self._skip, self._running_epoch = int(epoch), 0, None

    def state_dict(self) -> dict[str, Any]:
        """(epoch, batches consumed): exact when the order replays (see the module docstring)."""
        if self._running_epoch is not None:
            return {"version": STATE_VERSION, "mode": "torch", "seed": self.seed, "epoch": self._running_epoch,
                    "batches_consumed": self._consumed}
        return {"version": STATE_VERSION, "mode": "torch", "seed": self.seed, "epoch": self._epoch, "batches_consumed": self._skip}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iteration continues that epoch after its consumed batches."""
        if state.get("version") != STATE_VERSION or state.get("mode") != "torch":
            raise ValueError("not the state of a fastload.DataLoader over a torch Dataset")
        if state["seed"] != self.seed:
            raise ValueError(f"state was saved with seed={state['seed']}, this loader has seed={self.seed}")
        self._epoch, self._skip, self._running_epoch = int(state["epoch"]), int(state["batches_consumed"]), None

    def describe(self, step: int, epoch: int | None = None) -> Any:
        """Not available: over a torch Dataset its own code reads and augments the samples."""
        raise TypeError("describe() names the samples and crops of a converted dataset's batches; over a torch Dataset "
                        "the dataset's own code decides them (give fastload.DataLoader a converted dataset)")

    def close(self) -> None:
        """Stop torch's persistent workers, if any."""
        self._iterator = None

    @property
    def rank(self) -> int:
        return getattr(self.sampler, "rank", 0)

    @property
    def world_size(self) -> int:
        return getattr(self.sampler, "num_replicas", 1)
