"""Crops of long recordings in Matroska (FLAC, Opus, Vorbis; what a video's sound track in an
.mkv is), two ways in one process: this tree's fastload.av.pyav and a baseline revision's (its
pyav.py read from git, as benchmarks/bench_audio_crops.py does). Each codec's recording (a noisy
chirp of ``--seconds``, stereo) is cropped at ``--crops`` random 2 s spans, one decode_crops call a
crop (as a worker makes them), each checked against the recording decoded whole; the mean ms a crop.

    python benchmarks/bench_matroska_crops.py --baseline dd531b9 --seconds 60 --crops 20
"""

from __future__ import annotations

import argparse
import io
import json
import time
from fractions import Fraction

import av
import numpy as np
from bench_audio_crops import baseline, decoded_whole

from fastload.av import pyav

ENCODERS = {"flac": ("flac", 44100), "opus": ("libopus", 48000), "vorbis": ("vorbis", 44100)}


def matroska(encoder: str, rate: int, seconds: float) -> bytes:
    """A stereo chirp (20 Hz to a third of ``rate``) with noise, ``seconds`` long, encoded by ``encoder`` in Matroska."""
    t = np.arange(int(rate * seconds)) / rate
    tone = np.sin(2 * np.pi * (20 * t + (rate / 3 - 20) * t * t / (2 * seconds)))
    noise = np.random.default_rng(1).standard_normal((2, t.size))
    samples = (0.4 * tone + 0.05 * noise).astype(np.float32)
    out_buf = io.BytesIO()
    with av.open(out_buf, mode="w", format="matroska") as out:
        stream = out.add_stream(encoder, rate=rate, layout="stereo")
        if encoder == "vorbis":
            stream.codec_context.options = {"strict": "experimental"}  # FFmpeg's own Vorbis encoder
        convert = av.AudioResampler(format=stream.codec_context.codec.audio_formats[0].name, layout="stereo", rate=rate)
        for start in range(0, t.size, 1024):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[:, start : start + 1024]), format="fltp", layout="stereo")
            frame.sample_rate, frame.pts, frame.time_base = rate, start, Fraction(1, rate)
            for part in convert.resample(frame):
                out.mux(stream.encode(part))
        for part in convert.resample(None):
            out.mux(stream.encode(part))
        out.mux(stream.encode(None))
    return out_buf.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="the git revision whose fastload/av/pyav.py is compared")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--crops", type=int, default=20)
    args = parser.parse_args()
    old = baseline(args.baseline)
    report = {}
    for codec, (encoder, rate) in ENCODERS.items():
        data = matroska(encoder, rate, args.seconds)
        facts = pyav.probe_audio(data, codec)
        whole = decoded_whole(data)
        starts = np.random.default_rng(0).integers(0, facts.samples - 2 * rate, args.crops)
        crops = [(int(start), 2 * rate) for start in starts]
        for name, module in (("new", pyav), ("old", old)):
            getattr(module, "_PLACES", {}).clear()  # nothing kept from before: the first crop counts its packets
            began = time.perf_counter()
            got = [next(iter(module.decode_crops(data, codec, facts, [crop], time.monotonic() + 600))) for crop in crops]
            ms = 1000 * (time.perf_counter() - began) / len(crops)
            equal = sum(np.array_equal(g, whole[:, s : s + n]) for g, (s, n) in zip(got, crops))
            report[f"{codec} {name}"] = {"ms_per_crop": round(ms, 2), "equal": f"{equal}/{len(crops)}"}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
