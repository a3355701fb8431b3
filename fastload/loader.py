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
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from fastload.dali_feed import DaliFeed
from fastload.dataset import ShardedDataset
from fastload.dist import resolve_rank_world
from fastload.errors import SampleError, check_on_error, rebuild_error
from fastload.prefetch import ShardPrefetcher, shards_in_use_order
from fastload.sampling import EpochOrder, OrderSpec, RankBatches
from fastload.stats import LoaderStats
from fastload.transforms import Transform, batch_transform, output_size, validate
from fastload.workers import (
    BatchBuffers,
    BatchResult,
    WorkerConfig,
    WorkerError,
    WorkerPool,
    fill_batch,
    merge_parts,
)

log = logging.getLogger("fastload")
BACKENDS = ("auto", "cpu", "dali")
_logged: set[tuple[str, str]] = set()


def choose_backend(requested: str, decoded_pixels: bool) -> tuple[str, str]:
    """("cpu" | "dali-cpu" | "dali-gpu", why). ``auto`` takes DALI only on a GPU: on the CPU
    fastload's own workers measured 1.5-1.7x DALI's CPU pipeline (README, fastload bench)."""
    from fastload.decode.dali import dali_available

    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {requested!r}")
    if requested == "cpu":
        return "cpu", "backend='cpu'"
    if decoded_pixels:
        if requested == "dali":
            raise ValueError("backend='dali' decodes images; this dataset stores decoded pixels (use backend='cpu')")
        return "cpu", "the dataset stores decoded pixels: nothing to decode"
    gpu = torch.cuda.is_available()
    if requested == "dali":
        if not dali_available():
            raise ImportError("backend='dali' needs NVIDIA DALI: pip install 'fastload[dali]'")
        return ("dali-gpu", "a CUDA GPU is visible") if gpu else ("dali-cpu", "no CUDA GPU: DALI runs on the CPU")
    if gpu and dali_available():
        return "dali-gpu", "DALI is installed and a CUDA GPU is visible"
    if gpu:
        return "cpu", "DALI is not installed (pip install 'fastload[dali]' for GPU decoding)"
    return "cpu", "no CUDA GPU; on the CPU fastload's workers beat DALI's CPU pipeline"


STATE_VERSION = 1
LENDABLE_SLOTS = 2  # batch slots beyond the workers' queue, for batches the caller still holds
MIN_PART = 16  # the fewest samples a worker is given of a batch
REMOTE_SHUFFLE_BUFFER = 4096


