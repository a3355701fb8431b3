"""Which engine decodes a loader's batches: ``backend=`` as asked, and for ``auto`` a decision by
measurement. Without a CUDA GPU ``auto`` is the CPU path without probing (fastload's workers
measured 2.4x DALI's CPU pipeline: docs/performance.md, against the peers). With a GPU and DALI,
a short probe times each candidate engine (cpu, dali, hybrid) on the loader's own data and takes the fastest; its rates are
cached per machine (GPU name, CPU count, workers, batch size, the transform's kind), so the probe
runs once, and logged. The H200 table in docs/gpu.md is why: there the CPU path beat fastload's DALI
backend in short runs, so "DALI whenever a GPU is visible" was wrong on that machine."""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import torch

from fastload._util.files import atomic_write_bytes
from fastload.transforms import GEOMETRIC, Transform, output_size

log = logging.getLogger("fastload")

PROBE_WARMUP = 3  # batches per engine before timing: start-up and the queue filled meanwhile left out
PROBE_BATCHES = 20  # timed batches per engine (on the H200, 256-image batches: a few tenths of a second)
PROBE_CACHE_VERSION = 1


@dataclass(frozen=True)
class BackendChoice:
    """The engine taken (``cpu``, ``dali-cpu``, ``dali-gpu``, ``hybrid-cpu``, ``hybrid-gpu``), why,
    and the rates (images/s) a probe measured, by ``backend=`` name, when one did."""

    name: str
    why: str
    rates: dict[str, float] = field(default_factory=dict)

    @property
    def engine(self) -> str:
        """``cpu``, ``dali`` or ``hybrid``."""
        return self.name.split("-")[0]

    @property
    def gpu(self) -> bool:
        """Whether DALI decodes on the GPU."""
        return self.name.endswith("-gpu")


def probe_cache_path() -> Path:
    """Where probe results live: ``$FASTLOAD_PROBE_CACHE``, else ``~/.cache/fastload/backend-probe.json``."""
    return Path(os.environ.get("FASTLOAD_PROBE_CACHE") or Path.home() / ".cache" / "fastload" / "backend-probe.json")


def probe_key(specs: Sequence[Transform], num_workers: int, batch_size: int) -> str:
    """What a probe's result depends on: this machine (GPU name, CPU count), the workers, the
    batch size and the transform's kind (its geometric steps and output size)."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    kind = "+".join(type(spec).__name__ for spec in specs if isinstance(spec, GEOMETRIC)) or "none"
    return f"{gpu}|{os.cpu_count()} CPUs|{num_workers} workers|batch {batch_size}|{kind} {output_size(specs)}"


def measure_rates(make_loader: Callable[[str], Iterable], candidates: Sequence[str], batches: int = PROBE_BATCHES) -> dict[str, float]:
    """Each candidate ``backend=``'s images/s over ``batches`` batches after PROBE_WARMUP (start-up
    left out), one loader at a time; ``make_loader(backend)`` makes the loader (closed after)."""
    rates = {}
    for backend in candidates:
        loader = make_loader(backend)
        try:
            rates[backend] = _running_rate(loader, batches)
        finally:
            getattr(loader, "close", lambda: None)()
    return rates


def _running_rate(loader: Iterable, batches: int) -> float:
    """Images/s over ``batches`` batches after PROBE_WARMUP, as many epochs as it takes."""
    if len(cast(Sized, loader)) == 0:
        return 0.0
    stream = (batch for _ in itertools.count() for batch in loader)
    for _ in itertools.islice(stream, PROBE_WARMUP):
        pass
    began, seen = time.perf_counter(), 0
    for batch in itertools.islice(stream, batches):
        first = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
        seen += len(first)
    return seen / max(time.perf_counter() - began, 1e-9)


def cached_rates(key: str, path: Path | None = None) -> dict[str, float] | None:
    """The rates a probe measured for ``key`` on this machine before, if any."""
    path = path or probe_cache_path()
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entries, dict) or entries.get("version") != PROBE_CACHE_VERSION:
        return None
    rates = entries.get("probes", {}).get(key)
    return {str(k): float(v) for k, v in rates.items()} if isinstance(rates, dict) else None


def store_rates(key: str, rates: dict[str, float], path: Path | None = None) -> None:
    """Record a probe's rates for ``key`` (written to a temporary name, then renamed)."""
    path = path or probe_cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        entries = json.loads(path.read_text())
        probes = entries["probes"] if entries.get("version") == PROBE_CACHE_VERSION else {}
    except (OSError, ValueError, KeyError, AttributeError):
        probes = {}
    probes[key] = rates
    atomic_write_bytes(path, json.dumps({"version": PROBE_CACHE_VERSION, "probes": probes}, indent=1).encode(), durable=False)


