"""Clips decoded by DALI: NVDEC on a GPU through DALI's in-memory video decoder
(``fn.decoders.video`` on the ``mixed`` device; its ``cpu`` device without a GPU), fed the bytes,
frame numbers and crops the CPU workers use (planned here from the stream facts,
fastload.av.clip_decode), then resized (antialiased linear, the exact fractional crop box),
mirrored and laid out (F, C, H, W).

Tested with DALI on the CPU; the GPU (mixed) device has not run yet (docs/video.md says what the
first GPU run must check), so ``backend="auto"`` keeps clips on fastload's CPU workers and
``backend="dali"`` asks for this path. A batch DALI cannot decode is redone on the CPU path, which
names or skips the bad video.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import numpy as np
import torch

from fastload.av.clip_decode import plan_video, video_facts
from fastload.av.clips import Clip
from fastload.backends.dali.library import images_as_torch, import_dali
from fastload.errors import SampleError
from fastload.fields import FieldSpec, SampleSpec, decode_field
from fastload.loading.epoch import Epoch, EpochInputs
from fastload.loading.field_batch import as_tensor
from fastload.loading.state import LoaderState
from fastload.workers.batch_fill import Substitutes, fill_fields
from fastload.workers.rng import sample_rng

log = logging.getLogger("fastload")


def video_refusal(spec: SampleSpec) -> str | None:
    """Why DALI's video path cannot make these samples, or None: it makes one video field's clips
    and, beside them, a label."""
    roles = [f.role for f in spec.fields]
    if roles.count("video") != 1 or any(role not in ("video", "label") for role in roles):
        return "backend='dali' decodes the clips of one video field (and a label beside them): use backend='cpu'"
    return None


class DaliClipDecoder:
    """A DALI pipeline decoding a batch of videos' planned frames into uint8 (B, F, C, H, W) on the
    GPU: inputs fed per batch (``feed_input``), so each batch's frames and crops are fastload's."""

    INPUTS = ("encoded", "frames", "roi_start", "roi_end", "mirror")

    def __init__(self, batch_size: int, out_hw: tuple[int, int], device_id: int | None, num_threads: int) -> None:
        dali = import_dali()
        fn, types = dali.fn, dali.types
        height, width = out_hw
        self.device_id = device_id

        @dali.pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=device_id, prefetch_queue_depth=1,
                           exec_async=False, exec_pipelined=False)
        def pipeline():
            encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
            frames = fn.external_source(name="frames", dtype=types.INT32, ndim=1)
            roi_start = fn.external_source(name="roi_start", dtype=types.FLOAT, ndim=1)
            roi_end = fn.external_source(name="roi_end", dtype=types.FLOAT, ndim=1)
            mirror = fn.external_source(name="mirror", dtype=types.INT32, ndim=0)
            video = fn.decoders.video(encoded, device="cpu" if device_id is None else "mixed", frames=frames)  # F, H, W, C (NVDEC on a GPU)
            video = fn.resize(video, resize_x=width, resize_y=height, roi_start=roi_start, roi_end=roi_end, roi_relative=False,
                              antialias=True, interp_type=types.INTERP_LINEAR)
            return fn.crop_mirror_normalize(video, mirror=mirror, dtype=types.UINT8, output_layout="FCHW")

        self.build = pipeline
        self.pipe = pipeline()
        self.pipe.build()

    def decode(self, encoded: list[np.ndarray], frames: list[np.ndarray], boxes: list[tuple[float, float, float, float]],
               flips: list[bool]) -> torch.Tensor:
        """The batch's clips: ``frames[i]`` of video ``encoded[i]``, cropped to ``boxes[i]`` (x0, y0,
        x1, y1 in source pixels), mirrored where ``flips[i]``; a torch tensor on the pipeline's device."""
        starts = [np.asarray((b[1], b[0]), np.float32) for b in boxes]  # DALI's ROI follows the tensor's shape order: (y, x)
        ends = [np.asarray((b[3], b[2]), np.float32) for b in boxes]
        columns = (encoded, frames, starts, ends, [np.asarray(int(f), np.int32) for f in flips])
        for name, column in zip(self.INPUTS, columns):
            self.pipe.feed_input(name, column)
        try:
            (clips,) = self.pipe.run()
        except RuntimeError:  # a pipeline that failed is no longer valid: the next batch gets a fresh one
            self.pipe = self.build()
            self.pipe.build()
            raise
        return images_as_torch(clips.as_tensor(), self.device_id)

    def close(self) -> None:
        """Release the pipeline's device memory."""
        self.pipe = None


