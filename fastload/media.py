"""The media roles' registry: for each field role whose samples are streams (video, audio), one
row of the functions every place that dispatches on a field's role calls, so those places loop
over or look up this table and name no modality. A row's functions live in its modality's folder
(fastload/av/video_role.py, fastload/av/audio_role.py); those that run in a worker are handed the worker's
random streams and stage clock, since a modality's folder lies below the workers.

Where each is called: ``option`` by the loader (its keyword, fastload.loader; its class, check and join,
fastload.loading.loader_options; its words in a refusal, fastload.fields.SampleSpec; its flag and
parser, ``fastload describe``), ``conversion`` by ``fastload convert`` (its flags, cli/command.py;
its check and fingerprint, fastload.converters.convert_options; whether it re-encodes,
fastload.converters.conversion), ``prepare`` in conversion (fastload.converters.shard),
``probe_in_place`` by ``fastload index`` (fastload.converters.index_tars), ``columns`` for the batch
slots (fastload.workers.slots), ``fill`` in a worker (fastload.workers.sample_decode), ``beside`` and
``images`` when a batch is shaped (fastload.loading.field_batch), ``describe`` and ``described`` by
loader.describe (fastload.loading.provenance), ``text`` and ``report`` for ``fastload describe``'s and
``inspect``'s lines, ``check`` by ``fastload verify --decode`` (fastload.storage.verify),
``summarize`` by ``fastload inspect`` (fastload.storage.summary). ``classic``: without ``fields=``,
its sample is the classic (stream, label) one (fastload.fields.requested_spec)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastload.av import audio_role as audio
from fastload.av import video_role as video
from fastload.av.clips import Clip
from fastload.av.crops import Audio
from fastload.av.pyav import probe_audio

if TYPE_CHECKING:
    import numpy as np

    from fastload._util.stages import Laps
    from fastload.av.facts import MediaFacts
    from fastload.transforms import Transform


def _nothing_beside(key: str) -> tuple[str, ...]:
    """No columns after the field's own."""
    return ()


def _any_option(option: Any, on_error: str) -> None:
    """Any sampling goes with any other loader option."""


def _alone(option: Any, media: Mapping[str, Any]) -> Any:
    """A sampling that follows no other role's."""
    return option


@dataclass(frozen=True)
class MediaOption:
    """A role's sampling as the loader takes it: ``DataLoader(keyword=spec)``, ``fastload describe --keyword TEXT``."""

    keyword: str  # the DataLoader keyword (and fastload describe's option) holding its sampling: clip, audio
    spec: type[Any]  # the sampling's class (Clip, Audio): it has ``resolved(shuffle)``, its sampling decided
    asks: str  # a field of the role without its sampling: "field F {asks}"
    offers: str  # its sampling without such a field: "{keyword}= {offers}; the fields asked for hold none"
    metavar: str  # fastload describe's option
    help: str
    parse: Callable[[str, str | None], Any]  # (the option's text, --sampling) -> its sampling
    check: Callable[[Any, str], None] = _any_option  # (its sampling, on_error=): a ValueError for a pair the loader refuses
    # (its sampling, every role's sampling, decided) -> its sampling as it follows the others' (audio's sampling="clip": the clip=)
    join: Callable[[Any, Mapping[str, Any]], Any] = _alone


@dataclass(frozen=True)
class MediaConversion:
    """A role's part of ``fastload convert``: its flags, each setting the ConvertOptions field named
    by its ``dest`` (those fields are the role's typed conversion keywords), and what they mean."""

    flags: tuple[tuple[str, dict[str, Any]], ...]  # (flag, argparse's add_argument keywords, with dest)
    reencodes: Callable[[Any], bool]  # (ConvertOptions) -> whether preparing the role's fields re-encodes them
    check: Callable[[Any], None]  # (ConvertOptions) -> a ValueError for options that cannot be honoured
    unset: Callable[[Any], tuple[str, ...]]  # (ConvertOptions) -> its fields left out of the conversion's fingerprint

    @property
    def fields(self) -> tuple[str, ...]:
        """The ConvertOptions fields its flags set."""
        return tuple(keywords["dest"] for _, keywords in self.flags)


