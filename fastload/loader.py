"""``fastload.DataLoader``: a drop-in for ``torch.utils.data.DataLoader``.

Given any torch Dataset it *is* torch's DataLoader (same arguments, same batches). Given a
converted dataset (or its path) it takes the fast path: workers read bytes by offset, decode
with libjpeg-turbo at the smallest sufficient DCT scale, transform, and write pixels into shared
memory; the main process keeps ``prefetch_factor`` batches in flight per worker, pins and moves
batches to ``device``, and applies Normalize/ToDtype there on whole batches.
"""

from __future__ import annotations

import hashlib
import logging
import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from fastload.dali_feed import DaliFeed
from fastload.dataset import ShardedDataset
from fastload.dist import check_ranks_agree, resolve_rank_world
from fastload.errors import SampleError, check_on_error, rebuild_error
from fastload.field_batch import as_tensor, copied, field_batch
from fastload.frameworks import AccelerateEpoch, accelerate_device
from fastload.prefetch import ShardPrefetcher, shards_in_use_order
from fastload.sample_decode import resolve_spec
from fastload.samplers import BatchRequest, LoaderBatchSampler, LoaderSampler, adopt_sampler, collate, unwrap_subset
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
    fill_fields,
    merge_parts,
    spec_columns,
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


def is_fastload_dataset(dataset: Any) -> bool:
    """Whether ``dataset`` takes the fast path: a converted dataset, its path, or a Subset of one."""
    return isinstance(dataset, (str, os.PathLike)) or unwrap_subset(dataset)[0] is not None


