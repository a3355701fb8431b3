"""One audio field's crops planned and decoded into its batch rows, in a worker (or inline).

A recording's crops (which samples) are planned from its stream facts in the sample table, from
(seed, epoch, index) alone; the decoder then seeks to a little before each crop and decodes only
to its end, the container opened once for a recording's crops (fastload.av.pyav; a PCM WAV's
crops are read at their bytes, an Ogg Vorbis crop's packets found in its pages by fastload.av.ogg),
and each crop is mixed down and resampled (fastload.av.resample) into its row (int16 where asked),
or turned into Whisper's log-mel features (fastload.av.mel). Decoding is timed as the decode
stage, the rest as the transform stage. A video field asked for as audio gives its sound track,
planned from the video's facts (its length, its sound's rate and channels). The random streams and
the stage clock are the worker's, handed in (fastload.workers.rng, fastload.workers.stage_clock).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fastload._util.stages import DECODE, TRANSFORM
from fastload._util.stages import Laps as StageClock
from fastload.av.clips import Draws
from fastload.av.crops import CROP_SALT, Audio, plan_crops
from fastload.av.facts import AudioFacts, MediaFacts
from fastload.av.mel import log_mel
from fastload.av.pyav import decode_crops, resample_audio
from fastload.errors import SampleError


@dataclass(frozen=True)
class PlannedAudio:
    """What a worker makes of one recording: its facts and each crop's (first sample, samples)."""

    facts: AudioFacts
    crops: tuple[tuple[int, int], ...]

    def spans(self) -> tuple[tuple[float, float], ...]:
        """Each crop's start and end in seconds."""
        rate = self.facts.rate
        return tuple((round(start / rate, 6), round((start + count) / rate, 6)) for start, count in self.crops)


def as_int16(samples: np.ndarray) -> np.ndarray:
    """float32 samples as int16: each times 32767, rounded (half to even), clipped to int16's range
    (a resampled crop's peaks can pass 1.0)."""
    scaled = np.rint(samples * np.float32(32767))
    np.clip(scaled, -32768, 32767, out=scaled)
    return scaled.astype(np.int16)


def audio_facts(facts: MediaFacts, where: str, name: str) -> AudioFacts:
    """A field's facts as a recording's: its own, or a video's sound track's (a SampleError when the video has none)."""
    if isinstance(facts, AudioFacts):
        return facts
    if not facts.audio_rate or not facts.audio_channels:
        raise SampleError(where, f"field {name}: a video with no audio stream, and its audio was asked for")
    try:
        return AudioFacts("video", facts.audio_rate, facts.audio_channels, max(1, int(facts.seconds * facts.audio_rate)), 1,
                          (1, facts.audio_rate), 0, True)
    except ValueError as exc:
        raise SampleError(where, f"field {name}: its sound track's facts are out of bounds ({exc})") from None


def plan_audio(facts: AudioFacts, audio: Audio, seed: int, epoch: int, index: int, where: str,
               sample_rng: Callable[[int, int, int], Draws]) -> PlannedAudio:
    """The crops of sample ``index``'s recording: pure functions of (seed, epoch, index) and its
    facts, drawn from the worker's ``sample_rng``; a SampleError when it is shorter than a crop and ``audio.short`` is "drop"."""
    crops = plan_crops(audio, facts, sample_rng(seed ^ CROP_SALT, epoch, index))
    if crops is None:
        raise SampleError(where, f"{facts.seconds:.2f} s long, shorter than a crop of {audio.seconds} s (Audio short='drop')")
    return PlannedAudio(facts, crops)


def fill_audio(data: bytes, where: str, planned: PlannedAudio, audio: Audio, out: np.ndarray, lengths: np.ndarray, clock: StageClock) -> None:
    """Decode the planned crops of the recording in ``data`` into ``out`` (audio.shape(), audio.dtype)
    and each crop's valid samples at ``audio.rate`` into ``lengths``; a SampleError naming ``where``."""
    facts = planned.facts
    rows = out.reshape(-1, *out.shape[-2:]) if audio.mel is None else out.reshape(-1, *out.shape[-3:])
    counts = lengths.reshape(-1)
    deadline = time.monotonic() + audio.timeout_s
    clock.lap(TRANSFORM)
    with contextlib.closing(decode_crops(data, where, facts, planned.crops, deadline)) as crops:  # its container closed on an error too
        for row, source in enumerate(crops):
            clock.lap(DECODE)
            samples = resample_audio(source, facts.rate, audio.rate, audio.channels, where)
            valid = min(audio.length, samples.shape[1])
            if audio.mel is None:
                rows[row][:, :valid] = samples[:, :valid] if audio.dtype == "float32" else as_int16(samples[:, :valid])
                rows[row][:, valid:] = 0
            else:
                crop = np.zeros((audio.channels, audio.length), np.float32)
                crop[:, :valid] = samples[:, :valid]
                for channel in range(audio.channels):
                    log_mel(crop[channel], audio.mel, rows[row][channel])
            counts[row] = valid
            clock.lap(TRANSFORM)