def probed_choice(key: str, make_loader: Callable[[str], Iterable], candidates: Sequence[str], gpu: bool,
                  path: Path | None = None) -> BackendChoice:
    """``auto``'s choice among ``candidates`` by their rates: cached for ``key``, else measured now
    and cached. Logs the rates either way."""
    rates = cached_rates(key, path)
    source = "cached probe"
    if rates is None or not set(candidates) <= rates.keys():
        rates = measure_rates(make_loader, candidates)
        store_rates(key, rates, path)
        source = "probe"
    best = max(candidates, key=lambda name: rates[name])
    measured = ", ".join(f"{name} {rates[name]:.0f}" for name in candidates)
    why = f"{source} on this machine ({key}): {measured} images/s"
    log.warning("fastload: backend=auto measured %s", measured)
    suffix = "" if best == "cpu" else ("-gpu" if gpu else "-cpu")
    return BackendChoice(best + suffix, why, rates)


def choose_backend(requested: str, decoded_pixels: bool, dali_refusal: str | None, key: str,
                   make_loader: Callable[[str], Iterable], num_workers: int, clips: bool = False) -> BackendChoice:
    """The engine for a validated ``backend=``; ``dali_refusal`` says why DALI cannot make these
    samples (None when it can); ``make_loader`` makes a probe's loaders for ``auto``; ``clips``:
    the samples are video clips (``auto`` keeps them on the CPU workers: DALI's video path has
    not been measured on a GPU yet, docs/video.md)."""
    from fastload.backends.dali.library import dali_available

    if requested == "cpu":
        return BackendChoice("cpu", "backend='cpu'")
    if clips and requested == "auto":
        return BackendChoice("cpu", "clips decode on the CPU workers unless backend='dali' asks for DALI's video path")
    if clips and requested == "hybrid":
        raise ValueError("backend='hybrid' splits batches of images between DALI and the CPU workers; for clips use backend='dali' or 'cpu'")
    if decoded_pixels:
        if requested != "auto":
            raise ValueError(f"backend={requested!r} decodes images; this dataset stores decoded pixels (use backend='cpu')")
        return BackendChoice("cpu", "the dataset stores decoded pixels: nothing to decode")
    gpu = torch.cuda.is_available()
    if requested in ("dali", "hybrid"):
        if not dali_available():
            raise ImportError(f"backend={requested!r} needs NVIDIA DALI: pip install 'fastload[dali]'")
        if dali_refusal is not None:
            raise ValueError(dali_refusal)
        where = ("-gpu", "a CUDA GPU is visible") if gpu else ("-cpu", "no CUDA GPU: DALI runs on the CPU")
        return BackendChoice(requested + where[0], where[1])
    if not gpu:
        return BackendChoice("cpu", "no CUDA GPU; on the CPU fastload's workers beat DALI's CPU pipeline")
    if not dali_available():
        return BackendChoice("cpu", "DALI is not installed (pip install 'fastload[dali]' for GPU decoding)")
    if dali_refusal is not None:
        return BackendChoice("cpu", f"DALI cannot make these samples ({dali_refusal})")
    candidates = ("cpu", "dali", "hybrid") if num_workers > 0 else ("cpu", "dali")
    return probed_choice(key, make_loader, candidates, gpu)
