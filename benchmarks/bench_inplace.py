"""Data in place against the same images converted, and against Hugging Face ``datasets``, side by
side in one run (#40).

    python benchmarks/bench_inplace.py PHOTO_FOLDER WORKDIR [--workers 2] [--rounds 3] [--images 2000] [--epochs 2] [--peers PYTHON]
    python benchmarks/bench_inplace.py --simulate-rows 10000000 WORKDIR    # start-up and memory at scale

PHOTO_FOLDER holds real photos by class (``benchmarks/make_photos.py``). Made once in WORKDIR: the
photos as Hub-style Parquet written by ``datasets`` (an ``Image`` feature: ``{bytes, path}``
structs; a ClassLabel; row groups of 100 rows, as the Hub's image exports), the same rows
converted to fastload tar shards, saved with ``save_to_disk`` (Arrow) and written as Lance, and
with ``--peers``, LitData's index of the same Parquet files (``index_parquet_dataset``, its
one-time step, on a folder of links to them: it writes an ``index.json`` of its own). Each
round loads, in turn (the first alternates), each in a fresh process, EPOCHS epochs (default 2) of each with ``T.train(224)``, batch 64,
WORKERS workers, the CPU backend:

- ``parquet in place``, ``arrow in place``, ``lance in place``: ``fastload.DataLoader(LOCATION)``;
- ``converted shards``: the same rows converted to tars;
- ``hf datasets``: the Parquet files loaded by ``datasets.load_dataset`` (map-style, Arrow-backed,
  the image decoded by the ``Image`` feature: Pillow) under torch's DataLoader, each image
  cropped, resized and flipped exactly as fastload plans it (``fastload.bench.loaders.pillow_transform``);
- ``litdata parquet`` (with ``--peers PYTHON``, a venv holding litdata, polars and pyarrow: LitData
  brings torchvision, which the project's venv must not hold): LitData's own Parquet path,
  ``StreamingDataset(FOLDER, item_loader=ParquetLoader(), shuffle=True)`` under its
  ``StreamingDataLoader``, each image decoded by Pillow and cropped, resized and flipped as above.

It prints each one's median images/s and seconds to its first batch (from making the loader), and
the medians of the per-round ratios. With
``--simulate-rows``: that many rows of Parquet (1,000 files of 100-row groups of a tiny column) are
written once, indexed, then opened in a fresh process: the seconds to open the index and make an
epoch's order, the resident memory they add beyond importing pyarrow (what each forked worker
shares), and the index's size.
Run it under ``flock /tmp/bench.lock``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

GROUP_ROWS = 100  # the Hub's row groups of image datasets
FILE_ROWS = 1000
REPO = Path(__file__).resolve().parents[1]
LOADERS = ("parquet in place", "converted shards", "hf datasets", "litdata parquet", "arrow in place", "lance in place")
PEERS = ("litdata parquet",)  # run by --peers' python


def made_paths(workdir: Path) -> dict[str, Path]:
    """Where :func:`prepare` puts each form of the photos."""
    return {"parquet": workdir / "parquet", "wds": workdir / "wds", "arrow": workdir / "arrow", "lance": workdir / "photos.lance",
            "litdata": workdir / "litdata-parquet"}


def checkout_env() -> dict[str, str]:
    """The environment in which child processes (the peers' venv too) import this checkout's fastload."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}


def prepare(photos: Path, workdir: Path, images: int, peers: Path | None) -> dict[str, Path]:
    """The photos as Parquet (by datasets), converted shards, a save_to_disk folder, a Lance dataset
    and (``peers``: a python with litdata) LitData's index of the Parquet files, each made once."""
    import datasets

    from fastload.converters import ConvertOptions, convert

    out = made_paths(workdir)
    if not out["parquet"].exists():
        classes = sorted(p.name for p in photos.iterdir() if p.is_dir())
        items = [(str(p), label) for label, c in enumerate(classes) for p in sorted((photos / c).glob("*.jpg"))][:images]
        features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
        embedded = [{"bytes": Path(p).read_bytes(), "path": Path(p).name} for p, _ in items]  # as the Hub's files hold them
        ds = datasets.Dataset.from_dict({"image": embedded, "label": [y for _, y in items]}, features=features)
        ds = ds.shuffle(seed=0).flatten_indices()
        out["parquet"].mkdir(parents=True)
        shards = (len(ds) + FILE_ROWS - 1) // FILE_ROWS
        for n in range(shards):
            part = ds.shard(shards, n, contiguous=True)
            part.to_parquet(str(out["parquet"] / f"train-{n:05d}-of-{shards:05d}.parquet"), batch_size=GROUP_ROWS)
        ds.save_to_disk(str(out["arrow"]), num_shards=shards)
    if not (out["wds"] / "index.json").exists():
        convert(str(out["parquet"]), str(out["wds"]), ConvertOptions(source="parquet", shard_bytes=64 * 10**6))
    if not out["lance"].exists():
        import lance
        import pyarrow.parquet as pq

        lance.write_dataset(pq.read_table(out["parquet"]), str(out["lance"]))
    if peers is not None and not (out["litdata"] / "index.json").exists():
        out["litdata"].mkdir(exist_ok=True)
        for file in sorted(out["parquet"].glob("*.parquet")):
            link = out["litdata"] / file.name
            if not link.exists():
                link.symlink_to(file.resolve())
        subprocess.run([str(peers), "-c", "import sys, litdata; litdata.index_parquet_dataset(sys.argv[1])", str(out["litdata"])],
                       check=True, capture_output=True)
    return out


class HubImages(torch.utils.data.Dataset):
    """The Parquet files as Hugging Face ``datasets`` loads them (map-style): a row's image decoded by
    its Image feature, then cropped, resized and flipped as fastload plans it."""

    def __init__(self, parquet: Path, cache: Path) -> None:
        import datasets

        from fastload import transforms as T

        self.ds = datasets.load_dataset("parquet", data_files=sorted(str(p) for p in parquet.glob("*.parquet")), split="train",
                                        cache_dir=str(cache))
        self.specs = T.train(224)

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from fastload.bench.loaders import pillow_transform
        from fastload.workers.rng import sample_rng

        row = self.ds[i]
        return pillow_transform(row["image"], self.specs, sample_rng(0, 0, i)), row["label"]


class PillowRow:
    """A row of the Hub's image Parquet as LitData gives it (a dict) to (image tensor, label): the
    image decoded by Pillow and cropped, resized and flipped as fastload plans it (pickled to
    LitData's spawned workers, each counting its own rows)."""

    def __init__(self) -> None:
        from fastload import transforms as T

        self.specs, self.count = T.train(224), 0

    def __call__(self, row: dict) -> tuple[Any, int]:
        from PIL import Image

        from fastload.bench.loaders import pillow_transform
        from fastload.workers.rng import sample_rng

        self.count += 1
        image = Image.open(io.BytesIO(row["image"]["bytes"]))
        return pillow_transform(image, self.specs, sample_rng(0, os.getpid(), self.count)), row["label"]


def litdata_loader(folder: Path, workers: int) -> Any:
    """LitData's own Parquet path over ``folder`` (indexed by ``index_parquet_dataset``): its
    ParquetLoader under its StreamingDataLoader, shuffled, in spawned workers (LitData refuses
    forked ones for Polars' threads), kept across epochs (a spawned worker imports torch anew)."""
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming.item_loader import ParquetLoader

    dataset = StreamingDataset(str(folder), item_loader=ParquetLoader(), shuffle=True, transform=PillowRow())
    return StreamingDataLoader(dataset, batch_size=64, num_workers=workers, multiprocessing_context="spawn",
                               persistent_workers=True)


def run_one(name: str, made: dict[str, Path], workers: int, workdir: Path, epochs: int) -> tuple[float, float]:
    """(images/s over ``epochs`` epochs of configuration ``name``, seconds to its first batch): a
    fresh loader, its start-up counted."""
    import fastload
    from fastload import transforms as T

    start = time.perf_counter()
    if name == "litdata parquet":
        loader: Any = litdata_loader(made["litdata"], workers)
    elif name == "hf datasets":
        loader = torch.utils.data.DataLoader(HubImages(made["parquet"], workdir / "hf-cache"), batch_size=64, shuffle=True,
                                             num_workers=workers)
    else:
        location = {"parquet in place": made["parquet"], "arrow in place": made["arrow"], "lance in place": made["lance"],
                    "converted shards": made["wds"]}[name]
        loader = fastload.DataLoader(str(location), batch_size=64, shuffle=True, num_workers=workers, transform=T.train(224), backend="cpu")
    images, first = 0, 0.0
    for _ in range(epochs):
        for x, _ in loader:
            first = first or time.perf_counter() - start
            images += len(x)
    seconds = time.perf_counter() - start
    if hasattr(loader, "close"):
        loader.close()
    return images / seconds, first


def run_apart(name: str, args: argparse.Namespace) -> tuple[float, float]:
    """:func:`run_one` in a fresh process (LitData's in the peers' venv): what one configuration
    loads (pylance's threads, which are not fork-safe; datasets' caches) cannot slow or hang the next."""
    python = args.peers if name in PEERS else Path(sys.executable)
    command = [str(python), __file__, str(args.photos), str(args.workdir), "--workers", str(args.workers), "--images", str(args.images),
               "--epochs", str(args.epochs), "--run", name]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=checkout_env())
    if done.returncode != 0:
        print(f"{name} failed (exit status {done.returncode}): {done.stderr.strip().splitlines()[-1:]}", flush=True)
        return float("nan"), float("nan")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return float(got["rate"]), float(got["first_s"])


