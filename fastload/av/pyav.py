"""The one module importing PyAV (FFmpeg's libraries, bundled in its wheels), lazily: probing a
video's stream facts at conversion, decoding the frames a clip needs (a seek to the keyframe at
or before them, then decoding only to the last one), and re-encoding to H.264; for recordings
(and a video's sound track), probing by decoding them whole, decoding a crop's samples from a seek
a little before it (an Ogg Vorbis crop's packets, found by fastload.av.ogg, fed to a bare decoder
instead), remixing (swr) and resampling (fastload.av.resample, or swr), and re-encoding to FLAC or
Opus.

Chosen over torchcodec by measurement (docs/video.md: benchmarks/bench_video_decoders.py): on
the same clips, PyAV seeking to the keyframe the sample table names and converting each kept
frame to RGB at the size the crop needs decoded faster than torchcodec's ``get_frames_at``, and
PyAV's wheels load with any torch (torchcodec's are built for one torch release each).

Every failure is a SampleError naming the sample and what was wrong (never the file's bytes);
a decode is bounded in time (``deadline``) and in frames (what the clip needs, plus the
decoder's reordering), and a frame over the pixel limit is refused before it is converted.
"""

from __future__ import annotations

import hashlib
import io
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from fastload.av.facts import MAX_AUDIO_RATE, MAX_AUDIO_SECONDS, MAX_CHANNELS, MAX_FRAMES, AudioFacts, StreamFacts
from fastload.av.ogg import CAPTURE, NotPlain, VorbisStream, crop_start, packets, vorbis_stream
from fastload.av.resample import sinc_resample
from fastload.av.wav import data_chunk, read_wav, wav_layout
from fastload.decode.header import MAX_PIXELS
from fastload.errors import SampleError

REORDER_SLACK = 64  # frames a decoder may emit past a seek point before the one asked for (B-frame reordering, leading frames)
# The demuxers fastload opens, by FFmpeg's names: video containers only. FFmpeg refuses any other
# before reading its header (format_whitelist), so no script or playlist format (concat, HLS, image
# sequences) opens the files it names, and no image (png_pipe) is taken for a video.
DEMUXERS: tuple[str, ...] = ("mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm", "avi", "ogg", "mpeg", "mpegvideo")
CONTAINERS = "MP4/MOV, Matroska/WebM, AVI, Ogg, MPEG program and elementary streams"
# Demuxers whose seeks land anywhere and whose timestamps after a seek are the parser's guesses (no
# index, timestamps only where a PES packet starts): their clips are decoded from the file's start.
NO_SEEK_DEMUXERS = frozenset({"mpeg", "mpegvideo"})
# Codecs whose decoders skip the frames no other frame refers to (skip_frame NONREF) and whose
# packets carry the frames' timestamps: frames before a clip that are not references are not decoded.
SKIPPING_CODECS = frozenset({"h264", "hevc"})
AHEAD_FRAMES = 4096  # the most frames between keyframes whose packets are demuxed ahead to number them (more: no frame is skipped)


def _av() -> Any:
    """PyAV, or an ImportError naming the extra that installs it."""
    try:
        import av
    except ImportError:
        raise ImportError("video needs PyAV: pip install 'fastload[video]'") from None
    av.logging.set_level(av.logging.PANIC)  # FFmpeg's own messages about damaged streams: ours name the sample
    return av


def _open_input(data: bytes, where: str, demuxers: tuple[str, ...], kind: str, containers: str,
                options: dict[str, str] | None = None) -> Any:
    """An input container over ``data`` in one of ``demuxers``; a SampleError naming ``where`` for
    no bytes, another format (``containers``: the ones read, as the error names them) or a damaged
    start. ``kind``: "video" or "recording", as the errors say it."""
    av = _av()
    if not data:
        raise SampleError(where, f"empty {kind}: zero bytes")
    try:
        return av.open(io.BytesIO(data), mode="r", metadata_errors="ignore",
                       container_options={"format_whitelist": ",".join(demuxers)}, options=options or {})
    except (av.error.FFmpegError, ValueError, OSError) as exc:
        log = getattr(exc, "log", None)  # FFmpeg's last message: (level, component, text)
        if log and "not on whitelist" in str(log[2]):
            container_kind = "a video" if kind == "video" else "an audio"
            raise SampleError(where, f"its format ({log[1]}) is not {container_kind} container fastload reads ({containers})") from None
        raise SampleError(where, f"not a readable {kind} ({type(exc).__name__})") from None


def _open(data: bytes, where: str, max_pixels: int = MAX_PIXELS) -> Any:
    """An input container over ``data`` in one of the DEMUXERS, with its first video stream decoded
    on one thread; a SampleError for another format, no video stream, no decoder for it, or a frame
    size over ``max_pixels``. Probing, re-encoding and loading all open videos here."""
    # the pixel limit also binds the decodes FFmpeg's probing makes, before any size is known
    container = _open_input(data, where, DEMUXERS, "video", CONTAINERS, {"max_pixels": str(max_pixels)})
    try:
        if not container.streams.video:
            raise SampleError(where, "holds no video stream")
        stream = container.streams.video[0]
        if stream.codec_context is None:
            raise SampleError(where, f"no decoder for its video codec ({getattr(stream, 'codec_tag', '') or 'unknown'!r}) in this FFmpeg")
        stream.thread_type = "SLICE"  # a worker is one process: no frame threads (their latency and memory)
        stream.codec_context.thread_count = 1
        stream.codec_context.options = {"max_pixels": str(max_pixels)}  # a frame bigger than its container declares: refused, never allocated
        if not stream.codec_context.width or not stream.codec_context.height:  # probing found no size FFmpeg's limit let it decode
            raise SampleError(where, f"decompression bomb or damaged header: no frame size within the pixel limit {max_pixels}")
        _check_header_size(stream.codec_context.width, stream.codec_context.height, where, max_pixels)
    except BaseException:
        container.close()
        raise
    return container


