"""The one place a loader's engine is made: ``backend=`` resolved into a choice
(fastload.backends.choice: as asked, or ``auto`` by measurement) and the engine that makes the
loader's epochs (an :class:`~fastload.loading.epoch.Engine`).

To add a backend: a folder under ``backends/`` with an engine class (``epoch(inputs)``,
``close()``), its row in :data:`ENGINES`, and its name in ``fastload.loading.loader_options.Backend``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fastload.backends.choice import BackendChoice, cached_rates, choose_backend, probe_key
from fastload.backends.cpu.cpu_epoch import CpuEpoch
from fastload.backends.cpu.pool_engine import CpuWorkers
from fastload.backends.dali.dali_epoch import DaliPipeline, dali_refusal
from fastload.backends.hybrid.hybrid_epoch import HybridEngine
from fastload.fields import SampleSpec
from fastload.loading.epoch import Engine
from fastload.loading.loader_options import LoaderOptions
from fastload.media import has_frames


def _hybrid(choice: BackendChoice, options: LoaderOptions, key: str) -> Engine:
    """The hybrid engine, its split started from the probe's rates (this one's, else an earlier one's; else even)."""
    rates = choice.rates or cached_rates(key) or {}
    known = (rates["dali"], rates["cpu"]) if {"dali", "cpu"} <= rates.keys() else None
    return HybridEngine(choice.gpu, options.num_workers, known)


ENGINES: dict[str, Callable[[BackendChoice, LoaderOptions, str], Engine]] = {
    "cpu": lambda choice, options, key: CpuWorkers(CpuEpoch),
    "dali": lambda choice, options, key: DaliPipeline(gpu=choice.gpu),
    "hybrid": _hybrid,
}


def make_engine(options: LoaderOptions, sample_spec: SampleSpec, decoded_pixels: bool,
                probe_loader: Callable[[str], Iterable]) -> tuple[BackendChoice, Engine]:
    """The engine for a loader's validated options and the fields it makes: the choice (named,
    with why) and the engine itself. ``probe_loader(backend)`` makes the loaders ``auto`` times."""
    key = probe_key(options.transform, options.num_workers, options.batch_size)
    refusal = dali_refusal(sample_spec, options.torchvision_steps)
    choice = choose_backend(options.backend, decoded_pixels, refusal, key, probe_loader, options.num_workers,
                            has_frames(sample_spec.media))
    return choice, ENGINES[choice.engine](choice, options, key)