SIMULATE = """
import json, os, resource, sys, time
def rss():
    with open("/proc/self/status") as status:
        return int(status.read().split("VmRSS:")[1].split()[0]) * 1024
import fastload
from fastload.loading.loader_options import LoaderOptions
from fastload.formats.parquet.bounds import import_pyarrow_parquet
from fastload.loading.loader_options import LoaderOptions
from fastload.loading.loader_orders import LoaderOrders
from fastload.orders.position import Position
import_pyarrow_parquet()  # what any Parquet read costs (about 50 MB), apart from the index
before, start = rss(), time.perf_counter()
ds = fastload.open(sys.argv[1])
opened = time.perf_counter() - start
options = LoaderOptions(batch_size=256, shuffle=True, remote=True, stream_buffer=ds.shuffle_window)
orders = LoaderOrders(ds, options)
batches = orders.batches(Position(0))
order = orders.order(Position(0))
first = order.indices(batches.positions(0))
ordered = time.perf_counter() - start
print(json.dumps({"rows": len(ds), "shards": len(ds.index.shards), "open_s": opened, "open_and_order_s": ordered,
                  "rss_added_mb": (rss() - before) / 2**20, "index_json_mb": os.path.getsize(sys.argv[1] + "/index.json") / 1e6}))
"""


