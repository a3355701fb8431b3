"""Audio as the media roles' registry (fastload.media) calls it, one function a place where a
field's role is dispatched: probed (and re-encoded where asked) at conversion and when a tar is
indexed in place, its batch columns (the crops and their lengths), its crops filled in a worker,
described, verified and summed up for ``fastload inspect``. The planning and decoding are
fastload.av.audio_decode's; the worker's random streams and stage clock come in as arguments."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from fastload._util.stages import Laps
from fastload.av.audio_decode import PlannedAudio, audio_facts, fill_audio, plan_audio
from fastload.av.clip_audio import plan_clip_sound
from fastload.av.clips import Clip, Draws
from fastload.av.crops import Audio
from fastload.av.facts import AudioFacts, MediaFacts, StreamFacts
from fastload.av.pyav import AUDIO_ENCODERS, check_audio_encoding, probe_audio, reencode_audio
from fastload.errors import SampleError
from fastload.transforms import Transform

Columns = tuple[tuple[str, tuple[int, ...], str], ...]  # a field's batch columns: (name, one sample's shape, dtype)
SampleRng = Callable[[int, int, int], Draws]  # (seed, epoch, index) -> its random stream: the worker's, handed in


class AudioConversion(Protocol):
    """The conversion options a recording's preparation reads (fastload.converters.convert_options.ConvertOptions)."""

    @property
    def audio_codec(self) -> str | None: ...
    @property
    def audio_rate(self) -> int | None: ...


# fastload convert's audio flags: (flag, argparse's keywords; dest: the ConvertOptions field it sets)
AUDIO_FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--audio-codec", {"dest": "audio_codec", "choices": ["flac", "opus"], "help": "recordings: re-encode to FLAC (lossless) or Opus"}),
    ("--audio-rate", {"dest": "audio_rate", "type": int, "metavar": "HZ",
                      "help": "recordings: re-encode at this sample rate (FLAC unless --audio-codec)"}),
)


def reencodes_audio(options: AudioConversion) -> bool:
    """Whether preparing a recording re-encodes it (``--audio-codec``, ``--audio-rate``)."""
    return options.audio_codec is not None or options.audio_rate is not None


def check_audio_conversion(options: AudioConversion) -> None:
    """A ValueError unless recordings can be re-encoded as asked (the codec, the rate)."""
    if reencodes_audio(options):
        check_audio_encoding(options.audio_codec or "flac", options.audio_rate)


def audio_options_unset(options: AudioConversion) -> tuple[str, ...]:
    """The audio options left out of a conversion's fingerprint: those not given (absent when off:
    indexes written before they existed still match)."""
    return tuple(name for name in ("audio_codec", "audio_rate") if getattr(options, name) is None)


def prepare_audio(data: bytes, where: str, name: str, options: AudioConversion) -> tuple[str, bytes, MediaFacts]:
    """The recording as stored (re-encoded with ``--audio-codec`` or ``--audio-rate``, flac unless
    named) and its stream facts; a SampleError for one that does not probe."""
    if reencodes_audio(options):
        codec = options.audio_codec or "flac"
        data = reencode_audio(data, where, codec, options.audio_rate)
        name = AUDIO_ENCODERS[codec][2]
    return name, data, probe_audio(data, where)


def check_audio_option(audio: Audio, on_error: str) -> None:
    """A loader's ``audio=`` against its other options: ``short="drop"`` needs ``on_error="skip"``."""
    if audio.short == "drop" and on_error != "skip":
        raise ValueError("Audio(short='drop') makes a recording shorter than a crop a bad sample: it needs on_error='skip'")


def join_audio(audio: Audio, media: Mapping[str, Any]) -> Audio:
    """A loader's ``audio=`` beside its other samplings (role -> sampling, each decided): with
    sampling="clip", the loader's ``clip=`` it follows (a ValueError without one, or for another)."""
    if audio.sampling != "clip":
        return audio
    clip = media.get("video")
    if not isinstance(clip, Clip):
        raise ValueError("Audio(sampling='clip') crops the sound of each clip of a video: give the loader clip=fastload.Clip(...) too")
    if audio.clip not in (None, clip):
        raise ValueError(f"Audio clip= ({audio.clip}) is not the loader's clip= ({clip}): leave it out, the loader sets it")
    return replace(audio, clip=clip)


def parse_audio(text: str, sampling: str | None) -> Audio:
    """``SECONDS[:CROPS]`` (``fastload describe --audio 2.5``) as an Audio spec (its rate and channels change no crop's seconds)."""
    seconds, _, crops = text.partition(":")
    try:
        return Audio(float(seconds), int(crops or 1), sampling)  # type: ignore[arg-type]  # a choice of the command's parser
    except ValueError as exc:
        raise ValueError(f"--audio {text}: expected SECONDS[:CROPS] ({exc})") from None


def lengths_key(key: str) -> str:
    """The slot column holding audio field ``key``'s valid samples a crop (the batch's lengths)."""
    return f"{key}.lengths"


