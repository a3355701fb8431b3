"""Clips as data, like a crop: :class:`Clip` says what a loader takes of each video, and
:func:`plan_clips` turns it into frame numbers, a pure function of the video's frame count and a
random stream seeded from (seed, epoch, index), so a clip is planned without opening the file
and a resumed epoch plans the same clips (torchcodec's ``clips_at_random_indices`` and
``clips_at_regular_indices``, DALI's ``sequence_length`` / ``stride``, as a plan)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, get_args

Sampling = Literal["random", "uniform"]
SAMPLINGS: tuple[str, ...] = get_args(Sampling)
CLIP_SALT = 0xC11B  # the clip's random stream is the crop's seed with this mixed in: the two are independent


class Draws(Protocol):
    """The one draw a clip plan needs (fastload.workers.rng.SampleRandom has it)."""

    def integers(self, low: int, high: int) -> int: ...


@dataclass(frozen=True)
class Clip:
    """``frames`` frames ``stride`` apart from each video, ``clips`` clips a video. ``sampling``:
    "random" starts (training), "uniform" starts evenly spaced over the video (one clip: the
    centred one; evaluation); None: random when the loader shuffles, else uniform. A video
    shorter than a clip repeats its last frame (torchcodec's ``repeat_last``). ``timeout_s``
    bounds one video's decode: a video that takes longer is a bad sample."""

    frames: int = 16
    stride: int = 1
    clips: int = 1
    sampling: Sampling | None = None
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("frames", "stride", "clips"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Clip {name} must be a whole number >= 1, got {value!r}")
        if self.sampling is not None and self.sampling not in SAMPLINGS:
            raise ValueError(f"Clip sampling must be one of {SAMPLINGS} or None, got {self.sampling!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"Clip timeout_s must be positive, got {self.timeout_s!r}")

    @property
    def span(self) -> int:
        """How many frames one clip covers, first to last."""
        return (self.frames - 1) * self.stride + 1

    def shape(self) -> tuple[int, ...]:
        """The leading dimensions of one video's pixels: (T,) or (clips, T)."""
        return (self.frames,) if self.clips == 1 else (self.clips, self.frames)

    def resolved(self, shuffle: bool) -> Clip:
        """This clip with its sampling decided: random when shuffling, else uniform."""
        if self.sampling is not None:
            return self
        return Clip(self.frames, self.stride, self.clips, "random" if shuffle else "uniform", self.timeout_s)


def clip_starts(clip: Clip, frames: int, rng: Draws) -> tuple[int, ...]:
    """The first frame of each of the clips of a video of ``frames`` frames."""
    last = max(frames - clip.span, 0)
    if clip.sampling == "random":
        return tuple(rng.integers(0, last + 1) for _ in range(clip.clips))
    if clip.clips == 1:
        return (last // 2,)
    return tuple(round(i * last / (clip.clips - 1)) for i in range(clip.clips))


def plan_clips(clip: Clip, frames: int, rng: Draws) -> tuple[tuple[int, ...], ...]:
    """The frame numbers of each clip of a video of ``frames`` frames (past its end: its last frame)."""
    return tuple(tuple(min(start + k * clip.stride, frames - 1) for k in range(clip.frames)) for start in clip_starts(clip, frames, rng))
