"""Small recordings for the tests, made with PyAV: a chirp (its pitch rising, so a crop's place
in the recording can be told from its samples) in every codec fastload reads, at its own rate and
channels, a few seconds long."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np

# extension -> (encoder, container): every codec of issue 41's list
CODECS: dict[str, tuple[str, str]] = {
    "flac": ("flac", "flac"),
    "wav": ("pcm_s16le", "wav"),
    "mp3": ("libmp3lame", "mp3"),
    "ogg": ("vorbis", "ogg"),
    "opus": ("libopus", "ogg"),
    "m4a": ("aac", "ipod"),
}
FORMATS: dict[str, tuple[str, str]] = {**CODECS, "weba": ("libopus", "webm")}  # CODECS and other containers of them
LOSSLESS = ("flac", "wav")
NATIVE_RATE = {"opus": 48000}  # Opus encodes at 48 kHz only


def chirp(rate: int, seconds: float, channels: int = 1, seed: int = 0) -> np.ndarray:
    """(channels, n) float32: a tone rising from 100 Hz, louder in each further channel."""
    t = np.arange(int(rate * seconds)) / rate
    base = 100 + 20 * seed
    tone = 0.3 * np.sin(2 * np.pi * (base * t + 150 * t * t))
    return np.stack([tone * (1 + 0.5 * c) / (1 + 0.5 * (channels - 1)) for c in range(channels)]).astype(np.float32)


def encode(samples: np.ndarray, rate: int, ext: str, encoder: str | None = None, bit_rate: int | None = None,
           options: dict[str, str] | None = None) -> bytes:
    """``samples`` (channels, n float32) encoded as a file of extension ``ext`` (FORMATS; ``encoder``:
    another of its container's), at the encoder's default bit rate or ``bit_rate`` bits a second, with the encoder's ``options``."""
    encoder, container = encoder or FORMATS[ext][0], FORMATS[ext][1]
    channels = samples.shape[0]
    layout = av.AudioLayout(f"{channels}c").name  # FFmpeg's default layout: mono, stereo, 2.1, ..., 5.1, 6.1
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(encoder, rate=rate, layout=layout)
        if bit_rate:
            stream.bit_rate = bit_rate
        if encoder == "vorbis":
            stream.codec_context.options = {"strict": "experimental"}  # FFmpeg's own Vorbis encoder (stereo only)
        elif options:
            stream.codec_context.options = options
        convert = av.AudioResampler(format=stream.codec_context.codec.audio_formats[0].name, layout=layout, rate=rate)
        for start in range(0, samples.shape[1], 1024):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[:, start : start + 1024]), format="fltp", layout=layout)
            frame.sample_rate, frame.pts, frame.time_base = rate, start, Fraction(1, rate)
            for part in convert.resample(frame):
                out.mux(stream.encode(part))
        for part in convert.resample(None):
            out.mux(stream.encode(part))
        out.mux(stream.encode(None))
    return buf.getvalue()


def recording(ext: str, seconds: float = 2.0, rate: int = 16000, channels: int = 1, seed: int = 0) -> tuple[bytes, np.ndarray]:
    """(a file of extension ``ext``, the samples encoded in it), at the codec's own rate where it has one."""
    rate = NATIVE_RATE.get(ext, rate)
    channels = 2 if ext == "ogg" else channels
    samples = chirp(rate, seconds, channels, seed)
    return encode(samples, rate, ext), samples
