"""Crops of the codecs read through FFmpeg's demuxer and a seek, on real recordings
(benchmarks/fetch_audio.py holds Ogg Vorbis and WAV: each is re-encoded here as MP3, FLAC, Opus in
Ogg and in WebM, and AAC in M4A, by fastload's re-encoder), two ways in one process: this tree's
fastload.av.pyav and a baseline revision's (its pyav.py read from git). First a check: every
recording's crops at its start, its end, its last packet, its middle, random and short ones, each
compared with the recording decoded whole by PyAV from its start: equal sample for sample, or its
largest difference, and, where that is over 1e-4, whether it is the recording's samples from
elsewhere (misplaced: shifted by up to 2048 samples, within 1e-4). Then the time of one random 2 s crop a recording, median of
alternating passes, by codec (this tree's also for a second random crop of each recording, after the first).

    python benchmarks/bench_audio_crops.py data/audio --baseline 145f698 --passes 5
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import av
import numpy as np

from fastload.av import pyav
from fastload.av.facts import AudioFacts
from fastload.errors import SampleError

# extension: (encoder, muxer, a rate it takes for any other): what the recordings are re-encoded as
FORMATS = {"mp3": ("libmp3lame", "mp3", 44100), "flac": ("flac", "flac", 0), "opus": ("libopus", "ogg", 48000),
           "weba": ("libopus", "webm", 48000), "m4a": ("aac", "ipod", 44100)}
RATES = {"mp3": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000), "opus": (48000,), "weba": (48000,),
         "m4a": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000)}


def baseline(rev: str) -> ModuleType:
    """fastload/av/pyav.py as it was at ``rev``, imported as a module of its own."""
    source = subprocess.run(["git", "show", f"{rev}:fastload/av/pyav.py"], check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "pyav_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("pyav_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reencoded(data: bytes, where: str, ext: str) -> bytes:
    """The recording re-encoded as ``ext`` (FORMATS) by fastload's re-encoder, at its own rate where the encoder takes it."""
    encoder, muxer, other = FORMATS[ext]
    rate = pyav.probe_audio(data, where).rate
    pyav.AUDIO_ENCODERS[ext] = (encoder, muxer, ext)
    return pyav.reencode_audio(data, where, ext, rate if ext not in RATES or rate in RATES[ext] else other)