def audio_beside(key: str) -> tuple[str, ...]:
    """The columns a batch gives after audio field ``key``'s crops: their lengths."""
    return (lengths_key(key),)


def audio_columns(name: str, key: str, audio: Audio | None, image_shape: tuple[int, int, int] | None) -> Columns:
    """An audio field's columns: its crops (Audio.shape, Audio.dtype) and their valid samples int64."""
    if audio is None:
        raise ValueError(f"field {name}: audio needs audio=")
    return ((key, audio.shape(), audio.dtype), (lengths_key(key), audio.lengths_shape(), "int64"))


def fill_audio_field(
    data: bytes, where: str, name: str, facts: MediaFacts | None, audio: Audio, transforms: Sequence[Transform], seed: int,
    epoch: int, index: int, rows: Sequence[np.ndarray], sample_rng: SampleRng, clock: Laps,
) -> None:
    """Audio field ``name``'s crops, planned from its stream ``facts``, decoded into its batch rows
    (the crops, then their lengths); ``transforms`` (an image's geometry) do not apply to sound."""
    if facts is None:
        raise SampleError(where, f"field {name}: no stream facts in its shard's sample table (it did not probe when converted or indexed)")
    fill_audio(data, where, _planned(facts, where, name, audio, seed, epoch, index, sample_rng), audio, rows[0], rows[1], clock)


def _planned(facts: MediaFacts, where: str, name: str, audio: Audio, seed: int, epoch: int, index: int,
             sample_rng: SampleRng) -> PlannedAudio:
    """Sample ``index``'s crops of audio field ``name``: a recording's, or a video's sound (its
    clips', with sampling="clip"); a SampleError when it has none."""
    sound = audio_facts(facts, where, name)
    if audio.sampling != "clip":
        return plan_audio(sound, audio, seed, epoch, index, where, sample_rng)
    if not isinstance(facts, StreamFacts) or audio.clip is None:
        raise SampleError(where, f"field {name}: a recording, not a video: Audio(sampling='clip') takes the sound of a video's clips")
    return plan_clip_sound(facts, sound, audio, audio.clip, seed, epoch, index, sample_rng)


def describe_audio(facts: MediaFacts, where: str, name: str, audio: Audio, transforms: Sequence[Transform], seed: int, epoch: int,
                   index: int, sample_rng: SampleRng) -> dict[str, Any]:
    """A sample description's audio fields: its crops as a worker plans them (nothing of the
    recording is read), or the problem that stops it."""
    try:
        planned = _planned(facts, where, name, audio, seed, epoch, index, sample_rng)
    except SampleError as exc:
        return {"audio": name, "problem": exc.reason}
    return {"audio": name, "crops": planned.spans()}


def audio_text(described: dict[str, Any]) -> str:
    """A sample's crops in ``fastload describe``'s line: each one's start and end in seconds."""
    return "".join(f" audio {t0:.3f}-{t1:.3f} s" for t0, t1 in described["crops"])


def audio_report(a: dict, clip: str) -> list[str]:
    """``fastload inspect``'s lines on the recordings (``a``: :func:`summarize_audio`'s; ``clip``, a video clip's, does not apply)."""
    return [f"audio     {a['count']}, {', '.join(f'{c} {n}' for c, n in a['codecs'].items())}; {a['seconds']:.1f} s "
            f"({a['seconds_min']}-{a['seconds_max']} s each); Hz {a['rates']}, channels {a['channels']}"]


def check_audio(data: bytes, where: str, name: str, recorded: MediaFacts | None) -> None:
    """A SampleError unless the recording decodes (every sample: a probe decodes it whole) to the
    stream facts its sample table ``recorded``."""
    found = probe_audio(data, where)
    if not isinstance(recorded, AudioFacts):
        raise SampleError(where, f"field {name}: a recording without stream facts in its sample table (convert or index it with fastload)")
    if found != recorded:
        raise SampleError(where, f"field {name}: its stream facts in the sample table disagree with the recording (tampered table?)")


def summarize_audio(stream_facts: Iterable[MediaFacts], clip_span: int) -> dict:
    """The recordings' stream facts over a dataset (none is opened): how many, their codecs, sample
    rates, channels and seconds (``clip_span``, a video clip's, does not apply)."""
    codecs: Counter[str] = Counter()
    rates: Counter[int] = Counter()
    channels: Counter[int] = Counter()
    seconds: list[float] = []
    for facts in stream_facts:
        if isinstance(facts, AudioFacts):
            codecs[facts.codec] += 1
            rates[facts.rate] += 1
            channels[facts.channels] += 1
            seconds.append(facts.seconds)
    if not seconds:
        return {"count": 0}
    return {"count": len(seconds), "codecs": dict(codecs.most_common()), "rates": dict(rates.most_common()),
            "channels": dict(channels.most_common()), "seconds": round(sum(seconds), 1),
            "seconds_min": round(min(seconds), 3), "seconds_max": round(max(seconds), 3)}