@dataclass(frozen=True)
class MediaRole:
    """How one media role is asked for, probed, batched, decoded, described, verified and summed up."""

    option: MediaOption
    conversion: MediaConversion
    takes: str  # what the field named by the role takes, in a "no such field" error
    summary_key: str  # its part of `fastload inspect`'s summary
    # (data, where, field name, ConvertOptions) -> (the field's name as stored, its bytes, stream facts)
    prepare: Callable[[bytes, str, str, Any], tuple[str, bytes, MediaFacts]]
    # (field name, key, its sampling, the transforms' output (C, H, W) or None) -> its columns
    columns: Callable[[str, str, Any, tuple[int, int, int] | None], tuple[tuple[str, tuple[int, ...], str], ...]]
    # (data, where, field name, facts, sampling, transforms, seed, epoch, index, its rows, sample_rng, clock)
    fill: Callable[[bytes, str, str, MediaFacts | None, Any, Sequence[Transform], int, int, int, Sequence[np.ndarray],
                    Callable[[int, int, int], Any], Laps], None]
    # (facts, where, field name, sampling, transforms, seed, epoch, index, sample_rng) -> SampleDescription's fields
    # (its geometry, a problem) and the role's own (``described``)
    describe: Callable[[MediaFacts, str, str, Any, Sequence[Transform], int, int, int, Callable[[int, int, int], Any]], dict[str, Any]]
    described: tuple[tuple[str, Any], ...]  # the role's own names in a sample's description, and their values when it has none
    text: Callable[[dict[str, Any]], str]  # (its part of a sample's description) -> its part of fastload describe's line
    report: Callable[[dict, str], list[str]]  # (its part of the summary, inspect's --clip) -> fastload inspect's lines
    check: Callable[[bytes, str, str, MediaFacts | None], None]  # (data, where, field name, the table's facts)
    summarize: Callable[[Iterable[MediaFacts], int], dict]  # (every sample's facts, a clip's span in frames)
    beside: Callable[[str], tuple[str, ...]] = _nothing_beside  # the columns a batch gives after the field's own
    images: bool = False  # its rows are frames: a loader's image function (to float, normalised) applies to them
    classic: bool = False  # without fields=: the classic sample (its stream, the label); else a dict of it, label and transcript
    probe_in_place: Callable[[bytes, str], MediaFacts] | None = None  # `fastload index` probes its tar members

    @property
    def keyword(self) -> str:
        """The DataLoader keyword holding its sampling."""
        return self.option.keyword


MEDIA_ROLES: dict[str, MediaRole] = {
    "video": MediaRole(
        MediaOption("clip", Clip, "is a video: give clip=fastload.Clip(frames=..., stride=...) to say which frames to take",
                    "takes frames of videos", "FRAMES[:STRIDE[:CLIPS]]",
                    "a video dataset: the loader's clip=fastload.Clip(FRAMES, STRIDE, CLIPS)", video.parse_clip),
        MediaConversion(video.VIDEO_FLAGS, video.reencodes_video, video.check_video_conversion, video.video_options_unset),
        "takes a video of any container", "videos", video.prepare_video, video.video_columns, video.fill_video_field,
        video.describe_video, (("video", None), ("clips", ())), video.video_text, video.video_report, video.check_video, video.summarize_videos,
        images=True, classic=True),
    "audio": MediaRole(
        MediaOption("audio", Audio, "is audio: give audio=fastload.Audio(seconds=..., rate=...) to say which samples to take",
                    "takes crops of recordings", "SECONDS[:CROPS]",
                    "an audio dataset: the loader's audio=fastload.Audio(SECONDS, CROPS)", audio.parse_audio, audio.check_audio_option,
                    audio.join_audio),
        MediaConversion(audio.AUDIO_FLAGS, audio.reencodes_audio, audio.check_audio_conversion, audio.audio_options_unset),
        "takes a recording of any extension", "audio", audio.prepare_audio, audio.audio_columns, audio.fill_audio_field,
        audio.describe_audio, (("audio", None), ("crops", ())), audio.audio_text, audio.audio_report, audio.check_audio, audio.summarize_audio,
        beside=audio.audio_beside, probe_in_place=probe_audio),
}


def media_role_of(keyword: str) -> str | None:
    """The media role whose sampling the DataLoader keyword ``keyword`` holds (``clip``: video), or None."""
    return next((role for role, media in MEDIA_ROLES.items() if media.keyword == keyword), None)


def media_arguments(given: Mapping[str, Any]) -> dict[str, Any]:
    """The media roles' samplings among a DataLoader's keyword arguments ``given``: role -> sampling, those given."""
    return {role: given[media.keyword] for role, media in MEDIA_ROLES.items() if given.get(media.keyword) is not None}


def has_frames(roles: Iterable[str]) -> bool:
    """Whether any of these media roles' rows are frames (video's clips: images, as a transform sees them)."""
    return any(MEDIA_ROLES[role].images for role in roles)
