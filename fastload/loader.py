"""``fastload.DataLoader``: a drop-in for ``torch.utils.data.DataLoader``.

Given any torch Dataset it *is* torch's DataLoader (same arguments, same batches; fastload.loading.torch_mode).
Given a converted dataset (or its path) it takes the fast path: workers read bytes by offset, decode
with libjpeg-turbo at the smallest sufficient DCT scale, transform, and write pixels into shared
memory; the main process keeps ``prefetch_factor`` batches in flight per worker, pins and moves
batches to ``device``, and applies Normalize/ToDtype there on whole batches.

The loader is its stages: options validated once (fastload.loading.options), one training position
(fastload.loading.state), the orders (fastload.loading.loader_orders), and the engine that makes its epochs
(fastload.backends.engines: the CPU workers, DALI or both), each starting at the state's position
and advancing it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from dataclasses import replace
from typing import Any, cast

import numpy as np
import torch

from fastload._util.dist import check_ranks_agree
from fastload.av.clips import Clip
from fastload.backends.engines import make_engine
from fastload.decode.header import check_pixels
from fastload.errors import DEFAULT_MAX_SKIPPED
from fastload.fields import SampleSpec
from fastload.loading.batch_outputs import BatchOutputs
from fastload.loading.epoch import Epoch, EpochInputs
from fastload.loading.frameworks import KeptByAccelerate, accelerate_device
from fastload.loading.loader_orders import LoaderOrders, excluded_indices
from fastload.loading.options import LoaderOptions
from fastload.loading.provenance import StepDescription, describe_step
from fastload.loading.samplers import (
    BatchIndices,
    BatchRequest,
    LoaderBatchSampler,
    LoaderCollate,
    LoaderSampler,
    unwrap_subset,
)
from fastload.loading.state import LoaderState, OrderSettings, read_state_dict
from fastload.loading.stats import LoaderStats
from fastload.loading.torch_mode import TorchMode
from fastload.loading.torchvision_translation import TorchvisionSteps, steps_as_map
from fastload.orders.position import Position
from fastload.storage.dataset import ShardedDataset
from fastload.token_loader import TokenDataLoader
from fastload.transforms import Transform, batch_transform, output_size
from fastload.workers.sample_decode import resolve_spec

log = logging.getLogger("fastload")
_logged: set[tuple[str, str]] = set()


def with_torchvision_steps(spec: SampleSpec, steps: TorchvisionSteps | None) -> SampleSpec:
    """``spec`` with a torchvision transform's untranslated steps as its map, on the primary image and
    its masks, before the user's own ``map=`` (which then sees their result)."""
    if steps is None:
        return spec
    if spec.primary is None:
        raise ValueError("transform= holds torchvision steps for images; the fields asked for hold none")
    masks = [f.key for f in spec.fields if f.role == "mask"]
    return replace(spec, map=steps_as_map(steps, spec.primary.key, masks, then=spec.map))


def is_fastload_dataset(dataset: Any) -> bool:
    """Whether ``dataset`` takes the fast path: a converted dataset, its path, or a Subset of one."""
    return isinstance(dataset, (str, os.PathLike)) or unwrap_subset(dataset)[0] is not None


