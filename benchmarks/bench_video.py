"""Video clips, side by side in one run on the same videos: fastload's loader against a torch
DataLoader over a PyAV Dataset written as users write it (decode the video from its start, keep
every stride-th frame), one over a PyAV Dataset that seeks to the keyframe before its clip, and a torch DataLoader over torchcodec's own clip sampler
(``clips_at_random_indices``), all with 2 workers, 16-frame clips of stride 2, a random resized
crop to 224 and a flip, uint8 (B, T, C, H, W); plus the decode ceiling: the frames a second PyAV
decodes on one thread, every frame in order, times the workers. Each loader runs in rounds,
alternating, after one warm-up batch; the median of the rounds is reported.

    python benchmarks/make_videos.py data/videos --count 200
    fastload convert data/videos data/videos-wds --from videos --workers 2
    python benchmarks/bench_video.py data/videos data/videos-wds --rounds 3

On a GPU, ``--dali`` adds fastload's DALI video path (``backend="dali"``: NVDEC) and DALI's own
``fn.readers.video`` over the same files (random sequences, ``fn.random_resized_crop`` to 224 and a
flip), both on the GPU.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fastload
from fastload import transforms as T

FRAMES, STRIDE, SIZE, BATCH, WORKERS = 16, 2, 224, 8, 2


def random_resized_crop(clip: torch.Tensor, rng: random.Random) -> torch.Tensor:
    """torchvision's RandomResizedCrop(224) and a flip on a (T, C, H, W) uint8 clip, the same for every frame."""
    height, width = clip.shape[-2:]
    for _ in range(10):
        area = height * width * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top, left = rng.randint(0, height - h), rng.randint(0, width - w)
            break
    else:
        top, left, h, w = 0, 0, height, width
    crop = clip[..., top : top + h, left : left + w].float()
    out = torch.nn.functional.interpolate(crop, size=(SIZE, SIZE), mode="bilinear", antialias=True, align_corners=False)
    out = out.round().clamp(0, 255).to(torch.uint8)
    return out.flip(-1) if rng.random() < 0.5 else out


class VideoFiles(torch.utils.data.Dataset):
    """Video files and their labels; a subclass reads a clip of each."""

    def __init__(self, paths: list[Path], labels: list[int]) -> None:
        self.paths, self.labels = paths, labels

    def __len__(self) -> int:
        return len(self.paths)


class PyAVClips(VideoFiles):
    """A PyAV video Dataset as users write it: every frame decoded from the start, every stride-th
    kept; with ``seek``, FFmpeg's seek to the keyframe before a random start (frame numbers from the
    timestamps at the average rate), decoding on to the clip's last frame, each kept frame
    converted to RGB."""

    def __init__(self, paths: list[Path], labels: list[int], seek: bool = False) -> None:
        super().__init__(paths, labels)
        self.seek = seek

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        import av

        rng = random.Random(i * 7919 + int(time.time_ns() % 1000))
        with av.open(str(self.paths[i])) as container:
            kept = _seeking(container, rng) if self.seek else _from_start(container, rng)
        clip = torch.from_numpy(np.stack(kept)).permute(0, 3, 1, 2)
        return random_resized_crop(clip, rng), self.labels[i]


def _from_start(container, rng: random.Random) -> list[np.ndarray]:
    frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    start = rng.randint(0, max(len(frames) - (FRAMES - 1) * STRIDE - 1, 0))
    return [frames[min(start + k * STRIDE, len(frames) - 1)] for k in range(FRAMES)]


def _seeking(container, rng: random.Random) -> list[np.ndarray]:
    stream = container.streams.video[0]
    rate, first = stream.average_rate, stream.start_time or 0
    start = rng.randint(0, max(stream.frames - (FRAMES - 1) * STRIDE - 1, 0))
    wanted = [min(start + k * STRIDE, stream.frames - 1) for k in range(FRAMES)]
    container.seek(first + int(start / rate / stream.time_base), stream=stream, backward=True)
    kept: dict[int, np.ndarray] = {}
    for frame in container.decode(stream):
        number = round((frame.pts - first) * stream.time_base * rate)
        if number in wanted:
            kept[number] = frame.to_ndarray(format="rgb24")
        if number >= wanted[-1]:
            break
    return [kept[n] for n in wanted]


