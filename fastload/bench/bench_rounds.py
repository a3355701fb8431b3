"""The whole ``fastload bench`` run: every requested (loader, workers) pair in each round, each
in a fresh process, rounds interleaved so machine noise hits all alike; medians are reported,
with each loader's ratio to the plain-torch baseline (same workers), to the decode ceiling
(single-thread libjpeg-turbo full decodes/s x workers) and to what as many threads decoding at
once deliver on this machine (below the ceiling where cores are shared: SMT siblings, busy
neighbours on a VM).
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastload.bench.loaders import make_loader
from fastload.bench.measure import ceiling_images, decode_rate, mean_image_bytes, time_batches
from fastload.bench.training import data_stall
from fastload.storage.dataset import ShardedDataset

TRANSFORMS = ("train", "val", "decode")


def preset(name: str, size: int = 224) -> tuple:
    """The transform specs of a benchmark mode (``decode``: a full decode, then a centre crop)."""
    from fastload import transforms as T

    return {"train": T.train(size), "val": T.val(size), "decode": (T.CenterCrop(size),)}[name]


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
