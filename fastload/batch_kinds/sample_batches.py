"""Samples with their fields as a kind of batch: images (and masks, boxes, labels, any field),
clips of videos; decoded by the CPU workers, DALI or both (fastload.backends.engines), in the
orders of fastload.loading.loader_orders, described from the indexes (fastload.loading.provenance).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from fastload.backends.engines import make_engine
from fastload.decode.header import check_pixels
from fastload.fields import SampleSpec
from fastload.formats.part_table import PartTable
from fastload.loading.batch_outputs import BatchOutputs
from fastload.loading.epoch import Epoch, EpochInputs
from fastload.loading.loader_options import LoaderOptions
from fastload.loading.loader_orders import LoaderOrders
from fastload.loading.provenance import StepDescription, describe_step
from fastload.loading.samplers import BatchIndices, BatchRequest, LoaderCollate
from fastload.loading.state import LoaderState, OrderSettings, read_state_dict
from fastload.loading.stats import LoaderStats
from fastload.loading.torchvision_translation import TorchvisionSteps, steps_as_map
from fastload.media import has_frames
from fastload.orders.position import Position
from fastload.storage.dataset import ShardedDataset
from fastload.transforms import batch_transform, output_size
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


class SampleBatches:
    """Batches of samples of a converted dataset: what the workers make of each sample (fields=,
    map=, transform=, clip=), the engine chosen for them (backend=), and the orders they follow."""

    def __init__(self, sharded: ShardedDataset, options: LoaderOptions, state: LoaderState, stats: LoaderStats,
                 probe_loader: Callable[[str], Iterable]) -> None:
        self.sharded, self.options, self.state, self.stats = sharded, options, state, stats
        self.sample_spec = with_torchvision_steps(
            resolve_spec(sharded, options.fields, options.map, options.transform, options.media), options.torchvision_steps)
        self.image_shape = self._image_shape()
        choice, self.engine = make_engine(options, self.sample_spec, sharded.decoded, probe_loader)
        self.backend = choice.name
        if (choice.name, choice.why) not in _logged:
            _logged.add((choice.name, choice.why))
            log.warning("fastload: backend=%s (%s)", choice.name, choice.why)
        self.orders = LoaderOrders(sharded, options)
        self.collate_fn = LoaderCollate(options.collate_fn, options.batch_map)  # also what a torch DataLoader of the loader's parts uses
        self._batch_fn = batch_transform(options.transform)
        self._outputs = BatchOutputs(sharded.has_labels, options.return_keys, options.evaluation)

    def _image_shape(self) -> tuple[int, int, int] | None:
        if self.sample_spec.primary is None and not has_frames(self.sample_spec.media):
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

    def ranks(self) -> tuple[int, int]:
        """(rank, world size): rank=, a DistributedSampler's, the process group's, the launcher's."""
        return self.orders.ranks()

    def epoch_length(self, epoch: int) -> int:
        """Samples in ``epoch``'s order."""
        return len(self.orders.order(Position(epoch)))

    def batch_count(self, position: Position) -> int:
        """This rank's batches of the epoch at ``position`` from its start."""
        return len(self.orders.batches(replace(position, consumed=0)))

    def epoch(self, device: torch.device | None, accelerate: bool, before_start: Callable[[], None]) -> Epoch:
        """An iterator over the next epoch's batches, made by the engine."""
        inputs = EpochInputs(self.sharded, self.options, self.sample_spec, self.image_shape, device, self._batch_fn, self._outputs,
                             self.orders, self.state, self.stats, accelerate, before_start)
        return self.engine.epoch(inputs)

    def upcoming_batches(self, position: Position, device: torch.device | None) -> list[BatchIndices]:
        """This rank's batches from ``position`` as sample indices, each carrying how to make it."""
        options = self.options
        if options.batch_map is not None and device is not None and device.type != "cpu":
            raise NotImplementedError(
                f"loader.batch_sampler batches with batch_map= on {device}: a torch DataLoader of this loader's parts "
                "runs batch_map on the CPU, where its generator draws other numbers than the loader's on the device")
        request = BatchRequest(options.transform, options.seed, position.epoch, options.on_error, self.image_shape,
                               self._outputs, self.sample_spec, self.orders.ranks()[0])
        plan, order = self.orders.batches(position), self.orders.order(position)
        return [BatchIndices(order.indices(plan.positions(batch_no)).tolist(), request, plan.valid(batch_no, order).tolist(),
                             plan.global_step(batch_no)) for batch_no in range(len(plan))]

    def describe(self, step: int, epoch: int) -> StepDescription:
        """Each sample of this rank's batch at ``step``: key, index, planned crop, flip and DCT scale
        (fastload.loading.provenance); with on_error="skip", the stand-ins for skipped samples."""
        skipped = {entry["where"]: entry["reason"] for entry in self.stats.skipped.entries} if self.options.on_error == "skip" else None
        return describe_step(self.sharded, self.orders.spec(), self.state.resumed_from(epoch), epoch, step, self.sample_spec,
                             self.options.transform, self.options.seed, cpu_decode=self.backend == "cpu",
                             classes=self.orders.classes, skipped=skipped)

    def identity(self) -> str:
        """A digest of the samples read (shards, their checksums, a Subset's choice, a mixture's
        weights, exclusions, class weights)."""
        digest = hashlib.sha256()
        shards = self.sharded.index.shards
        if isinstance(shards, PartTable):  # data read in place: its files and parts, without making a shard of each
            digest.update(json.dumps(shards.files).encode() + shards.parts.tobytes())
        else:
            for shard in shards:
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

    def agreement(self) -> dict[str, int | bool]:
        """The settings every rank must share."""
        options = self.options
        return {"seed": options.seed, "batch_size": options.batch_size, "world_size": self.ranks()[1],
                "shuffle": options.shuffle, "drop_last": options.drop_last, "streaming order": options.streaming,
                "dataset (its identity digest)": int(self.identity()[:15], 16), "number of samples": len(self.sharded)}

    def _topology(self) -> tuple[int, int]:
        """(world size, batch size): recorded in state_dict (the streaming order's positions depend on it)."""
        return self.ranks()[1], self.options.batch_size

    def _order_settings(self) -> OrderSettings:
        """The order's settings a position's meaning depends on (recorded in state_dict)."""
        options = self.options
        return OrderSettings(options.streaming, options.shuffle, options.buffer_size if options.streaming else 1)

    def state_dict(self) -> dict[str, Any]:
        """The position, and of a mixture each member's own position derived from it."""
        state = self.state.state_dict(self.options.seed, self.identity(), self._topology(), self._order_settings())
        if self.orders.mixture is not None:
            position, mixture = self.state.position, self.orders.mixture
            weights = self.orders.weights_at(position) if mixture.schedule is not None else None  # those in force
            state["members"] = mixture.describe_positions(self.orders.member_positions(position), weights)
        return state

    def read_state(self, state: dict[str, Any]) -> Position:
        """The position ``state`` names (at any world size: the streaming order then deals the unseen shards anew)."""
        return read_state_dict(state, self.options.seed, self.identity(), self._topology(), self._order_settings(),
                               lambda p: len(self.orders.order(p)))

    def close(self) -> None:
        """Stop the engine's workers and release its shared memory."""
        self.engine.close()
