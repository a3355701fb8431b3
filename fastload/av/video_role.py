"""Video as the media roles' registry (fastload.media) calls it, one function a place where a
field's role is dispatched: probed (and re-encoded where asked) at conversion, its batch column,
its clips filled in a worker, described, verified and summed up for ``fastload inspect``. The
planning and decoding are fastload.av.clip_decode's; the worker's random streams and stage clock
come in as arguments, so nothing here imports the workers."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from fastload._util.stages import Laps
from fastload.av.clip_decode import SampleRng, fill_video, plan_video, video_facts
from fastload.av.clips import Clip
from fastload.av.facts import REENCODE_KEYFRAME_INTERVAL, MediaFacts, StreamFacts, frames_per_clip
from fastload.av.pyav import decode_frames, probe, reencode_h264
from fastload.errors import SampleError
from fastload.transforms import Transform

REENCODE_PAYS = 1.5  # fastload inspect advises --reencode when a clip would decode this many times fewer frames
Columns = tuple[tuple[str, tuple[int, ...], str], ...]  # a field's batch columns: (name, one sample's shape, dtype)


class VideoConversion(Protocol):
    """The conversion options a video's preparation reads (fastload.converters.convert_options.ConvertOptions)."""

    @property
    def reencode_video(self) -> bool: ...
    @property
    def max_size(self) -> int | None: ...
    @property
    def keyframe_interval(self) -> int: ...
    @property
    def max_pixels(self) -> int: ...


# fastload convert's video flags: (flag, argparse's keywords; dest: the ConvertOptions field it sets)
VIDEO_FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--reencode", {"dest": "reencode_video", "action": "store_true",
                    "help": "videos: re-encode to H.264 with a keyframe every --keyframe-interval frames"}),
    ("--keyframe-interval", {"dest": "keyframe_interval", "type": int, "default": REENCODE_KEYFRAME_INTERVAL, "metavar": "N",
                             "help": f"with --reencode: frames between keyframes (default {REENCODE_KEYFRAME_INTERVAL})"}),
)


def reencodes_video(options: VideoConversion) -> bool:
    """Whether preparing a video re-encodes it (``--reencode``, ``--max-size``)."""
    return options.reencode_video or options.max_size is not None


def check_video_conversion(options: VideoConversion) -> None:
    """A ValueError for video conversion options that cannot be honoured."""
    if options.keyframe_interval < 1:
        raise ValueError("keyframe_interval must be >= 1")


def video_options_unset(options: VideoConversion) -> tuple[str, ...]:
    """The video options left out of a conversion's fingerprint: without ``--reencode``, both
    (absent when off: indexes written before they existed still match)."""
    return () if options.reencode_video else ("reencode_video", "keyframe_interval")


def prepare_video(data: bytes, where: str, name: str, options: VideoConversion) -> tuple[str, bytes, MediaFacts]:
    """The video field as stored (re-encoded to H.264 in ``mp4`` with ``--reencode`` or ``--max-size``)
    and its stream facts; a SampleError for one that does not probe."""
    if reencodes_video(options):
        data = reencode_h264(data, where, options.keyframe_interval, options.max_size, options.max_pixels)
        name = "mp4"
    return name, data, probe(data, where, options.max_pixels)


def parse_clip(text: str, sampling: str | None) -> Clip:
    """``FRAMES[:STRIDE[:CLIPS]]`` (``fastload describe --clip 16:2``) as a Clip."""
    try:
        numbers = [int(part) for part in text.split(":")]
    except ValueError:
        raise ValueError(f"--clip {text}: expected FRAMES[:STRIDE[:CLIPS]], whole numbers") from None
    if not 1 <= len(numbers) <= 3:
        raise ValueError(f"--clip {text}: expected FRAMES[:STRIDE[:CLIPS]]")
    frames, stride, clips = (*numbers, 1, 1)[:3]
    return Clip(frames, stride, clips, sampling)  # type: ignore[arg-type]  # a choice of the command's parser


def video_columns(name: str, key: str, clip: Clip | None, image_shape: tuple[int, int, int] | None) -> Columns:
    """A video field's column: (clips,) frames, C, H, W uint8 of the transforms' output size."""
    if image_shape is None or clip is None:
        raise ValueError(f"field {name}: a video needs clip= and a transform with a fixed output size")
    return ((key, (*clip.shape(), *image_shape), "uint8"),)


def fill_video_field(
    data: bytes, where: str, name: str, facts: MediaFacts | None, clip: Clip, transforms: Sequence[Transform], seed: int,
    epoch: int, index: int, rows: Sequence[np.ndarray], sample_rng: SampleRng, clock: Laps,
) -> None:
    """Video field ``name``'s clips, planned from its stream ``facts``, decoded into its batch row."""
    planned = plan_video(video_facts(facts, where, name), clip, transforms, seed, epoch, index, sample_rng)
    fill_video(data, where, planned, rows[0], clip.timeout_s, clock)


