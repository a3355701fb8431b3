"""``fastload bench``: loaders side by side on the same data, the decode ceiling, data-stall analysis.

Every requested (loader, workers) pair runs in each round, each in a fresh process, rounds
interleaved so machine noise hits all alike; medians are reported, with each loader's ratio to the plain-torch baseline (same
workers), to the decode ceiling (single-thread libjpeg-turbo full decodes/s x workers) and to
what as many threads decoding at once deliver on this machine (below the ceiling where cores are
shared: SMT siblings, busy neighbours on a VM).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastload.dataset import ShardedDataset
from fastload.fields import JPEG_FIELD, LABEL_FIELD, image_field

LABEL_DIGITS = 8
WARMUP_STEPS = 3
BACKENDS = ("fastload-cpu", "fastload-dali", "torch", "webdataset", "dali-cpu", "dali-gpu")
TRANSFORMS = ("train", "val", "decode")


def preset(name: str, size: int = 224) -> tuple:
    """The transform specs of a benchmark mode (``decode``: a full decode, then a centre crop)."""
    from fastload import transforms as T

    return {"train": T.train(size), "val": T.val(size), "decode": (T.CenterCrop(size),)}[name]


# --- the plain-torch baseline: what users write by hand ------------------------------------------


class PillowImages:
    """Pillow decode + the same geometric specs as fastload (same crop params and flips), giving
    CHW uint8 tensors: over a raw image folder, or over the shards by random access. A map-style
    dataset for torch's DataLoader."""

    def __init__(self, specs: tuple, folder: Path | None = None, shards: ShardedDataset | None = None) -> None:
        self.specs = specs
        self.shards = shards
        self.items: list[tuple[str, int]] = []
        if folder is not None:
            classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
            self.items = [(str(p), label) for label, c in enumerate(classes) for p in sorted((folder / c).iterdir())]

    def __len__(self) -> int:
        return len(self.items) if self.items else len(self.shards)  # type: ignore[arg-type]

    def _open(self, i: int) -> tuple[Any, int]:
        from PIL import Image

        if self.items:
            path, label = self.items[i]
            return Image.open(path), label
        import io

        _, fields, pixels = self.shards.raw(i)  # type: ignore[union-attr]
        label = int(fields.get(LABEL_FIELD, b"-1"))
        if pixels is not None:  # a dataset of decoded pixels
            return Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels), label
        field = image_field(fields)
        return Image.open(io.BytesIO(fields[field])), label

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import numpy as np
        import torch
        from PIL import Image

        from fastload.sampling import sample_rng
        from fastload.transforms import plan

        image, label = self._open(i)
        with image:
            image = image.convert("RGB")
            p = plan(self.specs, image.height, image.width, sample_rng(0, 0, i))
            image = image.resize((p.size[1], p.size[0]), Image.Resampling.BILINEAR, box=p.box)
            if p.flip:
                image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1), label


# --- measurement -----------------------------------------------------------------------------------


def _tree_rss() -> float:
    import psutil

    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 1e6


class PeakRss:
    """Samples the process tree's RSS every 250 ms in a thread (shared pages count once per process)."""

    def __init__(self) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _tree_rss())
            self._stop.wait(0.25)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _tree_rss())


def _cpu_seconds() -> float:
    """CPU time of this process, its finished children and its live children."""
    import psutil

    own = resource.getrusage(resource.RUSAGE_SELF)
    done = resource.getrusage(resource.RUSAGE_CHILDREN)
    live = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            live += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return own.ru_utime + own.ru_stime + done.ru_utime + done.ru_stime + live


@dataclass
class Result:
    """One loader at one worker count, the median over rounds (see the module docstring)."""

    loader: str
    workers: int
    images_per_s: float
    mb_per_s: float
    cpu_s_per_1k: float
    peak_rss_mb: float
    first_batch_s: float
    running_images_per_s: float  # after the first batch: what a long run gets, start-up left out
    ratio_to_torch: float | None = None
    ratio_to_ceiling: float | None = None
    ratio_to_parallel: float | None = None  # to `workers` threads decoding at once: what the machine delivers


