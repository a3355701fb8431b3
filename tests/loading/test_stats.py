"""loader.stats by stage: real workers' counters add up, and the verdict follows the training loop."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload import transforms as T
from fastload.converters import ConvertOptions, convert
from fastload.workers.stage_clock import WORKER_STAGES
from tests.conftest import photo_folder
from tests.storage.test_remote import DatasetServer


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 JPEGs of 200x240, 6 per shard."""
    out = tmp_path_factory.mktemp("stats-wds")
    source = photo_folder(tmp_path_factory.mktemp("stats-src"), 24, (200, 240))
    convert(str(source), str(out), ConvertOptions(source="imagefolder", samples_per_shard=6))
    return out


def run_epoch(loader: fastload.DataLoader, sleep_s: float = 0.0) -> None:
    for _ in loader:
        time.sleep(sleep_s)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stage_totals_add_up(photos: Path, num_workers: int) -> None:
    with fastload.DataLoader(str(photos), batch_size=4, shuffle=True, num_workers=num_workers, transform=T.train(64),
                             map=lambda sample, rng: sample) as loader:
        run_epoch(loader)
        epoch = loader.stats.epochs[-1]
    ds = fastload.open(photos)
    stages = epoch.stage_s()
    assert set(stages) == set(WORKER_STAGES) and epoch.complete and (epoch.batches, epoch.samples) == (6, 24)
    assert all(seconds > 0 for seconds in stages.values())  # read, decode, transform and map= all timed
    assert epoch.workers is not None
    per_process = epoch.workers[:, : len(WORKER_STAGES)].sum(axis=1)
    assert (per_process <= epoch.wall_s).all()  # each process's stages lie within the epoch
    # the workers share one task queue: under load one may take every batch before the other starts
    assert 1 <= epoch.busy_processes() == np.count_nonzero(per_process) <= max(num_workers, 1)
    assert epoch.workers[:, len(WORKER_STAGES) + 1].sum() == 24  # each sample made once
    assert epoch.workers[:, len(WORKER_STAGES)].sum() == sum(len(v) for i in range(24) for v in ds.raw(i)[1].values())
    assert 0 < epoch.wait_s <= epoch.wall_s and epoch.handoff_s > 0
    assert epoch.wait_s + epoch.handoff_s + epoch.device_s <= epoch.wall_s


def test_the_verdict_follows_the_training_loop(photos: Path) -> None:
    with fastload.DataLoader(str(photos), batch_size=4, num_workers=1, transform=T.train(64)) as loader:
        run_epoch(loader)  # a loop that does nothing waits for every batch
        fast = loader.stats.epochs[-1]
        run_epoch(loader, sleep_s=0.2)  # a slow loop: the worker is always ahead
        slow = loader.stats.epochs[-1]
        summary = loader.stats.summary().splitlines()
    assert fast.verdict().startswith("input-bound by") and "% of worker time; try more workers" in fast.verdict()
    assert slow.verdict().startswith("not input-bound (") and slow.stall < 0.1
    assert [line.split(":")[0] for line in summary] == ["epoch 0", "epoch 1", "verdict"]
    assert summary[-1].startswith(f"verdict: {slow.verdict()}")


def test_an_epoch_broken_off_is_reported_as_such(photos: Path) -> None:
    with fastload.DataLoader(str(photos), batch_size=4, num_workers=1, transform=T.train(64)) as loader:
        for step, _ in enumerate(loader):
            if step == 1:
                break
        run_epoch(loader)  # starts the epoch over
        first, second = loader.stats.epochs
    assert (first.complete, first.batches) == (False, 2) and (second.complete, second.batches) == (True, 6)
    assert first.line().startswith("epoch 0 (broken off): 8 samples in 2 batches")


def test_the_dali_backend_reports_what_it_can(photos: Path) -> None:
    pytest.importorskip("nvidia.dali")
    with fastload.DataLoader(str(photos), batch_size=4, backend="dali", transform=T.train(64)) as loader:
        run_epoch(loader)
        epoch = loader.stats.epochs[-1]
    assert epoch.workers is None and epoch.stage_s() == {} and epoch.batches == 6
    assert 0 < epoch.wait_s <= epoch.wall_s and epoch.handoff_s > 0
    assert epoch.line().endswith("worker stages not measured (DALI runs them in its own pipeline)")
    assert "of worker time" not in epoch.verdict()


def test_reads_of_a_remote_dataset_count_as_remote(photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTLOAD_RETRY_DELAY", "0.05")
    server = DatasetServer(photos)
    try:
        dataset = fastload.open(server.url, cache_dir=tmp_path / "cache")
        with fastload.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2, transform=T.train(64), return_keys=True) as loader:
            keys = [key for _, _, batch_keys in loader for key in batch_keys]
            epoch = loader.stats.epochs[-1]
            described = [key for step in range(epoch.batches) for key in loader.describe(step, 0).keys]
    finally:
        server.shutdown()
        server.server_close()
    assert epoch.remote and "MB remote)" in epoch.line() and epoch.stage_s()["read"] > 0
    assert epoch.workers is not None and epoch.workers[:, len(WORKER_STAGES)].sum() > 0
    assert described == keys  # the streaming order a remote dataset reads in, described too
