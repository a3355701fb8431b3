"""Richer samples against the jpg+cls fast path, side by side in one run on the same photos.

    python benchmarks/bench_fields.py PHOTO_FOLDER WORKDIR [--workers 2] [--rounds 3] [--base-tree DIR]

From an image folder (``benchmarks/make_photos.py``) it builds, once, in WORKDIR: the converted
dataset (``jpg`` + ``cls``), and CLIP-style tars of the same images (``jpg``, ``txt``, ``json``,
written with webdataset's TarWriter and indexed in place with ``fastload index``). Each round
then loads every configuration in a fresh process, configurations interleaved; it reports the
median images/s and each one's ratio to the jpg+cls rate of the same round, and the CPU seconds
(main process and workers) per 1,000 images, which shared cores perturb less than the rate:

- ``jpg+cls``: today's classification path (no ``fields=``)
- ``jpg+txt+json``: ``fields=["jpg", "txt", "json"]`` on the CLIP-style tars
- ``jpg+cls, no-op map``: ``map=`` returning the sample as it is
- ``jpg+cls at BASE`` (with ``--base-tree``): the same loader from another checkout (e.g. an
  unpacked ``git archive`` of the base commit, its ``_turbo`` extension copied in)

Run it under ``flock /tmp/fastload-bench.lock`` on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("jpg+cls", "jpg+txt+json", "jpg+cls, no-op map")


def identity(sample: dict, rng: np.random.Generator) -> dict:
    """The no-op map: the sample as it came."""
    return sample


def build(photos: Path, workdir: Path) -> tuple[Path, Path]:
    """The converted dataset and the CLIP-style tars of the same photos (made once)."""
    from fastload.converters import ConvertOptions, convert

    converted, clip = workdir / "jpg-cls", workdir / "clip"
    if not (converted / "index.json").exists():
        convert(str(photos), str(converted), ConvertOptions(source="imagefolder", shuffle=True, shard_bytes=16 * 10**6, workers=2))
    if not (clip / "index.json").exists():
        import webdataset as wds

        import fastload
        from fastload.converters.index_tars import index_tars

        ds = fastload.open(converted)
        clip.mkdir(parents=True, exist_ok=True)
        per_tar = 256
        for start in range(0, len(ds), per_tar):
            with wds.TarWriter(str(clip / f"{start // per_tar:05d}.tar")) as writer:
                for i in range(start, min(start + per_tar, len(ds))):
                    key, fields, _ = ds.raw(i)
                    writer.write({"__key__": key.replace("/", "_"), "jpg": fields["jpg"], "txt": f"a photo of {key.split('/')[0]}",
                                  "json": {"key": key, "width": 0, "similarity": 0.31}})
        index_tars(clip)
    return converted, clip


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children (the joined workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_one(config: str, data: str, workers: int, epochs: int) -> tuple[float, float]:
    """(images/s, CPU seconds per 1,000 images) of one loader over ``epochs`` epochs from a fresh
    start (in this process; the CPU time counts its workers, joined at close)."""
    import fastload
    from fastload import transforms as T

    kwargs: dict = {}
    if config == "jpg+txt+json":
        kwargs["fields"] = ["jpg", "txt", "json"]
    elif config == "jpg+cls, no-op map":
        kwargs["map"] = identity
    loader = fastload.DataLoader(data, batch_size=64, shuffle=True, num_workers=workers, transform=T.train(224), backend="cpu", **kwargs)
    start, cpu_start, images = time.perf_counter(), cpu_seconds(), 0
    for _ in range(epochs):
        for batch in loader:
            images += len(batch[0]) if isinstance(batch, tuple) else len(batch["image"])
    seconds = time.perf_counter() - start
    loader.close()
    return images / seconds, (cpu_seconds() - cpu_start) / images * 1000


def measure(config: str, data: Path, workers: int, epochs: int, tree: Path) -> tuple[float, float]:
    """run_one in a fresh interpreter importing fastload from ``tree``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(tree), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH"))))}
    code = f"import bench_fields, json; print(json.dumps(bench_fields.run_one({config!r}, {str(data)!r}, {workers}, {epochs})))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tree, check=True)
    rate, cpu = json.loads(proc.stdout.strip().splitlines()[-1])
    return rate, cpu


def main() -> None:
    """Build the data, run the rounds, print the table (and the JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("photos", type=Path)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--base-tree", type=Path, help="another checkout whose jpg+cls loader runs beside (e.g. the base commit)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    converted, clip = build(args.photos, args.workdir)
    runs = [(config, clip if config == "jpg+txt+json" else converted, ROOT) for config in CONFIGS]
    if args.base_tree is not None:
        runs.append(("jpg+cls at BASE", converted, args.base_tree.resolve()))
    rates: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    ratios: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    cpu: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    for _ in range(args.rounds):
        got = {name: measure("jpg+cls" if name.endswith("BASE") else name, data, args.workers, args.epochs, tree) for name, data, tree in runs}
        for name, (rate, cpu_per_1k) in got.items():
            rates[name].append(rate)
            ratios[name].append(rate / got["jpg+cls"][0])
            cpu[name].append(cpu_per_1k)
    print(f"{'loader':<22} {'images/s':>9} {'x jpg+cls':>10} {'CPU s/1k':>9} {'x jpg+cls CPU':>14}   rate ratio per round")
    base_cpu = statistics.median(cpu["jpg+cls"])
    for name in rates:
        print(f"{name:<22} {statistics.median(rates[name]):>9.0f} {statistics.median(ratios[name]):>10.3f} "
              f"{statistics.median(cpu[name]):>9.3f} {statistics.median(cpu[name]) / base_cpu:>14.3f}   "
              + " ".join(f"{r:.3f}" for r in ratios[name]))
    if args.json:
        args.json.write_text(json.dumps({"rates": rates, "ratios": ratios, "cpu_s_per_1k": cpu, "workers": args.workers,
                                         "epochs": args.epochs}, indent=1))


if __name__ == "__main__":
    main()