def time_batches(make: Callable[[], Iterable], epochs: int, mean_bytes: float) -> dict[str, float]:
    """Iterate ``epochs`` epochs of a fresh loader (its start-up counts); rates and costs."""
    with PeakRss() as rss:
        cpu0, start = _cpu_seconds(), time.perf_counter()
        loader = make()
        first, first_images, images = None, 0, 0
        for _ in range(epochs):
            for batch in loader:
                images += len(batch[0])
                if first is None:
                    first, first_images = time.perf_counter() - start, images
        seconds = time.perf_counter() - start
        cpu = _cpu_seconds() - cpu0
        if hasattr(loader, "close"):
            loader.close()
        del loader
    return {
        "images_per_s": images / seconds, "mb_per_s": images * mean_bytes / seconds / 1e6,
        "cpu_s_per_1k": 1000 * cpu / max(images, 1), "peak_rss_mb": rss.peak, "first_batch_s": first or 0.0,
        "running_images_per_s": (images - first_images) / max(seconds - (first or 0.0), 1e-9),
    }


def ceiling_images(ds: ShardedDataset, limit: int = 600) -> list[bytes]:
    """Up to ``limit`` of the dataset's JPEGs, evenly spread: what the decode ceiling is measured on."""
    step = max(1, len(ds) // limit)
    return [fields[JPEG_FIELD] for fields in (ds.raw(i)[1] for i in range(0, len(ds), step)) if JPEG_FIELD in fields]


def decode_rate(images: list[bytes], threads: int = 1, passes: int = 3) -> float:
    """Full libjpeg-turbo decodes per second of ``threads`` threads each decoding every one of
    ``images`` at once (simplejpeg releases the GIL): the fastest of ``passes`` passes, so a pass
    slowed by machine noise doesn't lower the bar."""
    import simplejpeg

    def decode_all(_: int = 0) -> None:
        for data in images:
            simplejpeg.decode_jpeg(data, colorspace="RGB")

    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(passes):
            start = time.perf_counter()
            list(pool.map(decode_all, range(threads)))
            best = min(best, time.perf_counter() - start)
    return threads * len(images) / best


def mean_image_bytes(ds: ShardedDataset) -> float:
    """Average encoded bytes per sample (shard bytes / samples)."""
    return ds.index.total_bytes / max(len(ds), 1)


# --- the loaders -----------------------------------------------------------------------------------


def make_loader(name: str, ds: ShardedDataset, source: Path | None, specs: tuple, batch_size: int, workers: int) -> Callable[[], Iterable]:
    """A factory of one epoch-iterable loader of the given kind."""
    import torch

    if name in ("fastload-cpu", "fastload-dali"):
        from fastload.loader import DataLoader

        backend = name.split("-")[1]
        return lambda: DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers, transform=specs, backend=backend)
    if name == "torch":
        dataset = PillowImages(specs, folder=source) if source else PillowImages(specs, shards=ds)
        return lambda: torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers)
    if name == "webdataset":
        return _webdataset_loader(ds, specs, batch_size, workers)
    if name in ("dali-cpu", "dali-gpu"):
        return _dali_loader(ds, specs, batch_size, workers, gpu=name == "dali-gpu")
    raise ValueError(f"unknown loader {name!r}; expected one of {BACKENDS}")


def _webdataset_loader(ds: ShardedDataset, specs: tuple, batch_size: int, workers: int) -> Callable[[], Iterable]:
    """The webdataset library's own pipeline over the same tars: shard shuffle, sample shuffle,
    Pillow decode, the same crop and flip, batching in the workers."""
    import numpy as np
    import torch
    from PIL import Image

    try:
        import webdataset as wds
    except ImportError:
        raise ImportError("--backends webdataset needs the webdataset library: pip install 'fastload[bench]'") from None

    from fastload.transforms import plan

    if ds.index.layout != "wds":
        raise ValueError("the webdataset loader reads tar shards")
    urls = [str(ds.root / s.path) for s in ds.index.shards]

    def transform(sample: tuple) -> tuple:
        image, label = sample
        image = image.convert("RGB")
        p = plan(specs, image.height, image.width, np.random.default_rng())
        image = image.resize((p.size[1], p.size[0]), Image.Resampling.BILINEAR, box=p.box)
        if p.flip:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1), label

    def make() -> Iterable:
        pipeline = (
            wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, empty_check=False)
            .shuffle(1000).decode("pil").to_tuple("jpg", "cls").map(transform).batched(batch_size)
        )
        return wds.WebLoader(pipeline, batch_size=None, num_workers=workers)

    return make


