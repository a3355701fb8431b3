"""Small decoded images (CIFAR-sized) in HDF5: fastload.DataLoader against torch's DataLoader over
an h5py dataset reading one row per sample (what users write by hand), side by side: rows as
stored, and with train(SIZE) (random resized crop + flip; Pillow in the torch dataset).

The rows are real photos shrunk to 32x32 (from a folder of JPEGs, e.g. benchmarks/make_photos.py
output), stored with ``fastload convert --to hdf5 --hdf5-decoded``, uncompressed and with lzf.

    python benchmarks/bench_decoded.py data/photos --workers 2 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from PIL import Image

import fastload
from fastload import transforms as T
from fastload.converters import ConvertOptions, WriterOptions, convert
from fastload.transforms import apply_plan, plan
from fastload.workers.rng import sample_rng


class H5Rows(torch.utils.data.Dataset):
    """One h5py row read per sample, the file opened lazily in each worker; with ``specs``, the
    same crop and flip as fastload's, done with Pillow."""

    def __init__(self, path: Path, specs: tuple = ()) -> None:
        self.path, self.specs = path, specs
        self.file: Any = None  # an h5py.File, opened in the worker that reads
        with h5py.File(path, "r") as f:
            self.length = len(f["cls"])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        pixels = self.file["pixels"][i]
        if self.specs:
            height, width = pixels.shape[:2]
            pixels = apply_plan(pixels, plan(self.specs, height, width, sample_rng(0, 0, i)), height, width)
        return torch.from_numpy(np.array(pixels)).permute(2, 0, 1), int(self.file["cls"][i])


def small_photos(folder: Path, out: Path, size: int) -> Path:
    """The folder's JPEGs shrunk to size x size, as an .npz of images and labels."""
    files = sorted(folder.rglob("*.jpg"))
    images = np.stack([np.asarray(Image.open(f).convert("RGB").resize((size, size), Image.Resampling.BILINEAR)) for f in files])
    np.savez(out, images=images, labels=np.arange(len(files)) % 10)
    return out


def images_per_s(loader) -> float:
    start, n = time.perf_counter(), 0
    for images, _ in loader:
        n += len(images)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("photos", type=Path, help="a folder of JPEGs")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        npz = small_photos(args.photos, Path(tmp) / "small.npz", args.size)
        count = len(np.load(npz)["labels"])
        rates: dict[str, list[float]] = {}
        for compression in (None, "lzf"):
            out = Path(tmp) / f"h5-{compression}"
            options = WriterOptions(hdf5_decoded=True, hdf5_compression=compression)
            convert(str(npz), str(out), ConvertOptions(source="npz", layout="hdf5", writer_options=options), quiet=True)
            shard = next(out.glob("*.h5"))
            modes = [("rows", ())] + ([("train", T.train(args.size))] if compression is None else [])
            for _ in range(args.rounds):
                for mode, specs in modes:
                    name = f"{compression or 'uncompressed'}, {mode}"
                    with fastload.DataLoader(out, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, transform=specs) as loader:
                        rates.setdefault(f"fastload, {name}", []).append(images_per_s(loader))
                    torch_loader = torch.utils.data.DataLoader(
                        H5Rows(shard, specs), batch_size=args.batch_size, shuffle=True, num_workers=args.workers
                    )
                    rates.setdefault(f"torch + h5py rows, {name}", []).append(images_per_s(torch_loader))
    print(f"{count} photos at {args.size}x{args.size}, batch {args.batch_size}, "
          f"{args.workers} workers, shuffled, median of {args.rounds} rounds (each loader's first epoch)")
    for name, values in rates.items():
        mode = name.split(", ")[-1]
        baseline = statistics.median(rates[f"torch + h5py rows, uncompressed, {mode}"])
        print(f"  {name:40} {statistics.median(values) / baseline:6.1f}x torch + h5py rows, uncompressed, {mode}")


if __name__ == "__main__":
    main()
