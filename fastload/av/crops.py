"""Audio crops as data, like a clip: :class:`Audio` says what a loader takes of each recording,
and :func:`plan_crops` turns it into sample numbers, a pure function of the recording's stream
facts and a random stream seeded from (seed, epoch, index), so a crop is planned without opening
the file and a resumed epoch plans the same crops (Energon's ``get_audio_clips``, as a plan)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, get_args

from fastload.av.clips import Clip, Draws
from fastload.av.facts import MAX_AUDIO_RATE, MAX_AUDIO_SECONDS, MAX_CHANNELS, AudioFacts

AudioSampling = Literal["random", "uniform", "centred", "start", "clip"]
AUDIO_SAMPLINGS: tuple[str, ...] = get_args(AudioSampling)
Short = Literal["pad", "drop"]
SHORTS: tuple[str, ...] = get_args(Short)
AudioDtype = Literal["float32", "int16"]
AUDIO_DTYPES: tuple[str, ...] = get_args(AudioDtype)
MEL_BINS: tuple[int, ...] = (80, 128)  # Whisper's two recipes (large-v3: 128)
CROP_SALT = 0xA0D1  # the crops' random stream is the sample's seed with this mixed in (independent of a clip's)


@dataclass(frozen=True)
class Audio:
    """``crops`` crops of ``seconds`` from each recording, as ``channels`` channels (1: the channels'
    mean) at ``rate`` samples a second. ``sampling``: "random" starts (training), "uniform" starts
    evenly spaced over the recording (one crop: the centred one), "centred", or "start" (every crop
    from the recording's start: whole utterances for speech recognition), or "clip" (a video's
    sound track, one crop a clip of its video field: from the clip's first frame's presentation time
    to its last frame's end, at most ``seconds``; ``clip``: the loader's ``clip=``, set by the
    loader); None: random when the loader shuffles, else uniform. A recording shorter than a crop: ``short="pad"`` zero-pads it
    (its length in the batch's lengths), ``"drop"`` makes it a bad sample (skipped with
    ``on_error="skip"``). ``mel``: 80 or 128 log-mel bins (Whisper's features) instead of samples.
    ``timeout_s`` bounds one recording's decode. ``dtype``: "float32" samples in [-1, 1], or
    "int16": each float sample times 32767, rounded, clipped to int16's range."""

    seconds: float = 10.0
    crops: int = 1
    sampling: AudioSampling | None = None
    rate: int = 16000
    channels: int = 1
    short: Short = "pad"
    mel: int | None = None
    timeout_s: float = 30.0
    dtype: AudioDtype = "float32"
    clip: Clip | None = None

    def __post_init__(self) -> None:
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float)) or not 0 < self.seconds <= MAX_AUDIO_SECONDS:
            raise ValueError(f"Audio seconds must be a number in (0, {MAX_AUDIO_SECONDS}], got {self.seconds!r}")
        for name, top in (("crops", 1 << 16), ("rate", MAX_AUDIO_RATE), ("channels", MAX_CHANNELS)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise ValueError(f"Audio {name} must be a whole number from 1 to {top}, got {value!r}")
        if self.sampling is not None and self.sampling not in AUDIO_SAMPLINGS:
            raise ValueError(f"Audio sampling must be one of {AUDIO_SAMPLINGS} or None, got {self.sampling!r}")
        if self.sampling == "centred" and self.crops > 1:
            raise ValueError("Audio sampling='centred' takes one crop a recording: for several use 'uniform' or 'random'")
        if self.clip is not None and self.sampling != "clip":
            raise ValueError("Audio clip= is the clips sampling='clip' follows: give it with sampling='clip' (the loader sets it from its clip=)")
        if self.clip is not None and self.crops != self.clip.clips:
            raise ValueError(f"Audio(sampling='clip') takes one crop a clip: crops={self.clip.clips} for a Clip of {self.clip.clips} clips, got {self.crops}")
        if self.sampling == "clip" and self.short == "drop":
            raise ValueError("Audio(sampling='clip') crops a clip's span, shorter than a crop as a rule: short='drop' does not apply")
        if self.short not in SHORTS:
            raise ValueError(f"Audio short must be one of {SHORTS}, got {self.short!r}")
        if self.mel is not None and self.mel not in MEL_BINS:
            raise ValueError(f"Audio mel must be one of {MEL_BINS} (Whisper's recipes) or None, got {self.mel!r}")
        if self.mel is not None and self.rate != 16000:
            raise ValueError("Audio mel= is Whisper's recipe, at 16000 samples a second: give rate=16000")
        if self.mel is not None and self.length <= 200:
            raise ValueError(f"Audio mel= needs crops of more than 200 samples (its window reflects 200 at each end), got {self.length}")
        if self.dtype not in AUDIO_DTYPES:
            raise ValueError(f"Audio dtype must be one of {AUDIO_DTYPES}, got {self.dtype!r}")
        if self.mel is not None and self.dtype != "float32":
            raise ValueError("Audio mel= gives log-mel features, which are float32: leave dtype='float32'")
        if not self.timeout_s > 0:
            raise ValueError(f"Audio timeout_s must be positive, got {self.timeout_s!r}")

    @property
    def length(self) -> int:
        """A crop's samples a channel, at ``rate``."""
        return max(1, round(self.seconds * self.rate))

    def shape(self) -> tuple[int, ...]:
        """One recording's part of a batch: ([crops,] channels, samples), or with ``mel``
        ([crops,] channels, mel, frames) (Whisper's frames: one per 160 samples)."""
        lead = (self.crops,) if self.crops > 1 else ()
        if self.mel is not None:
            return (*lead, self.channels, self.mel, self.length // 160)
        return (*lead, self.channels, self.length)

    def lengths_shape(self) -> tuple[int, ...]:
        """The shape of one recording's lengths: one a crop."""
        return (self.crops,) if self.crops > 1 else ()

    def resolved(self, shuffle: bool) -> Audio:
        """This spec with its sampling decided: random when shuffling, else uniform (a clip's, as the loader's clip=)."""
        if self.clip is not None:
            return replace(self, clip=self.clip.resolved(shuffle))
        if self.sampling is not None:
            return self
        return replace(self, sampling="random" if shuffle else "uniform")


def plan_crops(audio: Audio, facts: AudioFacts, rng: Draws) -> tuple[tuple[int, int], ...] | None:
    """Each crop as (first sample, samples) at the recording's own rate; None when the recording is
    shorter than a crop and ``audio.short`` is "drop"."""
    span = max(1, round(audio.seconds * facts.rate))
    if facts.samples < span:
        if audio.short == "drop":
            return None
        return ((0, facts.samples),) * audio.crops
    last = facts.samples - span
    if audio.sampling == "random":
        starts = tuple(rng.integers(0, last + 1) for _ in range(audio.crops))
    elif audio.sampling == "start":
        starts = (0,) * audio.crops
    elif audio.crops == 1:
        starts = (last // 2,)
    else:
        starts = tuple(round(i * last / (audio.crops - 1)) for i in range(audio.crops))
    return tuple((start, span) for start in starts)