def probe(data: bytes, where: str, max_pixels: int = MAX_PIXELS) -> StreamFacts:
    """The stream facts of the video in ``data``: its packets' timestamps demuxed (nothing decoded
    but the first frame, which proves the codec decodes and gives the true frame size)."""
    av = _av()
    container = _open(data, where, max_pixels)
    try:
        stream = container.streams.video[0]
        context = stream.codec_context
        stamps: list[int] = []
        keys: list[int] = []
        latest = [(-(1 << 62), 0)] * 2  # the two latest timestamps, a held frame's (an empty packet) included, with their durations
        try:
            for packet in container.demux(stream):
                stamp = packet.pts if packet.pts is not None else packet.dts
                if stamp is not None and (packet.size or packet.duration):
                    if stamp > latest[0][0]:
                        latest = [(stamp, max(packet.duration or 0, 0)), latest[0]]
                    elif latest[1][0] < stamp < latest[0][0]:
                        latest[1] = (stamp, 0)
                if packet.size == 0 or stamp is None:
                    continue
                if packet.is_discard:  # frames a decoder drops (an MP4 edit list): frame numbers would disagree after a seek
                    raise SampleError(where, "an edit list hides some of its frames (cut with ffmpeg -c copy?): convert with --reencode")
                stamps.append(stamp)
                if packet.is_keyframe:
                    keys.append(stamp)
                if len(stamps) > MAX_FRAMES:
                    raise SampleError(where, f"more than {MAX_FRAMES} video frames")
        except av.error.FFmpegError as exc:
            if not stamps:
                raise SampleError(where, f"no readable video packet ({type(exc).__name__})") from None
        if not stamps:
            raise SampleError(where, "zero-length video stream: no frames")
        order = sorted(stamps)
        if len(set(order)) != len(order):
            raise SampleError(where, "two video frames share a timestamp: remux it (ffmpeg -c copy) or convert with --reencode")
        rank = {stamp: i for i, stamp in enumerate(order)}
        keyframes = sorted({rank[stamp] for stamp in keys})
        if not keyframes or keyframes[0] != 0:
            raise SampleError(where, "its first frame is no keyframe (a cut without its start): convert with --reencode")
        header_rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        if not header_rate or header_rate <= 0:
            raise SampleError(where, "no frame rate in its container: convert with --reencode")
        time_base = stream.time_base or Fraction(1, 90000)
        (stamp, duration), (before, _) = latest
        shown = min(duration, stamp - before) if duration and len(order) > 1 else duration  # the last frame's: a packet's duration can be a decode-order gap (B-frames in MP4)
        rate = _rate_from_timestamps(len(order), Fraction(header_rate), time_base, order, stamp + shown if shown else None)
        width, height = _first_frame_size(container, stream, where, max_pixels)
        audio = container.streams.audio[0] if container.streams.audio else None
        return StreamFacts(
            codec=context.name[:16], width=width, height=height, frames=len(order),
            rate=(rate.numerator, rate.denominator), time_base=(time_base.numerator, time_base.denominator),
            start_pts=order[0], keyframes=tuple(keyframes), keyframe_pts=tuple(order[k] for k in keyframes),
            audio_rate=int(audio.rate or 0) if audio is not None else 0,
            audio_channels=int(audio.channels or 0) if audio is not None else 0,
        )
    finally:
        container.close()


def _rate_from_timestamps(frames: int, header_rate: Fraction, time_base: Fraction, order: list[int], end: int | None) -> Fraction:
    """The average frame rate the timestamps say: ``frames`` over the time from the first frame to
    the end of the last one shown (``end``: the latest timestamp plus its duration, at most the gap
    before it; without one, a frame at the header's rate past the last frame's timestamp). The
    header's rate where it agrees to within a frame (a constant rate keeps its exact 30000/1001);
    else, a variable rate (an AVI's or a Theora file's held frames), the timestamps': an AVI's
    header said 15 fps for 68 frames over 29.6 s."""
    last = end if end is not None and end > order[-1] else order[-1] + max(1, round(1 / (header_rate * time_base)))
    shown = (last - order[0]) * time_base  # seconds
    if abs(shown - frames / header_rate) <= 1 / header_rate:
        return header_rate
    return Fraction(frames) / shown


def _check_header_size(width: int, height: int, where: str, max_pixels: int) -> None:
    """A SampleError for a frame size over the pixel limit, before anything is decoded."""
    if width * height > max_pixels:
        raise SampleError(where, f"decompression bomb: {width}x{height} = {width * height} pixels a frame > limit {max_pixels}")


def _decoded(container: Any, stream: Any, packets: Iterable[Any] | None = None, skip: Callable[[Any], bool] | None = None) -> Iterator[Any]:
    """The stream's frames from where ``container`` is (or from ``packets``), in presentation order:
    its packets decoded but the empty ones (Theora's "repeat the frame before", which probing does
    not count as frames and FFmpeg's decoder would take for the stream's end, refusing every packet
    after), then the decoder drained; a packet ``skip`` picks is decoded only if other frames refer
    to it (FFmpeg's skip_frame NONREF). Probing, loading and re-encoding all decode through here."""
    context, skipping = stream.codec_context, False
    for packet in container.demux(stream) if packets is None else packets:
        if packet.size:
            if skip is not None and skip(packet) != skipping:
                skipping = not skipping
                context.skip_frame = "NONREF" if skipping else "DEFAULT"
            yield from packet.decode()
    if skipping:
        context.skip_frame = "DEFAULT"
    yield from stream.decode(None)


def _first_frame_size(container: Any, stream: Any, where: str, max_pixels: int) -> tuple[int, int]:
    """(width, height) of the first decoded frame."""
    av = _av()
    try:
        container.seek(0, stream=stream)
        for frame in _decoded(container, stream):
            _check_header_size(frame.width, frame.height, where, max_pixels)
            return frame.width, frame.height
    except av.error.FFmpegError as exc:
        raise SampleError(where, f"its first frame does not decode ({type(exc).__name__})") from None
    raise SampleError(where, "no frame decodes")


