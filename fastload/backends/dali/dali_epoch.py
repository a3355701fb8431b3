"""The DALI backend's epoch: fastload reads and plans each batch in DALI's worker processes (the
feed), DALI decodes the crop regions on the GPU (or its CPU), in the same order as the CPU path;
the other fields (labels, text, json, arrays, boxes, masks) are made in the feed and travel beside."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, cast

import numpy as np
import torch

from fastload.backends.dali.feed import DaliFeed
from fastload.backends.dali.protocol import carried_stacked, read_carried
from fastload.backends.dali.shares import DaliShares
from fastload.backends.dali.video import DaliClipDecoder, DaliVideoEpoch, video_refusal
from fastload.fields import FieldSpec, SampleSpec
from fastload.loading.epoch import Epoch, EpochInputs
from fastload.loading.field_batch import as_tensor
from fastload.loading.state import LoaderState
from fastload.loading.torchvision_translation import TorchvisionSteps
from fastload.workers.batch_fill import fill_fields
from fastload.workers.slots import spec_columns

log = logging.getLogger("fastload")


def dali_refusal(spec: SampleSpec, torchvision_steps: TorchvisionSteps | None = None) -> str | None:
    """Why ``backend='dali'`` cannot make these samples (nor ``'hybrid'``), or None when it can."""
    if torchvision_steps is not None:
        names = ", ".join(type(step).__name__ for step in torchvision_steps.steps)
        return (f"transform=: {names} run by torchvision in the CPU workers, which backend='dali' has not: "
                "use backend='cpu', or keep to the steps fastload translates")
    if spec.map is not None:  # map= sees each decoded sample in the workers, and DALI decodes the image after them
        return "backend='dali' decodes the image after fastload's workers are done with a sample, so map= cannot see it: use backend='cpu'"
    if "video" in spec.media:  # DALI's video path is video's own (fastload.backends.dali.video)
        return video_refusal(spec)
    if spec.primary is None:
        return "backend='dali' decodes images, and the fields asked for hold none: use backend='cpu'"
    return None


def is_decode_failure(exc: BaseException) -> bool:
    """Whether a DALI pipeline error is one of its operators failing on the data (a JPEG it cannot
    decode), which the CPU path then names or skips. Errors from the feed's worker processes
    arrive as a plain Exception and are raised: unreadable samples travel as notes, not errors."""
    return type(exc) is RuntimeError and exc.__cause__ is None


class DaliPipeline:
    """A loader's DALI pipeline, built on first use and kept across its epochs (a GPU pipeline
    takes seconds to build; its worker processes carry on into the next epoch)."""

    def __init__(self, gpu: bool, feed_workers: int | None = None) -> None:
        self.gpu = gpu
        self.feed_workers = feed_workers  # DALI's feed processes; None: num_workers
        self.decoder: Any = None  # fastload.backends.dali.pipeline.DaliBatchDecoder
        self.clips: DaliClipDecoder | None = None  # the video path's pipeline

    def epoch(self, inputs: EpochInputs) -> Epoch:
        """An iterator over the next epoch's batches (of clips: DALI's video path)."""
        if "video" in inputs.sample_spec.media:
            return DaliVideoEpoch(inputs, self.ensure_clips(inputs))
        return DaliEpoch(inputs, self)

    def ensure_clips(self, inputs: EpochInputs) -> DaliClipDecoder:
        """The clip pipeline, made if not yet there (NVDEC with ``gpu``, DALI's CPU decoder otherwise)."""
        if self.clips is None:
            options = inputs.options
            device_id = torch.cuda.current_device() if self.gpu else None
            shape = cast(tuple[int, int, int], inputs.image_shape)  # a clip spec has a fixed output size (the loader checks)
            self.clips = DaliClipDecoder(options.batch_size, shape[1:], device_id, max(1, options.num_workers))
        return self.clips

    def ensure(self, inputs: EpochInputs) -> Any:
        """The pipeline's decoder, made if not yet there."""
        from fastload.backends.dali.pipeline import DaliBatchDecoder

        if self.decoder is None:
            options = inputs.options
            device_id = torch.cuda.current_device() if self.gpu else None
            if inputs.image_shape is None:  # dali_refusal() refused such a loader already
                raise ValueError("backend='dali' decodes an image field; these samples hold none")
            workers = options.num_workers if self.feed_workers is None else self.feed_workers
            self.decoder = DaliBatchDecoder(
                options.batch_size, inputs.image_shape[1:], max(1, options.num_workers), device_id,
                options.hw_decoder_load, workers=workers,
            )
        return self.decoder

    def close(self) -> None:
        """Release the pipeline (its device memory and worker processes)."""
        if self.decoder is not None:
            self.decoder.close()
            self.decoder = None
        if self.clips is not None:
            self.clips.close()
            self.clips = None


class DaliBatches:
    """The DALI side of an epoch: the feed started at the epoch's position, its decoded batches in
    order, and a batch DALI cannot decode (corrupt entropy data) redone on the CPU path, which names
    or skips the bad sample, DALI carrying on after it. ``shares`` (the hybrid backend) gives DALI
    each batch's first samples only."""

    def __init__(self, epoch: Epoch, decoder: Any, shares: DaliShares | None = None) -> None:
        inputs, options = epoch.inputs, epoch.inputs.options
        self.inputs, self.decoder, self.epoch_no, self.total = inputs, decoder, epoch.epoch, len(epoch.plan)
        self.columns = spec_columns(inputs.sample_spec, inputs.image_shape)
        self.feed = DaliFeed(
            inputs.dataset, inputs.sample_spec, carried_stacked(inputs.sample_spec, inputs.image_shape),
            options.transform, options.seed, options.on_error, inputs.skip_limit,
            inputs.orders.spec(epoch.start.resumed_from), epoch.epoch, epoch.plan.start, shares=shares,
            classes=inputs.orders.classes,
        )

    def start(self) -> None:
        """Start delivering: the pipeline carries on into this epoch, or is rebuilt for it."""
        self.decoder.start(self.feed, self.total)

    def next(self, batch_no: int, indices: np.ndarray) -> tuple[dict[str, Any], dict[str, list], list[str], list[tuple[str, str]]]:
        """Batch ``batch_no``'s DALI part (``indices``, its samples): stacked columns by field key
        (images as DALI's torch tensor), the other fields' values, keys and skip records."""
        spec = self.inputs.sample_spec
        try:
            images, keys, skipped, error, carried = self.decoder.next_batch()
        except Exception as exc:
            if not is_decode_failure(exc):
                raise
            log.warning("fastload: DALI failed on batch %d of epoch %d, redoing it on the CPU: %s",
                        batch_no, self.epoch_no, (str(exc).strip().splitlines() or ["RuntimeError"])[-1][:300])
            self.inputs.stats.record_redone_on_cpu()
            parts = self._on_cpu(indices)
            following = batch_no + 1
            self.decoder.start(replace(self.feed, first_batch=following), self.total - following)
            return parts
        if error is not None:  # a sample that could not be read (on_error="raise", or no substitute left)
            raise error
        columns, values = read_carried(carried, spec, self.feed.stacked, keys)
        image = cast(FieldSpec, spec.primary)  # there is one: ensure() refused samples without an image
        return {**columns, image.key: images}, values, keys, skipped

    def _on_cpu(self, indices: np.ndarray) -> tuple[dict[str, Any], dict[str, list], list[str], list[tuple[str, str]]]:
        options = self.inputs.options
        columns = {c.name: np.empty((len(indices), *c.shape), dtype=c.dtype) for c in self.columns}
        keys, skipped, values = fill_fields(self.inputs.dataset, indices, self.inputs.sample_spec, options.transform,
                                            options.seed, self.epoch_no, options.on_error, columns, skip_limit=self.inputs.skip_limit)
        return columns, values, keys, skipped


class DaliEpoch(Epoch):
    """One pass over a rank's batches decoded by DALI, in the same order as the CPU path.

    DALI's worker processes read each batch's bytes and plan its crops (fastload's own plans, so
    the geometry equals the CPU path's); DALI decodes only the crop regions and resizes. A sample
    whose header is unreadable is skipped while planning, or with ``on_error="raise"`` raised
    when its batch is due; a batch DALI cannot decode is redone on the CPU path (DaliBatches).
    """

    def __init__(self, inputs: EpochInputs, pipeline: DaliPipeline) -> None:
        super().__init__(inputs)
        self.pipeline = pipeline

    def reset(self, state: LoaderState) -> None:
        """Start at ``state``'s position: the feed starts there, and the pipeline carries on into it
        when it is the epoch after the one it has just finished (else it is rebuilt)."""
        super().reset(state)
        decoder = self.pipeline.ensure(self.inputs)
        self._start_prefetch()
        self.dali = DaliBatches(self, decoder)
        self.dali.start()

    def _next_batch(self) -> Any:
        stats = self.inputs.stats
        if self.prefetcher is not None:
            self.prefetcher.check()
        with stats.waiting():
            try:
                columns, values, keys, skipped = self.dali.next(self.next_yield, self.indices(self.next_yield))
            except BaseException:
                self.close()
                raise
        batch = self._finish_batch(as_tensors(columns), values, keys, skipped, self.next_yield)
        stats.record_batch(len(keys))
        return batch


def as_tensors(columns: dict[str, Any]) -> dict[str, Any]:
    """Stacked columns as tensors (DALI's images are already; the carried ones are numpy)."""
    return {name: column if isinstance(column, torch.Tensor) else as_tensor(column) for name, column in columns.items()}