def decoded_whole(data: bytes) -> np.ndarray:
    """(channels, n) float32 in [-1, 1]: every frame PyAV's demuxer and decoder give, from the start."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        gathered = pyav._Gathered("whole", stream.codec_context.channels)
        for frame in container.decode(stream):
            gathered.add(frame, 0, frame.samples)
    return gathered.samples()


def crops_of(facts: AudioFacts, rng: random.Random, last_packet: int) -> list[tuple[int, int]]:
    """A recording's first, last and middle 2 s crops, ten random ones, five short ones and its last packet's samples."""
    span = min(2 * facts.rate, facts.samples)
    last = facts.samples - span
    starts = sorted({0, last, last // 2, *(rng.randint(0, last) for _ in range(10))})
    short = [(start, min(rng.randint(1, 3000), facts.samples - start)) for start in (rng.randrange(facts.samples) for _ in range(5))]
    return [(start, span) for start in starts] + short + [(facts.samples - last_packet, last_packet)]


def misplaced_by(got: np.ndarray, whole: np.ndarray, start: int) -> int | None:
    """The shift (up to 2048 samples either way, not 0) at which ``got`` is the whole decode's samples within 1e-4, or None."""
    n = got.shape[1]
    if n < 64:
        return None
    head = got[:, :256]
    for shift in sorted(range(-2048, 2049), key=abs):
        at = start + shift
        if (shift and at >= 0 and at + n <= whole.shape[1] and float(np.abs(whole[:, at : at + head.shape[1]] - head).max()) <= 1e-4
                and float(np.abs(whole[:, at : at + n] - got).max()) <= 1e-4):
            return shift
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recordings", type=Path)
    parser.add_argument("--baseline", required=True, help="the git revision whose fastload/av/pyav.py is compared")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--limit", type=int, default=0, help="the first N recordings only (0: all)")
    args = parser.parse_args()
    old = baseline(args.baseline)
    paths = sorted(p for p in args.recordings.rglob("*") if p.suffix in (".ogg", ".oga", ".wav"))[: args.limit or None]
    rng = random.Random(1)
    report: dict[str, Any] = {"recordings": len(paths), "baseline": args.baseline, "check": {}, "ms_per_2s_crop": {}, "passes": {}}
    for ext in args.formats.split(","):
        files = []
        for path in paths:
            try:
                data = reencoded(path.read_bytes(), str(path), ext)
                files.append((f"{path}.{ext}", data, pyav.probe_audio(data, str(path))))
            except Exception as exc:  # a recording the encoder does not take (a rate or layout): counted, named
                report.setdefault("not_encoded", []).append(f"{path.name} as {ext}: {exc}")
        checked: dict[str, dict[str, Any]] = {name: {"crops": 0, "equal": 0, "differ": 0, "max_diff": 0.0, "misplaced": 0, "shifts": {}} for name in ("new", "old")}
        for where, data, facts in files:
            whole = decoded_whole(data)
            with av.open(io.BytesIO(data)) as container:
                last_packet = [frame.samples for frame in container.decode(audio=0)][-1]
            wanted = crops_of(facts, rng, min(last_packet, facts.samples))
            for name, module in (("new", pyav), ("old", old)):
                counts = checked[name]
                try:
                    crops = list(module.decode_crops(data, where, facts, wanted, time.monotonic() + 600))
                except SampleError as exc:  # counted, named, with the crops asked for
                    counts.setdefault("errors", []).append(f"{exc} (crops {wanted})")
                    continue
                for (start, count), got in zip(wanted, crops):
                    truth = whole[:, start : start + count]
                    counts["crops"] += 1
                    if got.shape == truth.shape and np.array_equal(got, truth):
                        counts["equal"] += 1
                        continue
                    counts["differ"] += 1
                    if got.shape == truth.shape:
                        counts["max_diff"] = max(counts["max_diff"], float(np.abs(got - truth).max()))
                    shift = None if got.shape == truth.shape and float(np.abs(got - truth).max()) <= 1e-4 else misplaced_by(got, whole, start)
                    if shift is not None:  # a crop within 1e-4 where it belongs is not looked for elsewhere (a smooth one matches itself shifted)
                        counts["misplaced"] += 1
                        counts["shifts"][shift] = counts["shifts"].get(shift, 0) + 1
        report["check"][ext] = {"recordings": len(files), **checked}
        one, two = ([[(rng.randint(0, f.samples - min(2 * f.rate, f.samples)), min(2 * f.rate, f.samples))] for _, _, f in files]
                    for _ in range(2))
        ms: dict[str, list[float]] = {"new": [], "old": [], "new_second": []}
        for _ in range(args.passes):
            # each pass's first crops with nothing a module keeps per recording (Matroska's counted packet
            # places), then, for this tree, another random crop of each: what a later epoch's crop costs
            for name, module, wanted_crops in (("new", pyav, one), ("new_second", pyav, two), ("old", old, one)):
                kept = getattr(module, "_PLACES", None)
                if kept is not None and name != "new_second":
                    kept.clear()
                began = time.perf_counter()
                for (where, data, facts), wanted in zip(files, wanted_crops):
                    with contextlib.suppress(SampleError):  # the check counted it
                        list(module.decode_crops(data, where, facts, wanted, time.monotonic() + 600))
                ms[name].append(1000 * (time.perf_counter() - began) / max(1, len(files)))
        report["ms_per_2s_crop"][ext] = {name: round(statistics.median(t), 3) for name, t in ms.items() if t}  # --passes 0: the check alone
        report["passes"][ext] = {name: [round(x, 3) for x in t] for name, t in ms.items()}
        print(ext, json.dumps(report["check"][ext]), report["ms_per_2s_crop"][ext], file=sys.stderr, flush=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
