"""The DALI backend's epoch: fastload reads and plans each batch in DALI's worker processes (the
feed), DALI decodes the crop regions on the GPU (or its CPU), in the same order as the CPU path;
the other fields (labels, text, json, arrays, boxes, masks) are made in the feed and travel beside."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, cast

import numpy as np
import torch

from fastload.dali.feed import DaliFeed
from fastload.dali.protocol import carried_stacked, read_carried
from fastload.epoch import Epoch, EpochInputs
from fastload.errors import SampleError
from fastload.field_batch import as_tensor
from fastload.fields import FieldSpec, SampleSpec
from fastload.slots import spec_columns
from fastload.state import LoaderState
from fastload.workers import fill_fields

log = logging.getLogger("fastload")


def dali_refusal(spec: SampleSpec) -> str | None:
    """Why ``backend='dali'`` cannot make these samples, or None when it can."""
    if spec.map is not None:  # map= sees each decoded sample in the workers, and DALI decodes the image after them
        return "backend='dali' decodes the image after fastload's workers are done with a sample, so map= cannot see it: use backend='cpu'"
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

    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu
        self.decoder: Any = None  # fastload.dali.pipeline.DaliBatchDecoder

    def epoch(self, inputs: EpochInputs) -> DaliEpoch:
        """An iterator over the next epoch's batches."""
        return DaliEpoch(inputs, self)

    def ensure(self, inputs: EpochInputs) -> Any:
        """The pipeline's decoder, made if not yet there."""
        from fastload.dali.pipeline import DaliBatchDecoder

        if self.decoder is None:
            options = inputs.options
            device_id = torch.cuda.current_device() if self.gpu else None
            if inputs.image_shape is None:  # dali_refusal() refused such a loader already
                raise ValueError("backend='dali' decodes an image field; these samples hold none")
            self.decoder = DaliBatchDecoder(
                options.batch_size, inputs.image_shape[1:], max(1, options.num_workers), device_id,
                options.hw_decoder_load, workers=options.num_workers,
            )
        return self.decoder

    def close(self) -> None:
        """Release the pipeline (its device memory and worker processes)."""
        if self.decoder is not None:
            self.decoder.close()
            self.decoder = None


class DaliEpoch(Epoch):
    """One pass over a rank's batches decoded by DALI, in the same order as the CPU path.

    DALI's worker processes read each batch's bytes and plan its crops (fastload's own plans, so
    the geometry equals the CPU path's); DALI decodes only the crop regions and resizes. A sample
    whose header is unreadable is skipped while planning, or with ``on_error="raise"`` raised
    when its batch is due; a batch DALI cannot decode (corrupt entropy data) is redone on the CPU
    path, which names or skips the bad sample, and DALI carries on after it.
    """

    def __init__(self, inputs: EpochInputs, pipeline: DaliPipeline) -> None:
        super().__init__(inputs)
        self.pipeline = pipeline

    def reset(self, state: LoaderState) -> None:
        """Start at ``state``'s position: the feed starts there, and the pipeline carries on into it
        when it is the epoch after the one it has just finished (else it is rebuilt)."""
        super().reset(state)
        inputs, options = self.inputs, self.inputs.options
        self.decoder = self.pipeline.ensure(inputs)
        self._start_prefetch()
        self.columns = spec_columns(inputs.sample_spec, inputs.image_shape)
        self.feed = DaliFeed(
            inputs.dataset, inputs.sample_spec, carried_stacked(inputs.sample_spec, inputs.image_shape),
            options.transform, options.seed, options.on_error,
            inputs.orders.spec(self.start.generations), self.epoch, self.plan.start, classes=inputs.orders.classes,
        )
        self.decoder.start(self.feed, len(self.plan))

    def _on_cpu(self, batch_no: int) -> tuple[dict[str, np.ndarray], dict[str, list], list[str], list[tuple[str, str]]]:
        inputs, options = self.inputs, self.inputs.options
        indices = self.indices(batch_no)
        columns = {c.name: np.empty((len(indices), *c.shape), dtype=c.dtype) for c in self.columns}
        keys, skipped, values = fill_fields(inputs.dataset, indices, inputs.sample_spec, options.transform, options.seed,
                                            self.epoch, options.on_error, columns)
        return columns, values, keys, skipped

    def _next_batch(self) -> Any:
        stats, spec = self.inputs.stats, self.inputs.sample_spec
        if self.prefetcher is not None:
            self.prefetcher.check()
        with stats.waiting():
            try:
                images, keys, skipped, error, carried = self.decoder.next_batch()
            except Exception as exc:
                if not is_decode_failure(exc):
                    self.close()
                    raise
                log.warning("fastload: DALI failed on batch %d of epoch %d, redoing it on the CPU: %s",
                            self.next_yield, self.epoch, (str(exc).strip().splitlines() or ["RuntimeError"])[-1][:300])
                stats.redone_on_cpu += 1
                try:
                    columns, values, keys, skipped = self._on_cpu(self.next_yield)
                except SampleError:
                    self.close()
                    raise
                following = self.next_yield + 1
                self.decoder.start(replace(self.feed, first_batch=following), len(self.plan) - following)
            else:
                if error is not None:  # a sample that could not be read (on_error="raise", or no substitute left)
                    self.close()
                    raise error
                columns, values = read_carried(carried, spec, self.feed.stacked, keys)
                image = cast(FieldSpec, spec.primary)  # there is one: ensure() refused samples without an image
                columns[image.key] = images
        tensors = {name: column if isinstance(column, torch.Tensor) else as_tensor(column) for name, column in columns.items()}
        batch = self._finish_batch(tensors, values, keys, skipped, self.next_yield)
        stats.record_batch(len(keys))
        return batch