class DataLoader(KeptByAccelerate, torch.utils.data.DataLoader):
    """Batches from a dataset; see the module docstring. Arguments before ``*`` are torch's.

    It is a ``torch.utils.data.DataLoader`` (Lightning and Accelerate treat it as one) with torch's
    attributes: ``dataset``, ``batch_size``, ``drop_last``, ``sampler`` (a DistributedSampler of
    this rank's indices whose ``set_epoch`` is the loader's), ``batch_sampler``. ``sampler=`` takes a
    DistributedSampler (rank, world size, shuffle, seed and drop_last come from it; its set_epoch
    takes effect), a Random/Sequential/SubsetRandomSampler; ``dataset`` may be a ``Subset`` of a
    fastload dataset. Rank and world size are resolved when iteration starts.

    fastload's own: ``transform`` (specs from fastload.transforms, or a torchvision Compose, translated by
    fastload.loading.torchvision_translation), ``backend`` ("auto": by measurement, fastload.backends.choice; "cpu";
    "dali"; "hybrid": each batch split between DALI and the CPU workers), ``device``,
    ``seed``, ``on_error`` ("raise" | "skip"), ``max_skipped`` (with "skip": at most this many samples
    skipped an epoch, an int, or this share of the rank's epoch, a float; None: no limit), ``return_keys``, ``rank``/``world_size``,
    ``evaluation`` (every sample once across ranks, padding marked by a ``valid`` tensor),
    ``shuffle_buffer`` (streaming order: each rank reads its own shuffled shards in sequence
    through a buffer; always used for remote datasets, with ``options.REMOTE_SHUFFLE_BUFFER`` by default) and
    ``hw_decoder_load`` (with DALI on a GPU: the share of JPEGs sent to the hardware decoder),
    ``exclude`` (keys, or a file of one key per line, left out of every epoch) and
    ``class_weights`` / ``balanced`` (each class's share of an epoch; fastload.orders.balanced).
    """

    use_stateful_dataloader = True  # Accelerate's save_state/load_state then save and load state_dict()

    def __new__(cls, dataset: Any = None, *args: Any, **kwargs: Any) -> DataLoader:
        if cls is DataLoader and "seq_len" in kwargs:  # a token dataset: its own loader (not a subclass: __init__ is not called again)
            return TokenDataLoader(dataset, *args, **kwargs)  # type: ignore[return-value]
        if cls is DataLoader and not is_fastload_dataset(dataset):
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
        transform: Sequence[Transform] | Any = None,
        backend: str = "auto",
        device: str | torch.device | None = None,
        seed: int = 0,
        on_error: str = "raise",
        max_skipped: int | float | None = DEFAULT_MAX_SKIPPED,
        return_keys: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        evaluation: bool = False,
        shuffle_buffer: int | None = None,
        hw_decoder_load: float = 0.65,
        fields: Sequence[str] | Mapping[str, str] | None = None,
        map: Callable[[dict, np.random.Generator], dict] | None = None,
        batch_map: Callable[[Any, torch.Generator], Any] | None = None,
        exclude: Sequence[str] | str | os.PathLike[str] | None = None,
        class_weights: Mapping[str | int, float] | None = None,
        balanced: bool = False,
        clip: Clip | None = None,
    ) -> None:
        if isinstance(dataset, (str, os.PathLike)):
            dataset = ShardedDataset(dataset)
        sharded, subset = unwrap_subset(dataset)
        assert sharded is not None  # __new__ sent every other dataset to torch_mode
        self.options = options = LoaderOptions.from_arguments(
            len(dataset), subset, sharded.streams, sampler=sampler, batch_sampler=batch_sampler,
            generator=generator, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size,
            batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory, drop_last=drop_last, timeout=timeout,
            worker_init_fn=worker_init_fn, collate_fn=collate_fn, prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            transform=transform, backend=backend, device=device, on_error=on_error, max_skipped=max_skipped, return_keys=return_keys,
            evaluation=evaluation, shuffle_buffer=shuffle_buffer, hw_decoder_load=hw_decoder_load, fields=fields, map=map,
            batch_map=batch_map, exclude=excluded_indices(sharded, exclude), class_weights=class_weights, balanced=balanced,
            clip=clip, stream_buffer=sharded.shuffle_window,
        )
        self.dataset = dataset
        self.sharded: ShardedDataset = sharded
        # torch's names, with torch's meanings (frameworks read them); the views refer to this loader weakly
        self.batch_size, self.drop_last, self.num_workers = options.batch_size, options.drop_last, options.num_workers
        self.pin_memory, self.pin_memory_device, self.timeout = options.pin_memory, "", options.timeout
        self.worker_init_fn, self.prefetch_factor = options.worker_init_fn, options.prefetch_factor
        self.persistent_workers, self.multiprocessing_context = options.persistent_workers, None
        self.generator, self.in_order = None, True
        self.sampler = options.distributed if options.distributed is not None else LoaderSampler(weakref.proxy(self))
        self.batch_sampler = LoaderBatchSampler(weakref.proxy(self))
        self.collate_fn = LoaderCollate(options.collate_fn, options.batch_map)  # also what a torch DataLoader of this loader's parts uses
        self.shuffle, self.seed = options.shuffle, options.seed
        self.device = options.device
        # fields= and map=: what the workers make of a sample (a torchvision transform's rest first)
        self.sample_spec = with_torchvision_steps(
            resolve_spec(sharded, options.fields, options.map, options.transform, options.clip), options.torchvision_steps)
        self.image_shape = self._image_shape()
        choice, self._engine = make_engine(options, self.sample_spec, sharded.decoded, self._probe_loader)
        self.backend = choice.name
        if (choice.name, choice.why) not in _logged:
            _logged.add((choice.name, choice.why))
            log.warning("fastload: backend=%s (%s)", choice.name, choice.why)
        self.stats = LoaderStats()
        self.state = LoaderState(options.streaming)
        self.orders = LoaderOrders(sharded, options)
        self._batch_fn = batch_transform(options.transform)
        self._batch_outputs = BatchOutputs(sharded.has_labels, options.return_keys, options.evaluation)
        self._sampler_epoch_seen = None if options.distributed is None else options.distributed.epoch
        self._active: weakref.ref[Epoch] | None = None  # held weakly: an iterator dropped mid-epoch ends it
        self._agreed = False
        self._accelerate = False

    def _probe_loader(self, backend: str) -> DataLoader:
        """A loader like this one on another ``backend=``: what ``auto``'s probe times."""
        options = self.options
        return DataLoader(self.dataset, batch_size=options.batch_size, shuffle=True, num_workers=options.num_workers,
                          transform=options.transform, backend=backend, fields=options.fields, on_error=options.on_error,
                          max_skipped=options.max_skipped, hw_decoder_load=options.hw_decoder_load, clip=options.clip)

    def _image_shape(self) -> tuple[int, int, int] | None:
        if self.sample_spec.primary is None and self.sample_spec.clip is None:
            return None  # nothing to decode: no transform needed
        ds = self.sharded
        size = output_size(self.options.transform)
        channels = 3
        if ds.index.decoded_shape is not None:  # ds.decoded
            height, width, channels = ds.index.decoded_shape
            if size is None:  # batches of the stored pixels: their slots are sized by what the index declares
                check_pixels(width, height, f"{ds.location}: index.json decoded_shape")
                size = (height, width)
        if size is None:
            raise ValueError(
                f"{'videos' if self.sample_spec.primary is None else 'images'} of this dataset vary in size: give a transform "
                "with a fixed output size, e.g. transform=fastload.transforms.val(224)"
            )
        return (channels, size[0], size[1])

    # --- the torch-compatible surface -----------------------------------------------------------

    @property
    def rank(self) -> int:
        """This process's rank: rank=, a DistributedSampler's, the process group's, the launcher's."""
        return self.orders.ranks()[0]

    @property
    def world_size(self) -> int:
        """The number of ranks sharing the dataset, resolved like :attr:`rank`."""
        return self.orders.ranks()[1]

    def __len__(self) -> int:
        return len(self.orders.batches(replace(self.state.upcoming(), consumed=0)))

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # torch annotates its own iterator class
        previous = self._active() if self._active is not None else None
        if previous is not None:
            previous.close()
        inputs = EpochInputs(
            self.sharded, self.options, self.sample_spec, self.image_shape, self.device, self._batch_fn, self._batch_outputs,
            self.orders, self.state, self.stats, self._accelerate, self._before_epoch,
        )
        iterator = self._engine.epoch(inputs)
        self._active = weakref.ref(iterator)
        return iterator

    def upcoming_batches(self, from_start: bool) -> list[BatchIndices]:
        """This rank's batches of the upcoming epoch (from its start, or from a loaded state's
        position) as sample indices: what ``loader.sampler`` and ``loader.batch_sampler`` yield."""
        position = self.state.upcoming()
        if from_start:
            position = replace(position, consumed=0)
        options = self.options
        device = self.device if self.device is not None else accelerate_device() if self._accelerate else None
        if options.batch_map is not None and device is not None and device.type != "cpu":
            raise NotImplementedError(
                f"loader.batch_sampler batches with batch_map= on {device}: a torch DataLoader of this loader's parts "
                "runs batch_map on the CPU, where its generator draws other numbers than the loader's on the device")
        request = BatchRequest(options.transform, options.seed, position.epoch, options.on_error, self.image_shape,
                               self._batch_outputs, self.sample_spec, self.orders.ranks()[0])
        plan, order = self.orders.batches(position), self.orders.order(position)
        batches = []
        first_step = plan.start // plan.step
        for batch_no in range(len(plan)):
            positions, valid = plan.positions(batch_no), plan.valid(batch_no)
            if (real := order.valid(positions)) is not None:
                valid = valid & real
            batches.append(BatchIndices(order.indices(positions).tolist(), request, valid.tolist(), first_step + batch_no))
        return batches

    def describe(self, step: int, epoch: int | None = None) -> StepDescription:
        """This rank's batch at ``step`` (counted from the epoch's start) of ``epoch`` (default: the
        one being or last iterated, else the next): each sample's key, index and planned crop, flip and DCT scale, read from the
        shards' indexes and image headers only (fastload.loading.provenance). Steps run before an elastic
        resume are described at the topology they ran at. With on_error="skip" each sample is the one
        that took the place of a skipped one (``stands_in_for`` names those it replaced)."""
        epoch = self.state.current_epoch if epoch is None else int(epoch)
        skipped = {entry["where"]: entry["reason"] for entry in self.stats.skipped.entries} if self.options.on_error == "skip" else None
        return describe_step(self.sharded, self.orders.spec(), self.state.resumed_from(epoch), epoch, int(step), self.sample_spec,
                             self.options.transform, self.options.seed, cpu_decode=self.backend == "cpu",
                             classes=self.orders.classes, skipped=skipped)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration yields (it also advances by itself once
        an epoch's batches are all handed out). Setting the epoch a loaded state_dict is in keeps
        that state's position; setting the one it finished (saved after its last batch) yields
        nothing more of it."""
        self._settle_abandoned()
        self.state.set_epoch(int(epoch), lambda e: len(self.orders.order(Position(e))))

    def _settle_abandoned(self) -> None:
        """Close an epoch left in progress (a break) now: closing breaks it off, which must happen
        before the caller sets another position (set_epoch, load_state_dict), not over it."""
        active = self._active() if self._active is not None else None
        if active is not None and active.started and not active.finished:
            active.close()

    @property
    def identity(self) -> str:
        """A digest of the samples this loader reads (shards, their checksums, a Subset's choice):
        recorded in state_dict, compared across ranks."""
        digest = hashlib.sha256()
        for shard in self.sharded.index.shards:
            digest.update(f"{shard.path}|{shard.samples}|{shard.sha256};".encode())
        if self.options.take is not None:
            digest.update(np.asarray(self.options.take, dtype=np.int64).tobytes())
        if self.orders.mixture is not None:  # its weights and epoch length decide its order
            digest.update(self.orders.mixture.identity().encode())
        if self.options.exclude:
            digest.update(b"exclude" + np.asarray(self.options.exclude, dtype=np.int64).tobytes())
        if self.orders.class_weights is not None:
            digest.update(b"class weights" + np.asarray(self.orders.class_weights, dtype=np.float64).tobytes())
        return digest.hexdigest()[:16]

    def _before_epoch(self) -> None:
        """As an epoch starts: a DistributedSampler passed as sampler= has its set_epoch take
        effect, and (once per loader, with a process group) the ranks must agree on the order."""
        sampler = self.options.distributed
        if sampler is not None and sampler.epoch != self._sampler_epoch_seen:
            self._sampler_epoch_seen = sampler.epoch
            self.set_epoch(sampler.epoch)
        if not self._agreed:
            options = self.options
            check_ranks_agree(
                {"seed": options.seed, "batch_size": options.batch_size, "world_size": self.world_size,
                 "shuffle": options.shuffle, "drop_last": options.drop_last, "streaming order": options.streaming,
                 "dataset (its identity digest)": int(self.identity[:15], 16), "number of samples": len(cast(Sized, self.dataset))},
                "fastload.DataLoader",
            )
            self._agreed = True

    def _topology(self) -> tuple[int, int]:
        """(world size, batch size): recorded in state_dict (the streaming order's positions depend on it)."""
        return self.world_size, self.options.batch_size

    def _order_settings(self) -> OrderSettings:
        """The order's settings a position's meaning depends on (recorded in state_dict)."""
        options = self.options
        return OrderSettings(options.streaming, options.shuffle, options.buffer_size if options.streaming else 1)

    def state_dict(self) -> dict[str, Any]:
        """Where training is: only batches handed to the caller count, not prefetched ones."""
        state = self.state.state_dict(self.options.seed, self.identity, self._topology(), self._order_settings())
        if self.orders.mixture is not None:  # each member's own position, derived from the mixture's
            position, mixture = self.state.position, self.orders.mixture
            weights = self.orders.weights_at(position) if mixture.schedule is not None else None  # those in force
            state["members"] = mixture.describe_positions(self.orders.member_positions(position), weights)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration yields exactly the samples of that epoch not yet consumed,
        at any world size (the streaming order then deals the unseen shards anew)."""
        position = read_state_dict(state, self.options.seed, self.identity, self._topology(), self._order_settings(),
                                   lambda p: len(self.orders.order(p)))
        self._settle_abandoned()
        self.state.restore(position)

    def close(self) -> None:
        """Stop the workers and release the shared memory (also done as soon as nothing refers to
        the loader or an iterator of it)."""
        active = self._active() if self._active is not None else None
        if active is not None:
            active.close()
        self._active = None
        self._engine.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TorchDatasetLoader(TorchMode, DataLoader):
    """What ``fastload.DataLoader(torch_dataset, ...)`` makes: torch's loader with fastload's surface
    (fastload.loading.torch_mode), and a ``fastload.DataLoader``."""
