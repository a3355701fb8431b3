"""How far each backend's pixels are from an independent reference: Pillow decodes the whole
image and applies torchvision's recipe itself (``val``: the short side resized to size/0.875,
bilinear with antialiasing, then the centre crop; ``decode``: the centre crop of the full decode),
with none of fastload's planning. The score of an image is its mean |difference| in levels.
``train`` has no independent reference for a random crop: the same plans (same seed) go through
every backend, and each backend after the first is scored against the first one's pixels.

    python -m fastload.bench.parity DATASET --backends cpu,dali [--transform val|decode|train]

On a GPU machine ``dali`` decodes with ``device="mixed"`` (nvJPEG), elsewhere on DALI's CPU.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.fields import image_field
from fastload.storage.dataset import ShardedDataset

PARITY_TRANSFORMS = ("val", "decode", "train")


def reference_pixels(data: bytes, transform: str, size: int) -> np.ndarray:
    """torchvision's recipe for ``transform`` on Pillow's full decode of ``data``: CHW uint8."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as opened:
        image = opened.convert("RGB")
    if transform == "val":
        short = int(size / 0.875)
        w, h = image.size
        resized = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
        image = image.resize(resized, Image.Resampling.BILINEAR)
    elif transform != "decode":
        raise ValueError(f"parity is measured for {PARITY_TRANSFORMS}, not {transform!r}")
    left, top = round((image.width - size) / 2.0), round((image.height - size) / 2.0)
    return np.asarray(image.crop((left, top, left + size, top + size))).transpose(2, 0, 1)


def loader_transform(transform: str, size: int) -> tuple:
    """fastload's specs for ``transform`` (what the loader under test is given)."""
    from fastload import transforms as T

    return {"val": T.val(size), "train": T.train(size)}.get(transform, (T.CenterCrop(size),))


@dataclass(frozen=True)
class Parity:
    """One backend's distance from the reference over a dataset, per image and summarised."""

    backend: str  # the backend the loader took: cpu, dali-cpu, dali-gpu
    transform: str
    per_image: dict[str, float]  # key -> mean |diff| in levels

    @property
    def p95(self) -> float:
        """The 95th percentile image's mean |diff|."""
        return float(np.percentile(list(self.per_image.values()), 95))

    @property
    def median(self) -> float:
        """The median image's mean |diff|."""
        return statistics.median(self.per_image.values())

    @property
    def worst(self) -> tuple[str, float]:
        """(key, mean |diff|) of the image farthest from the reference."""
        return max(self.per_image.items(), key=lambda item: item[1])

    def summary(self) -> dict[str, Any]:
        """The numbers a report shows: median, max, the worst image, the count."""
        key, worst = self.worst
        return {"backend": self.backend, "transform": self.transform, "images": len(self.per_image),
                "median": round(self.median, 4), "p95": round(self.p95, 4), "max": round(worst, 4), "worst_key": key}


def backend_pixels(dataset: ShardedDataset, backend: str, transform: str, size: int, batch_size: int = 32,
                   num_workers: int = 2, **loader_args: Any) -> tuple[str, dict[str, np.ndarray]]:
    """(the backend the loader took, each key's delivered CHW pixels) of ``dataset`` through
    ``fastload.DataLoader(backend=...)`` with ``transform``'s specs (seed 0: the same plans for any backend)."""
    import fastload

    pixels: dict[str, np.ndarray] = {}
    with fastload.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, backend=backend, seed=0,
                             transform=loader_transform(transform, size), return_keys=True, **loader_args) as loader:
        for images, _labels, keys in loader:
            pixels.update(zip(keys, images.cpu().numpy(), strict=True))
        return loader.backend, pixels


def distance(a: np.ndarray, b: np.ndarray) -> float:
    """Mean |difference| of two uint8 images, in levels."""
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def measure_parity(dataset: ShardedDataset, backend: str, transform: str = "val", size: int = 224,
                   batch_size: int = 32, num_workers: int = 2, **loader_args: Any) -> Parity:
    """Every image of ``dataset`` through ``fastload.DataLoader(backend=...)`` against the reference."""
    encoded = {}
    for i in range(len(dataset)):
        key, fields, _ = dataset.raw(i)
        encoded[key] = fields[image_field(fields) or ""]
    took, pixels = backend_pixels(dataset, backend, transform, size, batch_size, num_workers, **loader_args)
    return Parity(took, transform, {key: distance(image, reference_pixels(encoded[key], transform, size))
                                    for key, image in pixels.items()})


def measure_agreement(dataset: ShardedDataset, backend: str, against: dict[str, np.ndarray], transform: str = "train",
                      size: int = 224, num_workers: int = 2) -> Parity:
    """Every image of ``dataset`` through ``backend`` against another backend's ``against`` pixels
    of the same plans (a random crop has no independent reference)."""
    took, pixels = backend_pixels(dataset, backend, transform, size, num_workers=num_workers)
    return Parity(took, transform, {key: distance(image, against[key]) for key, image in pixels.items()})


def main(argv: list[str] | None = None) -> None:
    """The command line: each backend's median and worst image, as a table or JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset")
    parser.add_argument("--backends", default="cpu,dali")
    parser.add_argument("--transform", choices=PARITY_TRANSFORMS, default="val")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", help="write the per-image scores here")
    args = parser.parse_args(argv)
    dataset = ShardedDataset(args.dataset)
    results = []
    backends = args.backends.split(",")
    if args.transform == "train":
        reference, first = backend_pixels(dataset, backends[0], "train", args.size, num_workers=args.workers)
        print(json.dumps({"reference": reference, "transform": "train", "images": len(first)}))
    for backend in backends[1:] if args.transform == "train" else backends:
        if args.transform == "train":
            result = measure_agreement(dataset, backend, first, "train", args.size, args.workers)
        else:
            result = measure_parity(dataset, backend, args.transform, args.size, num_workers=args.workers)
        results.append(result)
        print(json.dumps(result.summary()))
    if args.json:
        with open(args.json, "w") as out:
            json.dump([{**r.summary(), "per_image": r.per_image} for r in results], out)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