def _dali_loader(ds: ShardedDataset, specs: tuple, batch_size: int, workers: int, gpu: bool) -> Callable[[], Iterable]:
    """DALI's own reader and decoder over the same tars, as its documentation recommends:
    fn.readers.webdataset with our .idx files, decoders.image_random_crop (ROI decoding) or
    decoders.image + resize for val, flip and CHW layout in crop_mirror_normalize."""
    import torch

    from fastload import transforms as T
    from fastload.decode.dali import import_dali, torch_iterator

    dali = import_dali()
    fn, types = dali.fn, dali.types
    if ds.index.layout != "wds":
        raise ValueError("DALI's webdataset reader reads tar shards")
    if gpu and not torch.cuda.is_available():
        raise RuntimeError("dali-gpu needs a CUDA GPU")
    paths = [str(ds.root / s.path) for s in ds.index.shards]
    indexes = [str(ds.root / s.offsets) for s in ds.index.shards]
    size = T.output_size(specs) or (224, 224)
    train = any(isinstance(s, T.RandomResizedCrop) for s in specs)

    @dali.pipeline_def(batch_size=batch_size, num_threads=max(1, workers), device_id=0 if gpu else None)
    def pipeline():  # type: ignore[no-untyped-def]
        jpegs, labels = fn.readers.webdataset(
            paths=paths, index_paths=indexes, ext=["jpg", "cls"], random_shuffle=True, initial_fill=1024, name="reader"
        )
        device = "mixed" if gpu else "cpu"
        if train:
            images = fn.decoders.image_random_crop(jpegs, device=device, output_type=types.RGB)
            images = fn.resize(images, resize_x=size[1], resize_y=size[0])
            mirror = fn.random.coin_flip(probability=0.5)
        else:
            images = fn.decoders.image(jpegs, device=device, output_type=types.RGB)
            images = fn.resize(images, resize_shorter=int(size[0] / 0.875))
            mirror = 0
        images = fn.crop_mirror_normalize(images, crop=size, mirror=mirror, dtype=types.UINT8, output_layout="CHW")
        return images, fn.pad(labels, axes=(0,), shape=(LABEL_DIGITS,))  # ASCII digits, NUL-padded

    def make() -> Iterable:
        pipe = pipeline()
        pipe.build()
        return _DaliEpochs(torch_iterator(pipe, ["images", "labels"], "reader"))

    return make


class _DaliEpochs:
    """A DALI iterator as (images, labels) batches, one epoch per ``iter()``."""

    def __init__(self, iterator: Any) -> None:
        self.iterator = iterator

    def __iter__(self):  # type: ignore[no-untyped-def]
        return ((b[0]["images"], ascii_labels(b[0]["labels"])) for b in self.iterator)


def ascii_labels(digits: Any) -> Any:
    """Decimal labels from NUL-padded ASCII digit rows (how webdataset stores ``cls``)."""
    import torch

    values = torch.zeros(len(digits), dtype=torch.int64)
    for column in digits.cpu().to(torch.int64).T:
        present = column > 0
        values = torch.where(present, values * 10 + (column - 48), values)
    return values


# --- the data-stall analysis -------------------------------------------------------------------


