"""Distributed loading with real gloo process groups: disjoint ranks that cover the dataset, equal
batch counts on uneven sizes (no collective hangs at the epoch's end), exact and elastic resume."""

from __future__ import annotations

import faulthandler
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fastload
from fastload._util.dist import resolve_rank_world
from fastload.converters import ConvertOptions, convert

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def dataset_1001(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("d1001")
    rng = np.random.default_rng(0)
    np.savez(root / "raw.npz", images=rng.integers(0, 256, (1001, 8, 8, 3), dtype=np.uint8), labels=np.arange(1001) % 7)
    convert(str(root / "raw.npz"), str(root / "wds"), ConvertOptions(source="npz", samples_per_shard=100))
    return root / "wds"


RANK_HANG_S = 180  # a rank's whole run takes seconds; past this it is stuck (pytest-timeout ends the test at 240 s)
# The watchdog stays armed after _rank_main returns: a rank stuck on its way out (multiprocessing's exit joining
# children or threads) also prints its stack and fails, instead of hanging mp.spawn's join with no stack of its own.


def _rank_main(rank: int, world: int, init: str, data: str | dict, out: str, kwargs: dict, state: dict | None, stop_after: int | None) -> None:
    faulthandler.dump_traceback_later(RANK_HANG_S, exit=True)  # a rank that hangs prints its stack and fails, before pytest's timeout
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    dataset = fastload.mix(data) if isinstance(data, dict) else data  # a dict: {path: weight} of a mixture
    loader = fastload.DataLoader(dataset, return_keys=True, transform=[fastload.transforms.CenterCrop(8)], **kwargs)
    assert (loader.rank, loader.world_size) == (rank, world)
    if state is not None:
        loader.load_state_dict(state)
    keys, valid, batches, saved = [], [], 0, None
    for batch in loader:
        keys += batch[2]
        valid += batch[3].tolist() if kwargs.get("evaluation") else [True] * len(batch[2])
        step = torch.ones(1)
        dist.all_reduce(step)  # a collective per batch, as DDP does: hangs if batch counts differ
        batches += 1
        if stop_after is not None and batches == stop_after:
            saved = loader.state_dict()
            break
    states = [None] * world
    dist.all_gather_object(states, saved)
    Path(out, f"rank{rank}.json").write_text(json.dumps({"keys": keys, "valid": valid, "batches": batches, "states": states}))
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


def run_ranks(tmp_path: Path, world: int, data: Path | dict[str, float], kwargs: dict, state: dict | None = None,
              stop_after: int | None = None) -> list[dict]:
    out = tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}"
    out.mkdir()
    source = data if isinstance(data, dict) else str(data)
    mp.spawn(_rank_main, args=(world, str(out / "init"), source, str(out), kwargs, state, stop_after), nprocs=world, join=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def all_keys(data: Path) -> list[str]:
    ds = fastload.open(data)
    return [ds.raw(i)[0] for i in range(len(ds))]


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_are_disjoint_cover_and_get_equal_batches(dataset_1001: Path, tmp_path: Path, drop_last: bool) -> None:
    results = run_ranks(tmp_path, 3, dataset_1001, dict(batch_size=7, shuffle=True, seed=1, drop_last=drop_last, num_workers=1))
    assert len({r["batches"] for r in results}) == 1
    per_rank = [r["keys"] for r in results]
    seen = Counter(k for keys in per_rank for k in keys)
    if drop_last:  # 1001 // 21 = 47 global steps; the 14 samples left over are dropped
        assert results[0]["batches"] == 47 and sum(seen.values()) == 987 and max(seen.values()) == 1
    else:  # one more batch of ceil(14 / 3) = 5 per rank; one sample repeated as padding
        assert results[0]["batches"] == 48 and set(seen) == set(all_keys(dataset_1001))
        assert sum(seen.values()) == 1002
        # the padding sits in the last rank's last slot: every other slot holds a sample of its own
        assert [k for k, n in seen.items() if n == 2] == [per_rank[2][-1]]


def test_evaluation_mode_marks_padding_so_each_sample_counts_once(dataset_1001: Path, tmp_path: Path) -> None:
    results = run_ranks(tmp_path, 3, dataset_1001, dict(batch_size=5, evaluation=True))
    assert len({r["batches"] for r in results}) == 1
    counted = Counter(k for r in results for k, ok in zip(r["keys"], r["valid"]) if ok)
    assert counted == Counter(all_keys(dataset_1001))
    assert sum(not ok for r in results for ok in r["valid"]) == 1  # 11 left over, 3 ranks x 4 slots


def shard_of_key(data: Path) -> dict[str, int]:
    ds = fastload.open(data)
    return {ds.raw(i)[0]: ds.locate(i)[0] for i in range(len(ds))}


@pytest.mark.parametrize("drop_last", [False, True])
def test_streaming_order_gives_each_rank_its_own_whole_shards(dataset_1001: Path, tmp_path: Path, drop_last: bool) -> None:
    kwargs = dict(batch_size=7, shuffle=True, shuffle_buffer=30, seed=2, drop_last=drop_last)
    results = run_ranks(tmp_path, 3, dataset_1001, kwargs)
    assert len({r["batches"] for r in results}) == 1
    shard_of = shard_of_key(dataset_1001)
    shards = [{shard_of[k] for k in r["keys"]} for r in results]
    assert not (shards[0] & shards[1]) and not (shards[0] & shards[2]) and not (shards[1] & shards[2])
    seen = Counter(k for r in results for k in r["keys"])
    if drop_last:  # every rank stops at the shortest lane's last full batch: nothing repeats
        assert max(seen.values()) == 1
    else:  # shorter lanes repeat their own samples; every sample is seen
        assert set(seen) == set(all_keys(dataset_1001))


@pytest.mark.slow
@pytest.mark.parametrize("world_after", [3, 2])
@pytest.mark.parametrize("streaming", [False, True])
def test_mid_epoch_resume_same_and_other_world_size(dataset_1001: Path, tmp_path: Path, world_after: int, streaming: bool) -> None:
    kwargs = dict(batch_size=9, shuffle=True, seed=4, evaluation=True, **(dict(shuffle_buffer=40) if streaming else {}))
    whole = run_ranks(tmp_path, 3, dataset_1001, kwargs)
    first = run_ranks(tmp_path, 3, dataset_1001, kwargs, stop_after=10)
    states = first[0]["states"]
    expected = {"version": 3, "seed": 4, "epoch": 0, "samples_consumed": 270, "dataset": fastload.DataLoader(dataset_1001, transform=fastload.transforms.val(8)).identity}
    order = dict(order="streaming", shuffle=True, shuffle_buffer=kwargs["shuffle_buffer"]) if streaming else dict(order="global", shuffle=True)
    expected.update(world_size=3, batch_size=9, resumed_from=[], **order)
    assert states[0] == states[1] == states[2] == expected
    second = run_ranks(tmp_path, world_after, dataset_1001, kwargs, state=states[0])
    before = [k for r in first for k in r["keys"]]
    after = [k for r in second for k, ok in zip(r["keys"], r["valid"]) if ok]
    assert not set(before) & set(after)
    assert Counter(before + after) == Counter(all_keys(dataset_1001))
    if world_after == 3:  # same world size: each rank continues exactly where it stopped
        for r in range(3):
            assert first[r]["keys"] + second[r]["keys"] == whole[r]["keys"]


def test_rank_discovery_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert resolve_rank_world() == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert resolve_rank_world() == (2, 4)
    assert resolve_rank_world(1, 2) == (1, 2)
    with pytest.raises(ValueError, match="rank=5 is not valid for world_size=4"):
        resolve_rank_world(5, None)


def test_streaming_resume_at_the_same_world_size_and_another_batch_size_delivers_every_sample_once(dataset_1001: Path) -> None:
    """Two ranks (each its own loader, as each process of a job has), saved after 10 steps of 9 a rank
    and resumed with batches of 7 (180 positions: no whole number of its steps): the samples before
    and after, padding left out, are the dataset once."""
    kwargs = dict(shuffle=True, seed=4, evaluation=True, shuffle_buffer=40, return_keys=True, transform=[fastload.transforms.CenterCrop(8)])
    before, state = [], None
    for rank in range(2):
        loader = fastload.DataLoader(dataset_1001, batch_size=9, rank=rank, world_size=2, **kwargs)
        it = iter(loader)
        for _ in range(10):
            _, _, keys, valid = next(it)
            before += [k for k, ok in zip(keys, valid.tolist()) if ok]
        state = loader.state_dict()
        loader.close()
    assert state is not None and state["samples_consumed"] == 180 and state["order"] == "streaming"
    after = []
    for rank in range(2):
        with fastload.DataLoader(dataset_1001, batch_size=7, rank=rank, world_size=2, **kwargs) as loader:
            loader.load_state_dict(state)
            after += [k for _, _, keys, valid in loader for k, ok in zip(keys, valid.tolist()) if ok]
    assert len(before) == 180 and Counter(before + after) == Counter(all_keys(dataset_1001))
