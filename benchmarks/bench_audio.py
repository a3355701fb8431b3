"""Audio crops, side by side in one run on the same real recordings (benchmarks/fetch_audio.py):
fastload's loader (``audio=fastload.Audio(...)``: each crop decoded from a seek before it, mixed
down and resampled by torchaudio's recipe in the workers) against a torch DataLoader over a Dataset
written as users write it: ``soundfile.read`` of the crop (libsndfile seeks to it), the channels'
mean, then torchaudio's default resampler (``torchaudio.functional.resample``'s windowed sinc,
written out here: torchaudio cannot be installed beside this torch), zero-padded. Each: 2 workers,
batches of 16 random 2 s crops at 16 kHz mono with their lengths, the label beside. Each loader
runs whole epochs in rounds, alternating, after one warm-up epoch; the median round is reported.
Then each side's cost a crop in one process on one thread (no workers, nothing crossing processes).
With ``--torchcodec-python`` (a Python whose environment has torch and torchcodec:
torchcodec's wheels are built for one torch release each), a third side: a Dataset decoding each
crop with torchcodec's ``AudioDecoder`` (benchmarks/bench_audio_torchcodec.py, in its own process,
its rounds alternating with the others'). Conversion: ``fastload convert --from audio`` (every
recording decoded once for its stream facts) against webdataset's ``TarWriter`` storing the same
files, input MB/s.

    python benchmarks/fetch_audio.py data/audio
    python benchmarks/bench_audio.py data/audio --rounds 3 --torchcodec-python data/venv-tc/bin/python
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from functools import lru_cache
from pathlib import Path

import soundfile
import torch

import fastload
from fastload.converters import ConvertOptions, convert

SECONDS, RATE, BATCH, WORKERS = 2.0, 16000, 16, 2
LENGTH = round(SECONDS * RATE)


@lru_cache(maxsize=32)
def sinc_kernel(orig: int, new: int) -> tuple[torch.Tensor, int]:
    """torchaudio.functional._get_sinc_resample_kernel (lowpass_filter_width 6, rolloff 0.99, Hann window)."""
    gcd = math.gcd(orig, new)
    orig, new = orig // gcd, new // gcd
    base = min(orig, new) * 0.99
    width = math.ceil(6 * orig / base)
    idx = torch.arange(-width, width + orig, dtype=torch.float32)[None, None] / orig
    t = (torch.arange(0, -new, -1, dtype=torch.float32)[:, None, None] / new + idx) * base
    t = t.clamp_(-6, 6)
    window = torch.cos(t * math.pi / 6 / 2) ** 2
    t *= math.pi
    kernels = torch.where(t == 0, torch.tensor(1.0), t.sin() / t) * window * (base / orig)
    return kernels, width


def resample(wave: torch.Tensor, orig: int, new: int) -> torch.Tensor:
    """torchaudio.functional.resample(wave, orig, new) for (channels, n) float32."""
    if orig == new:
        return wave
    kernel, width = sinc_kernel(orig, new)
    gcd = math.gcd(orig, new)
    o, n = orig // gcd, new // gcd
    padded = torch.nn.functional.pad(wave, (width, width + o))
    out = torch.nn.functional.conv1d(padded[:, None], kernel, stride=o).transpose(1, 2).reshape(wave.shape[0], -1)
    return out[:, : math.ceil(n * wave.shape[1] / o)]


class SoundfileCrops(torch.utils.data.Dataset):
    """Random 2 s crops read by soundfile (the files' lengths and rates read once, as a user's index would)."""

    def __init__(self, paths: list[Path], labels: list[int]) -> None:
        self.paths, self.labels = paths, labels
        self.info = [(soundfile.info(str(p)).frames, soundfile.info(str(p)).samplerate) for p in paths]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        frames, rate = self.info[i]
        span = round(SECONDS * rate)
        start = random.randint(0, max(frames - span, 0))
        data, _ = soundfile.read(str(self.paths[i]), start=start, frames=min(span, frames), dtype="float32", always_2d=True)
        wave = resample(torch.from_numpy(data.T.mean(axis=0, keepdims=True)), rate, RATE)[:, :LENGTH]
        out = torch.zeros(1, LENGTH)
        out[:, : wave.shape[1]] = wave
        return out, wave.shape[1], self.labels[i]


def time_epoch(loader) -> tuple[float, int]:
    """(seconds, samples) of one pass over ``loader``."""
    start, samples = time.perf_counter(), 0
    for batch in loader:
        samples += batch[0].shape[0]
    return time.perf_counter() - start, samples


def in_process_ms(dataset: Path, paths: list[Path], labels: list[int], rounds: int) -> dict[str, float]:
    """Milliseconds a crop costs each side in this one process on one thread (no workers, no batches
    crossing processes): fastload's loader with num_workers=0 against the Dataset's __getitem__."""
    torch.set_num_threads(1)
    inline = fastload.DataLoader(dataset, batch_size=BATCH, shuffle=True, audio=fastload.Audio(seconds=SECONDS, rate=RATE))
    baseline = SoundfileCrops(paths, labels)
    times: dict[str, list[float]] = {"fastload": [], "soundfile+resample": []}
    for _ in range(rounds):
        seconds, samples = time_epoch(inline)
        times["fastload"].append(1000 * seconds / samples)
        start = time.perf_counter()
        for i in range(len(baseline)):
            baseline[i]
        times["soundfile+resample"].append(1000 * (time.perf_counter() - start) / len(baseline))
    return {name: round(statistics.median(t), 2) for name, t in times.items()}


def conversion(folder: Path, out: Path) -> dict[str, float]:
    """Input MB/s of fastload convert --from audio (2 workers) and of webdataset's TarWriter over the same files."""
    import webdataset

    files = sorted(p for p in folder.rglob("*") if p.is_file())
    size = sum(p.stat().st_size for p in files) / 1e6
    start = time.perf_counter()
    convert(str(folder), str(out / "fastload"), ConvertOptions(source="audio", workers=WORKERS), quiet=True)
    fastload_s = time.perf_counter() - start
    start = time.perf_counter()
    with webdataset.TarWriter(str(out / "wds.tar")) as writer:
        for i, path in enumerate(files):
            writer.write({"__key__": f"{i:06d}", path.suffix[1:]: path.read_bytes(), "cls": path.parent.name})
    wds_s = time.perf_counter() - start
    return {"input_mb": round(size, 1), "fastload_mb_s": round(size / fastload_s, 1), "webdataset_mb_s": round(size / wds_s, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recordings", type=Path, help="class folders of recordings (benchmarks/fetch_audio.py)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2, help="epochs a loader runs each round")
    parser.add_argument("--torchcodec-python", help="a Python with torch and torchcodec installed: adds torchcodec's AudioDecoder Dataset")
    args = parser.parse_args()
    torchcodec = None
    if args.torchcodec_python:
        script = Path(__file__).with_name("bench_audio_torchcodec.py")
        torchcodec = subprocess.Popen([args.torchcodec_python, str(script), str(args.recordings), "--epochs", str(args.epochs)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    work = Path(tempfile.mkdtemp(prefix="bench-audio-"))
    try:
        converted = conversion(args.recordings, work)
        dataset = work / "fastload"
        classes = sorted(p.name for p in args.recordings.iterdir() if p.is_dir())
        paths = sorted(p for c in classes for p in (args.recordings / c).iterdir() if p.is_file())
        labels = [classes.index(p.parent.name) for p in paths]
        loaders = {
            "fastload": fastload.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                            audio=fastload.Audio(seconds=SECONDS, rate=RATE)),
            "soundfile+resample": torch.utils.data.DataLoader(SoundfileCrops(paths, labels), batch_size=BATCH, shuffle=True,
                                                              num_workers=WORKERS, persistent_workers=True),
        }
        rates: dict[str, list[float]] = {name: [] for name in loaders}
        versions = {}
        if torchcodec is not None:
            versions["torchcodec"] = ask(torchcodec, None)["ready"]  # its warm-up epoch done
            rates["torchcodec"] = []
        for loader in loaders.values():
            time_epoch(loader)  # warm-up: workers started, files in the page cache
        for _ in range(args.rounds):
            for name, loader in loaders.items():
                seconds, samples = 0.0, 0
                for _ in range(args.epochs):
                    s, n = time_epoch(loader)
                    seconds, samples = seconds + s, samples + n
                rates[name].append(samples / seconds)
            if torchcodec is not None:
                rates["torchcodec"].append(ask(torchcodec, "round")["crops_per_s"])
        medians = {name: round(statistics.median(r), 1) for name, r in rates.items()}
        for loader in loaders.values():
            del loader  # the workers end before the one-process measurement
        loaders.clear()
        per_crop = in_process_ms(dataset, paths, labels, args.rounds)
        if torchcodec is not None:
            per_crop["torchcodec"] = round(statistics.median(ask(torchcodec, "inline")["ms_per_crop"] for _ in range(args.rounds)), 2)
        speedups = {f"x {name}": round(medians["fastload"] / medians[name], 2) for name in medians if name != "fastload"}
        result = {
            "recordings": len(paths), "crop_s": SECONDS, "rate": RATE, "batch": BATCH, "workers": WORKERS, "rounds": args.rounds,
            "crops_per_s": medians, "rounds_crops_per_s": {k: [round(x, 1) for x in v] for k, v in rates.items()},
            "speedup": speedups, "conversion": converted, "in_process_ms_per_crop": per_crop, **versions,
        }
        print(json.dumps(result, indent=1))
    finally:
        if torchcodec is not None:
            torchcodec.stdin.close()  # type: ignore[union-attr]
            torchcodec.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)


def ask(process: subprocess.Popen, command: str | None) -> dict:
    """Send ``command`` (None: nothing) to the torchcodec side and return its JSON answer."""
    if command is not None:
        process.stdin.write(command + "\n")  # type: ignore[union-attr]
        process.stdin.flush()  # type: ignore[union-attr]
    line = process.stdout.readline()  # type: ignore[union-attr]
    if not line:
        raise RuntimeError(f"the torchcodec side ended (exit status {process.wait()})")
    return json.loads(line)


if __name__ == "__main__":
    main()
