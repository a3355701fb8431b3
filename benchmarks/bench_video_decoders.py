"""Which FFmpeg binding decodes fastload's clips fastest: PyAV or torchcodec, side by side in one
process on the same videos and the same clip plans (16 frames, stride 2, a random start, a
RandomResizedCrop to 224 and a flip, planned as the loader plans them), each decoder on one thread.

- ``pyav-seek``: fastload's decoder (fastload.av.pyav): a seek to the keyframe the stream facts
  name, decoding up to the clip's last frame, each kept frame converted to RGB at the smallest
  size that keeps the crop's resolution, then the crop resampled (libjpeg-turbo extension).
- ``pyav-seek-full``: the same, each kept frame converted to RGB at its full size.
- ``torchcodec``: ``VideoDecoder(bytes, seek_mode=...).get_frames_at(frames)`` (it seeks to the
  keyframe itself), full-size RGB, then the same crop resample.
- the decode ceiling: every frame of each video decoded in order by PyAV, nothing converted.

    python benchmarks/bench_video_decoders.py data/videos --clips 200
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Literal

import numpy as np

from fastload.av.clips import CLIP_SALT, Clip, plan_clips
from fastload.av.facts import StreamFacts
from fastload.av.pyav import decode_frames, probe
from fastload.decode.cpu import turbo
from fastload.transforms import apply_plan, dct_min_size, plan, scaled_box, train
from fastload.workers.rng import sample_rng

CLIP = Clip(frames=16, stride=2, sampling="random")


def resample(pixels: np.ndarray, box_plan, height: int, width: int, out: np.ndarray) -> None:
    """The planned crop of one frame (``pixels``: the frame at any scale of height x width) into ``out`` (C, H, W)."""
    if turbo is not None:
        box = scaled_box(box_plan, pixels, height, width)
        turbo.resample_into(np.ascontiguousarray(pixels), pixels.shape[0], pixels.shape[1], box, out, out.shape[1], out.shape[2], box_plan.flip)
    else:
        np.copyto(out, apply_plan(pixels, box_plan, height, width).transpose(2, 0, 1))


def run_pyav(videos: list[tuple[bytes, StreamFacts]], jobs: list, reduced: bool) -> float:
    out = np.empty((CLIP.frames, 3, 224, 224), np.uint8)
    began = time.perf_counter()
    for number, frames, box_plan in jobs:
        data, facts = videos[number]
        size = dct_min_size(box_plan, facts.height, facts.width) if reduced else (0, 0)
        for t, (_, pixels) in enumerate(decode_frames(data, str(number), facts, frames, size if size != (0, 0) else None, time.monotonic() + 30)):
            resample(pixels, box_plan, facts.height, facts.width, out[t])
    return time.perf_counter() - began


def run_torchcodec(videos: list[tuple[bytes, StreamFacts]], jobs: list, seek_mode: Literal["exact", "approximate"]) -> float:
    from torchcodec.decoders import VideoDecoder

    out = np.empty((CLIP.frames, 3, 224, 224), np.uint8)
    began = time.perf_counter()
    for number, frames, box_plan in jobs:
        data, facts = videos[number]
        decoder = VideoDecoder(data, dimension_order="NHWC", num_ffmpeg_threads=1, seek_mode=seek_mode)
        batch = decoder.get_frames_at(list(frames)).data.numpy()
        for t in range(len(frames)):
            resample(batch[t], box_plan, facts.height, facts.width, out[t])
    return time.perf_counter() - began


def decode_ceiling(videos: list[tuple[bytes, StreamFacts]]) -> float:
    """Frames a second PyAV decodes on one thread, every frame in order, nothing converted."""
    import io

    import av

    frames, began = 0, time.perf_counter()
    for data, _ in videos:
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.video[0]
            stream.codec_context.thread_count = 1
            for _ in container.decode(stream):
                frames += 1
    return frames / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("videos", type=Path, help="a folder of .mp4 files (benchmarks/make_videos.py)")
    parser.add_argument("--clips", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    paths = sorted(args.videos.rglob("*.mp4"))
    videos = [(p.read_bytes(), probe(p.read_bytes(), str(p))) for p in paths]
    transforms = train(224)
    jobs = []
    for i in range(args.clips):
        number = i % len(videos)
        facts = videos[number][1]
        (frames,) = plan_clips(CLIP, facts.frames, sample_rng(0 ^ CLIP_SALT, 0, i))
        jobs.append((number, frames, plan(transforms, facts.height, facts.width, sample_rng(0, 0, i))))
    kept = args.clips * CLIP.frames
    runs: dict[str, list[float]] = {"pyav-seek": [], "pyav-seek-full": [], "torchcodec-approximate": [], "torchcodec-exact": []}
    ceilings = []
    for _ in range(args.rounds):
        runs["pyav-seek"].append(kept / run_pyav(videos, jobs, reduced=True))
        runs["pyav-seek-full"].append(kept / run_pyav(videos, jobs, reduced=False))
        runs["torchcodec-approximate"].append(kept / run_torchcodec(videos, jobs, "approximate"))
        runs["torchcodec-exact"].append(kept / run_torchcodec(videos, jobs, "exact"))
        ceilings.append(decode_ceiling(videos))
    result = {name: round(float(np.median(rates)), 1) for name, rates in runs.items()}
    result["decode ceiling (frames/s, every frame)"] = round(float(np.median(ceilings)), 1)
    print(json.dumps({"clip frames per second (one thread)": result, "videos": len(videos), "clips": args.clips}, indent=1))


if __name__ == "__main__":
    main()