def describe_video(facts: MediaFacts, where: str, name: str, clip: Clip, transforms: Sequence[Transform], seed: int, epoch: int,
                   index: int, sample_rng: SampleRng) -> dict[str, Any]:
    """A sample description's video fields: its clips and geometry as a worker plans them (nothing
    of the video is read), or the problem that stops it."""
    try:
        planned = plan_video(video_facts(facts, where, name), clip, transforms, seed, epoch, index, sample_rng)
    except SampleError as exc:
        return {"video": name, "problem": exc.reason}
    except ValueError as exc:
        return {"video": name, "problem": str(exc)}
    return {"video": name, "source_size": (planned.facts.height, planned.facts.width), "box": planned.plan.box,
            "size": planned.plan.size, "flip": planned.plan.flip, "clips": planned.spans()}


def video_text(described: dict[str, Any]) -> str:
    """A sample's clips in ``fastload describe``'s line: each one's frames and seconds."""
    return "".join(f" frames {a}-{b} ({t0:.2f}-{t1:.2f} s)" for a, b, t0, t1 in described["clips"])


def check_video(data: bytes, where: str, name: str, recorded: MediaFacts | None) -> None:
    """A SampleError unless the video probes to the stream facts its sample table ``recorded`` and
    every one of its frames decodes as a loader decodes them (a probe decodes the first alone)."""
    found = probe(data, where)
    if not isinstance(recorded, StreamFacts):
        raise SampleError(where, f"field {name}: a video without stream facts in its sample table (convert it with fastload convert)")
    if found != recorded:
        raise SampleError(where, f"field {name}: its stream facts in the sample table disagree with the video (tampered table?)")
    for _ in decode_frames(data, where, recorded, range(recorded.frames), None, math.inf):
        pass


def video_report(v: dict, clip: str) -> list[str]:
    """``fastload inspect``'s lines on the videos (``v``: :func:`summarize_videos`'s), and the frames
    a random ``clip`` (inspect's ``--clip``) decodes on average, and whether --reencode would pay off."""
    now, then, factor = v["clip_frames_decoded"], v["clip_frames_decoded_reencoded"], v["reencode_factor"]
    return [f"videos    {v['count']}, {', '.join(f'{c} {n}' for c, n in v['codecs'].items())}; {v['seconds']:.1f} s, "
            f"{v['frames_min']}-{v['frames_max']} frames, a keyframe every {v['mean_frames_per_keyframe']} frames; "
            f"{v['smallest'][0]}x{v['smallest'][1]} to {v['largest'][0]}x{v['largest'][1]}; {v['with_audio']} with audio",
            f"clips     a random {clip} clip ({v['clip_span']} frames) decodes {now:.1f} frames on average from the keyframe before it; "
            f"--reencode (a keyframe every {v['reencode_keyframe_interval']}): {then:.1f}, {factor:.2f}x fewer"
            + (": worth it for training on clips" if factor >= REENCODE_PAYS else "")]


def summarize_videos(stream_facts: Iterable[MediaFacts], clip_span: int) -> dict:
    """The videos' stream facts over a dataset (no video is opened): how many, their codecs, frames,
    seconds, sizes, keyframe spacing and audio; the frames a random clip covering ``clip_span``
    frames decodes on average, as they are and re-encoded."""
    codecs: Counter[str] = Counter()
    frames: list[int] = []
    gaps: list[float] = []
    sides: list[tuple[int, int]] = []
    seconds, audio = 0.0, 0
    decoded, reencoded = 0.0, 0.0
    for facts in stream_facts:
        if not isinstance(facts, StreamFacts):
            continue
        codecs[facts.codec] += 1
        frames.append(facts.frames)
        seconds += facts.seconds
        gaps.append(facts.frames / len(facts.keyframes))
        sides.append((facts.width, facts.height))
        audio += facts.audio_rate > 0
        decoded += facts.frames_per_clip(clip_span)
        reencoded += frames_per_clip(range(0, facts.frames, REENCODE_KEYFRAME_INTERVAL), facts.frames, clip_span)
    if not frames:
        return {"count": 0}
    smallest, largest = min(sides, key=_area), max(sides, key=_area)
    return {
        "count": len(frames), "codecs": dict(codecs.most_common()), "frames_min": min(frames), "frames_max": max(frames),
        "seconds": round(seconds, 1), "mean_frames_per_keyframe": round(sum(gaps) / len(gaps), 1),
        "smallest": [*smallest], "largest": [*largest],
        "with_audio": audio,
        "clip_span": clip_span, "clip_frames_decoded": round(decoded / len(frames), 1),
        "clip_frames_decoded_reencoded": round(reencoded / len(frames), 1), "reencode_keyframe_interval": REENCODE_KEYFRAME_INTERVAL,
        "reencode_factor": round(decoded / reencoded, 2),
    }


def _area(side: tuple[int, int]) -> int:
    return side[0] * side[1]
