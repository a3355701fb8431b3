"""WAV files read without a decoder: the RIFF chunks walked to the format and the data chunk, and
a crop of PCM or float samples read at its byte offset (data start + first sample x block size) with
numpy, converted as FFmpeg's decoders convert them (8-bit unsigned around 128; 16, 24, 32-bit signed;
32, 64-bit float), so it is the crop PyAV would decode, sample for sample.

Measured on 89 real WAVs (benchmarks/fetch_audio.py), a 2 s crop: 2.7 ms through PyAV (opening the
container, a seek, 4 KB packets each a frame object), 0.05 ms here. A WAV this does not read (a
compressed codec in WAV, RF64, a block size that is not channels x sample size) returns None and is
decoded by PyAV as before.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from fastload.errors import SampleError

WAV_UNKNOWN_SIZES = (0, 0xFFFFFFFF)  # a data chunk's size a streaming writer leaves for "until the file ends"
MAX_CHUNKS = 64  # chunks walked before the data chunk (fmt, LIST, fact, ...)
PCM, FLOAT, EXTENSIBLE = 1, 3, 0xFFFE  # WAVE format tags
# (format tag, bits a sample) -> (numpy dtype of a stored sample, scale to [-1, 1], offset of its zero)
_STORED: dict[tuple[int, int], tuple[str, float, float]] = {
    (PCM, 8): ("u1", 1 / 128, 128.0), (PCM, 16): ("<i2", 1 / 32768, 0.0), (PCM, 32): ("<i4", 1 / 2147483648, 0.0),
    (FLOAT, 32): ("<f4", 1.0, 0.0), (FLOAT, 64): ("<f8", 1.0, 0.0),
}


@dataclass(frozen=True)
class WavData:
    """Where a WAV's samples are: its format tag (PCM or FLOAT), rate, channels, bits a sample, and
    the data chunk's first byte and size (what the file holds of it where its header says more)."""

    tag: int
    rate: int
    channels: int
    bits: int
    offset: int
    size: int

    @property
    def frame_bytes(self) -> int:
        """Bytes of one instant: a sample of every channel."""
        return self.channels * self.bits // 8

    @property
    def samples(self) -> int:
        """A channel's samples the data chunk holds."""
        return self.size // self.frame_bytes


def data_chunk(data: bytes, where: str) -> tuple[int, int] | None:
    """(the data chunk's first byte, its size as the file holds it) of the WAV in ``data``; None when
    there is none in the first MAX_CHUNKS chunks. A SampleError when its size declares more bytes
    than the file holds (FFmpeg reads what is there, so a truncated WAV or a lying size would
    otherwise pass for a shorter one)."""
    offset = 12  # past "RIFF", its size and "WAVE"
    for _ in range(MAX_CHUNKS):
        if offset + 8 > len(data):
            return None
        name, size = data[offset : offset + 4], int.from_bytes(data[offset + 4 : offset + 8], "little")
        if name == b"data":
            held = len(data) - offset - 8
            if size in WAV_UNKNOWN_SIZES:
                return offset + 8, held
            if size > held:
                raise SampleError(where, f"truncated or a lying header: its data chunk declares {size} bytes, the file holds {held}")
            return offset + 8, size
        offset += 8 + size + (size & 1)
    return None


def _format(data: bytes) -> tuple[int, int, int, int, int] | None:
    """The fmt chunk's (format tag, channels, rate, block size, bits a sample), the tag of an
    extensible format its sub-format's; None without one among the first MAX_CHUNKS chunks."""
    offset = 12
    for _ in range(MAX_CHUNKS):
        if offset + 8 > len(data):
            return None
        name, size = data[offset : offset + 4], int.from_bytes(data[offset + 4 : offset + 8], "little")
        if name == b"fmt " and size >= 16 and offset + 8 + size <= len(data):
            tag, channels, rate, _, block, bits = struct.unpack_from("<HHIIHH", data, offset + 8)
            if tag == EXTENSIBLE:
                if size < 40:
                    return None
                tag = int.from_bytes(data[offset + 32 : offset + 34], "little")  # the sub-format GUID's first two bytes
            return tag, channels, rate, block, bits
        if name == b"data":
            return None
        offset += 8 + size + (size & 1)
    return None


def wav_layout(data: bytes, where: str) -> WavData | None:
    """Where the samples of ``data`` are, when it is a RIFF WAV of PCM (8, 16, 24, 32-bit) or float
    (32, 64-bit) samples, each instant channels x sample size bytes; None for anything else."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    fmt = _format(data)
    if fmt is None:
        return None
    tag, channels, rate, block, bits = fmt
    if ((tag, bits) not in _STORED and (tag, bits) != (PCM, 24)) or not channels or not rate or block != channels * bits // 8:
        return None
    found = data_chunk(data, where)
    if found is None:
        return None
    return WavData(tag, rate, channels, bits, *found)


def read_wav(data: bytes, wav: WavData, start: int, count: int) -> np.ndarray:
    """A channel's samples ``start`` to ``start + count`` of ``wav`` (fewer where it ends), as float32
    (channels, n) in [-1, 1]: only those bytes are read."""
    first = min(start, wav.samples)
    n = min(count, wav.samples - first)
    at = wav.offset + first * wav.frame_bytes
    if wav.bits == 24:  # three bytes a sample: widened to int32 as FFmpeg's pcm_s24le does (the value shifted up 8 bits)
        raw = np.frombuffer(data, np.uint8, n * wav.frame_bytes, at).reshape(n * wav.channels, 3)
        wide = np.zeros((n * wav.channels, 4), np.uint8)
        wide[:, 1:] = raw
        values = wide.view("<i4").reshape(n, wav.channels).T.astype(np.float32, order="C")
        values *= np.float32(1 / 2147483648)
        return values
    dtype, scale, zero = _STORED[(wav.tag, wav.bits)]
    values = np.frombuffer(data, dtype, n * wav.channels, at).reshape(n, wav.channels).T.astype(np.float32, order="C")
    if zero:
        values -= np.float32(zero)
    if scale != 1.0:
        values *= np.float32(scale)
    return values
