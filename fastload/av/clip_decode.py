"""One video field's clips planned and decoded into its batch rows, in a worker (or inline).

A video's clips (which frames) and its geometry (crop, resize, flip: the same for every frame of
every clip) are planned from its stream facts in the sample table, from (seed, epoch, index)
alone; then the decoder seeks to the keyframe before each clip and decodes only to its last
frame (fastload.av.pyav), and each kept frame is resampled into its row. Decoding (with the
conversion to RGB) is timed as the decode stage, the resample as the transform stage. The random
streams and the stage clock are the worker's, handed in (fastload.workers.rng, fastload.workers.stage_clock).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fastload._util.stages import DECODE, TRANSFORM
from fastload._util.stages import Laps as StageClock
from fastload.av.clips import CLIP_SALT, Clip, Draws, plan_clips
from fastload.av.facts import MediaFacts, StreamFacts
from fastload.av.pyav import decode_frames
from fastload.errors import SampleError
from fastload.transforms import Plan, RandomSource, Transform, plan, resample_into


class SampleStream(Draws, RandomSource, Protocol):
    """A sample's random stream as a video's plan draws from it (fastload.workers.rng.SampleRandom)."""


SampleRng = Callable[[int, int, int], SampleStream]  # (seed, epoch, index) -> its stream: the worker's, handed in


@dataclass(frozen=True)
class PlannedVideo:
    """What a worker makes of one video: its facts, each clip's frame numbers, the geometry."""

    facts: StreamFacts
    clips: tuple[tuple[int, ...], ...]
    plan: Plan

    def spans(self) -> tuple[tuple[int, int, float, float], ...]:
        """Each clip's first and last frame, and the seconds they are shown at."""
        return tuple((c[0], c[-1], round(self.facts.time_of(c[0]), 6), round(self.facts.time_of(c[-1]), 6)) for c in self.clips)


def video_facts(facts: MediaFacts | None, where: str, name: str) -> StreamFacts:
    """A video field's facts from its sample table; a SampleError when it has none or a recording's."""
    if facts is None:
        raise SampleError(where, f"field {name}: no stream facts in its shard's sample table (convert the dataset with fastload convert to record them)")
    if not isinstance(facts, StreamFacts):
        raise SampleError(where, f"field {name}: a recording, not a video (ask for it as audio)")
    return facts


def plan_video(facts: StreamFacts, clip: Clip, transforms: Sequence[Transform], seed: int, epoch: int, index: int,
               sample_rng: SampleRng) -> PlannedVideo:
    """The clips and geometry of sample ``index``'s video: pure functions of (seed, epoch, index)
    and its facts, drawn from ``sample_rng`` (the crop's random stream is an image's; the clips' is independent of it)."""
    return PlannedVideo(facts, clip_frames(facts, clip, seed, epoch, index, sample_rng),
                        plan(transforms, facts.height, facts.width, sample_rng(seed, epoch, index)))


def clip_frames(facts: StreamFacts, clip: Clip, seed: int, epoch: int, index: int,
                sample_rng: Callable[[int, int, int], Draws]) -> tuple[tuple[int, ...], ...]:
    """Each clip's frame numbers of sample ``index``'s video, as its video field plans them: a pure
    function of (seed, epoch, index) and its facts (the sound of a clip follows them)."""
    return plan_clips(clip, facts.frames, sample_rng(seed ^ CLIP_SALT, epoch, index))


def fill_video(data: bytes, where: str, planned: PlannedVideo, out: np.ndarray, timeout_s: float, clock: StageClock) -> None:
    """Decode the planned clips of the video in ``data`` into ``out`` ((clips,) T, C, H, W uint8),
    each distinct frame decoded once; a SampleError naming ``where`` when it cannot."""
    if tuple(planned.plan.size) != out.shape[-2:]:
        raise SampleError(where, f"transforms give {planned.plan.size[0]}x{planned.plan.size[1]}, the batch holds {out.shape[-2]}x{out.shape[-1]}")
    rows = out.reshape(-1, *out.shape[-3:])
    places: dict[int, list[int]] = {}
    for row, frame in enumerate(frame for clip in planned.clips for frame in clip):
        places.setdefault(frame, []).append(row)
    facts = planned.facts
    clock.lap(TRANSFORM)
    for frame, pixels in decode_frames(data, where, facts, sorted(places), None, time.monotonic() + timeout_s):
        clock.lap(DECODE)
        first, *repeats = places[frame]
        try:
            resample_into(pixels, planned.plan, facts.height, facts.width, rows[first])
        except ValueError as exc:
            raise SampleError(where, f"frame {frame} has {exc}") from None
        for row in repeats:
            rows[row] = rows[first]
        clock.lap(TRANSFORM)