class DataLoader(torch.utils.data.DataLoader):
    """Batches from a dataset; see the module docstring. Arguments before ``*`` are torch's.

    It is a ``torch.utils.data.DataLoader`` (Lightning and Accelerate treat it as one) with torch's
    attributes: ``dataset``, ``batch_size``, ``drop_last``, ``sampler`` (a DistributedSampler of
    this rank's indices whose ``set_epoch`` is the loader's), ``batch_sampler``. ``sampler=`` takes a
    DistributedSampler (rank, world size, shuffle, seed and drop_last come from it; its set_epoch
    takes effect), a Random/Sequential/SubsetRandomSampler; ``dataset`` may be a ``Subset`` of a
    fastload dataset. Rank and world size are resolved when iteration starts.

    fastload's own: ``transform`` (specs from fastload.transforms), ``backend``, ``device``,
    ``seed``, ``on_error`` ("raise" | "skip"), ``return_keys``, ``rank``/``world_size``,
    ``evaluation`` (every sample once across ranks, padding marked by a ``valid`` tensor),
    ``shuffle_buffer`` (streaming order: each rank reads its own shuffled shards in sequence
    through a buffer; always used for remote datasets, with ``REMOTE_SHUFFLE_BUFFER`` by default) and
    ``hw_decoder_load`` (with DALI on a GPU: the share of JPEGs sent to the hardware decoder).
    """

    use_stateful_dataloader = True  # Accelerate's save_state/load_state then save and load state_dict()

    def __new__(cls, dataset: Any = None, *args: Any, **kwargs: Any) -> DataLoader:
        if cls is DataLoader and not is_fastload_dataset(dataset):
            from fastload.torch_mode import TorchDatasetLoader

            return super().__new__(TorchDatasetLoader)
        return super().__new__(cls)

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
        fields: Sequence[str] | Mapping[str, str] | None = None,
        map: Callable[[dict, np.random.Generator], dict] | None = None,  # noqa: A002 - the public name
    ) -> None:
        if isinstance(dataset, (str, os.PathLike)):
            dataset = ShardedDataset(dataset)
        sharded, take = unwrap_subset(dataset)
        assert sharded is not None  # __new__ sent every other dataset to torch_mode
        self.dataset = dataset
        self.sharded: ShardedDataset = sharded
        for name, value in (("batch_sampler", batch_sampler), ("collate_fn", collate_fn), ("generator", generator)):
            if value is not None:
                raise ValueError(
                    f"{name}= is not used with a fastload dataset: order comes from shuffle/seed/rank "
                    f"(so it can resume exactly) and batches are assembled in shared memory"
                )
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle (as in torch)")
        choice = adopt_sampler(sampler, len(dataset))
        if choice.take is not None:
            take = choice.take if take is None else take[choice.take]
        if choice.seed is not None and seed not in (0, choice.seed):
            raise ValueError(f"seed={seed} and the sampler's seed={choice.seed} differ: give one of them")
        shuffle = choice.shuffle if choice.shuffle is not None else shuffle
        seed = choice.seed if choice.seed is not None else seed
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
        self.streaming = shuffle_buffer is not None or sharded.url is not None
        if self.streaming and take is not None:
            raise ValueError("a Subset (or SubsetRandomSampler) picks samples across shards: not with the streaming "
                             "order (remote datasets, shuffle_buffer=), which reads whole shards")
        self._take = None if take is None else tuple(take.tolist())
        self.shuffle_buffer = (shuffle_buffer or REMOTE_SHUFFLE_BUFFER) if shuffle else 1
        if not 0 <= hw_decoder_load <= 1:
            raise ValueError("hw_decoder_load is a share of images, between 0 and 1")
        self.hw_decoder_load = hw_decoder_load
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.drop_last = drop_last
        self.shuffle = bool(shuffle)
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self.pin_memory_device = ""
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.prefetch_factor = (2 if prefetch_factor is None else prefetch_factor) if num_workers else None  # torch's values
        self.persistent_workers = persistent_workers  # workers always live as long as the loader
        self.multiprocessing_context = None
        self.generator = None
        self.in_order = True
        self.seed = seed
        self.on_error = check_on_error(on_error)
        self.return_keys = return_keys
        self.transform = validate(transform)
        self.sample_spec = resolve_spec(sharded, fields, map, self.transform)  # fields= and map=: what workers make of a sample
        self.device = torch.device(device) if device is not None else None
        self._rank_arg = rank if rank is not None else choice.rank
        self._world_arg = world_size if world_size is not None else choice.world_size
        if self._rank_arg is not None and self._world_arg is not None:
            resolve_rank_world(self._rank_arg, self._world_arg)  # refuse an impossible pair now
        self._drop_remainder = choice.drop_remainder
        self._distributed_sampler = choice.distributed
        self._sampler_epoch_seen = None if choice.distributed is None else choice.distributed.epoch
        self.stats = LoaderStats()
        self.image_shape = self._image_shape()
        self._batch_fn = batch_transform(self.transform)
        self._epoch = 0
        self._resume_at = 0
        self._generations: list[tuple[int, int, int]] = []  # (world, batch, consumed) of earlier layouts this epoch
        self._order_cache: tuple[tuple, EpochOrder] | None = None
        self._pool: WorkerPool | None = None
        self._buffers: BatchBuffers | None = None
        self._active: weakref.ref[_Epoch] | None = None  # held weakly: an iterator dropped mid-epoch ends it
        self._abandoned: tuple[int, int, list] | None = None  # (epoch, consumed, layouts) where an iteration broke off
        self._runs = 0  # iterations started: tags worker tasks, so answers for an abandoned one are recognised
        self._agreed = False
        self._accelerate = False
        self._dali = None
        # torch's names, with torch's meanings; they refer to this loader weakly (no reference cycle)
        self.sampler = choice.distributed if choice.distributed is not None else LoaderSampler(weakref.proxy(self))
        self.batch_sampler = LoaderBatchSampler(weakref.proxy(self))
        self.collate_fn = collate
        self.backend, why = choose_backend(backend, sharded.decoded)
        if self.backend.startswith("dali") and (not self.sample_spec.classic or map is not None):
            raise ValueError("backend='dali' carries images and labels only for now: with fields= or map=, use backend='cpu'")
        if (self.backend, why) not in _logged:
            _logged.add((self.backend, why))
            log.warning("fastload: backend=%s (%s)", self.backend, why)

    def _image_shape(self) -> tuple[int, int, int] | None:
        if self.sample_spec.primary is None:
            return None  # nothing to decode: no transform needed
        ds = self.sharded
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

    @property
    def rank(self) -> int:
        """This process's rank: rank=, a DistributedSampler's, the process group's, the launcher's."""
        return resolve_rank_world(self._rank_arg, self._world_arg)[0]

    @property
    def world_size(self) -> int:
        """The number of ranks sharing the dataset, resolved like :attr:`rank`."""
        return resolve_rank_world(self._rank_arg, self._world_arg)[1]

    @property
    def _is_accelerate_prepared(self) -> bool:
        """Read by accelerate's ``prepare()``: True keeps this loader, fast path and all, instead of a
        torch DataLoader around its dataset (fastload shards by rank itself). Batches then go to the
        Accelerator's device unless ``device=`` was given, and epochs report to its GradientState."""
        if not self._accelerate:
            self._accelerate = True
            if self.device is None:
                self.device = accelerate_device()
        return True

    @_is_accelerate_prepared.setter
    def _is_accelerate_prepared(self, value: bool) -> None:  # accelerate's prepare() also sets it
        if value:
            _ = self._is_accelerate_prepared

    def __len__(self) -> int:
        return len(self._plan(self._epoch, 0).batches)

    def __iter__(self) -> Iterator[Any]:
        previous = self._active() if self._active is not None else None
        if previous is not None:
            previous.close()
        epoch_class = _DaliEpoch if self.backend.startswith("dali") else _EpochIterator
        iterator = epoch_class(self)
        self._active = weakref.ref(iterator)
        return iterator

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration yields (it also advances by itself once
        an epoch's batches are all handed out). Setting the epoch a loaded state_dict is in keeps
        that state's position."""
        self._settle_abandoned()
        self._abandoned = None
        if int(epoch) != self._epoch:
            self._epoch = int(epoch)
            self._resume_at = 0
            self._generations = []

    def _running(self) -> _Epoch | None:
        """The iterator of an epoch in progress (started, not finished), if any."""
        active = self._active() if self._active is not None else None
        return active if active is not None and active.started and not active.finished else None

    def _settle_abandoned(self) -> None:
        """Close an epoch left in progress (a break) now: closing restores its own position, which
        must happen before the caller sets another (set_epoch, load_state_dict), not over it."""
        running = self._running()
        if running is not None:
            running.close()

    @property
    def identity(self) -> str:
        """A digest of the samples this loader reads (shards, their checksums, a Subset's choice):
        recorded in state_dict, compared across ranks."""
        digest = hashlib.sha256()
        for shard in self.sharded.index.shards:
            digest.update(f"{shard.path}|{shard.samples}|{shard.sha256};".encode())
        if self._take is not None:
            digest.update(np.asarray(self._take, dtype=np.int64).tobytes())
        return digest.hexdigest()[:16]

    def _check_ranks_agree(self) -> None:
        """Once per loader, with a process group: the ranks must agree on what decides the order."""
        if not self._agreed:
            check_ranks_agree(
                {"seed": self.seed, "batch_size": self.batch_size, "world_size": self.world_size,
                 "shuffle": self.shuffle, "drop_last": self.drop_last, "streaming order": self.streaming,
                 "dataset (its identity digest)": int(self.identity[:15], 16), "number of samples": len(self.dataset)},
                "fastload.DataLoader",
            )
            self._agreed = True

    def _follow_sampler_epoch(self) -> None:
        """A DistributedSampler passed as sampler=: its set_epoch takes effect at the next iteration."""
        sampler = self._distributed_sampler
        if sampler is not None and sampler.epoch != self._sampler_epoch_seen:
            self._sampler_epoch_seen = sampler.epoch
            self.set_epoch(sampler.epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where training is: only batches handed to the caller count, not prefetched ones."""
        running = self._running()
        if running is not None:
            epoch, consumed, generations = running.epoch, running.consumed(), self._generations
        elif self._abandoned is not None:  # an iteration broken off (its next one starts the epoch over)
            epoch, consumed, generations = self._abandoned
        else:
            epoch, consumed, generations = self._epoch, self._resume_at, self._generations
        state: dict[str, Any] = {"version": STATE_VERSION, "seed": self.seed, "epoch": epoch, "samples_consumed": consumed,
                                 "dataset": self.identity}
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
        if state.get("dataset", self.identity) != self.identity:
            raise ValueError(f"state was saved for another dataset (identity {state['dataset']}, this loader reads {self.identity})")
        order = "streaming" if self.streaming else "global"
        if state.get("order", "global") != order:
            raise ValueError(f"state was saved with the {state.get('order', 'global')} order, this loader uses the {order} order")
        self._settle_abandoned()
        self._abandoned = None
        consumed = int(state["samples_consumed"])
        generations = [tuple(int(v) for v in g) for g in state.get("resumed_from", [])] if self.streaming else []
        layout = (int(state.get("world_size", self.world_size)), int(state.get("batch_size", self.batch_size)))
        if self.streaming and consumed and layout != (self.world_size, self.batch_size):
            generations.append((*layout, consumed))
            consumed = 0
        self._epoch, self._resume_at, self._generations = int(state["epoch"]), consumed, generations  # type: ignore[assignment]

    def close(self) -> None:
        """Stop the workers and release the shared memory (also done as soon as nothing refers to
        the loader or an iterator of it)."""
        active = self._active() if self._active is not None else None
        if active is not None:
            active.close()
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

    def _epoch_batches(self, from_start: bool) -> list[np.ndarray]:
        """This rank's batches of the current epoch as sample indices (from its start, or from a
        loaded state's position)."""
        order = self._epoch_order(self._epoch).order
        return [order[positions] for positions in self._plan(self._epoch, 0 if from_start else self._resume_at).batches]

    def _batch_request(self) -> BatchRequest:
        if not self.sample_spec.classic or self.sample_spec.map is not None:
            raise NotImplementedError("loader.batch_sampler batches (a torch DataLoader of this loader's parts) carry images and labels only")
        return BatchRequest(self.transform, self.seed, self._epoch, self.on_error, self.image_shape,
                            self.sharded.has_labels, self.return_keys, self.evaluation)

    def _order_spec(self) -> OrderSpec:
        """What this loader's orders depend on, as plain values (DALI's workers get a copy)."""
        rank, world = resolve_rank_world(self._rank_arg, self._world_arg)
        return OrderSpec(
            tuple(shard.samples for shard in self.sharded.index.shards), self.seed, self.shuffle, self.batch_size,  # type: ignore[arg-type]
            rank, world, self.drop_last, self.streaming, self.shuffle_buffer, tuple(self._generations),
            self._take, self._drop_remainder,
        )

    def _epoch_order(self, epoch: int) -> EpochOrder:
        """The epoch's global order (the same for every backend), cached for the current epoch."""
        spec = self._order_spec()
        if self._order_cache is None or self._order_cache[0] != (epoch, spec):
            self._order_cache = ((epoch, spec), spec.order(epoch))
        return self._order_cache[1]

    def _remainder(self, plan: RankBatches, order: EpochOrder) -> int:
        """Real samples in the epoch's last global batch, as accelerate's ``remainder``: 0 when
        every global batch is full, -1 when padding is not at the end (the streaming order)."""
        if order.valid is not None:
            return -1
        if self.drop_last:
            return 0
        return len(order) % plan.step

    def _discard_pool(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._buffers is not None:
            self._buffers.forget_filling()  # nobody writes into those slots any more

    def _ensure_workers(self) -> tuple[BatchBuffers, WorkerPool | None]:
        if self._buffers is None:
            in_flight = self.num_workers * (self.prefetch_factor or 0)
            slots = in_flight + LENDABLE_SLOTS if in_flight else 1
            self._buffers = BatchBuffers(slots, self.batch_size, spec_columns(self.sample_spec, self.image_shape))
        if self.num_workers and self._pool is None:
            config = WorkerConfig(self.sharded, self.transform, self.seed, self.on_error, self._buffers, self.worker_init_fn, self.sample_spec)
            self._pool = WorkerPool(config, self.num_workers)
        return self._buffers, self._pool

    def _deliver(self, result: BatchResult, buffers: BatchBuffers, valid: np.ndarray) -> Any:
        """Hand a finished slot's columns out (lent without a copy when workers fill the slots and
        nothing is pinned; else copied, into pinned memory when asked) and finish the batch."""
        n = result.count
        keep = self.num_workers * (self.prefetch_factor or 0)  # lending never thins the workers' queue
        lent = None if self.pin_memory or self._pool is None else buffers.lend(result.slot, n, keep=keep)
        if lent is not None:
            # per-sample scalars (labels) are copied: a caller keeping them must not keep the slot
            columns = {name: as_tensor(view if view.ndim > 1 else view.copy()) for name, view in lent.items()}
        else:
            columns = {c.name: copied(buffers.column(result.slot, c.name)[:n], self.pin_memory) for c in buffers.columns}
            buffers.give_back(result.slot)
        if not self.sample_spec.classic:
            return self._finish_fields(columns, result, valid)
        image, label = self.sample_spec.fields
        return self._finish_batch(columns[image.key], columns[label.key], result.keys, result.skipped, valid)

    def _finish_fields(self, columns: dict, result: BatchResult, valid: np.ndarray) -> tuple:
        """A fields= batch: a tuple in the fields' order, then keys (return_keys) and valid (evaluation)."""
        for where, reason in result.skipped:
            self.stats.record_skip(where, reason)
        batch = field_batch(self.sample_spec, columns, result.values, self.device, self._batch_fn)
        return batch + ((result.keys,) if self.return_keys else ()) + ((torch.from_numpy(valid),) if self.evaluation else ())

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
        if self.sharded.has_labels:
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
    """One pass over a rank's batches, in the epoch's order; subclasses produce the batches.

    Nothing is read when the iterator is made: the first ``next()`` starts the epoch, taking the
    loader's epoch and position, rank and world size then (torch's samplers are lazy alike). The
    epoch is finished once its last batch is handed out, whether or not StopIteration is reached;
    an iterator dropped or closed before that puts the loader back to the epoch's start."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.started = self.finished = False
        self.next_yield = 0
        self.prefetcher: ShardPrefetcher | None = None
        self.accelerate: AccelerateEpoch | None = None

    def _start(self) -> None:
        loader = self.loader
        loader._follow_sampler_epoch()
        loader._check_ranks_agree()
        self.epoch, start = loader._epoch, loader._resume_at
        loader._resume_at, loader._abandoned = 0, None
        self.plan = loader._plan(self.epoch, start)
        epoch_order = loader._epoch_order(self.epoch)
        self.order, self.order_valid = epoch_order.order, epoch_order.valid
        loader._runs += 1
        self.run = loader._runs
        self.started = True
        if loader._accelerate:
            self.accelerate = AccelerateEpoch(self, loader._remainder(self.plan, epoch_order))

    def _start_prefetch(self) -> None:
        """For a remote dataset, start downloading this rank's shards ahead of use."""
        if self.loader.sharded.url is not None and self.plan.batches:
            batches = [self.order[positions] for positions in self.plan.batches]
            shards, first_batch = shards_in_use_order(self.loader.sharded, batches)
            self.prefetcher = ShardPrefetcher(self.loader.sharded, shards, first_batch, self._dispatched)

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

    def __next__(self) -> Any:
        if not self.started:
            if self.finished:  # closed before it started
                raise StopIteration
            self._start()
        if self.next_yield >= len(self.plan.batches):
            self._finish()
            self._end_accelerate()
            raise StopIteration
        if self.next_yield == len(self.plan.batches) - 1 and self.accelerate is not None:
            self.accelerate.last_batch()
        batch = self._next_batch()
        self.next_yield += 1
        if self.next_yield == len(self.plan.batches):
            self._finish()  # all handed out: the next iter() starts the next epoch
        return batch

    def _next_batch(self) -> Any:
        raise NotImplementedError

    def _end_accelerate(self) -> None:
        if self.accelerate is not None:
            self.accelerate.end()
            self.accelerate = None

    def _finish(self) -> None:
        self._stop_prefetch()
        if not self.finished:
            self.finished = True
            self.loader._epoch = self.epoch + 1
            self.loader._resume_at = 0
            self.loader._generations = []

    def close(self) -> None:
        """Abandon the epoch (a break, an exception, the iterator dropped): like torch, the next
        iteration starts this epoch over; state_dict() still says where it stopped, so
        load_state_dict resumes there."""
        self._stop_prefetch()
        self._end_accelerate()
        if self.started and not self.finished:
            self.loader._abandoned = (self.epoch, self.consumed(), list(self.loader._generations))
            self.loader._resume_at = 0
            self.loader._epoch = self.epoch
            self.loader._generations = []
        self.finished = True

    def __del__(self) -> None:
        if not self.finished:
            try:
                self.close()
            except Exception:  # noqa: BLE001 - at interpreter exit the loader may be half torn down
                pass


class _EpochIterator(_Epoch):
    """The CPU path: dispatches batches to the workers' free slots, yields them in order."""

    def _start(self) -> None:
        super()._start()
        self.buffers, self.pool = self.loader._ensure_workers()
        self.buffers.reclaim()  # slots still lent or being filled for an abandoned epoch stay out
        self.next_submit = 0
        self.parts: dict[int, list[BatchResult]] = {}  # finished parts of batches not yet whole
        self.expected_parts: dict[int, int] = {}
        self.ready: dict[int, BatchResult] = {}
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
            self.buffers.filling[slot] = count
            for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
                self.pool.submit(self.run, self.next_submit, slot, self.epoch, start, indices[start:end])  # type: ignore[union-attr]
            self.expected_parts[self.next_submit] = count
            self.next_submit += 1

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
        result = BatchResult(run=self.run, batch_no=self.next_yield, slot=slot, count=len(indices))  # type: ignore[arg-type]
        try:
            result.keys, result.skipped, result.values = fill_fields(
                self.loader.sharded, indices, self.loader.sample_spec, self.loader.transform, self.loader.seed, self.epoch,
                self.loader.on_error, self.buffers.slot_columns(slot),  # type: ignore[arg-type]
            )
        except BaseException:
            self.buffers.give_back(slot)  # type: ignore[arg-type]
            raise
        return result

    def _await_ready(self) -> BatchResult:
        """Wait for the next batch in order; answers for an abandoned iteration free their slots."""
        self._submit_more()
        while self.next_yield not in self.ready:
            try:
                got = self.pool.get(self.loader.timeout)  # type: ignore[union-attr]
            except (WorkerError, TimeoutError):
                self.loader._discard_pool()  # the next iteration starts fresh workers at once
                self.close()
                raise
            self.buffers.part_done(got.slot)
            if got.run != self.run:
                continue
            if got.error is not None:
                self.buffers.release(got.slot)
                self.close()
                if got.bad_sample is not None:
                    raise SampleError(*got.bad_sample) from WorkerError(got.error)
                if got.failure is not None:
                    raise rebuild_error(*got.failure) from WorkerError(got.error)
                raise WorkerError(got.error)
            self._receive(got)
        return self.ready.pop(self.next_yield)

    def _next_batch(self) -> Any:
        stats = self.loader.stats
        if self.prefetcher is not None:
            self.prefetcher.check()
        with stats.waiting():
            result = self._run_inline() if self.pool is None else self._await_ready()
        batch = self.loader._deliver(result, self.buffers, self.valid(self.next_yield))
        stats.record_batch(result.count)
        return batch

    def close(self) -> None:
        """Abandon the epoch: batches in flight are not waited for; their slots come back as the
        workers' answers arrive (recognised by the run they were asked for)."""
        if self.started and not self.finished:
            for slot in list(self.buffers.filling):
                self.buffers.release(slot)
            for batch in self.ready.values():
                self.buffers.release(batch.slot)
            for parts in self.parts.values():
                self.buffers.release(parts[0].slot)
            self.ready.clear()
            self.parts.clear()
            self.expected_parts.clear()
        super().close()


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

    def _start(self) -> None:
        super()._start()
        loader = self.loader
        self.decoder = loader._dali_decoder()
        self._start_prefetch()
        self.feed = DaliFeed(
            loader.sharded, loader.transform, loader.seed, loader.on_error, loader._order_spec(), self.epoch, self.plan.start
        )
        self.decoder.start(self.feed, len(self.plan.batches))

    def _on_cpu(self, batch_no: int) -> tuple[torch.Tensor, list[int], list[str], list[tuple[str, str]]]:
        loader = self.loader
        indices = self.order[self.plan.batches[batch_no]]
        images = np.empty((len(indices), *loader.image_shape), dtype=np.uint8)
        labels = np.empty(len(indices), dtype=np.int64)
        keys, skipped = fill_batch(loader.sharded, indices, loader.transform, loader.seed, self.epoch, loader.on_error, images, labels)
        return torch.from_numpy(images), labels.tolist(), keys, skipped

    def _next_batch(self) -> Any:
        if self.prefetcher is not None:
            self.prefetcher.check()
        with self.loader.stats.waiting():
            try:
                images, labels, keys, skipped, error = self.decoder.next_batch()
            except Exception as exc:  # noqa: BLE001 - data DALI cannot decode goes to the CPU path; anything else is raised
                if not is_decode_failure(exc):
                    self.close()
                    raise
                log.warning("fastload: DALI failed on batch %d of epoch %d, redoing it on the CPU: %s",
                            self.next_yield, self.epoch, (str(exc).strip().splitlines() or ["RuntimeError"])[-1][:300])
                self.loader.stats.redone_on_cpu += 1
                try:
                    images, labels, keys, skipped = self._on_cpu(self.next_yield)
                except SampleError:
                    self.close()
                    raise
                following = self.next_yield + 1
                self.decoder.start(replace(self.feed, first_batch=following), len(self.plan.batches) - following)
            else:
                if error is not None:  # a sample that could not be read (on_error="raise", or no substitute left)
                    self.close()
                    raise error
        batch = self.loader._finish_batch(
            images, torch.tensor(labels, dtype=torch.int64), keys, skipped, self.valid(self.next_yield)
        )
        self.loader.stats.record_batch(len(keys))
        return batch