def data_stall(make: Callable[[], Iterable], model_name: str, steps: int, num_classes: int) -> dict[str, Any]:
    """Train ``steps`` steps fed by the loader and ``steps`` on one cached batch: the share of step
    time spent waiting for data, the model's own images/s, and a verdict."""
    import torch

    from fastload.models import build_model

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(model_name, num_classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(images: Any, labels: Any) -> None:
        images = images.to(device, non_blocking=True).float().div_(255)
        labels = labels.to(device, non_blocking=True).long().view(-1) % num_classes
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    loader = make()
    batches = iter(_forever(loader))
    cached = next(batches)
    for _ in range(WARMUP_STEPS):
        step(*next(batches))  # warms the model, the allocator and the loader's pipeline
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step(*next(batches))
    sync()
    fed_step = (time.perf_counter() - start) / steps
    start = time.perf_counter()
    for _ in range(steps):
        step(*cached)
    sync()
    model_step = (time.perf_counter() - start) / steps
    if hasattr(loader, "close"):
        loader.close()
    stall = max(0.0, 1 - model_step / fed_step)
    batch = len(cached[0])
    verdict = (
        f"input-bound by {100 * stall:.0f}%: try more workers or backend=dali"
        if stall > 0.1
        else f"not input-bound ({100 * stall:.0f}% of step time waiting for data)"
    )
    return {"model": model_name, "device": str(device), "steps": steps, "stall_share": stall,
            "model_images_per_s": batch / model_step, "fed_images_per_s": batch / fed_step, "verdict": verdict}


def _forever(loader: Iterable) -> Iterable:
    while True:
        yield from loader


# --- the whole run --------------------------------------------------------------------------------


def _in_fresh_process(fn: Callable, args: tuple) -> Any:
    """Run ``fn(*args)`` in a spawned (non-daemonic: it may start workers) process; return its result."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child_main, args=(sender, fn, args))
    process.start()
    sender.close()
    try:
        ok, value = receiver.recv()
    except EOFError:
        process.join()
        raise RuntimeError(f"the benchmark process died (exit code {process.exitcode})") from None
    process.join()
    if not ok:
        raise RuntimeError(f"the benchmark process failed:\n{value}")
    return value


def _child_main(sender: Any, fn: Callable, args: tuple) -> None:
    import traceback

    multiprocessing.set_start_method("fork", force=True)  # loaders inside start workers as usual on Linux
    try:
        sender.send((True, fn(*args)))
    except Exception:
        sender.send((False, traceback.format_exc()))


def _measure(
    backend: str, dataset: str, source: Path | None, transform: str, size: int, batch_size: int, workers: int,
    epochs: int, mean_bytes: float,
) -> dict[str, float]:
    """One measurement, run in a fresh spawned process by run_bench."""
    loader = make_loader(backend, ShardedDataset(dataset), source, preset(transform, size), batch_size, workers)
    return time_batches(loader, epochs, mean_bytes)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    info: dict[str, Any] = {"cpus": os.cpu_count(), "torch": torch.__version__}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def run_bench(
    dataset: str | Path, source: Path | None, backends: list[str], workers: list[int], batch_size: int,
    transform: str, epochs: int, rounds: int, model: str | None = None, steps: int = 20, size: int = 224,
) -> dict[str, Any]:
    """Measure every (backend, workers) pair; return the JSON-ready report. ``size``: the
    transform's output side (224 for ImageNet-sized photos, 32 for CIFAR-sized ones)."""
    ds = ShardedDataset(dataset)
    specs = preset(transform, size)
    mean_bytes = mean_image_bytes(ds)
    runs: dict[tuple[str, int], list[dict]] = {(b, w): [] for b in backends for w in workers}
    images = ceiling_images(ds)
    parallel_counts = sorted({w for w in workers if w > 1})
    ceilings: list[float] = []
    parallel: dict[int, list[float]] = {w: [] for w in parallel_counts}
    for name in backends:
        make_loader(name, ds, source, specs, batch_size, 0)  # fail fast on an unknown or unavailable loader
    for _ in range(rounds):
        if images:  # none for PNGs or decoded pixels: no libjpeg-turbo ceiling to compare with
            ceilings.append(decode_rate(images))
            for w in parallel_counts:
                parallel[w].append(decode_rate(images, threads=w))
        for backend, w in runs:
            # each measurement in a fresh interpreter: no memory or threads left over from another loader
            args = (backend, str(dataset), source, transform, size, batch_size, w, epochs, mean_bytes)
            runs[(backend, w)].append(_in_fresh_process(_measure, args))
    single = statistics.median(ceilings) if ceilings else None
    together = {w: statistics.median(rates) for w, rates in parallel.items() if rates}
    results = [
        Result(loader=b, workers=w, **{k: statistics.median(r[k] for r in rs) for k in rs[0]}) for (b, w), rs in runs.items()
    ]
    for result in results:
        baseline = next((r for r in results if r.loader == "torch" and r.workers == result.workers), None)
        result.ratio_to_torch = result.images_per_s / baseline.images_per_s if baseline else None
        if single:
            result.ratio_to_ceiling = result.images_per_s / (single * max(result.workers, 1))
            result.ratio_to_parallel = result.images_per_s / together.get(result.workers, single)
    report: dict[str, Any] = {
        "results": [asdict(r) for r in results],
        "ceiling": {
            "single_thread_images_per_s": single, "method": "simplejpeg full decode, x workers",
            "parallel_images_per_s": {str(w): rate for w, rate in together.items()},  # w threads decoding at once
        },
        "machine": machine(),
        "config": {
            "dataset": str(dataset), "batch_size": batch_size, "transform": transform, "size": size, "epochs": epochs,
            "rounds": rounds,
        },
    }
    if model:
        first = backends[0]
        report["data_stall"] = data_stall(
            make_loader(first, ds, source, specs, batch_size, max(workers)), model, steps, max(len(ds.classes or []), 2)
        ) | {"loader": first, "workers": max(workers)}
    return report


def format_table(report: dict[str, Any], gpu_price: float | None = None, dataset_size: int | None = None) -> str:
    """The terminal table: one row per loader and worker count."""
    ceiling = report["ceiling"]["single_thread_images_per_s"]
    together = ", ".join(
        f"{rate:.0f} with {w} threads ({rate / (int(w) * ceiling):.2f}x)" for w, rate in report["ceiling"]["parallel_images_per_s"].items()
    )
    lines = [
        f"decode ceiling: {ceiling:.0f} images/s per thread (x workers)" if ceiling else "decode ceiling: none (no JPEG images)",
        *([f"decoding at once: {together}"] if together else []),
        f"{'loader':14} {'workers':>7} {'images/s':>9} {'running':>8} {'MB/s':>7} {'CPU s/1k':>9} {'RSS MB':>7} {'1st batch':>9} "
        f"{'x torch':>8} {'x ceiling':>9} {'x at once':>9}",
    ]
    for r in report["results"]:
        torch_ratio = f"{r['ratio_to_torch']:.2f}" if r["ratio_to_torch"] else "-"
        ceiling_ratio = f"{r['ratio_to_ceiling']:.2f}" if r["ratio_to_ceiling"] else "-"
        parallel_ratio = f"{r['ratio_to_parallel']:.2f}" if r["ratio_to_parallel"] else "-"
        lines.append(
            f"{r['loader']:14} {r['workers']:>7} {r['images_per_s']:9.0f} {r['running_images_per_s']:8.0f} {r['mb_per_s']:7.1f} "
            f"{r['cpu_s_per_1k']:9.2f} {r['peak_rss_mb']:7.0f} {r['first_batch_s']:8.2f}s {torch_ratio:>8} {ceiling_ratio:>9} {parallel_ratio:>9}"
        )
    stall = report.get("data_stall")
    if stall:
        lines.append(
            f"data stall ({stall['model']} on {stall['device']}, {stall['loader']} x{stall['workers']}): "
            f"model alone {stall['model_images_per_s']:.0f} images/s, fed {stall['fed_images_per_s']:.0f} images/s; {stall['verdict']}"
        )
    if gpu_price is not None and dataset_size:
        best = max(report["results"], key=lambda r: r["images_per_s"])
        rate = min(best["images_per_s"], stall["fed_images_per_s"]) if stall else best["images_per_s"]
        hours = dataset_size / rate / 3600
        lines.append(f"one epoch of {dataset_size} images at {rate:.0f} images/s: {hours * 60:.1f} min, ${hours * gpu_price:.2f} at ${gpu_price}/h")
    return "\n".join(lines)


def write_outputs(report: dict[str, Any], json_path: Path | None, plot_path: Path | None) -> str | None:
    """Write the JSON and, when matplotlib is installed, the throughput-vs-workers plot."""
    if json_path:
        json_path.write_text(json.dumps(report, indent=1))
    if not plot_path:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(6, 4))
    for loader in dict.fromkeys(r["loader"] for r in report["results"]):
        rows = [r for r in report["results"] if r["loader"] == loader]
        ax.plot([r["workers"] for r in rows], [r["images_per_s"] for r in rows], marker="o", label=loader)
    ax.set_xlabel("workers")
    ax.set_ylabel("images/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(plot_path)
    return None
