"""fastload.DataLoader inside real training frameworks and torch's own idioms: Lightning DDP,
Accelerate under torchrun, a torchrun script written for torch's DataLoader + DistributedSampler;
and the loader behaviours they rely on (epochs, rank discovery, samplers, Subset, lifecycle)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import RandomSampler, Subset, SubsetRandomSampler, TensorDataset, WeightedRandomSampler
from torch.utils.data.distributed import DistributedSampler

import fastload
from fastload import transforms as T
from fastload.converters.conversion import convert
from fastload.converters.convert_options import ConvertOptions
from tests.conftest import run_script, torchrun

HERE = Path(__file__).parent / "frameworks"
N = 43  # odd: every topology has a remainder


@pytest.fixture(scope="module")
def data43(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("d43")
    rng = np.random.default_rng(0)
    np.savez(root / "raw.npz", images=rng.integers(0, 256, (N, 8, 8, 3), dtype=np.uint8), labels=np.arange(N) % 5)
    convert(str(root / "raw.npz"), str(root / "wds"), ConvertOptions(source="npz", samples_per_shard=10))
    return root / "wds"


def loader_keys(loader: fastload.DataLoader, limit: int | None = None) -> list[str]:
    return [k for *_, keys in itertools.islice(iter(loader), limit) for k in keys]


# --- the loader behaviours frameworks rely on ---------------------------------------------------


def test_taking_len_batches_finishes_the_epoch(data43: Path) -> None:
    """Lightning (and islice(iter(loader), len(loader))) never reach StopIteration: the next iter()
    must still start the next epoch, and state_dict must say so."""
    with fastload.DataLoader(data43, batch_size=4, shuffle=True, transform=T.val(8), return_keys=True) as loader:
        first = loader_keys(loader, len(loader))
        assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["samples_consumed"] == 0
        second = loader_keys(loader, len(loader))
        assert first != second and sorted(first) == sorted(second)
        broken = loader_keys(loader, 2)  # a break before the end: the epoch starts over, as in torch
        assert loader.state_dict()["epoch"] == 2 and loader.state_dict()["samples_consumed"] == 8
        assert loader_keys(loader)[:8] == broken


def test_rank_and_world_come_from_the_environment_when_iteration_starts(data43: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    loader = fastload.DataLoader(data43, batch_size=4, transform=T.val(8), return_keys=True)
    assert (loader.rank, loader.world_size) == (0, 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")  # Lightning's DDP children: no RANK
    assert (loader.rank, loader.world_size) == (1, 2)
    assert len(loader) == 6 and len(loader_keys(loader)) == 22  # 21.5 a rank, padded
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert (loader.rank, loader.world_size) == (3, 4)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    with pytest.raises(ValueError, match="cannot tell this process's global rank"):
        _ = loader.rank
    monkeypatch.setenv("RANK", "2")
    assert (loader.rank, loader.world_size) == (2, 4)
    explicit = fastload.DataLoader(data43, batch_size=4, transform=T.val(8), rank=0, world_size=3)
    assert (explicit.rank, explicit.world_size) == (0, 3)


def test_distributed_sampler_drives_the_fast_path(data43: Path) -> None:
    ranks = []
    for rank in (0, 1):
        sampler = DistributedSampler(fastload.open(data43), num_replicas=2, rank=rank, shuffle=True, seed=7, drop_last=True)
        loader = fastload.DataLoader(data43, batch_size=4, sampler=sampler, transform=T.val(8), return_keys=True)
        assert (loader.rank, loader.world_size, loader.seed, loader.shuffle) == (rank, 2, 7, True)
        assert loader.sampler is sampler and len(loader.sampler) == 21
        epoch0 = loader_keys(loader)
        sampler.set_epoch(5)  # takes effect at the next iteration
        epoch5 = loader_keys(loader)
        sampler.set_epoch(5)
        assert loader_keys(loader) != epoch5  # not set again: the loader's epoch advanced by itself
        ranks.append((epoch0, epoch5))
    for e in (0, 1):
        a, b = ranks[0][e], ranks[1][e]
        assert len(a) == len(b) == 21 and not set(a) & set(b)
    assert ranks[0][0] != ranks[0][1]


def test_loader_sampler_and_batch_sampler_have_torch_meanings(data43: Path) -> None:
    loader = fastload.DataLoader(data43, batch_size=4, shuffle=True, transform=T.val(8), rank=1, world_size=2, return_keys=True)
    assert isinstance(loader, torch.utils.data.DataLoader) and isinstance(loader.sampler, DistributedSampler)
    indices = list(loader.sampler)
    keys = loader_keys(loader)
    ds = fastload.open(data43)
    assert [ds.raw(i)[0] for i in indices] == keys and len(loader.sampler) == 22
    assert (loader.sampler.num_replicas, loader.sampler.rank) == (2, 1)
    loader.sampler.set_epoch(3)
    assert loader.state_dict()["epoch"] == 3
    batches = list(loader.batch_sampler)
    assert len(batches) == len(loader) == 6 and [len(b) for b in batches] == [4] * 5 + [2]
    assert loader.batch_sampler.sampler is loader.sampler
    assert [ds.raw(i)[0] for b in batches for i in b] == loader_keys(loader)


def test_refused_samplers_say_what_to_use(data43: Path) -> None:
    for sampler in (WeightedRandomSampler([1.0] * N, N), RandomSampler(range(N), replacement=True), list(range(5))):
        with pytest.raises(ValueError, match="cannot honour sampler=.*Subset"):
            fastload.DataLoader(data43, batch_size=4, sampler=sampler, transform=T.val(8))
    with pytest.raises(ValueError, match="mutually exclusive with shuffle"):
        fastload.DataLoader(data43, batch_size=4, shuffle=True, sampler=RandomSampler(range(N)), transform=T.val(8))


def test_subsets_and_subset_samplers_take_the_fast_path(data43: Path) -> None:
    ds = fastload.open(data43)
    picks = [40, 3, 17, 8, 22, 31, 5]
    loader = fastload.DataLoader(Subset(Subset(ds, list(range(N))[::-1]), [N - 1 - p for p in picks]), batch_size=3,
                                 transform=T.val(8), return_keys=True)
    assert loader.backend == "cpu" and loader_keys(loader) == [ds.raw(p)[0] for p in picks]
    shuffled = fastload.DataLoader(data43, batch_size=3, sampler=SubsetRandomSampler(picks), transform=T.val(8), return_keys=True)
    got = loader_keys(shuffled)
    assert sorted(got) == sorted(ds.raw(p)[0] for p in picks) and got != [ds.raw(p)[0] for p in picks]


def test_torch_dataset_mode_has_every_method() -> None:
    dataset = TensorDataset(torch.arange(20))
    with fastload.DataLoader(dataset, batch_size=3, shuffle=True, seed=2) as loader:
        assert isinstance(loader, fastload.DataLoader) and isinstance(loader, torch.utils.data.DataLoader)
        whole = [b[0].tolist() for b in loader]
        it = iter(loader)
        part = [next(it)[0].tolist() for _ in range(3)]
        state = loader.state_dict()
        assert state["epoch"] == 1 and state["batches_consumed"] == 3 and part != whole[:3]
        resumed = fastload.DataLoader(dataset, batch_size=3, shuffle=True, seed=2)
        resumed.load_state_dict(state)
        assert part + [b[0].tolist() for b in resumed] == [b[0].tolist() for b in _epoch(dataset, 1)]
        loader.set_epoch(0)
        assert [b[0].tolist() for b in loader] == whole
        assert loader.stats.batches == 7 + 3 + 7 and loader.sampler is not None
    sampler = DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True)
    dl = fastload.DataLoader(dataset, batch_size=4, sampler=sampler)
    dl.set_epoch(4)
    assert sampler.epoch == 0 and list(iter(dl)) and sampler.epoch == 4


def _epoch(dataset: TensorDataset, epoch: int) -> fastload.DataLoader:
    loader = fastload.DataLoader(dataset, batch_size=3, shuffle=True, seed=2)
    loader.set_epoch(epoch)
    return loader


def test_dropped_loaders_stop_their_workers_at_once(data43: Path) -> None:
    """50 loaders made and dropped (after a break, or at the end of a function) leave at most one
    loader's workers alive, with no cyclic garbage collection; no finalizer runs in another
    loader's workers (it had printed 'can only join a child process')."""
    script = textwrap.dedent(f"""
        import gc, itertools, psutil, fastload, fastload.transforms as T
        from fastload import DataLoader  # imported first: the frame that imports it keeps import-time garbage
        gc.disable()
        def one_epoch(i):
            loader = DataLoader({str(data43)!r}, batch_size=4, num_workers=2, transform=T.val(8))
            for j, _ in enumerate(loader):
                if j == i % 3:
                    break
        most = 0
        for i in range(50):
            one_epoch(i)
            for _ in itertools.islice(DataLoader({str(data43)!r}, batch_size=4, num_workers=2, transform=T.val(8)), 2):
                most = max(most, len(psutil.Process().children()))
            most = max(most, len(psutil.Process().children()))
        print("most", most, "left", len(psutil.Process().children()))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["most", "2", "left", "0"], proc.stdout
    assert "can only join" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-3000:]


def test_state_dict_refuses_another_dataset(data43: Path, tmp_path: Path) -> None:
    loader = fastload.DataLoader(data43, batch_size=4, transform=T.val(8))
    other = fastload.DataLoader(Subset(fastload.open(data43), range(20)), batch_size=4, transform=T.val(8))
    with pytest.raises(ValueError, match="saved for another dataset"):
        other.load_state_dict(loader.state_dict())


# --- real frameworks ------------------------------------------------------------------------------


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("mixture", [False, True])
def test_lightning_ddp_shards_reshuffles_and_resumes(data43: Path, tmp_path: Path, mixture: bool) -> None:
    whole, split = tmp_path / "whole", tmp_path / "split"
    whole.mkdir(), split.mkdir()
    mix = ["--mix"] if mixture else []
    run_script([sys.executable, str(HERE / "lightning_ddp.py"), str(data43), str(whole), *mix])
    by_epoch = {}
    for rank in (0, 1):
        for row in read_jsonl(whole / f"rank{rank}.jsonl"):
            by_epoch.setdefault((rank, row["epoch"]), []).append(row["keys"])
    for epoch in (0, 1):
        a, b = ([k for keys in by_epoch[(rank, epoch)] for k in keys] for rank in (0, 1))
        assert len(a) == len(b) == 22  # 5 batches of 4 and one of 2 per rank (one padding entry)
        assert len(set(a) | set(b)) == N  # disjoint up to the padding, complete
    assert by_epoch[(0, 0)] != by_epoch[(0, 1)]  # a new order every epoch
    assert all(k.startswith("0/") == mixture for keys in by_epoch[(0, 0)] for k in keys)  # a mixture's keys name the member
    # preempted after step 3 (mid-epoch 0): resume from that checkpoint in a new run
    run_script([sys.executable, str(HERE / "lightning_ddp.py"), str(data43), str(split), str(whole / "step=3.ckpt"), *mix])
    for rank in (0, 1):
        rows = read_jsonl(split / f"rank{rank}.jsonl")
        assert [r["keys"] for r in rows if r["epoch"] == 0] == by_epoch[(rank, 0)][3:]  # exactly the rest of epoch 0
        assert [r["keys"] for r in rows if r["epoch"] == 1] == by_epoch[(rank, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("mixture", [False, True])
def test_accelerate_under_torchrun(data43: Path, tmp_path: Path, mixture: bool) -> None:
    run_script(torchrun(HERE / "accelerate_train.py", str(data43), str(tmp_path), *(["--mix"] if mixture else [])))
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for report in reports:
        assert report["prepared_is_fastload"] and report["batches"] == 6
        assert report["syncs"] == [False, False, False, True, False, True]  # synced on the epoch's last batch
        assert report["val_seen"] == N  # gather_for_metrics drops the padding
        assert report["resumed_equal"] and report["skip_equal"]
    assert len(set(reports[0]["epoch1_keys"]) | set(reports[1]["epoch1_keys"])) == N  # the ranks share the epoch
    assert all(k.startswith("0/") == mixture for k in reports[0]["epoch1_keys"])  # a mixture's keys name the member


@pytest.mark.slow
def test_torchrun_script_written_for_torch(data43: Path, tmp_path: Path) -> None:
    run_script(torchrun(HERE / "torchrun_imagenet_style.py", str(data43), str(tmp_path)))
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for epoch in (0, 1):
        a, b = reports[0]["epochs"][epoch], reports[1]["epochs"][epoch]
        assert len(a) == len(b) == 22 and len(set(a) | set(b)) == N  # ceil(43 / 2) each, as DistributedSampler pads
    assert reports[0]["epochs"][0] != reports[0]["epochs"][1]  # set_epoch took effect
    validated = reports[0]["validated"] + reports[1]["validated"]
    assert len(validated) == len(set(validated)) == 42 and reports[0]["sampler_len"] == 21  # drop_last: 43 - 43 % 2
    remainder = set(reports[0]["remainder"]) | set(reports[1]["remainder"])
    assert remainder == {fastload.open(data43).raw(N - 1)[0]} and not remainder & set(validated)  # every sample validated
    for report in reports:
        assert report["resumed_epoch1"] == report["epochs"][1]  # --resume replays the right epoch


@pytest.mark.parametrize("make", [lambda ds: Subset(ds, [0, 9999]), lambda ds: Subset(ds, [-1, 0]),
                                  lambda ds: Subset(Subset(ds, [1, 2, 3]), [0, 3])])
def test_a_subset_index_out_of_range_is_refused_not_read_as_another_sample(data43: Path, make) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(IndexError, match="Subset index .* out of range"):
        fastload.DataLoader(make(fastload.open(data43)), batch_size=2, transform=T.val(8))
    with pytest.raises(IndexError, match="SubsetRandomSampler index 50 .position 1. out of range for 43"):
        fastload.DataLoader(data43, batch_size=2, sampler=SubsetRandomSampler([1, 50]), transform=T.val(8))
