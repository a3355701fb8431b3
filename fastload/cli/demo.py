"""``fastload demo``: make a small image dataset, convert it to both layouts, inspect and verify it,
load it, and benchmark fastload against a plain torch DataLoader on it.

The generated images are smooth synthetic scenes (gradients, soft shapes), not noise, so their
JPEG sizes and decode costs resemble photographs; real-photo benchmarks live in ``benchmarks/``.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

DEMO_CLASSES = ("circles", "stripes", "squares", "waves")


def synthetic_image(rng: np.random.Generator, label: int, height: int, width: int) -> Image.Image:
    """A smooth RGB scene whose dominant shape depends on ``label``."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = rng.uniform(40, 215, size=3)
    slope = rng.uniform(-0.25, 0.25, size=(3, 2))
    pixels = np.stack([base[c] + slope[c, 0] * y + slope[c, 1] * x for c in range(3)], axis=-1)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(4, 9))):
        color = tuple(int(v) for v in rng.integers(0, 256, size=3))
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(min(height, width) / 12, min(height, width) / 3)
        if label == 0:
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=color)
        elif label == 1:
            draw.rectangle([0, cy - r / 4, width, cy + r / 4], fill=color)
        elif label == 2:
            draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=color)
        else:
            points = [(px, cy + r * np.sin(px / (r / 2 + 1))) for px in range(0, width, 8)]
            draw.line(points, fill=color, width=int(r / 4) + 2)
    return image.filter(ImageFilter.GaussianBlur(1.2))


def make_demo_images(folder: str | Path, count: int, seed: int = 0) -> Path:
    """Write ``count`` JPEGs (quality 90, ImageNet-like sizes) into ``folder/CLASS/``; return it."""
    folder = Path(folder)
    rng = np.random.default_rng(seed)
    for i in range(count):
        label = i % len(DEMO_CLASSES)
        short, long = int(rng.integers(300, 501)), int(rng.integers(400, 641))
        height, width = (short, long) if rng.random() < 0.7 else (long, short)
        path = folder / DEMO_CLASSES[label] / f"img_{i:06d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        synthetic_image(rng, label, height, width).save(buf, format="JPEG", quality=90)
        path.write_bytes(buf.getvalue())
    return folder


def run_demo(workdir: str | Path, images: int, fastload_command: Callable[[Sequence[str]], int]) -> int:
    """Build, convert (both layouts, 2 workers), inspect, verify, load and bench, each step through
    ``fastload_command`` (the ``fastload`` command's entry point; returns its exit status)."""
    workdir = Path(workdir)
    raw = workdir / "raw"
    if not raw.exists():
        start = time.perf_counter()
        make_demo_images(raw, images)
        print(f"== made {images} synthetic JPEGs in {raw} ({time.perf_counter() - start:.1f}s)")
    steps = [
        ["convert", str(raw), str(workdir / "wds"), "--from", "imagefolder", "--to", "wds", "--workers", "2", "--shard-size", "8MB", "--shuffle"],
        ["convert", str(raw), str(workdir / "hdf5"), "--from", "imagefolder", "--to", "hdf5", "--workers", "2", "--shard-size", "8MB", "--shuffle"],
        ["inspect", str(workdir / "wds")],
        ["verify", str(workdir / "wds"), "--decode"],
        ["verify", str(workdir / "hdf5"), "--decode"],
    ]
    for step in steps:
        print(f"== fastload {' '.join(step)}", flush=True)
        status = fastload_command(step)
        if status:
            return status
    # the tar shards are loaded by the bench below; load the HDF5 ones here
    print(f"== load {workdir / 'hdf5'} with fastload.DataLoader(train(224), batch 64, 2 workers)", flush=True)
    print(f"   {measure_loading(workdir / 'hdf5')}")
    bench = ["bench", str(workdir / "wds"), "--source", str(raw), "--backends", "fastload-cpu,torch",
             "--workers", "2", "--batch-size", "64", "--epochs", "2"]
    print(f"== fastload {' '.join(bench)}", flush=True)
    return fastload_command(bench)


def measure_loading(path: Path, epochs: int = 2) -> str:
    """Iterate the dataset for a few epochs; report images/s of the last and the first batch's latency."""
    import fastload
    from fastload import transforms
    from fastload.loader import DataLoader  # noqa: F401 - import torch before the clock starts

    start = time.perf_counter()
    with fastload.DataLoader(path, batch_size=64, shuffle=True, num_workers=2, transform=transforms.train(224)) as loader:
        first = None
        for _ in range(epochs):
            epoch_start, images = time.perf_counter(), 0
            for batch, _labels in loader:
                first = first or time.perf_counter() - start
                images += len(batch)
            rate = images / (time.perf_counter() - epoch_start)
    return f"{rate:.0f} images/s ({batch.shape[1:]} uint8 batches), first batch after {first:.2f}s"
