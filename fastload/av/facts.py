"""A video's stream facts: what a clip plan needs, read once at conversion into the shard's sample
table (:mod:`fastload.formats.table`), so loading plans clips without probing the file.

Frames are numbered in presentation order, 0 to ``frames - 1``, from the packets the container
actually holds (not its header's frame count, which may lie); ``keyframes`` are the numbers of
the frames a decoder can start at, with their timestamps (``keyframe_pts``) to seek to.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fastload.decode.header import MAX_PIXELS, check_pixels

MAX_CODEC_NAME = 16  # bytes a codec's name takes in a sample table
MAX_FRAMES = 1 << 24  # ~6 days at 30 fps: more is a damaged or hostile container
REENCODE_KEYFRAME_INTERVAL = 32  # frames between keyframes of a video converted with --reencode, unless asked otherwise


@dataclass(frozen=True)
class StreamFacts:
    """One video stream: codec, size, frame count and rate, time base, keyframes, audio."""

    codec: str
    width: int
    height: int
    frames: int
    rate: tuple[int, int]  # average frames per second as (numerator, denominator)
    time_base: tuple[int, int]  # seconds per timestamp unit as (numerator, denominator)
    start_pts: int  # the first frame's timestamp
    keyframes: tuple[int, ...]  # frame numbers a decode can start at, ascending, the first 0
    keyframe_pts: tuple[int, ...]  # their timestamps
    audio_rate: int = 0  # the first audio stream's samples per second (0: no audio)
    audio_channels: int = 0

    def __post_init__(self) -> None:
        if not self.codec.isascii() or not 0 < len(self.codec) <= MAX_CODEC_NAME:
            raise ValueError(f"a codec name is 1 to {MAX_CODEC_NAME} ASCII characters, got {self.codec!r}")
        if not (0 < self.frames <= MAX_FRAMES and self.width > 0 and self.height > 0):
            raise ValueError(f"a video has 1 to {MAX_FRAMES} frames of a positive size, got {self.frames} of {self.width}x{self.height}")
        if min(*self.rate, *self.time_base) <= 0:
            raise ValueError(f"frame rate {self.rate} and time base {self.time_base} must be positive fractions")
        if len(self.keyframes) != len(self.keyframe_pts) or not self.keyframes or self.keyframes[0] != 0:
            raise ValueError("keyframes: one timestamp each, the first at frame 0")
        if any(b <= a for a, b in zip(self.keyframes, self.keyframes[1:])) or self.keyframes[-1] >= self.frames:
            raise ValueError("keyframes: ascending frame numbers within the video")
        if self.audio_rate < 0 or self.audio_channels < 0:
            raise ValueError("audio rate and channels cannot be negative")

    @property
    def fps(self) -> float:
        """Average frames per second (over the time the timestamps span: see :func:`fastload.av.pyav.probe`)."""
        return self.rate[0] / self.rate[1]

    @property
    def seconds(self) -> float:
        """The video's length in seconds, its first frame shown to its last one's end (frames over the average rate)."""
        return self.frames / self.fps

    def time_of(self, frame: int) -> float:
        """When frame ``frame`` is shown, in seconds from the first frame: a keyframe's from its
        timestamp, another's on the line between the keyframes around it (or the video's end)."""
        k = self.keyframe_before(frame)
        at, stamp = self.keyframes[k], (self.keyframe_pts[k] - self.start_pts) * self.time_base[0] / self.time_base[1]
        following = k + 1 < len(self.keyframes)
        upto = self.keyframes[k + 1] if following else self.frames
        until = (self.keyframe_pts[k + 1] - self.start_pts) * self.time_base[0] / self.time_base[1] if following else self.seconds
        return stamp + (until - stamp) * (frame - at) / (upto - at)

    def frames_per_clip(self, span: int) -> float:
        """The frames a clip covering ``span`` frames decodes on average at a random start (see :func:`frames_per_clip`)."""
        return frames_per_clip(self.keyframes, self.frames, span)

    def keyframe_before(self, frame: int) -> int:
        """The position in ``keyframes`` of the last keyframe at or before frame ``frame``."""
        return bisect.bisect_right(self.keyframes, frame) - 1

    def check_size(self, where: str, max_pixels: int = MAX_PIXELS) -> None:
        """A SampleError naming ``where`` when a frame has more pixels than ``max_pixels``."""
        check_pixels(self.width, self.height, where, max_pixels)


def frames_per_clip(keyframes: Sequence[int], frames: int, span: int) -> float:
    """The frames a clip covering ``span`` of a video's ``frames`` decodes on average, its start drawn
    at random: from the keyframe at or before its first frame to its last (``keyframes``: their
    frame numbers, ascending from 0)."""
    if frames <= span:
        return float(frames)
    starts = frames - span + 1  # a clip starts at 0 to frames - span
    total = 0
    for i, first in enumerate(keyframes):
        count = min(keyframes[i + 1] if i + 1 < len(keyframes) else frames, starts) - first  # starts after this keyframe
        if count <= 0:
            break
        total += count * span + count * (count - 1) // 2  # a start s decodes s - first + span frames
    return total / starts


MAX_AUDIO_RATE = 768_000  # samples per second a recording may have (DXD's 352.8 kHz, doubled): more is a damaged or hostile header
MAX_CHANNELS = 64  # channels a recording may have (Ambisonics of the 7th order); more is refused before anything is decoded
MAX_AUDIO_SECONDS = 24 * 3600  # one recording of a day at most: longer is refused at conversion (its decode stops there)


@dataclass(frozen=True)
class AudioFacts:
    """One audio stream (a recording, or a video's sound track): codec, sample rate, channels, its
    length in samples a channel as decoded at conversion (not its header's duration, which may
    lie), packets, the timestamps' base and the first one, and whether its container seeks."""

    codec: str
    rate: int  # samples per second
    channels: int
    samples: int  # a channel's samples, decoded
    packets: int
    time_base: tuple[int, int]  # seconds per timestamp unit as (numerator, denominator)
    start_pts: int  # the first packet's timestamp
    seekable: bool  # False: a crop is decoded from the file's start (a container without timestamps to seek by)

    def __post_init__(self) -> None:
        if not self.codec.isascii() or not 0 < len(self.codec) <= MAX_CODEC_NAME:
            raise ValueError(f"a codec name is 1 to {MAX_CODEC_NAME} ASCII characters, got {self.codec!r}")
        if not 0 < self.rate <= MAX_AUDIO_RATE:
            raise ValueError(f"a sample rate is 1 to {MAX_AUDIO_RATE} Hz, got {self.rate}")
        if not 0 < self.channels <= MAX_CHANNELS:
            raise ValueError(f"an audio stream has 1 to {MAX_CHANNELS} channels, got {self.channels}")
        if not (0 < self.samples <= MAX_AUDIO_SECONDS * self.rate and 0 < self.packets <= self.samples):
            raise ValueError(f"an audio stream has 1 to {MAX_AUDIO_SECONDS} s of samples in at most as many packets, got {self.samples} in {self.packets}")
        if min(self.time_base) <= 0:
            raise ValueError(f"time base {self.time_base} must be a positive fraction")

    @property
    def seconds(self) -> float:
        """The recording's length in seconds."""
        return self.samples / self.rate

    def seconds_of(self, pts: int) -> float:
        """Timestamp ``pts`` in seconds from the stream's first one."""
        return (pts - self.start_pts) * self.time_base[0] / self.time_base[1]

    def pts_of(self, sample: int) -> int:
        """The timestamp at which a channel's sample number ``sample`` is played (rounded down)."""
        return self.start_pts + sample * self.time_base[1] // (self.rate * self.time_base[0])


MediaFacts = StreamFacts | AudioFacts  # what a sample table records of one video or audio field
FACT_COLUMNS = 14  # int64 columns of one field's facts in a sample table (fastload.formats.table)
_AUDIO_ROW = 0  # a row's second column (a video's width, never 0) is 0 for audio


def facts_row(facts: MediaFacts, first_keyframe: int) -> tuple[list[int], list[tuple[int, int]]]:
    """One field's facts as a sample table stores them: FACT_COLUMNS int64 (the codec's name in the
    last two), and the (frame number, timestamp) pairs of its keyframes, which the table keeps in a
    section of their own from ``first_keyframe`` on (audio: none)."""
    codec = [int.from_bytes(facts.codec.encode().ljust(MAX_CODEC_NAME, b"\0")[i : i + 8], "little", signed=True) for i in (0, 8)]
    if isinstance(facts, AudioFacts):
        row = [facts.packets, _AUDIO_ROW, facts.channels, facts.rate, facts.samples, *facts.time_base, facts.start_pts, 0, 0,
               int(facts.seekable), 0]
        return row + codec, []
    row = [facts.frames, facts.width, facts.height, *facts.rate, *facts.time_base, facts.start_pts, first_keyframe, len(facts.keyframes),
           facts.audio_rate, facts.audio_channels]
    return row + codec, list(zip(facts.keyframes, facts.keyframe_pts))


def facts_from_row(row: Sequence[int], keyframes: Callable[[int, int], list[tuple[int, int]]]) -> MediaFacts:
    """The facts :func:`facts_row` stored (``keyframes(first, count)``: those pairs of the table's
    keyframes); a ValueError when the row is inconsistent."""
    packets_or_frames, kind, c2, c3, c4, tb_num, tb_den, start_pts, first, count, c10, c11 = row[:12]
    codec = b"".join(int(v).to_bytes(8, "little", signed=True) for v in row[12:14]).rstrip(b"\0")
    try:
        name = codec.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError("a codec's name is not ASCII") from None
    if kind == _AUDIO_ROW:
        if first or count or c10 not in (0, 1) or c11:
            raise ValueError("an audio row with keyframes")
        return AudioFacts(name, c3, c2, c4, packets_or_frames, (tb_num, tb_den), start_pts, bool(c10))
    pairs = keyframes(first, count)
    return StreamFacts(name, kind, c2, packets_or_frames, (c3, c4), (tb_num, tb_den), start_pts, tuple(p[0] for p in pairs),
                       tuple(p[1] for p in pairs), c10, c11)
