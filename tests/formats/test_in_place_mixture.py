"""Mixtures of data read in place with converted datasets (#40): ``fastload.mix`` of Parquet files
and tar shards loaded by ``fastload.DataLoader`` — the classic samples of both however each names
its fields, the weights, each member in its own order (the in-place member streams a window of row
groups at a time), exact and elastic resume, and the refusals."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pytest
import torch

import fastload
from fastload import transforms as T
from tests.conftest import png_bytes, small_photo
from tests.formats.test_parquet_in_place import cache, converted, hub, hub_rows  # noqa: F401  # cache: every test reads with a cache folder of its own; hub: the module fixture of the same rows as Parquet
from tests.test_resume_contract import BATCH, LOCAL_PATHS, dali_installed, run_resume_contract

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def shards(hub: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The hub's rows converted to tar shards of 8 samples (fields jpg and cls)."""
    return converted(hub, tmp_path_factory.mktemp("converted") / "wds")


def keys_of(loader: fastload.DataLoader, stop_after: int | None = None) -> list[str]:
    return [key for batch in itertools.islice(iter(loader), stop_after) for key in batch[2]]


def test_in_place_and_converted_members_give_their_classic_samples_by_weight(hub: Path, shards: Path,  # noqa: F811
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Parquet's image and label columns and the tars' jpg and cls are one (images, labels) batch;
    the weights hold exactly an epoch; no member sample twice within its own epoch; each label
    is its row's; the Parquet member is read in its streaming order, a window of row groups at a time."""
    in_place = fastload.open(hub)
    row_bytes = in_place.index.total_bytes // len(in_place)
    monkeypatch.setenv("FASTLOAD_PARQUET_MEMORY", str(20 * row_bytes))  # a window of about 10 rows (half the memory)
    mixture = fastload.mix({in_place: 1, fastload.open(shards): 2})
    with fastload.DataLoader(mixture, batch_size=6, shuffle=True, seed=2, transform=T.val(16), return_keys=True,
                             num_workers=2) as loader:
        batches = list(loader)
        described = loader.describe(1, 0)
    assert described.keys == batches[1][2]
    for sample in described.samples:  # each names its member's file: a Parquet file of the hub, a tar shard
        assert sample.shard.startswith(f"{hub}/train-") if sample.key.startswith("0/") else sample.shard.startswith(f"{shards}/shard-")
    keys = [key for _, _, ks in batches for key in ks]
    by_member = [[own for number, own in map(mixture.member_key, keys) if number == member] for member in range(2)]
    assert [len(own) for own in by_member] == [30, 60] and len(set(by_member[0])) == 30 and len(set(by_member[1])) == 45
    rows = {in_place.key_of(i): i for i in range(len(in_place))}
    tars = fastload.open(shards)
    for images, labels, ks in batches:
        assert images.shape == (len(ks), 3, 16, 16) and images.float().mean() > 0
        for label, key in zip(labels.tolist(), ks):
            number, own = mixture.member_key(key)
            want = rows[own] % 3 if number == 0 else tars[int(tars.indices_of([own])[0])]["label"]
            assert label == want
    groups = [in_place.locate(rows[own])[0] for own in by_member[0][:9]]
    assert len(set(groups)) <= 3  # the member's first 9 rows come from one window of row groups holding >= 10 rows


def test_in_place_members_named_differently_mix(hub: Path, tmp_path: Path) -> None:  # noqa: F811
    """Two Parquet datasets naming their image and label columns differently, and a converted one."""
    pq.write_table(pa.table({"img": [png_bytes(small_photo(i)) for i in range(12)], "y": [i % 3 for i in range(12)]}),
                   tmp_path / "other.parquet", row_group_size=5)
    mixture = fastload.mix({fastload.open(hub): 1, fastload.open(tmp_path / "other.parquet"): 1})
    with fastload.DataLoader(mixture, batch_size=19, shuffle=False, transform=T.val(16), return_keys=True) as loader:
        (images, labels, keys), *_ = list(loader)
    own = [mixture.member_key(key) for key in keys]
    assert Counter(number for number, _ in own) == {0: 10, 1: 9} and images.shape == (19, 3, 16, 16)
    assert labels.tolist() == [int(key.split(":row")[1]) % 3 for _, key in own]  # each file's label column, row by row
    same = fastload.mix({fastload.open(hub): 1, fastload.open(hub / "train-00001-of-00002.parquet"): 1})  # the same columns
    with fastload.DataLoader(same, batch_size=4, fields=["caption", "label"], return_keys=True) as loader:
        captions, labels, keys = next(iter(loader))
    assert captions == [f"photo {int(key.split(':row')[1]) + 30 * key.startswith('1/')}" for key in keys]


@pytest.mark.parametrize("taken", [1, 3])
@pytest.mark.parametrize("path", ["cpu workers", "dali on the cpu"])
def test_resume_of_a_mixture_with_a_member_in_place_equals_an_uninterrupted_run(hub: Path, shards: Path, path: str,  # noqa: F811
                                                                                taken: int) -> None:
    if path.startswith("dali") and not dali_installed():
        pytest.skip("needs NVIDIA DALI")

    def make_loader() -> fastload.DataLoader:
        return fastload.DataLoader(fastload.mix({fastload.open(shards): 1, fastload.open(hub): 1}, samples_per_epoch=40),
                                   batch_size=BATCH, shuffle=True, seed=5, transform=T.train(16), return_keys=True, **LOCAL_PATHS[path])

    run_resume_contract(make_loader, taken)


def test_resume_at_another_world_size_delivers_every_remaining_sample_once(hub: Path, shards: Path) -> None:  # noqa: F811
    mixture = fastload.mix({fastload.open(hub): 2, fastload.open(shards): 1}, samples_per_epoch=60)

    def loader_of(rank: int, world: int) -> fastload.DataLoader:
        return fastload.DataLoader(mixture, batch_size=3, shuffle=True, seed=7, transform=T.val(16), return_keys=True,
                                   rank=rank, world_size=world)

    whole = keys_of(loader_of(0, 1))
    first = [loader_of(rank, 2) for rank in range(2)]
    before = [key for loader in first for key in keys_of(loader, stop_after=3)]
    state = first[0].state_dict()
    assert state == first[1].state_dict() and state["samples_consumed"] == 18
    member_counts = Counter(mixture.member_key(key)[0] for key in before)
    assert [m["samples_consumed"] for m in state["members"]] == [member_counts[0], member_counts[1]]
    after = []
    for rank in range(3):
        resumed = loader_of(rank, 3)
        resumed.load_state_dict(state)
        after += keys_of(resumed)
    assert Counter(before) + Counter(after) == Counter(whole)


def test_a_member_in_place_without_labels_is_refused_by_name(hub: Path, shards: Path, tmp_path: Path) -> None:  # noqa: F811
    rows = hub_rows(0, 4)
    pq.write_table(pa.table({"picture": [r["bytes"] for r in rows["image"]], "caption": rows["caption"]}), tmp_path / "bare.parquet")
    with pytest.raises(ValueError, match=r"mix: member 1 \(.*bare.parquet\) has labels False, member 0 \(.*\) has True: members must hold the same fields"):
        fastload.mix({fastload.open(shards): 1, fastload.open(tmp_path / "bare.parquet"): 1})
    pq.write_table(pa.table({"caption": rows["caption"], "label": rows["label"]}), tmp_path / "text.parquet")
    with pytest.raises(ValueError, match=r"mix: member 1 \(.*text.parquet\) has images False.*same fields"):
        fastload.mix({fastload.open(hub): 1, fastload.open(tmp_path / "text.parquet"): 1})
    assert torch.is_tensor(next(iter(fastload.DataLoader(fastload.mix({fastload.open(hub): 1}), batch_size=2, transform=T.val(8))))[0])