class _FrameCursor:
    """A video's frames by number, for one clip plan: a seek to the keyframe at or before a frame,
    checked where it landed (FFmpeg's seek can land before or after the keyframe: in an MPEG
    program stream it lands anywhere), then decoding on. Frames shown before the keyframe (a
    landing early, an open GOP's leading frames) are passed over; a landing past it starts again
    from the keyframe before, and the first keyframe is decoded from the file's start, no seek
    (as is every frame of an MPEG program or elementary stream: NO_SEEK_DEMUXERS). A frame the plan
    does not keep (``wanted``: every frame it asks for) that no other frame refers to is not decoded,
    before a clip, between its kept frames or after its last."""

    def __init__(self, data: bytes, where: str, facts: StreamFacts, wanted: Iterable[int], deadline: float, max_pixels: int) -> None:
        self.data, self.where, self.facts, self.deadline, self.max_pixels = data, where, facts, deadline, max_pixels
        self.wanted = frozenset(wanted)
        self.container = _open(data, where, max_pixels)
        self.frames: Iterator[Any] | None = None  # the decoder's frames, from the last seek on
        self.position = -1  # the number of the frame last decoded
        self.key, self.landed = 0, False  # the keyframe decoding started at, and whether its first frame came
        self.seeks = self.container.format.name not in NO_SEEK_DEMUXERS
        self.skips = self.seeks and self.container.streams.video[0].codec_context.name in SKIPPING_CODECS
        self.target = 0  # the frame asked for: frames before it, or not wanted, that no other frame refers to need no decoding
        self.numbers: dict[int, int] = {}  # timestamp -> frame number, of the keyframe's group of frames where known

    def close(self) -> None:
        """Close the container."""
        self.container.close()

    def _start(self, key: int) -> None:
        """Decode from keyframe ``key`` on: a seek to it, or for the first, from the file's start."""
        av = _av()
        if key == 0 and self.frames is not None:  # a fresh demuxer: decoding from byte 0 needs no seek
            self.container.close()
            self.container = _open(self.data, self.where, self.max_pixels)
        stream = self.container.streams.video[0]
        if key > 0:
            try:
                self.container.seek(self.facts.keyframe_pts[key], stream=stream, backward=True, any_frame=False)
            except av.error.FFmpegError as exc:  # a damaged stream can fail the seek itself
                raise SampleError(self.where, f"seeking to the keyframe at frame {self.facts.keyframes[key]} failed ({type(exc).__name__})") from None
        packets: Iterator[Any] = self.container.demux(stream)
        self.numbers = {}
        if self.skips:
            packets = self._number(packets, key)
        self.frames = _decoded(self.container, stream, packets, self._skippable if self.numbers else None)
        self.key, self.landed, self.position = key, False, self.facts.keyframes[key] - 1

    def _number(self, packets: Iterator[Any], key: int) -> Iterator[Any]:
        """``packets``, those of keyframe ``key``'s group (the frames shown from it to the next
        keyframe, at most AHEAD_FRAMES) demuxed ahead to number each frame by its timestamp
        (``self.numbers``); no numbers where they do not all come within REORDER_SLACK packets more
        (timestamps missing, a seek that landed elsewhere). A demuxing error comes where it occurred."""
        av = _av()
        facts = self.facts
        low = facts.keyframe_pts[key]
        high = facts.keyframe_pts[key + 1] if key + 1 < len(facts.keyframes) else None
        count = (facts.keyframes[key + 1] if high is not None else facts.frames) - facts.keyframes[key]
        if count > AHEAD_FRAMES:
            return packets
        ahead: list[Any] = []
        stamps: set[int] = set()
        rest: Iterator[Any] | Exception | None = None  # the packets after those demuxed ahead; None: the stream ended
        try:
            for packet in packets:
                ahead.append(packet)
                if packet.size and packet.pts is not None and low <= packet.pts and (high is None or packet.pts < high):
                    stamps.add(packet.pts)
                    if len(stamps) == count:
                        self.numbers = {stamp: facts.keyframes[key] + i for i, stamp in enumerate(sorted(stamps))}
                        rest = packets
                        break
                if len(ahead) > count + REORDER_SLACK:
                    rest = packets
                    break
        except av.error.FFmpegError as exc:
            rest = exc
        return self._replay(ahead, rest)

    @staticmethod
    def _replay(ahead: list[Any], rest: Iterator[Any] | Exception | None) -> Iterator[Any]:
        """The packets demuxed ahead, then the others (an ended demuxer is not asked again), or the error demuxing them raised."""
        yield from ahead
        if isinstance(rest, Exception):
            raise rest
        if rest is not None:
            yield from rest

    def _skippable(self, packet: Any) -> bool:
        """Whether ``packet`` is a frame not to show: shown before the keyframe decoding started at,
        or numbered before the target or not wanted at all (a frame no other refers to is then not decoded)."""
        if packet.pts is None:
            return False
        number = self.numbers.get(packet.pts)
        return packet.pts < self.facts.keyframe_pts[self.key] or (number is not None and (number < self.target or number not in self.wanted))

    def frame(self, target: int) -> Any:
        """Frame number ``target`` (at or after the last one asked for, or anywhere after a seek)."""
        av = _av()
        facts = self.facts
        key = facts.keyframe_before(target) if self.seeks else 0
        self.target = target
        if self.frames is None or self.position >= target or facts.keyframes[key] > self.position + 1:
            self._start(key)
        budget = target - self.position + REORDER_SLACK  # for each target: one reached by decoding on gets its own
        while self.position < target:
            if budget <= 0:
                raise SampleError(self.where, f"decoding from the keyframe before frame {target} never reached it (frames out of order?)")
            try:
                frame = next(self.frames)  # type: ignore[arg-type]  # _start set it
            except StopIteration:
                raise SampleError(self.where, f"the video ends before frame {target} (its sample table says {facts.frames} frames)") from None
            except av.error.FFmpegError as exc:
                raise SampleError(self.where, f"frame {self.position + 1} does not decode ({type(exc).__name__})") from None
            budget -= 1
            if time.monotonic() > self.deadline:
                raise SampleError(self.where, f"decoding took longer than its time limit (at frame {self.position + 1})")
            if self.numbers and frame.pts is None:  # frames numbered by their timestamps have none here: decode every frame
                self.skips = False
                self._start(self.key)
                budget = target - self.position + REORDER_SLACK
                continue
            start_pts = facts.keyframe_pts[self.key]
            if frame.pts is not None and frame.pts < start_pts:
                continue  # shown before the keyframe: a landing early, or a leading frame of an open GOP
            if not self.landed:
                self.landed = True
                if frame.pts is not None and frame.pts != start_pts:  # landed past the keyframe
                    if self.key == 0:
                        raise SampleError(self.where, f"its first frame is shown at {frame.pts}, its sample table says {start_pts}")
                    self._start(self.key - 1)
                    budget = target - self.position + REORDER_SLACK
                    continue
            self.position = self._number_of(frame, target)
        return frame

    def _number_of(self, frame: Any, target: int) -> int:
        """The number of ``frame``, the one after the last decoded: by its timestamp where frames
        before the target may have been skipped (past the group numbered, the next keyframe's says
        where counting goes on), else one past the last."""
        if not self.numbers:
            return self.position + 1
        number = self.numbers.get(frame.pts)
        following = self.key + 1 < len(self.facts.keyframes)
        if number is None and following and frame.pts == self.facts.keyframe_pts[self.key + 1]:
            number = self.facts.keyframes[self.key + 1]
        if number is None:
            return self.position + 1
        if number > target or number <= self.position:
            raise SampleError(self.where, f"frame {number} came where frame {self.position + 1} was due (frames out of order?)")
        return number


def decode_frames(
    data: bytes, where: str, facts: StreamFacts, wanted: Sequence[int], size: tuple[int, int] | None, deadline: float,
    max_pixels: int = MAX_PIXELS,
) -> Iterator[tuple[int, np.ndarray]]:
    """Each of the frames ``wanted`` (ascending frame numbers) as (number, HWC uint8 RGB), at
    ``size`` (height, width; None: as stored): a seek to the keyframe at or before a wanted frame
    whenever the decoder is not already on the way to it, then decoding up to it. A SampleError
    when the video ends first (its table promised more frames), when ``time.monotonic()`` passes
    ``deadline``, or when a frame is bigger than ``max_pixels``."""
    av = _av()
    if not wanted:
        return
    facts.check_size(where, max_pixels)
    cursor = _FrameCursor(data, where, facts, wanted, deadline, max_pixels)
    reformatter = av.video.reformatter.VideoReformatter()  # one scaler for the clip: FFmpeg's context is set up once
    height, width = size if size is not None else (facts.height, facts.width)
    try:
        for target in wanted:
            frame = cursor.frame(target)
            _check_header_size(frame.width, frame.height, where, max_pixels)
            try:
                pixels = reformatter.reformat(frame, width=width, height=height, format="rgb24", interpolation="BILINEAR").to_ndarray()
            except av.error.FFmpegError as exc:  # a damaged stream's frame FFmpeg cannot convert
                raise SampleError(where, f"frame {target} does not convert to RGB ({type(exc).__name__})") from None
            yield target, pixels
    finally:
        cursor.close()


