"""The sound of a video's clips (``Audio(sampling="clip")``): one crop of its sound track a clip,
from the presentation time of the clip's first frame to the end of its last (the stream facts'
timestamps, as the clip planner times a clip), planned from the same (seed, epoch, index) as the
video field's clips, so a clip and its sound agree in every epoch, resumed or described."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fastload.av.audio_decode import PlannedAudio
from fastload.av.clip_decode import clip_frames
from fastload.av.clips import Clip, Draws
from fastload.av.crops import Audio
from fastload.av.facts import AudioFacts, StreamFacts


@dataclass(frozen=True)
class ClipSound(PlannedAudio):
    """A video's sound planned clip by clip: each crop's samples, and its clip's seconds."""

    times: tuple[tuple[float, float], ...] = ()

    def spans(self) -> tuple[tuple[float, float], ...]:
        """Each crop's start and end in seconds from the video's first frame: its clip's first
        frame's time, and its last frame's end (or the start plus the crop's ``seconds``, sooner)."""
        return self.times


def plan_clip_sound(video: StreamFacts, sound: AudioFacts, audio: Audio, clip: Clip, seed: int, epoch: int, index: int,
                    sample_rng: Callable[[int, int, int], Draws]) -> ClipSound:
    """The crops of sample ``index``'s video's sound, one a clip of ``clip`` (its video field's
    clips, planned alike): a clip's seconds on the container's clock (its sound's samples count
    from 0 there), at most ``audio.seconds`` of each."""
    origin = video.start_pts * video.time_base[0] / video.time_base[1]  # the first frame's time on the container's clock
    crops, times = [], []
    for frames in clip_frames(video, clip, seed, epoch, index, sample_rng):
        start = video.time_of(frames[0])
        end = min(video.time_of(frames[-1] + 1), start + audio.seconds)  # the next frame's time: the video's end after its last
        first = max(0, round((origin + start) * sound.rate))
        crops.append((first, max(1, round((origin + end) * sound.rate) - first)))
        times.append((round(start, 6), round(end, 6)))
    return ClipSound(sound, tuple(crops), tuple(times))
