"""The resume contract, one harness run against every path an epoch can take (the CPU workers,
the inline CPU path, DALI on the CPU, the streaming order, a remote dataset over loopback HTTP):
take k batches, save ``state_dict()``, build a fresh loader, load the state, and the rest of the
epoch equals an uninterrupted run, pixel for pixel, key for key. The data: conftest's ``clean``
(30 JPEGs in 4 tar shards)."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import fastload
from fastload import transforms as T
from tests.storage.test_remote import DatasetServer

Batch = tuple[torch.Tensor, torch.Tensor, list[str]]
EPOCH = 2
BATCH = 4


def dali_installed() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def clone(batch: Any) -> Batch:
    images, labels, keys = batch
    return images.cpu().clone(), labels.cpu().clone(), list(keys)


def assert_same_batches(got: list[Batch], expected: list[Batch]) -> None:
    assert [keys for *_, keys in got] == [keys for *_, keys in expected]
    for (images, labels, _), (want_images, want_labels, _) in zip(got, expected):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


# What a training loop calls at the top of each epoch, after load_state_dict: it must keep the
# loaded position when it names the state's epoch (torch-style loops call it every epoch).
TOP_OF_EPOCH: dict[str, Callable[[fastload.DataLoader], None]] = {
    "nothing": lambda loader: None,
    "loader.set_epoch": lambda loader: loader.set_epoch(EPOCH),
    "loader.sampler.set_epoch": lambda loader: loader.sampler.set_epoch(EPOCH),
    "set_epoch twice": lambda loader: (loader.set_epoch(EPOCH), loader.set_epoch(EPOCH)),
}


def run_resume_contract(make_loader: Callable[[], fastload.DataLoader], taken: int,
                        top_of_epoch: Callable[[fastload.DataLoader], None] = TOP_OF_EPOCH["nothing"]) -> None:
    """Take ``taken`` batches of epoch EPOCH, save, resume in a fresh loader (``top_of_epoch``
    called after loading, as a training loop does): the rest matches an uninterrupted run, and the
    resumed loader then moves on to the next epoch."""
    with make_loader() as loader:
        loader.set_epoch(EPOCH)
        uninterrupted = [clone(b) for b in loader]
    assert 0 <= taken < len(uninterrupted), "the harness resumes inside the epoch"
    with make_loader() as loader:
        loader.set_epoch(EPOCH)
        before = [clone(b) for b in itertools.islice(iter(loader), taken)]
        state = loader.state_dict()
        assert state["epoch"] == EPOCH and state["samples_consumed"] == taken * BATCH * loader.world_size
    with make_loader() as loader:
        loader.load_state_dict(state)
        top_of_epoch(loader)
        assert len(loader.batch_sampler) == len(uninterrupted) - taken
        after = [clone(b) for b in loader]
        assert loader.state_dict()["epoch"] == EPOCH + 1 and loader.state_dict()["samples_consumed"] == 0
    assert_same_batches(before + after, uninterrupted)


@pytest.fixture()
def served(clean: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("FASTLOAD_RETRY_DELAY", "0.05")
    root = tmp_path / "served"
    shutil.copytree(clean, root)
    server = DatasetServer(root)
    yield server.url
    server.shutdown()
    server.server_close()


LOCAL_PATHS = {
    "cpu workers": {"backend": "cpu", "num_workers": 2},
    "cpu inline": {"backend": "cpu", "num_workers": 0},
    "cpu, rank 1 of 2": {"backend": "cpu", "num_workers": 1, "rank": 1, "world_size": 2},
    "dali on the cpu": {"backend": "dali", "num_workers": 1},
    "streaming order": {"backend": "cpu", "num_workers": 2, "shuffle_buffer": 5},
}


@pytest.mark.parametrize("taken", [0, 1, 3])
@pytest.mark.parametrize("path", sorted(LOCAL_PATHS))
def test_resume_equals_an_uninterrupted_run(clean: Path, path: str, taken: int) -> None:
    if path.startswith("dali") and not dali_installed():
        pytest.skip("needs NVIDIA DALI")
    kwargs = dict(batch_size=BATCH, shuffle=True, seed=5, transform=T.train(16), return_keys=True, **LOCAL_PATHS[path])
    run_resume_contract(lambda: fastload.DataLoader(clean, **kwargs), taken)


@pytest.mark.parametrize("taken", [0, 3])
def test_resume_of_a_remote_dataset_equals_an_uninterrupted_run(served: str, tmp_path: Path, taken: int) -> None:
    def make_loader() -> fastload.DataLoader:
        dataset = fastload.open(served, cache_dir=tmp_path / "cache")
        return fastload.DataLoader(dataset, batch_size=BATCH, shuffle=True, seed=5, transform=T.train(16),
                                   return_keys=True, num_workers=2)

    run_resume_contract(make_loader, taken)


@pytest.mark.parametrize("top", sorted(set(TOP_OF_EPOCH) - {"nothing"}))
@pytest.mark.parametrize("path", sorted(LOCAL_PATHS))
def test_set_epoch_of_the_loaded_epoch_keeps_the_resumed_position(clean: Path, path: str, top: str) -> None:
    """load_state_dict, then set_epoch(the state's epoch) at the top of the loop: the rest of the
    epoch, not the epoch over (a bug restarting it delivered 52 samples of a 40-sample epoch)."""
    if path.startswith("dali") and not dali_installed():
        pytest.skip("needs NVIDIA DALI")
    kwargs = dict(batch_size=BATCH, shuffle=True, seed=5, transform=T.train(16), return_keys=True, **LOCAL_PATHS[path])
    run_resume_contract(lambda: fastload.DataLoader(clean, **kwargs), 3, TOP_OF_EPOCH[top])


def test_set_epoch_of_the_loaded_epoch_keeps_a_mixtures_position(clean: Path, h5_clean: Path) -> None:
    def make_loader() -> fastload.DataLoader:
        return fastload.DataLoader(fastload.mix({clean: 2.0, h5_clean: 1.0}, samples_per_epoch=36), batch_size=BATCH, shuffle=True,
                                   seed=5, transform=T.train(16), return_keys=True, num_workers=2)

    for top in ("loader.set_epoch", "loader.sampler.set_epoch"):
        run_resume_contract(make_loader, 4, TOP_OF_EPOCH[top])


def test_a_distributed_samplers_set_epoch_after_loading_keeps_the_position(clean: Path) -> None:
    """sampler=DistributedSampler (rank 1 of 2), whose set_epoch the loader follows when iteration starts."""
    from torch.utils.data.distributed import DistributedSampler

    def make_loader() -> fastload.DataLoader:
        sampler = DistributedSampler(range(30), num_replicas=2, rank=1, shuffle=True, seed=5)
        loader = fastload.DataLoader(clean, batch_size=BATCH, sampler=sampler, transform=T.train(16), return_keys=True, num_workers=1)
        loader.distributed_sampler = sampler  # type: ignore[attr-defined]  # the caller's, to set_epoch as a loop does
        return loader

    run_resume_contract(make_loader, 1, lambda loader: loader.distributed_sampler.set_epoch(EPOCH))  # type: ignore[attr-defined]


def test_set_epoch_of_another_epoch_after_loading_starts_that_epoch_whole(clean: Path) -> None:
    kwargs = dict(batch_size=BATCH, shuffle=True, seed=5, transform=T.train(16), return_keys=True, num_workers=2)
    with fastload.DataLoader(clean, **kwargs) as loader:
        loader.set_epoch(EPOCH + 1)
        whole = [keys for *_, keys in loader]
    with fastload.DataLoader(clean, **kwargs) as loader:
        loader.set_epoch(EPOCH)
        next(iter(loader))
        state = loader.state_dict()
    with fastload.DataLoader(clean, **kwargs) as loader:
        loader.load_state_dict(state)
        loader.set_epoch(EPOCH + 1)
        assert [keys for *_, keys in loader] == whole


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_state_saved_on_the_last_batch_then_that_epoch_set_again_is_not_replayed(clean: Path, num_workers: int) -> None:
    """A loop that checkpoints its own epoch number beside the state on the epoch's last batch,
    then resumes with set_epoch(that number): nothing more of it (not the epoch over), then the
    next epoch whole. And describe(step) in the loop body names the batch just delivered, the
    last one too (the position has moved on to the next epoch by then)."""
    kwargs = dict(batch_size=BATCH, shuffle=True, seed=5, transform=T.train(16), return_keys=True, num_workers=num_workers)
    runs: dict[int, list[list[str]]] = {}
    with fastload.DataLoader(clean, **kwargs) as loader:
        for epoch in (EPOCH, EPOCH + 1):
            loader.set_epoch(epoch)
            runs[epoch] = []
            for step, (*_, keys) in enumerate(loader):
                runs[epoch].append(list(keys))
                assert [sample.key for sample in loader.describe(step).samples] == list(keys)
                if epoch == EPOCH:
                    saved = (epoch, loader.state_dict())
    assert saved[1]["epoch"] == EPOCH + 1 and saved[1]["samples_consumed"] == 0
    with fastload.DataLoader(clean, **kwargs) as loader:
        loader.load_state_dict(saved[1])
        loader.set_epoch(saved[0])
        assert [keys for *_, keys in loader] == []
        assert (loader.state_dict()["epoch"], loader.state_dict()["samples_consumed"]) == (EPOCH + 1, 0)
        loader.set_epoch(EPOCH + 1)
        assert [list(keys) for *_, keys in loader] == runs[EPOCH + 1]