class DataLoader:
    """Batches from a dataset; see the module docstring. Arguments before ``*`` are torch's.

    fastload's own: ``transform`` (specs from fastload.transforms), ``backend``, ``device``,
    ``seed``, ``on_error`` ("raise" | "skip"), ``return_keys``, ``rank``/``world_size``,
    ``evaluation`` (every sample once across ranks, padding marked by a ``valid`` tensor),
    ``shuffle_buffer`` (streaming order: each rank reads its own shuffled shards in sequence
    through a buffer; always used for remote datasets, with ``REMOTE_SHUFFLE_BUFFER`` by default) and
    ``hw_decoder_load`` (with DALI on a GPU: the share of JPEGs sent to the hardware decoder).
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
        hw_decoder_load: float = 0.65,
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
                ("shuffle_buffer", shuffle_buffer, None), ("hw_decoder_load", hw_decoder_load, 0.65),
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
        self.streaming = shuffle_buffer is not None or dataset.url is not None
        self.shuffle_buffer = (shuffle_buffer or REMOTE_SHUFFLE_BUFFER) if shuffle else 1
        if not 0 <= hw_decoder_load <= 1:
            raise ValueError("hw_decoder_load is a share of images, between 0 and 1")
        self.hw_decoder_load = hw_decoder_load
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
        self._generations: list[tuple[int, int, int]] = []  # (world, batch, consumed) of earlier layouts this epoch
        self._order_cache: tuple[tuple, EpochOrder] | None = None
        self._pool: WorkerPool | None = None
        self._buffers: BatchBuffers | None = None
        self._active: _Epoch | None = None
        self._dali = None
        self.backend, why = choose_backend(backend, dataset.decoded)
        if (self.backend, why) not in _logged:
            _logged.add((self.backend, why))
            log.warning("fastload: backend=%s (%s)", self.backend, why)

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
        epoch_class = _DaliEpoch if self.backend.startswith("dali") else _EpochIterator
        self._active = epoch_class(self, self._epoch, self._plan(self._epoch, start))
        return self._active

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration yields (it also advances by itself).
        Setting the epoch a loaded state_dict is in keeps that state's position."""
        self._settle_abandoned()
        if int(epoch) != self._epoch:
            self._epoch = int(epoch)
            self._resume_at = 0
            self._generations = []

    def _settle_abandoned(self) -> None:
        """Close an epoch left in progress (a break) now: closing restores its own position, which
        must happen before the caller sets another (set_epoch, load_state_dict), not over it."""
        if self._active is not None:
            self._active.close()

    def state_dict(self) -> dict[str, Any]:
        """Where training is: only batches handed to the caller count, not prefetched ones."""
        generations = self._generations
        if self._active is not None and not self._active.finished:
            epoch, consumed = self._active.epoch, self._active.consumed()
            if consumed >= self._active.plan.end and self._active.next_yield >= len(self._active.plan.batches):
                epoch, consumed, generations = epoch + 1, 0, []
        else:
            epoch, consumed = self._epoch, self._resume_at
        state: dict[str, Any] = {"version": STATE_VERSION, "seed": self.seed, "epoch": epoch, "samples_consumed": consumed}
        if self.streaming:  # its positions depend on the layout: record it for a resume at another one
            state.update(order="streaming", world_size=self.world_size, batch_size=self.batch_size,
                         resumed_from=[list(g) for g in generations])
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration yields exactly the samples of that epoch not yet consumed,
        at any world size (the streaming order then deals the unseen shards anew)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"loader state version {state.get('version')} is not {STATE_VERSION}")
        if state["seed"] != self.seed:
            raise ValueError(f"state was saved with seed={state['seed']}, this loader has seed={self.seed}")
        order = "streaming" if self.streaming else "global"
        if state.get("order", "global") != order:
            raise ValueError(f"state was saved with the {state.get('order', 'global')} order, this loader uses the {order} order")
        self._settle_abandoned()
        consumed = int(state["samples_consumed"])
        generations = [tuple(int(v) for v in g) for g in state.get("resumed_from", [])] if self.streaming else []
        layout = (int(state.get("world_size", self.world_size)), int(state.get("batch_size", self.batch_size)))
        if self.streaming and consumed and layout != (self.world_size, self.batch_size):
            generations.append((*layout, consumed))
            consumed = 0
        self._epoch, self._resume_at, self._generations = int(state["epoch"]), consumed, generations  # type: ignore[assignment]

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
        if self._dali is not None:
            self._dali.close()
            self._dali = None

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------------

    def _plan(self, epoch: int, start: int) -> RankBatches:
        return self._order_spec().batches(len(self._epoch_order(epoch)), start)

    def _order_spec(self) -> OrderSpec:
        """What this loader's orders depend on, as plain values (DALI's workers get a copy)."""
        ds: ShardedDataset = self.dataset
        return OrderSpec(
            tuple(shard.samples for shard in ds.index.shards), self.seed, self.shuffle, self.batch_size,  # type: ignore[arg-type]
            self.rank, self.world_size, self.drop_last, self.streaming, self.shuffle_buffer, tuple(self._generations),
        )

    def _epoch_order(self, epoch: int) -> EpochOrder:
        """The epoch's global order (the same for every backend), cached for the current epoch."""
        spec = self._order_spec()
        if self._order_cache is None or self._order_cache[0] != (epoch, spec):
            self._order_cache = ((epoch, spec), spec.order(epoch))
        return self._order_cache[1]

    def _discard_pool(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._active is not None:
            self._active.finished = True

    def _ensure_workers(self) -> tuple[BatchBuffers, WorkerPool | None]:
        if self._buffers is None:
            in_flight = self.num_workers * self.prefetch_factor
            slots = in_flight + LENDABLE_SLOTS if in_flight else 1
            self._buffers = BatchBuffers(slots, self.batch_size, self.image_shape)  # type: ignore[arg-type]
        if self.num_workers and self._pool is None:
            config = WorkerConfig(self.dataset, self.transform, self.seed, self.on_error, self._buffers, self.worker_init_fn)
            self._pool = WorkerPool(config, self.num_workers)
        return self._buffers, self._pool

    def _deliver(self, result: BatchResult, buffers: BatchBuffers, valid: np.ndarray) -> Any:
        """Hand a finished slot's images out (lent without a copy when workers fill the slots and
        nothing is pinned; else copied, into pinned memory when asked) and finish the batch."""
        n = result.count
        labels = torch.from_numpy(buffers.labels(result.slot)[:n].copy())
        keep = self.num_workers * self.prefetch_factor  # lending never thins the workers' queue
        lent = None if self.pin_memory or self._pool is None else buffers.lend(result.slot, n, keep=keep)
        if lent is not None:
            images = torch.from_numpy(lent)
        else:
            images = torch.empty((n, *self.image_shape), dtype=torch.uint8, pin_memory=self.pin_memory)
            np.copyto(images.numpy(), buffers.images(result.slot)[:n])
            buffers.give_back(result.slot)
        return self._finish_batch(images, labels, result.keys, result.skipped, valid)

    def _finish_batch(self, images: torch.Tensor, labels: torch.Tensor, keys: list[str], skipped: list, valid: np.ndarray) -> Any:
        """Move to ``device``, apply Normalize/ToDtype there, shape the batch. In evaluation mode a
        last element, the bool tensor ``valid``, marks padding entries."""
        if self.device is not None:
            images = images.to(self.device, non_blocking=True)
            labels = labels.to(self.device, non_blocking=True)
        if self._batch_fn is not None:
            images = self._batch_fn(images)
        for where, reason in skipped:
            self.stats.record_skip(where, reason)
        if self.dataset.has_labels:
            batch: Any = (images, labels, keys) if self.return_keys else (images, labels)
            return (*batch, torch.from_numpy(valid)) if self.evaluation else batch
        batch = {"image": images}
        if self.return_keys:
            batch["key"] = keys
        if self.evaluation:
            batch["valid"] = torch.from_numpy(valid)
        return batch

    def _dali_decoder(self):  # type: ignore[no-untyped-def]
        """The DALI pipeline wrapper of this loader, made on first use."""
        from fastload.decode.dali import DaliBatchDecoder

        if self._dali is None:
            device_id = torch.cuda.current_device() if self.backend == "dali-gpu" else None
            self._dali = DaliBatchDecoder(
                self.batch_size, self.image_shape[1:], max(1, self.num_workers), device_id, self.hw_decoder_load,  # type: ignore[arg-type]
                workers=self.num_workers,
            )
        return self._dali


class _Epoch:
    """One pass over a rank's batches, in the epoch's order; subclasses produce the batches."""

    def __init__(self, loader: DataLoader, epoch: int, plan: RankBatches) -> None:
        self.loader, self.epoch, self.plan = loader, epoch, plan
        epoch_order = loader._epoch_order(epoch)
        self.order, self.order_valid = epoch_order.order, epoch_order.valid
        self.next_yield = 0
        self.finished = False
        self.prefetcher: ShardPrefetcher | None = None

    def _start_prefetch(self) -> None:
        """For a remote dataset, start downloading this rank's shards ahead of use."""
        if self.loader.dataset.url is not None and self.plan.batches:
            batches = [self.order[positions] for positions in self.plan.batches]
            shards, first_batch = shards_in_use_order(self.loader.dataset, batches)
            self.prefetcher = ShardPrefetcher(self.loader.dataset, shards, first_batch, self._dispatched)

    def _dispatched(self) -> int:
        """Batches whose samples have been handed to the decoders so far."""
        return self.next_yield

    def _stop_prefetch(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.stop()
            self.prefetcher = None

    def valid(self, batch_no: int) -> np.ndarray:
        """Which entries of batch ``batch_no`` are real samples (not padding)."""
        valid = self.plan.valid(batch_no)
        if self.order_valid is not None:
            valid = valid & self.order_valid[self.plan.batches[batch_no]]
        return valid

    def consumed(self) -> int:
        """Global samples consumed once the batches yielded so far are counted."""
        return self.plan.consumed_after(self.next_yield)

    def __iter__(self) -> _Epoch:
        return self

    def _finish(self) -> None:
        self._stop_prefetch()
        if not self.finished:
            self.finished = True
            self.loader._epoch = self.epoch + 1
            self.loader._resume_at = 0
            self.loader._generations = []

    def _abandon(self) -> None:
        """Like torch, a new iteration after an abandoned one starts this epoch over."""
        self._stop_prefetch()
        if not self.finished:
            self.loader._resume_at = 0
            self.loader._epoch = self.epoch
            self.loader._generations = []
        self.finished = True


class _EpochIterator(_Epoch):
    """The CPU path: dispatches batches to the workers' free slots, yields them in order."""

    def __init__(self, loader: DataLoader, epoch: int, plan: RankBatches) -> None:
        super().__init__(loader, epoch, plan)
        self.buffers, self.pool = loader._ensure_workers()
        self.buffers.reclaim()  # nothing is being filled now; lent slots stay lent
        self.next_submit = 0
        self.parts: dict[int, list[BatchResult]] = {}  # finished parts of batches not yet whole
        self.expected_parts: dict[int, int] = {}
        self.ready: dict[int, BatchResult] = {}
        self.in_flight = 0  # parts submitted and not answered
        self._start_prefetch()

    def _dispatched(self) -> int:
        return self.next_submit

    def _indices(self, batch_no: int) -> np.ndarray:
        return self.order[self.plan.batches[batch_no]]

    def _submit_more(self) -> None:
        """Give every free slot the next batch, split into one part per worker (at least
        MIN_PART samples each): all workers work on the oldest batch, so a batch, the first
        one included, is ready in 1/workers of the time, and an epoch's last batches don't
        leave workers idle."""
        while self.next_submit < len(self.plan.batches) and (slot := self.buffers.take()) is not None:
            indices = self._indices(self.next_submit)
            count = max(1, min(self.loader.num_workers, len(indices) // MIN_PART))
            bounds = np.linspace(0, len(indices), count + 1).astype(int)
            for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
                self.pool.submit(self.next_submit, slot, self.epoch, start, indices[start:end])  # type: ignore[union-attr]
            self.expected_parts[self.next_submit] = count
            self.next_submit += 1
            self.in_flight += count

    def _receive(self, got: BatchResult) -> None:
        """File a finished part; a batch whose parts are all in is ready."""
        parts = self.parts.setdefault(got.batch_no, [])
        parts.append(got)
        if len(parts) == self.expected_parts[got.batch_no]:
            self.ready[got.batch_no] = merge_parts(self.parts.pop(got.batch_no))
            del self.expected_parts[got.batch_no]

    def _run_inline(self) -> BatchResult:
        slot = self.buffers.take()  # never None: the inline path copies every batch out
        indices = self._indices(self.next_yield)
        result = BatchResult(batch_no=self.next_yield, slot=slot, count=len(indices))  # type: ignore[arg-type]
        try:
            result.keys, result.skipped = fill_batch(
                self.loader.dataset, indices, self.loader.transform, self.loader.seed, self.epoch,
                self.loader.on_error, self.buffers.images(slot), self.buffers.labels(slot),  # type: ignore[arg-type]
            )
        except BaseException:
            self.buffers.give_back(slot)  # type: ignore[arg-type]
            raise
        return result

    def __next__(self) -> Any:
        if self.next_yield >= len(self.plan.batches):
            self._finish()
            raise StopIteration
        stats = self.loader.stats
        if self.prefetcher is not None:
            self.prefetcher.check()
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
                        if got.failure is not None:
                            raise rebuild_error(*got.failure) from WorkerError(got.error)
                        raise WorkerError(got.error)
                    self._receive(got)
                result = self.ready.pop(self.next_yield)
        batch = self.loader._deliver(result, self.buffers, self.valid(self.next_yield))
        self.next_yield += 1
        stats.record_batch(result.count)
        return batch

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
        self.parts.clear()
        self.expected_parts.clear()
        self.in_flight = 0
        self._abandon()



def is_decode_failure(exc: BaseException) -> bool:
    """Whether a DALI pipeline error is one of its operators failing on the data (a JPEG it cannot
    decode), which the CPU path then names or skips. Errors from the feed's worker processes
    arrive as a plain Exception and are raised: unreadable samples travel as notes, not errors."""
    return type(exc) is RuntimeError and exc.__cause__ is None


class _DaliEpoch(_Epoch):
    """One pass over a rank's batches decoded by DALI, in the same order as the CPU path.

    DALI's worker processes read each batch's bytes and plan its crops (fastload's own plans, so
    the geometry equals the CPU path's); DALI decodes only the crop regions and resizes. A sample
    whose header is unreadable is skipped while planning, or with ``on_error="raise"`` raised
    when its batch is due; a batch DALI cannot decode (corrupt entropy data) is redone on the CPU
    path, which names or skips the bad sample, and DALI carries on after it.
    """

    def __init__(self, loader: DataLoader, epoch: int, plan: RankBatches) -> None:
        super().__init__(loader, epoch, plan)
        self.decoder = loader._dali_decoder()
        self._start_prefetch()
        self.feed = DaliFeed(
            loader.dataset, loader.transform, loader.seed, loader.on_error, loader._order_spec(), epoch, plan.start
        )
        self.decoder.start(self.feed, len(plan.batches))

    def _on_cpu(self, batch_no: int) -> tuple[torch.Tensor, list[int], list[str], list[tuple[str, str]]]:
        loader = self.loader
        indices = self.order[self.plan.batches[batch_no]]
        images = np.empty((len(indices), *loader.image_shape), dtype=np.uint8)
        labels = np.empty(len(indices), dtype=np.int64)
        keys, skipped = fill_batch(loader.dataset, indices, loader.transform, loader.seed, self.epoch, loader.on_error, images, labels)
        return torch.from_numpy(images), labels.tolist(), keys, skipped

    def __next__(self) -> Any:
        if self.next_yield >= len(self.plan.batches):
            self._finish()
            raise StopIteration
        if self.prefetcher is not None:
            self.prefetcher.check()
        with self.loader.stats.waiting():
            try:
                images, labels, keys, skipped, error = self.decoder.next_batch()
            except Exception as exc:  # noqa: BLE001 - data DALI cannot decode goes to the CPU path; anything else is raised
                if not is_decode_failure(exc):
                    self.finished = True
                    raise
                log.warning("fastload: DALI failed on batch %d of epoch %d, redoing it on the CPU: %s",
                            self.next_yield, self.epoch, (str(exc).strip().splitlines() or ["RuntimeError"])[-1][:300])
                self.loader.stats.redone_on_cpu += 1
                try:
                    images, labels, keys, skipped = self._on_cpu(self.next_yield)
                except SampleError:
                    self.finished = True
                    raise
                following = self.next_yield + 1
                self.decoder.start(replace(self.feed, first_batch=following), len(self.plan.batches) - following)
            else:
                if error is not None:  # a sample that could not be read (on_error="raise", or no substitute left)
                    self.finished = True
                    raise error
        batch = self.loader._finish_batch(
            images, torch.tensor(labels, dtype=torch.int64), keys, skipped, self.valid(self.next_yield)
        )
        self.next_yield += 1
        self.loader.stats.record_batch(len(keys))
        return batch

    def close(self) -> None:
        """Abandon the epoch; the next iteration starts it over (and rebuilds the pipeline)."""
        self._abandon()