class TorchcodecClips(VideoFiles):
    """torchcodec's own clip sampler: one clip at a random index, 16 frames, 2 apart."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from torchcodec.decoders import VideoDecoder
        from torchcodec.samplers import clips_at_random_indices

        decoder = VideoDecoder(str(self.paths[i]), num_ffmpeg_threads=1, seek_mode="approximate")
        clip = clips_at_random_indices(decoder, num_clips=1, num_frames_per_clip=FRAMES, num_indices_between_frames=STRIDE).data[0]
        return random_resized_crop(clip, random.Random(i)), self.labels[i]


def clips_per_second(loader, clips: int) -> float:
    """Clips a second after the first batch (start-up left out), over ``clips`` clips, epochs as needed."""
    done, began = 0, None
    while True:
        for batch, _ in loader:
            assert batch.shape[1:] == (FRAMES, 3, SIZE, SIZE) and batch.dtype == torch.uint8
            if began is None:
                began = time.perf_counter()
                continue
            done += len(batch)
            if done >= clips:
                return done / (time.perf_counter() - began)


class DaliReaderClips:
    """DALI's own video reader over the files: random 16-frame sequences of stride 2 on the GPU,
    a random resized crop to 224 and a flip, (B, T, C, H, W) uint8, with labels."""

    def __init__(self, paths: list[Path], labels: list[int]) -> None:
        import nvidia.dali as dali
        import nvidia.dali.fn as fn
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        @dali.pipeline_def(batch_size=BATCH, num_threads=WORKERS, device_id=torch.cuda.current_device())
        def pipeline():
            video, label = fn.readers.video(device="gpu", filenames=[str(p) for p in paths], labels=labels, sequence_length=FRAMES,
                                            stride=STRIDE, random_shuffle=True, initial_fill=len(paths), name="reader")  # type: ignore[misc]  # its stub returns None
            video = fn.random_resized_crop(video, size=(SIZE, SIZE))
            video = fn.flip(video, horizontal=fn.random.coin_flip())
            return fn.transpose(video, perm=[0, 3, 1, 2], output_layout="FCHW"), label

        pipe = pipeline()
        pipe.build()
        self.iterator = DALIGenericIterator(pipe, ["clips", "labels"], reader_name="reader", auto_reset=True)

    def __iter__(self):
        for (batch,) in self.iterator:
            yield batch["clips"], batch["labels"]


def decode_ceiling(paths: list[Path]) -> float:
    """Frames a second PyAV decodes on one thread, every frame of every video in order."""
    import av

    frames, began = 0, time.perf_counter()
    for path in paths:
        with av.open(io.BytesIO(path.read_bytes())) as container:
            stream = container.streams.video[0]
            stream.thread_type, stream.codec_context.thread_count = "SLICE", 1
            for _ in container.decode(stream):
                frames += 1
    return frames / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("videos", type=Path, help="the raw videos (class folders of .mp4)")
    parser.add_argument("dataset", type=Path, help="the same videos converted (fastload convert --from videos)")
    parser.add_argument("--clips", type=int, default=160, help="clips timed per loader and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dali", action="store_true", help="on a GPU: fastload's DALI video path and DALI's fn.readers.video too")
    args = parser.parse_args()
    paths = sorted(args.videos.rglob("*.mp4"))
    classes = sorted({p.parent.name for p in paths})
    labels = [classes.index(p.parent.name) for p in paths]
    assert len(paths) == len(fastload.open(args.dataset)), "the raw folder and the dataset hold other videos"
    loaders: dict[str, Callable[[], Iterable[Any]]] = {
        "fastload.DataLoader": lambda: fastload.DataLoader(args.dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                                           clip=fastload.Clip(frames=FRAMES, stride=STRIDE), transform=T.train(SIZE)),
        "torch DataLoader + PyAV Dataset": lambda: torch.utils.data.DataLoader(PyAVClips(paths, labels), batch_size=BATCH, shuffle=True,
                                                                                num_workers=WORKERS, persistent_workers=True),
        "torch DataLoader + PyAV seeking Dataset": lambda: torch.utils.data.DataLoader(PyAVClips(paths, labels, seek=True), batch_size=BATCH,
                                                                                    shuffle=True, num_workers=WORKERS, persistent_workers=True),
        "torch DataLoader + torchcodec clips_at_random_indices": lambda: torch.utils.data.DataLoader(
            TorchcodecClips(paths, labels), batch_size=BATCH, shuffle=True, num_workers=WORKERS, persistent_workers=True),
    }
    if args.dali:
        loaders["fastload.DataLoader(backend='dali')"] = lambda: fastload.DataLoader(
            args.dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS, backend="dali",
            clip=fastload.Clip(frames=FRAMES, stride=STRIDE), transform=T.train(SIZE))
        loaders["DALI fn.readers.video"] = lambda: DaliReaderClips(paths, labels)
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    ceilings = []
    for _ in range(args.rounds):
        for name, make in loaders.items():
            loader = make()
            rates[name].append(clips_per_second(loader, args.clips))
            getattr(loader, "close", lambda: None)()
            del loader
        ceilings.append(decode_ceiling(paths) * WORKERS)
    median = {name: float(np.median(r)) for name, r in rates.items()}
    ceiling = float(np.median(ceilings))
    base = median["torch DataLoader + PyAV Dataset"]
    seeking = median["torch DataLoader + PyAV seeking Dataset"]
    codec = median["torch DataLoader + torchcodec clips_at_random_indices"]
    report = {
        name: {"clips/s": round(rate, 2), "clip frames/s": round(rate * FRAMES, 1), "x PyAV Dataset": round(rate / base, 2),
               "x PyAV seeking Dataset": round(rate / seeking, 2), "x torchcodec sampler": round(rate / codec, 2),
               "rounds": [round(r, 2) for r in rates[name]]}
        for name, rate in median.items()
    }
    report["decode ceiling"] = {"frames/s (every frame, 1 thread x 2 workers)": round(ceiling, 1)}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
