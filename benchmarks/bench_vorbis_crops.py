"""Ogg Vorbis crops on real recordings (benchmarks/fetch_audio.py), two ways in one process:
fastload's own path (fastload/av/ogg.py: the pages walked, a bare decoder) and FFmpeg's demuxer
path (a container opened, a seek, its frames; what fastload.av.pyav does for other codecs, reached
here by its plain-Vorbis check answering None). First a check: crops of every recording at its
start, its end and between, each compared with the recording decoded whole by FFmpeg (equal, sample
for sample, or counted as a difference); then the time of one random 2 s crop a recording, median
of alternating passes.

    python benchmarks/bench_vorbis_crops.py data/audio --passes 7
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import time
from pathlib import Path

import av
import numpy as np

from fastload.av import pyav
from fastload.av.facts import AudioFacts


def decoded_whole(data: bytes) -> np.ndarray:
    """(channels, n) float32: every frame FFmpeg's demuxer and decoder give, from the start."""
    with av.open(io.BytesIO(data)) as container:
        return np.concatenate([frame.to_ndarray() for frame in container.decode(audio=0)], axis=1)


def crops_of(facts: AudioFacts, rng: random.Random) -> list[tuple[int, int]]:
    """A recording's first, last and middle 2 s crops, eight random ones and five short ones."""
    span = min(2 * facts.rate, facts.samples)
    last = facts.samples - span
    starts = sorted({0, last, last // 2, *(rng.randint(0, last) for _ in range(8))})
    short = [(start, min(rng.randint(1, 3000), facts.samples - start)) for start in (rng.randrange(facts.samples) for _ in range(5))]
    return [(start, span) for start in starts] + short


def crops(data: bytes, where: str, facts: AudioFacts, wanted: list[tuple[int, int]], demuxer: bool) -> list[np.ndarray]:
    """``wanted`` crops of one recording, by fastload's Ogg path or (``demuxer``) FFmpeg's demuxer."""
    plain = pyav._plain_vorbis
    if demuxer:
        pyav._plain_vorbis = lambda data, facts: None
    try:
        return list(pyav.decode_crops(data, where, facts, wanted, time.monotonic() + 600))
    finally:
        pyav._plain_vorbis = plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recordings", type=Path)
    parser.add_argument("--passes", type=int, default=7)
    args = parser.parse_args()
    paths = sorted(p for p in args.recordings.rglob("*") if p.suffix in (".ogg", ".oga"))
    files = [(str(p), p.read_bytes()) for p in paths]
    facts = [pyav.probe_audio(data, where) for where, data in files]
    rng = random.Random(1)
    checked = {"crops": 0, "fastload differs": 0, "demuxer differs": 0}
    for (where, data), fact in zip(files, facts):
        whole = decoded_whole(data)
        wanted = crops_of(fact, rng)
        for demuxer, name in ((False, "fastload differs"), (True, "demuxer differs")):
            for (start, count), got in zip(wanted, crops(data, where, fact, wanted, demuxer)):
                checked[name] += not np.array_equal(got, whole[:, start : start + count])
        checked["crops"] += len(wanted)
    timed = [(min(2 * f.rate, f.samples), f) for f in facts]
    one = [[(rng.randint(0, f.samples - span), span)] for span, f in timed]
    ms: dict[str, list[float]] = {"fastload": [], "demuxer": []}
    for _ in range(args.passes):
        for name, demuxer in (("fastload", False), ("demuxer", True)):
            began = time.perf_counter()
            for (where, data), fact, wanted in zip(files, facts, one):
                crops(data, where, fact, wanted, demuxer)
            ms[name].append(1000 * (time.perf_counter() - began) / len(files))
    print(json.dumps({"recordings": len(files), "check": checked,
                      "ms_per_2s_crop": {name: round(statistics.median(t), 3) for name, t in ms.items()},
                      "passes": {name: [round(x, 3) for x in t] for name, t in ms.items()}}, indent=1))


if __name__ == "__main__":
    main()
