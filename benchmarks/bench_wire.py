"""The loader-side API against torch's DataLoader doing the same, side by side in one run on real photos.

    python benchmarks/bench_wire.py PHOTO_FOLDER WORKDIR [--count 800] [--workers 2] [--rounds 3] [--epochs 1]

Needs torchvision (run it with /work/tv-venv's python, torch 2.14.1 on the CPU). From an image folder
(``benchmarks/make_photos.py``) it builds, once, in WORKDIR: the converted dataset (``jpg`` + ``cls``),
a mask dataset — each photo with ``seg.png``, a mask painted from a threshold of the photo's luminance
(its median: two classes, 0 and 1), written as tars and indexed in place with ``fastload index`` — and
the same pairs as plain files for torch. Each round runs every configuration in a fresh process,
configurations interleaved, batch 64, and reports the median images/s and the ratio of each pair:

- ``mask``: image + mask under RandomResizedCrop(224) + flip. fastload: ``fields={"jpg": "image",
  "seg.png": "mask"}`` with ``T.train(224)``; torch: a Dataset decoding both files with Pillow, the
  pair as ``tv_tensors.Image`` / ``tv_tensors.Mask`` through ``v2.RandomResizedCrop(224)`` +
  ``v2.RandomHorizontalFlip()``.
- ``jitter``: ``v2.Compose([RandomResizedCrop(224), RandomHorizontalFlip(), ColorJitter(0.4, 0.4, 0.4)])``
  given to fastload as ``transform=`` (ColorJitter then runs by torchvision in its workers) and in
  a torch Dataset over the photo files (after ``v2.ToImage()``).
- ``collate``: fastload's ``T.train(224)`` with ``collate_fn=torch.utils.data.default_collate``
  against the default shared-memory stacking.

Run it under ``flock /tmp/fastload-bench.lock`` on a shared machine.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
PAIRS = {"mask": ("mask fastload", "mask torch"), "jitter": ("jitter fastload", "jitter torch"),
         "collate": ("collate_fn=default_collate", "default stacking")}
BATCH = 64
PER_TAR = 256


def build(photos: Path, workdir: Path, count: int) -> tuple[Path, Path, Path]:
    """(converted jpg+cls dataset, mask tars, mask files folder), made once in ``workdir``."""
    from PIL import Image

    from fastload.converters import ConvertOptions, convert
    from fastload.converters.index_tars import index_tars

    converted, tars, files = workdir / "jpg-cls", workdir / "mask-tars", workdir / "mask-files"
    if not (converted / "index.json").exists():
        convert(str(photos), str(converted), ConvertOptions(source="imagefolder", shuffle=True, limit=count, workers=2))
    if not (tars / "index.json").exists():
        import fastload

        ds = fastload.open(converted)
        tars.mkdir(parents=True, exist_ok=True)
        files.mkdir(parents=True, exist_ok=True)
        for start in range(0, len(ds), PER_TAR):
            with tarfile.open(tars / f"{start // PER_TAR:05d}.tar", "w") as tar:
                for i in range(start, min(start + PER_TAR, len(ds))):
                    _, fields, _ = ds.raw(i)
                    luminance = np.asarray(Image.open(io.BytesIO(fields["jpg"])).convert("L"))
                    buf = io.BytesIO()
                    Image.fromarray((luminance > np.median(luminance)).astype(np.uint8), mode="L").save(buf, format="PNG")
                    for ext, data in (("jpg", fields["jpg"]), ("seg.png", buf.getvalue())):
                        member = tarfile.TarInfo(f"p{i:06d}.{ext}")
                        member.size = len(data)
                        tar.addfile(member, io.BytesIO(data))
                        (files / f"p{i:06d}.{ext}").write_bytes(data)
        index_tars(tars)
    return converted, tars, files


class TorchPairs(torch.utils.data.Dataset):
    """torch's way: a Dataset decoding each file with Pillow, transformed by torchvision v2."""

    def __init__(self, files: list[Path], masks: bool) -> None:
        from torchvision.transforms import v2

        self.files, self.masks = files, masks
        steps = [v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()]
        self.transform = v2.Compose(steps if masks else [v2.ToImage(), *steps, v2.ColorJitter(0.4, 0.4, 0.4)])

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple:
        from PIL import Image
        from torchvision import tv_tensors
        from torchvision.transforms.v2 import functional as F

        path = self.files[i]
        image = Image.open(path).convert("RGB")
        if not self.masks:
            return self.transform(image), 0
        mask = tv_tensors.Mask(F.pil_to_tensor(Image.open(path.with_suffix(".seg.png"))))
        return self.transform(tv_tensors.Image(F.pil_to_tensor(image)), mask)