def reencode_h264(data: bytes, where: str, gop: int, max_size: int | None, max_pixels: int = MAX_PIXELS) -> bytes:
    """The video in ``data`` as H.264 in MP4 (yuv420p, a keyframe every ``gop`` frames, its longer
    side at most ``max_size``), its first audio stream dropped; a SampleError when it does not decode."""
    av = _av()
    source = _open(data, where, max_pixels)
    out = io.BytesIO()
    try:
        stream = source.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate or Fraction(30)
        time_base = stream.time_base or Fraction(1) / Fraction(rate)
        tick = max(1, round(1 / (Fraction(rate) * time_base)))  # one frame at the average rate, in the time base
        with av.open(out, mode="w", format="mp4") as target:
            encoded, first, last = None, None, -tick
            for frame in _decoded(source, stream):
                _check_header_size(frame.width, frame.height, where, max_pixels)
                if encoded is None:
                    scale = min(1.0, max_size / max(frame.width, frame.height)) if max_size else 1.0
                    encoded = target.add_stream("libx264", rate=rate)
                    encoded.width, encoded.height = max(2, int(frame.width * scale) // 2 * 2), max(2, int(frame.height * scale) // 2 * 2)  # even, never past max_size
                    encoded.pix_fmt = "yuv420p"
                    encoded.codec_context.gop_size = gop
                    # one thread, and no macroblock tree: x264's reads memory its earlier encoders in this process left
                    # (the same video encoded first or after others gave other bytes); the output is then a function of the input
                    encoded.codec_context.options = {"keyint_min": str(gop), "sc_threshold": "0", "threads": "1", "mbtree": "0"}
                    encoded.codec_context.time_base = time_base
                picture = frame.reformat(width=encoded.width, height=encoded.height, format="yuv420p")
                if first is None and frame.pts is not None:
                    first = frame.pts
                # each frame shown when the source shows it (a variable rate kept); one without a later timestamp: a frame after the last
                stamp = frame.pts - first if frame.pts is not None and first is not None and frame.pts - first > last else last + tick
                picture.pts, picture.time_base, last = stamp, time_base, stamp
                picture.pict_type = av.video.frame.PictureType.NONE  # the encoder picks keyframes (a source's I frames would stay keyframes)
                target.mux(encoded.encode(picture))
            if encoded is None:
                raise SampleError(where, "zero-length video stream: no frames")
            target.mux(encoded.encode(None))
    except av.error.FFmpegError as exc:
        raise SampleError(where, f"does not decode for re-encoding ({type(exc).__name__})") from None
    finally:
        source.close()
    return out.getvalue()


# --- audio ------------------------------------------------------------------------------------

# The demuxers a recording is opened with (besides the video containers, whose sound tracks load the
# same way): FLAC, WAV (and Wave64), MP3, Ogg (Vorbis, Opus, FLAC), MP4/M4A, Matroska/WebM, ADTS AAC, AIFF.
AUDIO_DEMUXERS: tuple[str, ...] = ("flac", "wav", "w64", "mp3", "aac", "aiff", *DEMUXERS)
AUDIO_CONTAINERS = "FLAC, WAV, MP3, Ogg (Vorbis, Opus), M4A/MP4, Matroska/WebM, AAC, AIFF, or a video's sound track"
# Demuxers whose timestamps after a seek are guesses (ADTS AAC has none to seek by): crops decoded from the file's start.
NO_SEEK_AUDIO = frozenset({"aac", "mpeg", "mpegvideo"})
SEEK_PREROLL_S = 0.25  # seconds decoded before a crop after a seek (AAC's overlap, FLAC's none), then dropped
# Opus's decoder converges on a decode from the start only gradually after a seek (its predictors'
# state): 0.25 s left crops 7e-4 off at 16 kbps, 0.5 s within 1e-6 (1e-3 at 6 kbps; tests/audio/test_crops.py).
OPUS_PREROLL_S = 0.5
# An MP3 frame's data may begin in the frames before it (the bit reservoir: up to 511 bytes back in
# MPEG-1, 255 in MPEG-2 and 2.5), and FFmpeg's decoder refills its reservoir only frame by frame after
# a seek: a crop is decoded from twice a reservoir of the frames' data (the recording's mean frame
# less its header and side information) before it, plus two frames (the overlap). The 0.25 s pre-roll
# before left 8 kbps crops wrong by up to 0.5 for 0.24 s (a 24 kHz stereo one: 3 bytes of data a
# frame, 170 frames of pre-roll).
TRUNCATION_SLACK_S = 0.25  # seconds a decoded recording may fall short of its header's duration (encoder padding) before it counts as truncated
# a sample format's (numpy dtype, scale to [-1, 1]), planar or packed
_SAMPLE_TYPES = {"s16": ("<i2", 1 / 32768), "s32": ("<i4", 1 / 2147483648), "u8": ("u1", 1 / 128), "flt": ("<f4", 1.0),
                 "dbl": ("<f8", 1.0), "s64": ("<i8", 1 / 9223372036854775808)}


def _open_audio(data: bytes, where: str) -> tuple[Any, Any]:
    """(container, its first audio stream) over ``data`` in one of AUDIO_DEMUXERS, its rate and
    channels checked against the limits before anything is decoded; a SampleError otherwise."""
    container = _open_input(data, where, AUDIO_DEMUXERS, "recording", AUDIO_CONTAINERS)
    try:
        if not container.streams.audio:
            raise SampleError(where, "holds no audio stream")
        stream = container.streams.audio[0]
        context = stream.codec_context
        if context is None:
            raise SampleError(where, f"no decoder for its audio codec ({getattr(stream, 'codec_tag', '') or 'unknown'!r}) in this FFmpeg")
        rate, channels = int(context.sample_rate or 0), int(context.channels or 0)
        if not 0 < rate <= MAX_AUDIO_RATE:
            raise SampleError(where, f"its header declares {rate} samples a second (fastload reads 1 to {MAX_AUDIO_RATE})")
        if not 0 < channels <= MAX_CHANNELS:
            raise SampleError(where, f"its header declares {channels} channels (fastload reads 1 to {MAX_CHANNELS})")
        context.thread_count = 1
    except BaseException:
        container.close()
        raise
    return container, stream


class _Gathered:
    """A crop's samples gathered from decoded frames as their planes' bytes (one copy a frame, no
    array a frame), converted to float32 (channels, n) in [-1, 1] once at the end: on a 2 s Vorbis
    crop (~80 frames of 128 to 1024 samples) a third less time than converting frame by frame."""

    def __init__(self, where: str, channels: int) -> None:
        self.where, self.channels = where, channels
        self.format: str | None = None
        self.width = 0  # bytes of one sample in a plane: one channel's (planar) or every channel's (packed)
        self.planes: list[list[bytes]] = []

    def add(self, frame: Any, first: int, last: int) -> None:
        """Samples ``first`` to ``last`` of ``frame`` (whose channels the caller checked)."""
        name = frame.format.name
        if self.format is None:
            if name.rstrip("p") not in _SAMPLE_TYPES:
                raise SampleError(self.where, f"decodes to samples of format {name}, which fastload does not convert")
            self.format = name
            self.width = np.dtype(_SAMPLE_TYPES[name.rstrip("p")][0]).itemsize * (1 if name.endswith("p") else self.channels)
            self.planes = [[] for _ in range(self.channels if name.endswith("p") else 1)]
        elif name != self.format:
            raise SampleError(self.where, f"changes its decoded sample format from {self.format} to {name} mid-stream")
        width = self.width
        for plane, gathered in zip(frame.planes, self.planes):
            gathered.append(bytes(memoryview(plane)[first * width : last * width]))

    def samples(self) -> np.ndarray:
        """Everything added, as float32 (channels, n) in [-1, 1]."""
        if self.format is None:
            return np.zeros((self.channels, 0), np.float32)
        dtype, scale = _SAMPLE_TYPES[self.format.rstrip("p")]
        if self.format.endswith("p"):  # np.stack makes a fresh array: a float32 one is kept as it is
            out = np.stack([np.frombuffer(b"".join(parts), dtype) for parts in self.planes]).astype(np.float32, copy=False)
        else:
            out = np.frombuffer(b"".join(self.planes[0]), dtype).reshape(-1, self.channels).T.astype(np.float32, order="C")
        if self.format.startswith("u8"):
            out -= np.float32(128)
        if scale != 1.0:
            out *= np.float32(scale)
        return out


def probe_audio(data: bytes, where: str) -> AudioFacts:
    """The stream facts of the recording in ``data``: every packet demuxed and decoded (proving it
    decodes, and counting its samples: a header's duration can lie), at most MAX_AUDIO_SECONDS; a
    SampleError when it does not decode, changes rate or channels mid-stream, or holds less than its
    header declares (truncated)."""
    av = _av()
    container, stream = _open_audio(data, where)
    try:
        rate, channels = int(stream.codec_context.sample_rate), int(stream.codec_context.channels)
        limit = MAX_AUDIO_SECONDS * rate
        samples = packets = 0
        start_pts: int | None = None
        timed = True
        try:
            for packet in container.demux(stream):
                if packet.size:
                    packets += 1
                for frame in packet.decode():
                    if frame.sample_rate != rate or frame.layout.nb_channels != channels:
                        raise SampleError(where, f"changes from {rate} Hz, {channels} channels to {frame.sample_rate} Hz, "
                                                 f"{frame.layout.nb_channels} channels mid-stream: convert it with ffmpeg first")
                    if start_pts is None:  # demux ends with an empty packet, whose decode drains the decoder
                        start_pts = frame.pts
                    timed = timed and frame.pts is not None
                    samples += frame.samples
                    if samples > limit:
                        raise SampleError(where, f"longer than {MAX_AUDIO_SECONDS} s")
        except av.error.FFmpegError as exc:
            raise SampleError(where, f"does not decode at {samples / rate:.2f} s ({type(exc).__name__})") from None
        if not samples:
            raise SampleError(where, "zero-length audio stream: no samples")
        if container.format.name == "wav":
            data_chunk(data, where)  # a SampleError where its data chunk declares more than the file holds
        declared = _declared_seconds(container, stream)
        if declared is not None and declared > samples / rate + TRUNCATION_SLACK_S + 0.01 * declared:
            raise SampleError(where, f"truncated or a lying header: it declares {declared:.2f} s and decodes to {samples / rate:.2f} s")
        time_base = stream.time_base or Fraction(1, rate)
        return AudioFacts(
            codec=stream.codec_context.name[:16], rate=rate, channels=channels, samples=samples, packets=max(min(packets, samples), 1),
            time_base=(time_base.numerator, time_base.denominator), start_pts=start_pts or 0,
            seekable=timed and container.format.name not in NO_SEEK_AUDIO,
        )
    finally:
        container.close()


def _declared_seconds(container: Any, stream: Any) -> float | None:
    """The recording's length its header declares, where it declares one."""
    if stream.duration is not None and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000
    return None


def decode_crops(data: bytes, where: str, facts: AudioFacts, crops: Sequence[tuple[int, int]], deadline: float) -> Generator[np.ndarray, None, None]:
    """Each crop's samples (a channel's ``start`` to ``start + count``, for each (start, count) of
    ``crops``) of the recording in ``data``, as float32 (channels, n): a PCM WAV's read at their bytes
    (fastload.av.wav), others decoded from a seek to a little before them (or from the file's start:
    a container that does not seek, a seek that landed past them), the container opened once for all
    of them; n < ``count`` only where the recording ends. Nothing is allocated but what the file
    holds or the decoder gave. A SampleError naming ``where`` when it does not decode, differs from
    its facts, or passes ``deadline``."""
    wav = wav_layout(data, where)
    if wav is not None:
        _check_facts(where, facts, wav.rate, wav.channels)
        for start, count in crops:
            _check_length(where, facts, wav.samples, start + count)
            yield read_wav(data, wav, start, count)
        return
    av = _av()
    ogg = _plain_vorbis(data, facts)
    origin = facts.start_pts * facts.time_base[0] / facts.time_base[1]  # seconds of sample 0
    container: Any = None
    stream: Any = None
    places: _Places | None = None  # timestamps coarser than a sample: the packets' places, counted
    read = False  # whether the open container has been read from
    codec = facts.codec
    frame_bytes: float | None = len(data) / facts.packets  # MP3's mean frame, for its pre-roll
    try:
        if codec == "video":  # a video's sound track: its codec (for its pre-roll) from the stream
            container, stream = _open_audio(data, where)
            codec, frame_bytes = _sound_codec(stream, facts.rate)
        for start, count in crops:
            if ogg is not None:
                try:
                    yield _decode_vorbis(av, data, where, facts, ogg, start, count, deadline).samples()
                    continue
                except NotPlain:
                    ogg = None  # read by the demuxer from here on
            seek_to = max(0.0, (start / facts.rate) - _preroll(codec, facts.rate, facts.channels, frame_bytes))
            for seeking in ((True, False) if facts.seekable and seek_to > 0 else (False,)):
                # A seek flushes the decoder; decoding from the start needs a fresh one. So does a seek in an Ogg
                # container read before: onto its last page, FFmpeg's Ogg demuxer timed the packets up to 0.7 s early.
                if container is None or not seeking or (read and container.format.name == "ogg"):
                    if container is not None:
                        container.close()
                    container, stream = _open_audio(data, where)
                if seeking and places is None and stream.time_base is not None and stream.time_base * facts.rate > 1:
                    places = _take_places(data, stream, facts)
                if seeking and places is not None and not read:
                    _prime(av, container, stream)
                read = True
                place = None if places is None else (lambda pts, counted=places: counted.place(data, where, pts))
                gathered = _decode_range(av, container, stream, where, facts, origin, seek_to if seeking else None, start, count, deadline,
                                         place)
                if gathered is not None:
                    break
            else:  # unreachable: no seek always lands at 0
                raise SampleError(where, f"decoding from its start never reached sample {start}")
            yield gathered.samples()
    finally:
        if container is not None:
            container.close()
        if places is not None:
            _keep_places(places)


def _prime(av: Any, container: Any, stream: Any) -> None:
    """Decode a fresh container's first packets up to one that gives samples: the decoder's start skip
    (Opus's pre-skip, AAC's priming) is spent on them. Unspent, it trimmed the first packet decoded after
    a seek, whose frame then had no packet's timestamp to be placed by (every WebM crop after a seek
    was decoded again from the start)."""
    try:
        for packet in container.demux(stream):
            if packet.size and sum(frame.samples for frame in packet.decode()):
                return
    except av.error.FFmpegError:
        return  # the seek's first frame then has no place, and the crop is decoded from the start, where it fails by name


# Codecs whose every packet decodes to the decoder's frame size (the last one trimmed by the container)
FIXED_FRAME_CODECS = frozenset({"aac", "mp3", "mp3float"})


def _flac_samples(packet: memoryview) -> int:
    """The samples a FLAC frame decodes to, from its header's block size: 4 bits of its third byte,
    or 8 or 16 bits after its coded frame number (RFC 9639, 9.1); a ValueError for no frame header."""
    if packet[0] != 0xFF or packet[1] >> 1 != 0x7C or not packet[2] >> 4:
        raise ValueError("not a FLAC frame header")
    code = packet[2] >> 4
    if code < 6:
        return 192 if code == 1 else 576 << (code - 2)
    if code > 7:
        return 256 << (code - 8)
    at = 4 + max(1, 8 - (packet[4] ^ 0xFF).bit_length())  # after the frame number, coded as UTF-8 is: as many bytes as its first one's leading ones
    return (packet[at] if code == 6 else packet[at] << 8 | packet[at + 1]) + 1


def _opus_samples(packet: memoryview) -> int:
    """The 48 kHz samples an Opus packet decodes to, from its table-of-contents byte (RFC 6716, 3.1)."""
    config, code = packet[0] >> 3, packet[0] & 3
    size = (480, 960, 1920, 2880)[config % 4] if config < 12 else (480, 960)[config % 2] if config < 16 else (120, 240, 480, 960)[config % 4]
    frames = 1 if code == 0 else 2 if code < 3 else (packet[1] & 0x3F if len(packet) > 1 else 0)
    return size * frames


class _Places:
    """A Matroska/WebM recording's packets' places (each one's timestamp -> the recording's sample its
    decoded samples start at), counted from its start without decoding (Opus's from its table of
    contents, FLAC's from its frame header, a fixed frame size's codec's from that; only the first packets decoded, for the samples
    the decoder skips at the start), only as far as a crop needs, and on from there for a later one
    (a seek back to the last packet counted): for a stream whose timestamps are coarser than a
    sample. Every packet's count is checked against its timestamp (a miscount moves a place by more
    than two of the timestamps' ticks), and the total, once the count reaches the end, against the
    facts. Where a packet's samples cannot be told so or a check fails, :meth:`place` is None."""

    def __init__(self, stream: Any, facts: AudioFacts, key: tuple[int, bytes, AudioFacts]) -> None:
        self.facts, self.key = facts, key  # key: what _PLACES knows the recording by
        self._reset()
        self.counted: Callable[[memoryview], int] | None = None  # None: not countable
        context, base = stream.codec_context, stream.time_base
        fixed = int(context.frame_size or 0)
        if context.name in ("opus", "libopus") and facts.rate == 48000:
            self.counted, least = _opus_samples, 120  # a packet's samples: a multiple of 2.5 ms
        elif context.name in FIXED_FRAME_CODECS and fixed > 0:
            self.counted, least = (lambda packet: fixed), fixed
        elif context.name == "flac":
            self.counted, least = _flac_samples, 0  # a frame's own header: what its decoder decodes
        else:
            return
        self.tick = (base.numerator * facts.rate, base.denominator)  # samples a timestamp unit, as a fraction
        if least and 2 * self.tick[0] + self.tick[1] >= least * self.tick[1]:  # ticks too coarse to tell a miscount
            self.counted = None

    def _reset(self) -> None:
        """Nothing counted."""
        self.places: dict[int, int] = {}  # timestamp -> the samples of the packets before it, from the first one
        self.fed = 0  # the samples of every packet counted
        self.samples = 0  # the last packet counted's
        self.last: int | None = None  # its timestamp
        self.first = 0  # the first packet's timestamp
        self.skip: int | None = None  # the packets' samples before the recording's first
        self.checked = 0  # packets after the skip decoded to the samples counted
        self.done = False  # counted to the end

    def place(self, data: bytes, where: str, pts: int) -> int | None:
        """The recording's sample the packet at ``pts`` starts at (counted as far as it first), or None."""
        if self.counted is not None and not self.done and (self.last is None or pts > self.last):  # a count stops only past the checks
            self._count(data, where, pts)
        at = self.places.get(pts) if self.counted is not None else None
        return None if at is None or self.skip is None else at - self.skip

    def _count(self, data: bytes, where: str, target: int) -> None:
        """Count on to the packet at ``target`` (its timestamp) and two packets past the decoder's
        start skip, from the last packet counted (a seek back to it) or the start; ``counted`` None where a check fails."""
        for resume in ((True, False) if self.last is not None else (False,)):
            container, stream = _open_audio(data, where)
            try:
                if resume and not self._count_on(container, stream, target, True):
                    continue  # the seek did not land at or before the last packet counted: from the start
                if not resume:
                    self._reset()
                    self._count_on(container, stream, target, False)
                return
            except (_av().error.FFmpegError, IndexError, ValueError):  # a damaged packet: decoded from the start, where it fails by name
                self.counted = None
                return
            finally:
                container.close()

    def _count_on(self, container: Any, stream: Any, target: int, resume: bool) -> bool:
        """:meth:`_count`'s demuxing; with ``resume``, after a seek to the last packet counted,
        False where the seek landed past it."""
        counted = self.counted
        assert counted is not None
        rate_n, rate_d = self.tick
        last = self.last
        if resume:
            container.seek(last, backward=True, any_frame=False, stream=stream)
        for packet in container.demux(stream):
            if not packet.size:
                continue
            pts = packet.pts
            if resume:  # packets counted before, up to the last one
                if pts is None or pts > last:
                    return False
                resume = pts != last
                continue
            if pts is None or (self.last is not None and pts <= self.last):
                self.counted = None
                return True
            if self.last is None:
                self.first = pts
            samples = counted(memoryview(packet))  # no copy: Opus reads its first two bytes
            if abs((pts - self.first) * rate_n - self.fed * rate_d) > rate_n + rate_d:  # not where its timestamp says
                self.counted = None
                return True
            self.places[pts], self.last, self.samples = self.fed, pts, samples
            if self.skip is None or self.checked < 2:  # the skip found, and two packets after it decoding to the samples counted
                produced = sum(frame.samples for frame in packet.decode())
                if self.skip is not None:
                    if produced != samples:
                        self.counted = None
                        return True
                    self.checked += 1
                elif produced:
                    self.skip = self.fed + samples - produced
            self.fed += samples
            if pts >= target and self.checked >= 2:
                return True
        if resume:
            return False
        self.done = True
        if self.skip is None or (self.facts.codec != "video" and not 0 <= self.fed - self.skip - self.facts.samples < max(self.samples, 1)):
            self.counted = None  # the last packet's end trimmed
        return True


_PLACES: OrderedDict[tuple[int, bytes, AudioFacts], _Places] = OrderedDict()  # a process's counted places by recording
_PLACES_LOCK = threading.Lock()  # two threads' loaders (a prefetch thread each) take and keep places at once
PLACES_KEPT = 1 << 16  # the most packets' places kept (~6 MB: 22 minutes of 20 ms Opus packets)
PLACES_KEY_BYTES = 1 << 16  # a recording is known by its length, facts, and the hash of this many bytes at its start and end


def _places_key(data: bytes, facts: AudioFacts) -> tuple[int, bytes, AudioFacts]:
    """What :data:`_PLACES` knows a recording by."""
    view = memoryview(data)
    ends = hashlib.blake2b(view[:PLACES_KEY_BYTES], digest_size=16)
    ends.update(view[-PLACES_KEY_BYTES:])
    return len(data), ends.digest(), facts


def _take_places(data: bytes, stream: Any, facts: AudioFacts) -> _Places:
    """The places counted for the recording in ``data`` (``stream``: its audio stream) before, taken
    out of the kept ones (so no other thread counts on with them at once), or new ones."""
    key = _places_key(data, facts)
    with _PLACES_LOCK:
        kept = _PLACES.pop(key, None)
    return kept or _Places(stream, facts, key)


def _keep_places(places: _Places) -> None:
    """``places`` back among the kept ones, the least recently used dropped beyond PLACES_KEPT packets."""
    with _PLACES_LOCK:
        _PLACES[places.key] = places
        while _PLACES and sum(len(kept.places) for kept in _PLACES.values()) > PLACES_KEPT:
            _PLACES.popitem(last=False)


def _preroll(codec: str, rate: int, channels: int, frame_bytes: float | None) -> float:
    """Seconds decoded before a crop after a seek so that its samples equal a decode from the start
    (within Opus's convergence): by ``codec``, MP3's from its mean frame's bytes (None: not known, its
    smallest frame's, 32 kbps in MPEG-1 and 8 kbps in MPEG-2 and 2.5: the longest pre-roll)."""
    if codec in ("mp3", "mp3float"):
        mpeg1 = rate >= 32000
        frame, reservoir = (1152, 511) if mpeg1 else (576, 255)  # samples a frame, reservoir bytes
        side = (32 if channels > 1 else 17) if mpeg1 else (17 if channels > 1 else 9)
        if frame_bytes is None:
            frame_bytes = _mp3_frame_bytes(rate, 32000 if mpeg1 else 8000)
        data_bytes = max(1.0, frame_bytes - 4 - side)  # a frame's own data, after its header and side information
        frames = 2 + math.ceil(2 * reservoir / data_bytes)
        return max(SEEK_PREROLL_S, frames * frame / rate)
    if codec in ("opus", "libopus"):
        return OPUS_PREROLL_S
    return SEEK_PREROLL_S


def _mp3_frame_bytes(rate: int, bit_rate: int) -> float:
    """An MP3 frame's mean bytes at ``bit_rate`` bits a second (MPEG-1 from 32 kHz, 1152 samples a frame; else 576)."""
    return (144 if rate >= 32000 else 72) * bit_rate / rate


def _sound_codec(stream: Any, rate: int) -> tuple[str, float | None]:
    """A video's sound track's codec (its stream facts name none) and, for MP3's pre-roll, its mean
    frame's bytes from its bit rate (None where the container declares none)."""
    bit_rate = int(stream.bit_rate or stream.codec_context.bit_rate or 0)
    return stream.codec_context.name, _mp3_frame_bytes(rate, bit_rate) if bit_rate > 0 else None


def _plain_vorbis(data: bytes, facts: AudioFacts) -> VorbisStream | None:
    """The plain Ogg Vorbis stream in ``data`` (fastload.av.ogg) where its facts' timestamps count
    its samples from 0; None for any other recording."""
    if facts.codec != "vorbis" or facts.time_base != (1, facts.rate) or not data.startswith(CAPTURE):
        return None
    try:
        return vorbis_stream(data)
    except NotPlain:
        return None


_VORBIS_DECODERS: OrderedDict[bytes, Any] = OrderedDict()  # a process's idle Vorbis decoders by headers: a setup header's codebooks built once
VORBIS_DECODERS_KEPT = 8


def _vorbis_decoder(av: Any, ogg: VorbisStream, where: str) -> Any:
    """A Vorbis decoder for ``ogg``'s headers, flushed, taken out of the idle ones (so no other
    thread's crop shares it) where one with the same identification and setup headers is there (the
    comment header does not change decoding), else a new one."""
    decoder = _VORBIS_DECODERS.pop(ogg.headers[0] + ogg.headers[2], None)
    if decoder is not None:
        decoder.flush_buffers()
        return decoder
    decoder = av.CodecContext.create("vorbis", "r")
    decoder.extradata = ogg.extradata()
    decoder.thread_count = 1
    try:
        decoder.open()
    except av.error.FFmpegError as exc:
        raise SampleError(where, f"not a readable recording ({type(exc).__name__})") from None
    return decoder


def _keep_vorbis_decoder(ogg: VorbisStream, decoder: Any) -> None:
    """``decoder`` (done with a crop of ``ogg``) back among the idle ones, the least recently used dropped beyond VORBIS_DECODERS_KEPT."""
    _VORBIS_DECODERS[ogg.headers[0] + ogg.headers[2]] = decoder
    while len(_VORBIS_DECODERS) > VORBIS_DECODERS_KEPT:
        _VORBIS_DECODERS.popitem(last=False)


def _decode_vorbis(av: Any, data: bytes, where: str, facts: AudioFacts, ogg: VorbisStream, start: int, count: int,
                   deadline: float) -> _Gathered:
    """One crop of a plain Ogg Vorbis stream: its packets from the one ending the last page at or
    before the crop (which primes the decoder) fed to a bare decoder, the samples placed by that
    page's granule position and checked against every later page's; NotPlain where they disagree."""
    _check_facts(where, facts, ogg.rate, ogg.channels)
    page, segment, granule = crop_start(data, ogg, start + facts.start_pts)
    position = 0 if granule is None else granule - facts.start_pts  # a channel's samples before the first one decoded
    decoder = _vorbis_decoder(av, ogg, where)
    end = start + count
    gathered = _Gathered(where, facts.channels)
    try:
        for packet, anchor in packets(data, ogg, page, segment):
            for frame in decoder.decode(av.Packet(packet)):  # its rate and channels are the identification header's, checked
                n = frame.samples
                if position + n > start:
                    gathered.add(frame, max(start - position, 0), min(end - position, n))
                position += n
            if anchor is not None and position != anchor - facts.start_pts:
                raise NotPlain  # the samples are not where the pages say: the demuxer's timestamps would differ
            if position >= end:
                break
            if time.monotonic() > deadline:
                raise SampleError(where, f"decoding took longer than its time limit (at {position / facts.rate:.2f} s)")
    except av.error.FFmpegError as exc:
        raise SampleError(where, f"does not decode at {position / facts.rate:.2f} s ({type(exc).__name__})") from None
    _keep_vorbis_decoder(ogg, decoder)  # only after a crop that decoded (a failed one's decoder is dropped)
    if position < end:
        _check_length(where, facts, position, end)
    return gathered


def _check_facts(where: str, facts: AudioFacts, rate: int, channels: int) -> None:
    """A SampleError when a recording decodes to another rate or channel count than its facts say."""
    if rate != facts.rate or channels != facts.channels:
        raise SampleError(where, f"decodes to {rate} Hz, {channels} channels; its sample table says {facts.rate} Hz, {facts.channels}")


def _check_length(where: str, facts: AudioFacts, position: int, end: int) -> None:
    """A SampleError when a recording ends at ``position`` well before ``end`` and its facts' length."""
    if position < min(end, facts.samples) - round(TRUNCATION_SLACK_S * facts.rate):
        raise SampleError(where, f"ends at {position / facts.rate:.2f} s, its sample table says {facts.seconds:.2f} s")


def _decode_range(av: Any, container: Any, stream: Any, where: str, facts: AudioFacts, origin: float, seek_to: float | None,
                  start: int, count: int, deadline: float, place: Callable[[int], int | None] | None = None) -> _Gathered | None:
    """One crop's try in :func:`decode_crops`: the crop's samples, or None when a seek to ``seek_to``
    seconds landed past half the pre-roll before it, or cannot place samples exactly. Timestamps
    coarser than a sample (Matroska's and WebM's milliseconds, rounded: Opus crops came 24 samples
    early, AAC ones up to 22 samples off) place the first frame after a seek by ``place`` (its
    packet's timestamp -> its first sample, :class:`_Places`); without it, from the start."""
    coarse = stream.time_base is None or stream.time_base * facts.rate > 1
    if seek_to is not None:
        if coarse and place is None:
            return None
        try:
            container.seek(int((origin + seek_to) * 1_000_000), backward=True, any_frame=False)
        except av.error.FFmpegError:
            return None
    position: int | None = None if seek_to is not None else 0
    landed_by = start if seek_to is None else (start + seek_to * facts.rate) / 2  # half the pre-roll decoded at least
    end = start + count
    gathered = _Gathered(where, facts.channels)
    try:
        for frame in container.decode(stream):
            _check_facts(where, facts, frame.sample_rate, frame.layout.nb_channels)
            if position is None:
                if frame.pts is None:
                    return None
                position = place(frame.pts) if coarse and place is not None else round((float(frame.pts * frame.time_base) - origin) * facts.rate)
                if position is None:
                    return None
                if position > landed_by:  # past half its pre-roll: the decoder would not have caught up
                    return None
            n = frame.samples
            if position + n > start:
                gathered.add(frame, max(start - position, 0), min(end - position, n))
            position += n
            if position >= end:
                return gathered
            if time.monotonic() > deadline:
                raise SampleError(where, f"decoding took longer than its time limit (at {position / facts.rate:.2f} s)")
    except av.error.FFmpegError as exc:
        raise SampleError(where, f"does not decode at {(position or 0) / facts.rate:.2f} s ({type(exc).__name__})") from None
    _check_length(where, facts, position or 0, end)
    return gathered


# --audio-codec: (encoder, muxer, the field it is stored under)
AUDIO_ENCODERS: dict[str, tuple[str, str, str]] = {"flac": ("flac", "flac", "flac"), "opus": ("libopus", "ogg", "opus")}


def check_audio_encoding(codec: str, rate: int | None) -> None:
    """A ValueError unless recordings can be re-encoded to ``codec`` at ``rate`` (None: each its own)."""
    if codec not in AUDIO_ENCODERS:
        raise ValueError(f"--audio-codec must be one of {sorted(AUDIO_ENCODERS)}, got {codec!r}")
    if rate is not None and not 0 < rate <= MAX_AUDIO_RATE:
        raise ValueError(f"--audio-rate must be 1 to {MAX_AUDIO_RATE} Hz, got {rate}")
    if codec == "opus" and rate not in (None, 48000):
        raise ValueError(f"--audio-rate {rate}: Opus decodes at 48000 Hz whatever it encoded (leave --audio-rate out, or re-encode to flac)")


def reencode_audio(data: bytes, where: str, codec: str, rate: int | None) -> bytes:
    """The recording in ``data`` decoded and encoded again as ``codec`` (AUDIO_ENCODERS) at ``rate``
    (None: its own; Opus: 48 kHz), its channels kept (at most 7: swr's layouts); a
    SampleError when it does not decode (the probe's limits apply: rate, channels, 24 hours)."""
    av = _av()
    encoder, muxer, _ = AUDIO_ENCODERS[codec]
    source, stream = _open_audio(data, where)
    out = io.BytesIO()
    try:
        channels, source_rate = int(stream.codec_context.channels), int(stream.codec_context.sample_rate)
        layout = _layout(channels)
        if layout is None:
            raise SampleError(where, f"{channels} channels: fastload re-encodes 1 to 7")
        target_rate = rate or (48000 if codec == "opus" else source_rate)
        limit, decoded = MAX_AUDIO_SECONDS * source_rate, 0
        with av.open(out, mode="w", format=muxer, container_options={"fflags": "+bitexact"}) as target:  # Ogg: no random serial number
            encoded = target.add_stream(encoder, rate=target_rate, layout=layout)
            encoded.codec_context.thread_count = 1
            encoded.codec_context.options = {"flags": "+bitexact"}  # no encoder version in the file: the same bytes from any FFmpeg build
            convert = av.AudioResampler(format=encoded.codec_context.codec.audio_formats[0].name, layout=layout, rate=target_rate)
            for packet in source.demux(stream):
                for frame in packet.decode():
                    decoded += frame.samples
                    if decoded > limit:
                        raise SampleError(where, f"longer than {MAX_AUDIO_SECONDS} s")
                    frame.pts = None  # the resampler counts samples; a source's timestamps may jump
                    for part in convert.resample(frame):
                        target.mux(encoded.encode(part))
            for part in convert.resample(None):
                target.mux(encoded.encode(part))
            if not decoded:
                raise SampleError(where, "zero-length audio stream: no samples")
            target.mux(encoded.encode(None))
    except av.error.FFmpegError as exc:
        raise SampleError(where, f"does not decode for re-encoding ({type(exc).__name__})") from None
    finally:
        source.close()
    return out.getvalue()


def resample_audio(samples: np.ndarray, rate: int, target_rate: int, channels: int, where: str) -> np.ndarray:
    """``samples`` (C, n float32 at ``rate``) as ``channels`` channels at ``target_rate``: mono is the
    channels' mean, one channel is repeated to more, other counts are swr's remix of FFmpeg's
    default layouts; then resampled (:func:`fastload.av.resample.sinc_resample`, torchaudio's
    recipe; swr for pairs of rates it has no kernel for) to ``round(n * target_rate / rate)``
    samples (the last zero-padded where fewer come)."""
    count = samples.shape[0]
    if channels == 1 and count > 1:
        samples, count = samples.mean(axis=0, keepdims=True, dtype=np.float32), 1
    elif count == 1 and channels > 1:
        samples, count = np.repeat(samples, channels, axis=0), channels
    if not samples.shape[1]:
        return np.zeros((channels, 0), np.float32)
    if count != channels:
        samples = _swr(samples, rate, rate, channels, where)  # a remix, at the source's rate
    if rate == target_rate:
        return samples
    resampled = sinc_resample(samples, rate, target_rate)
    if resampled is None:
        resampled = _swr(samples, rate, target_rate, channels, where)
    wanted = round(samples.shape[1] * target_rate / rate)
    out = np.zeros((channels, wanted), np.float32)
    out[:, : min(wanted, resampled.shape[1])] = resampled[:, :wanted]
    return out


def _swr(samples: np.ndarray, rate: int, target_rate: int, channels: int, where: str) -> np.ndarray:
    """``samples`` (C, n) remixed to ``channels`` and resampled to ``target_rate`` by FFmpeg's swr, flushed."""
    av = _av()
    count = samples.shape[0]
    source, layout = _layout(count), _layout(channels)
    if source is None or layout is None:
        if count != channels:
            raise SampleError(where, f"cannot remix {count} channels to {channels} (fastload remixes 1 to 7 channels; ask for 1 or {count})")
        return np.concatenate([_swr(row[None], rate, target_rate, 1, where) for row in samples])  # channel by channel
    try:
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples, dtype=np.float32), format="fltp", layout=source)
        frame.sample_rate = rate
        resampler = av.AudioResampler(format="fltp", layout=layout, rate=target_rate)
        parts = [f.to_ndarray() for f in (*resampler.resample(frame), *resampler.resample(None))]
    except (av.error.FFmpegError, ValueError, IndexError) as exc:
        raise SampleError(where, f"cannot resample {count} channels at {rate} Hz to {channels} at {target_rate} Hz ({type(exc).__name__})") from None
    return np.concatenate(parts, axis=1) if parts else np.zeros((channels, 0), np.float32)


def _layout(channels: int) -> str | None:
    """FFmpeg's default layout of ``channels`` channels (mono, stereo, 2.1, ..., 6.1), or None past 7
    (PyAV fills at most 7 planes of a frame: 7.1 and larger fail) or where it has none."""
    av = _av()
    if channels > 7:
        return None
    try:
        layout = av.AudioLayout(f"{channels}c")
    except ValueError:
        return None
    name = str(layout.name)
    return name if layout.nb_channels == channels and not name.endswith("channels") else None  # "12 channels": no order, which PyAV cannot fill