class DaliVideoEpoch(Epoch):
    """One pass over a rank's batches of clips decoded by DALI, in the CPU path's order: each
    batch's videos read and planned in this process (a sample that cannot be read or planned is
    skipped or raised there, as on_error says), decoded on the GPU; a batch DALI fails on is
    redone on the CPU path."""

    def __init__(self, inputs: EpochInputs, decoder: DaliClipDecoder) -> None:
        super().__init__(inputs)
        self.decoder = decoder

    def reset(self, state: LoaderState) -> None:
        """Start at ``state``'s position (a remote dataset's shards fetched ahead of use)."""
        super().reset(state)
        self._start_prefetch()

    def _next_batch(self) -> Any:
        inputs = self.inputs
        indices = self.indices(self.next_yield)
        with inputs.stats.waiting():
            try:
                columns, keys, skipped = self._on_gpu(indices)
            except RuntimeError as exc:  # DALI's operators failing on the data
                log.warning("fastload: DALI failed on a batch of clips, redoing it on the CPU: %s", str(exc).strip()[-300:])
                inputs.stats.record_redone_on_cpu()
                columns, keys, skipped = self._on_cpu(indices)
        batch = self._finish_batch({name: as_tensor(c) if isinstance(c, np.ndarray) else c for name, c in columns.items()},
                                   {}, keys, skipped, self.next_yield)
        inputs.stats.record_batch(len(keys))
        return batch

    def _on_gpu(self, indices: np.ndarray) -> tuple[dict[str, Any], list[str], list[tuple[str, str]]]:
        inputs, spec = self.inputs, self.inputs.sample_spec
        video = next(f for f in spec.fields if f.role == "video")
        label = next((f for f in spec.fields if f.role == "label"), None)
        clip = cast(Clip, spec.media["video"])
        substitutes = Substitutes(inputs.dataset, inputs.options.on_error, inputs.skip_limit)
        planned = [substitutes.first_readable(index, lambda i: self._plan(i, video, label, clip)) for index in indices.tolist()]
        skipped = substitutes.skipped
        keys = [p[0] for p in planned]
        clips = self.decoder.decode([p[1] for p in planned], [p[2] for p in planned], [p[3] for p in planned], [p[4] for p in planned])
        columns: dict[str, Any] = {video.key: clips.reshape(len(indices), *clip.shape(), *clips.shape[-3:])}
        if label is not None:
            columns[label.key] = np.asarray([p[5] for p in planned], dtype=np.int64)
        return columns, keys, skipped

    def _plan(self, index: int, video: FieldSpec, label: FieldSpec | None, clip: Clip) -> tuple:
        """(key, the video's bytes, its frame numbers, crop box, flip, label) of sample ``index``."""
        inputs = self.inputs
        key, stored, _ = inputs.dataset.raw(index)
        where = f"{inputs.dataset.shard_name(inputs.dataset.locate(index)[0])}:{key}"
        name = video.find(stored)
        if name is None:
            raise SampleError(where, f"no field {video.name} among {sorted(stored)}")
        facts = video_facts(inputs.dataset.stream_facts(index).get(name), where, name)
        planned = plan_video(facts, clip, inputs.options.transform, inputs.options.seed, self.epoch, index, sample_rng)
        frames = np.asarray([frame for each in planned.clips for frame in each], dtype=np.int32)
        found = label.find(stored) if label is not None else None
        value = decode_field("label", stored[found], where, found) if found is not None else -1
        return key, np.frombuffer(stored[name], dtype=np.uint8), frames, planned.plan.box, planned.plan.flip, value

    def _on_cpu(self, indices: np.ndarray) -> tuple[dict[str, Any], list[str], list[tuple[str, str]]]:
        from fastload.workers.slots import spec_columns

        inputs, options = self.inputs, self.inputs.options
        columns = {c.name: np.empty((len(indices), *c.shape), dtype=c.dtype) for c in spec_columns(inputs.sample_spec, inputs.image_shape)}
        keys, skipped, _ = fill_fields(inputs.dataset, indices, inputs.sample_spec, options.transform, options.seed, self.epoch,
                                       options.on_error, columns, skip_limit=inputs.skip_limit)
        return dict(columns), keys, skipped