def loader_for(config: str, converted: Path, tars: Path, files: Path, photos: Path, workers: int) -> Iterable[Any]:
    """The loader a configuration measures."""
    from torchvision.transforms import v2

    import fastload
    from fastload import transforms as T

    common: dict[str, Any] = dict(batch_size=BATCH, shuffle=True, num_workers=workers)
    if config == "mask fastload":
        return fastload.DataLoader(str(tars), transform=T.train(224), fields={"jpg": "image", "seg.png": "mask"}, backend="cpu", **common)
    if config == "jitter fastload":
        recipe = v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), v2.ColorJitter(0.4, 0.4, 0.4)])
        return fastload.DataLoader(str(converted), transform=recipe, backend="cpu", **common)
    if config in PAIRS["collate"]:
        collate = torch.utils.data.default_collate if config.startswith("collate_fn") else None
        return fastload.DataLoader(str(converted), transform=T.train(224), backend="cpu", collate_fn=collate, **common)
    if config == "mask torch":
        return torch.utils.data.DataLoader(TorchPairs(sorted(files.glob("*.jpg")), masks=True), **common)
    count = len(fastload.open(converted))
    return torch.utils.data.DataLoader(TorchPairs(sorted(photos.rglob("*.jpg"))[:count], masks=False), **common)


def run_one(config: str, paths: list[str], workers: int, epochs: int) -> float:
    """Images/s of one loader over ``epochs`` epochs from a fresh start (in this process)."""
    converted, tars, files, photos = map(Path, paths)
    loader = loader_for(config, converted, tars, files, photos, workers)
    start, images = time.perf_counter(), 0
    for _ in range(epochs):
        for batch in loader:
            images += len(batch[0])
    return images / (time.perf_counter() - start)


def measure(config: str, paths: list[str], workers: int, epochs: int) -> float:
    """run_one in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH"))))}
    code = f"import bench_wire, json; print(json.dumps(bench_wire.run_one({config!r}, {paths!r}, {workers}, {epochs})))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    return float(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    """Build the data, run the rounds, print the table (and the JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("photos", type=Path)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--count", type=int, default=800)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--only", default=",".join(PAIRS), help="pairs to run, of " + ",".join(PAIRS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    paths = [str(p.resolve()) for p in (*build(args.photos, args.workdir, args.count), args.photos)]
    pairs = [PAIRS[name] for name in args.only.split(",")]
    rates: dict[str, list[float]] = {config: [] for pair in pairs for config in pair}
    ratios: dict[str, list[float]] = {pair[0]: [] for pair in pairs}
    for _ in range(args.rounds):
        for mine, theirs in pairs:
            got = {config: measure(config, paths, args.workers, args.epochs) for config in (mine, theirs)}
            for config, rate in got.items():
                rates[config].append(rate)
            ratios[mine].append(got[mine] / got[theirs])
    print(f"{'loader':<28} {'images/s':>9} {'ratio':>7}   ratio per round")
    for mine, theirs in pairs:
        print(f"{mine:<28} {statistics.median(rates[mine]):>9.0f} {statistics.median(ratios[mine]):>7.2f}   "
              + " ".join(f"{r:.2f}" for r in ratios[mine]))
        print(f"{theirs:<28} {statistics.median(rates[theirs]):>9.0f} {1:>7.2f}")
    if args.json:
        args.json.write_text(json.dumps({"rates": rates, "ratios": ratios, "workers": args.workers, "epochs": args.epochs}, indent=1))


if __name__ == "__main__":
    main()
