"""The media roles' registry: for each field role whose samples are streams (video, audio), one
row of the functions every place that dispatches on a field's role calls, so those places loop
over or look up this table and name no modality. A row's functions live in its modality's folder
(fastload/av/video_role.py, fastload/av/audio_role.py); those that run in a worker are handed the worker's
random streams and stage clock, since a modality's folder lies below the workers.

Where each is called: ``prepare`` in conversion (fastload.converters.shard), ``probe_in_place`` by
``fastload index`` (fastload.converters.index_tars), ``columns`` for the batch slots
(fastload.workers.slots), ``fill`` in a worker (fastload.workers.sample_decode), ``beside`` and
``images`` when a batch is shaped (fastload.loading.field_batch), ``describe`` by loader.describe
(fastload.loading.provenance), ``check`` by ``fastload verify --decode`` (fastload.storage.verify),
``summarize`` by ``fastload inspect`` (fastload.storage.summary)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastload.av import audio_role as audio
from fastload.av import video_role as video
from fastload.av.pyav import probe_audio

if TYPE_CHECKING:
    import numpy as np

    from fastload._util.stages import Laps
    from fastload.av.facts import MediaFacts
    from fastload.transforms import Transform


def _nothing_beside(key: str) -> tuple[str, ...]:
    """No columns after the field's own."""
    return ()


@dataclass(frozen=True)
class MediaRole:
    """How one media role is probed, batched, decoded, described, verified and summed up."""

    keyword: str  # the DataLoader keyword (and SampleSpec attribute) holding its sampling: clip, audio
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
    describe: Callable[[MediaFacts, str, str, Any, Sequence[Transform], int, int, int, Callable[[int, int, int], Any]], dict[str, Any]]
    check: Callable[[bytes, str, str, MediaFacts | None], None]  # (data, where, field name, the table's facts)
    summarize: Callable[[Iterable[MediaFacts], int], dict]  # (every sample's facts, a clip's span in frames)
    beside: Callable[[str], tuple[str, ...]] = _nothing_beside  # the columns a batch gives after the field's own
    images: bool = False  # its rows are frames: a loader's image function (to float, normalised) applies to them
    probe_in_place: Callable[[bytes, str], MediaFacts] | None = None  # `fastload index` probes its tar members


MEDIA_ROLES: dict[str, MediaRole] = {
    "video": MediaRole("clip", "takes a video of any container", "videos", video.prepare_video, video.video_columns,
                       video.fill_video_field, video.describe_video, video.check_video, video.summarize_videos, images=True),
    "audio": MediaRole("audio", "takes a recording of any extension", "audio", audio.prepare_audio, audio.audio_columns,
                       audio.fill_audio_field, audio.describe_audio, audio.check_audio, audio.summarize_audio,
                       beside=audio.audio_beside, probe_in_place=probe_audio),
}