def simulate(rows: int, workdir: Path) -> None:
    """Write ``rows`` rows of tiny Parquet once, index them, and measure opening them in a fresh process."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = workdir / f"simulated-{rows}"
    files = 1000
    if not (folder / "index.json").exists():
        folder.mkdir(parents=True, exist_ok=True)
        per_file = rows // files
        table = pa.table({"label": pa.array(range(per_file), pa.int64())})
        for n in range(files):
            pq.write_table(table, folder / f"part-{n:05d}.parquet", row_group_size=GROUP_ROWS, write_statistics=False)
        subprocess.run([sys.executable, "-m", "fastload.cli", "index", str(folder)], check=True)
    got = json.loads(subprocess.run([sys.executable, "-c", SIMULATE, str(folder)], check=True, capture_output=True, text=True).stdout)
    print(json.dumps(got))


def main() -> None:
    """Make the datasets, run the rounds, print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("photos", type=Path, nargs="?")
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=2, help="epochs a loader runs (its start-up counted once)")
    parser.add_argument("--only", nargs="*", help="the configurations to run (default: all)")
    parser.add_argument("--peers", type=Path, help="a python with litdata, polars and pyarrow (default: LitData is not run)")
    parser.add_argument("--simulate-rows", type=int)
    parser.add_argument("--run", help=argparse.SUPPRESS)  # one configuration, in this process (run_apart)
    args = parser.parse_args()
    if args.simulate_rows:
        simulate(args.simulate_rows, args.workdir)
        return
    if args.run:  # in a fresh process, maybe the peers' venv (no datasets there): the forms are made
        rate, first = run_one(args.run, made_paths(args.workdir), args.workers, args.workdir, args.epochs)
        print(json.dumps({"rate": rate, "first_s": first}))
        return
    prepare(args.photos, args.workdir, args.images, args.peers)
    names = args.only or [name for name in LOADERS if args.peers is not None or name not in PEERS]
    rates: dict[str, list[float]] = {name: [] for name in names}
    firsts: dict[str, list[float]] = {name: [] for name in names}
    for round_no in range(args.rounds):
        order = names[round_no % len(names):] + names[: round_no % len(names)]
        for name in order:
            rate, first = run_apart(name, args)
            rates[name].append(rate)
            firsts[name].append(first)
        print(f"round {round_no + 1}: " + ", ".join(f"{name} {rates[name][-1]:.0f}/s" for name in names), flush=True)
    print(f"\n{args.images} photos, batch 64, T.train(224), {args.workers} workers, {args.epochs} epochs a loader (its start-up "
          f"counted), median of {args.rounds} rounds")
    for name in names:
        print(f"{name:18s} {statistics.median(rates[name]):8.0f} images/s  (rounds: {', '.join(f'{r:.0f}' for r in rates[name])}); "
              f"first batch after {statistics.median(firsts[name]):.2f} s  (rounds: {', '.join(f'{f:.2f}' for f in firsts[name])})")
    base = names[0]
    for name in names[1:]:
        ratios = [a / b for a, b in zip(rates[base], rates[name])]
        print(f"{base} / {name}: {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
