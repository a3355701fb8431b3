"""``fastload.DataLoader``: a drop-in for ``torch.utils.data.DataLoader``.

Given any torch Dataset it *is* torch's DataLoader (same arguments, same batches). Given a
converted dataset (or its path) it takes the fast path: workers read bytes by offset, decode
with libjpeg-turbo at the smallest sufficient DCT scale, transform, and write pixels into shared
memory; the main process keeps ``prefetch_factor`` batches in flight per worker, pins and moves
batches to ``device``, and applies Normalize/ToDtype there on whole batches.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from fastload.dataset import ShardedDataset
from fastload.dist import resolve_rank_world
from fastload.errors import SampleError, check_on_error
from fastload.sampling import RankBatches, epoch_order, rank_batches, shard_buffer_order
from fastload.stats import LoaderStats
from fastload.transforms import Transform, batch_transform, output_size, validate
from fastload.workers import BatchBuffers, BatchResult, WorkerConfig, WorkerError, WorkerPool, fill_batch

log = logging.getLogger("fastload")
BACKENDS = ("auto", "cpu")
STATE_VERSION = 1


class DataLoader:
    """Batches from a dataset; see the module docstring. Arguments before ``*`` are torch's.

    fastload's own: ``transform`` (specs from fastload.transforms), ``backend``, ``device``,
    ``seed``, ``on_error`` ("raise" | "skip"), ``return_keys``, ``rank``/``world_size``,
    ``evaluation`` (every sample once across ranks, padding marked by a ``valid`` tensor) and
    ``shuffle_buffer`` (streaming order: shuffled shards read in sequence through a buffer).
    """

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
        transform: Sequence[Transform] | None = None,
        backend: str = "auto",
        device: str | torch.device | None = None,
        seed: int = 0,
        on_error: str = "raise",
        return_keys: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        evaluation: bool = False,
        shuffle_buffer: int | None = None,
    ) -> None:
        if isinstance(dataset, (str, os.PathLike)):
            dataset = ShardedDataset(dataset)
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.drop_last = drop_last
        self.device = torch.device(device) if device is not None else None
        self._torch_loader: torch.utils.data.DataLoader | None = None
        if not isinstance(dataset, ShardedDataset):
            for name, value, default in (
                ("transform", transform, None), ("return_keys", return_keys, False),
                ("on_error", on_error, "raise"), ("evaluation", evaluation, False),
                ("shuffle_buffer", shuffle_buffer, None),
            ):
                if value != default:
                    raise ValueError(f"{name}= applies to fastload datasets; with a torch Dataset, do it inside the dataset")
            self._torch_loader = torch.utils.data.DataLoader(
                dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
                num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory, drop_last=drop_last,
                timeout=timeout, worker_init_fn=worker_init_fn, generator=generator,
                prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            )
            return
        for name, value in (("sampler", sampler), ("batch_sampler", batch_sampler), ("collate_fn", collate_fn), ("generator", generator)):
            if value is not None:
                raise ValueError(
                    f"{name}= is not used with a fastload dataset: order comes from shuffle/seed/rank "
                    f"(so it can resume exactly) and batches are assembled in shared memory"
                )
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if batch_size is None or batch_size < 1:
            raise ValueError("a fastload dataset needs batch_size >= 1")
        if num_workers < 0:
            raise ValueError("num_workers must be >= 0")
        if prefetch_factor is not None and num_workers == 0:
            raise ValueError("prefetch_factor needs num_workers > 0 (as in torch)")
        if evaluation and drop_last:
            raise ValueError("evaluation=True yields every sample exactly once: it cannot drop_last")
        self.evaluation = evaluation
        if shuffle_buffer is not None and (not shuffle or shuffle_buffer < 1):
            raise ValueError("shuffle_buffer= (streaming order) needs shuffle=True and a size >= 1")
        self.shuffle_buffer = shuffle_buffer
        self.shuffle = bool(shuffle)
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.prefetch_factor = 2 if prefetch_factor is None else prefetch_factor
        self.seed = seed
        self.on_error = check_on_error(on_error)
        self.return_keys = return_keys
        self.transform = validate(transform)
        self.rank, self.world_size = resolve_rank_world(rank, world_size)
        self.stats = LoaderStats()
        self.image_shape = self._image_shape()
        self._batch_fn = batch_transform(self.transform)
        self._epoch = 0
        self._resume_at = 0
        self._pool: WorkerPool | None = None
        self._buffers: BatchBuffers | None = None
        self._active: _EpochIterator | None = None
        log.info("fastload: backend=cpu (%s workers, libjpeg-turbo decode, shared-memory batches)", num_workers)

    def _image_shape(self) -> tuple[int, int, int]:
        ds: ShardedDataset = self.dataset
        size = output_size(self.transform)
        channels = 3
        if ds.decoded:
            height, width, channels = ds.index.decoded_shape  # type: ignore[misc]
            size = size or (height, width)
        if size is None:
            raise ValueError(
                "images of this dataset vary in size: give a transform with a fixed output size, "
                "e.g. transform=fastload.transforms.val(224)"
            )
        return (channels, size[0], size[1])

    # --- the torch-compatible surface -----------------------------------------------------------

    def __len__(self) -> int:
        if self._torch_loader is not None:
            return len(self._torch_loader)
        return len(self._plan(self._epoch, 0).batches)

    def __iter__(self) -> Iterator[Any]:
        if self._torch_loader is not None:
            return iter(self._torch_loader)
        if self._active is not None:
            self._active.close()
        start, self._resume_at = self._resume_at, 0
        self._active = _EpochIterator(self, self._epoch, self._plan(self._epoch, start))
        return self._active

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration yields (it also advances by itself).
        Setting the epoch a loaded state_dict is in keeps that state's position."""
        if int(epoch) != self._epoch:
            self._epoch = int(epoch)
            self._resume_at = 0

    def state_dict(self) -> dict[str, int]:
        """Where training is: only batches handed to the caller count, not prefetched ones."""
        if self._active is not None and not self._active.finished:
            epoch, consumed = self._active.epoch, self._active.consumed()
            if consumed >= self._active.plan.end and self._active.next_yield >= len(self._active.plan.batches):
                epoch, consumed = epoch + 1, 0
        else:
            epoch, consumed = self._epoch, self._resume_at
        return {"version": STATE_VERSION, "seed": self.seed, "epoch": epoch, "samples_consumed": consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume: the next iteration yields exactly the samples of that epoch not yet consumed."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"loader state version {state.get('version')} is not {STATE_VERSION}")
        if state["seed"] != self.seed:
            raise ValueError(f"state was saved with seed={state['seed']}, this loader has seed={self.seed}")
        self._epoch, self._resume_at = int(state["epoch"]), int(state["samples_consumed"])

    def close(self) -> None:
        """Stop the workers and release the shared memory (also done at garbage collection)."""
        if self._active is not None:
            self._active.finished = True
            self._active = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._buffers is not None:
            self._buffers.close()
            self._buffers = None

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------------

    def _plan(self, epoch: int, start: int) -> RankBatches:
        return rank_batches(len(self.dataset), start, self.batch_size, self.rank, self.world_size, self.drop_last)  # type: ignore[arg-type]

    def _discard_pool(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._active is not None:
            self._active.finished = True

    def _ensure_workers(self) -> tuple[BatchBuffers, WorkerPool | None]:
        if self._buffers is None:
            slots = max(1, self.num_workers * self.prefetch_factor)
            self._buffers = BatchBuffers(slots, self.batch_size, self.image_shape)  # type: ignore[arg-type]
        if self.num_workers and self._pool is None:
            config = WorkerConfig(self.dataset, self.transform, self.seed, self.on_error, self._buffers, self.worker_init_fn)
            self._pool = WorkerPool(config, self.num_workers)
        return self._buffers, self._pool

    def _deliver(self, result: BatchResult, buffers: BatchBuffers, valid: np.ndarray) -> Any:
        """Copy a finished slot out (into pinned memory when asked), move it, finish the batch.
        In evaluation mode a last element, the bool tensor ``valid``, marks padding entries."""
        n = result.count
        images = torch.empty((n, *self.image_shape), dtype=torch.uint8, pin_memory=self.pin_memory)
        np.copyto(images.numpy(), buffers.images(result.slot)[:n])
        labels = torch.from_numpy(buffers.labels(result.slot)[:n].copy())
        if self.device is not None:
            images = images.to(self.device, non_blocking=True)
            labels = labels.to(self.device, non_blocking=True)
        if self._batch_fn is not None:
            images = self._batch_fn(images)
        for where, reason in result.skipped:
            self.stats.record_skip(where, reason)
        if self.dataset.has_labels:
            batch: Any = (images, labels, result.keys) if self.return_keys else (images, labels)
            return (*batch, torch.from_numpy(valid)) if self.evaluation else batch
        batch = {"image": images}
        if self.return_keys:
            batch["key"] = result.keys
        if self.evaluation:
            batch["valid"] = torch.from_numpy(valid)
        return batch


class _EpochIterator:
    """One pass over a rank's batches: dispatches to free slots, yields in order."""

    def __init__(self, loader: DataLoader, epoch: int, plan: RankBatches) -> None:
        self.loader, self.epoch, self.plan = loader, epoch, plan
        if loader.shuffle_buffer is not None:
            sizes = [shard.samples for shard in loader.dataset.index.shards]
            self.order = shard_buffer_order(sizes, loader.seed, epoch, loader.shuffle_buffer)
        else:
            self.order = epoch_order(len(loader.dataset), loader.seed, epoch, loader.shuffle)
        self.buffers, self.pool = loader._ensure_workers()
        self.free_slots = list(range(self.buffers.slots))
        self.next_submit = 0
        self.next_yield = 0
        self.ready: dict[int, BatchResult] = {}
        self.finished = False
        self.in_flight = 0

    def consumed(self) -> int:
        return self.plan.consumed_after(self.next_yield)

    def __iter__(self) -> _EpochIterator:
        return self

    def _indices(self, batch_no: int) -> np.ndarray:
        return self.order[self.plan.batches[batch_no]]

    def _submit_more(self) -> None:
        while self.free_slots and self.next_submit < len(self.plan.batches):
            slot = self.free_slots.pop()
            self.pool.submit(self.next_submit, slot, self.epoch, self._indices(self.next_submit))  # type: ignore[union-attr]
            self.next_submit += 1
            self.in_flight += 1

    def _run_inline(self) -> BatchResult:
        slot = 0
        indices = self._indices(self.next_yield)
        result = BatchResult(batch_no=self.next_yield, slot=slot, count=len(indices))
        result.keys, result.skipped = fill_batch(
            self.loader.dataset, indices, self.loader.transform, self.loader.seed, self.epoch,
            self.loader.on_error, self.buffers.images(slot), self.buffers.labels(slot),
        )
        return result

    def __next__(self) -> Any:
        if self.next_yield >= len(self.plan.batches):
            self._finish()
            raise StopIteration
        stats = self.loader.stats
        with stats.waiting():
            if self.pool is None:
                result = self._run_inline()
            else:
                self._submit_more()
                while self.next_yield not in self.ready:
                    try:
                        got = self.pool.get(self.loader.timeout)
                    except WorkerError:
                        self.loader._discard_pool()  # the next iteration starts fresh workers
                        raise
                    self.in_flight -= 1
                    if got.error is not None:
                        self.close()
                        if got.bad_sample is not None:
                            raise SampleError(*got.bad_sample) from WorkerError(got.error)
                        raise WorkerError(got.error)
                    self.ready[got.batch_no] = got
                result = self.ready.pop(self.next_yield)
        batch = self.loader._deliver(result, self.buffers, self.plan.valid(self.next_yield))
        if self.pool is not None:
            self.free_slots.append(result.slot)
        self.next_yield += 1
        stats.record_batch(result.count)
        return batch

    def _finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.loader._epoch = self.epoch + 1
            self.loader._resume_at = 0

    def close(self) -> None:
        """Abandon the epoch (a break, an exception): drain the workers' pending answers.
        The next iteration starts this epoch over, as with torch; resume needs load_state_dict."""
        if self.pool is not None and self.in_flight and not self.finished:
            try:
                while self.in_flight:
                    self.pool.get(timeout=30)
                    self.in_flight -= 1
            except (WorkerError, TimeoutError):
                self.loader._discard_pool()
        self.ready.clear()
        self.in_flight = 0
        if not self.finished:  # like torch: a new iteration starts this epoch over
            self.loader._resume_at = 0
            self.loader._epoch = self.epoch
        self.finished = True

