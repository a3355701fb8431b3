"""torchcodec's side of benchmarks/bench_audio.py, run by it in torchcodec's own environment
(torchcodec's wheels are built for one torch release each, so it gets a venv of its own): a torch
DataLoader over a Dataset that decodes each random 2 s crop with ``torchcodec.decoders.AudioDecoder``
(its sample_rate=16000, num_channels=1: FFmpeg decodes from a seek, resamples and mixes down),
zero-padded, with its length and label; 2 workers, batches of 16. It reads commands on stdin and
answers a JSON line each: ``round`` runs EPOCHS epochs (crops a second), ``inline`` times the
Dataset's ``__getitem__`` in this process on one thread (ms a crop).

    python benchmarks/bench_audio.py data/audio --torchcodec-python /work/venv-tc/bin/python
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
from torchcodec.decoders import AudioDecoder

SECONDS, RATE, BATCH, WORKERS = 2.0, 16000, 16, 2
LENGTH = round(SECONDS * RATE)


class TorchcodecCrops(torch.utils.data.Dataset):
    """Random 2 s crops decoded by torchcodec at 16 kHz mono (the files' lengths read once, as a user's index would)."""

    def __init__(self, paths: list[Path], labels: list[int]) -> None:
        self.paths, self.labels = paths, labels
        self.seconds = [AudioDecoder(str(p)).metadata.duration_seconds_from_header for p in paths]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        length = self.seconds[i]
        start = random.uniform(0.0, max(length - SECONDS, 0.0))
        decoder = AudioDecoder(str(self.paths[i]), sample_rate=RATE, num_channels=1)
        wave = decoder.get_samples_played_in_range(start, min(start + SECONDS, length)).data[:, :LENGTH]
        out = torch.zeros(1, LENGTH)
        out[:, : wave.shape[1]] = wave
        return out, wave.shape[1], self.labels[i]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recordings", type=Path)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    classes = sorted(p.name for p in args.recordings.iterdir() if p.is_dir())
    paths = sorted(p for c in classes for p in (args.recordings / c).iterdir() if p.is_file())
    dataset = TorchcodecCrops(paths, [classes.index(p.parent.name) for p in paths])
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS, persistent_workers=True)
    for _ in loader:  # warm-up: workers started, files in the page cache
        pass
    print(json.dumps({"ready": torchcodec_version()}), flush=True)
    for command in sys.stdin:
        if command.strip() == "round":
            start, samples = time.perf_counter(), 0
            for _ in range(args.epochs):
                for batch in loader:
                    samples += batch[0].shape[0]
            print(json.dumps({"crops_per_s": samples / (time.perf_counter() - start)}), flush=True)
        elif command.strip() == "inline":
            torch.set_num_threads(1)
            start = time.perf_counter()
            for i in range(len(dataset)):
                dataset[i]
            print(json.dumps({"ms_per_crop": 1000 * (time.perf_counter() - start) / len(dataset)}), flush=True)


def torchcodec_version() -> str:
    """torchcodec's and torch's versions."""
    import torchcodec

    return f"torchcodec {torchcodec.__version__}, torch {torch.__version__}"


if __name__ == "__main__":
    main()
