"""Small real-looking videos for the tests, made with PyAV: a camera panning and zooming over a
photograph (Debian's wallpapers where scripts/env.sh fetched them, else the demo's smooth scenes),
a few frames each, H.264 with B-frames and a fixed keyframe interval unless asked otherwise."""

from __future__ import annotations

import io
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image

from fastload.cli.demo import synthetic_image

WALLPAPERS = Path(__file__).resolve().parents[2] / "data" / ".wallpapers" / "usr" / "share" / "wallpapers"


def photo(seed: int) -> Image.Image:
    """A real photograph (a wallpaper) where one is on disk, else a smooth synthetic scene."""
    found = sorted(WALLPAPERS.glob("*/contents/images/*.jpg")) if WALLPAPERS.is_dir() else []
    if found:
        with Image.open(found[seed % len(found)]) as im:
            image = im.convert("RGB")
            image.thumbnail((640, 640))
            return image
    return synthetic_image(np.random.default_rng(seed), seed % 4, 360, 480)


def camera_frames(seed: int, frames: int, width: int, height: int) -> list[np.ndarray]:
    """``frames`` RGB frames of a camera panning right and zooming in over a photo."""
    image = photo(seed)
    out = []
    for t in range(frames):
        zoom = 1.0 - 0.3 * t / max(frames - 1, 1)
        w, h = image.width * 0.6 * zoom, image.height * 0.6 * zoom
        x = (image.width - w) * t / max(frames - 1, 1)
        y = (image.height - h) / 2
        crop = image.resize((width, height), Image.Resampling.BILINEAR, box=(x, y, x + w, y + h))
        out.append(np.asarray(crop))
    return out


def encode(frames: list[np.ndarray], codec: str = "libx264", container: str = "mp4", gop: int = 8, rate: int = 24,
           audio_rate: int = 0, bframes: int = 0, stamps: list[int] | None = None, sound: np.ndarray | None = None,
           audio_codec: str = "aac", audio_options: dict[str, str] | None = None) -> bytes:
    """The frames encoded (``codec`` in ``container``, a keyframe every ``gop`` frames; x264 with
    ``bframes`` B-frames (default 2), x265 with 4, other codecs with ``bframes``), with a sine tone of ``audio_rate`` Hz sampling where asked
    (``sound``: these mono samples instead, encoded by ``audio_codec`` with ``audio_options``);
    frame i shown at ``stamps[i] / rate`` seconds where given (a variable frame rate), else at ``i / rate``."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p" if codec != "mjpeg" else "yuvj420p"
        stream.codec_context.gop_size = gop
        if codec == "libx264":
            stream.codec_context.options = {"keyint_min": str(gop), "sc_threshold": "0", "bf": str(bframes or 2), "threads": "1"}
        elif codec == "libx265":  # x265's defaults otherwise: open groups of frames, B-frames some refer to
            stream.codec_context.options = {"x265-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes={bframes or 4}:log-level=error"}
        elif bframes:
            stream.codec_context.max_b_frames = bframes
        track = out.add_stream(audio_codec, rate=audio_rate, layout="mono") if audio_rate else None
        if track is not None and audio_options:
            track.codec_context.options = audio_options
        for i, pixels in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            if stamps is not None:
                frame.pts, frame.time_base = stamps[i], Fraction(1, rate)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
        if track is not None:
            samples = int(audio_rate * len(frames) / rate)
            tone = (0.2 * np.sin(2 * np.pi * 440 * np.arange(samples) / audio_rate)).astype(np.float32) if sound is None else sound
            convert = av.AudioResampler(format=track.codec_context.codec.audio_formats[0].name, layout="mono", rate=audio_rate)
            for start in range(0, len(tone), 1024):
                chunk = av.AudioFrame.from_ndarray(np.ascontiguousarray(tone[None, start : start + 1024]), format="fltp", layout="mono")
                chunk.sample_rate, chunk.pts, chunk.time_base = audio_rate, start, Fraction(1, audio_rate)
                for part in convert.resample(chunk):
                    out.mux(track.encode(part))
            out.mux(track.encode(None))
    return buf.getvalue()


def video(seed: int, frames: int = 24, width: int = 96, height: int = 64, **options) -> bytes:
    """A panning, zooming camera over photo ``seed``, encoded (see :func:`encode`)."""
    return encode(camera_frames(seed, frames, width, height), **options)


def every_frame(data: bytes) -> list[np.ndarray]:
    """Every frame of a video decoded in order from its start, as RGB: what a clip must match. An
    empty packet (Theora's "repeat the frame before") is no frame: the stream facts count packets,
    and PyAV would hand it to the decoder as the stream's end."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = [frame for packet in container.demux(stream) if packet.size for frame in packet.decode()]
        return [frame.to_ndarray(format="rgb24") for frame in [*frames, *stream.decode(None)]]


def video_folder(root: Path, count: int = 6, frames: tuple[int, ...] = (24, 30, 40), gop: int = 8) -> Path:
    """ROOT/cK/vNN.mp4: ``count`` videos in 2 class folders, of the frame counts given in turn."""
    for i in range(count):
        path = root / f"c{i % 2}" / f"v{i:02d}.mp4"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(video(i, frames[i % len(frames)], gop=gop))
    return root


def ffmpeg_encode(frames: list[np.ndarray], suffix: str, *args: str, rate: int = 24) -> bytes:
    """The frames encoded by the ffmpeg command (``args``: its output options, e.g. an encoder PyAV's
    wheels lack) into a file of ``suffix``; pytest skips the test where ffmpeg is not installed."""
    import tempfile

    import pytest

    if shutil.which("ffmpeg") is None:
        pytest.skip("needs the ffmpeg command")
    height, width = frames[0].shape[:2]
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / f"video{suffix}"
        command = ["ffmpeg", "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}", "-r", str(rate), "-i", "-"]
        subprocess.run([*command, *args, str(out)], input=b"".join(f.tobytes() for f in frames), check=True, timeout=60)
        return out.read_bytes()
