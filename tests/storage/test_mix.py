"""fastload.mix: weighted mixtures of real converted datasets read by real loaders — proportions,
per-member epochs, determinism, exact resume, resume at another world size, refusals."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload import transforms as T
from fastload.converters.conversion import convert
from fastload.converters.convert_options import ConvertOptions
from fastload.orders import mixture_order
from tests.test_distributed import run_ranks
from tests.test_resume_contract import BATCH, LOCAL_PATHS, dali_installed, run_resume_contract, served  # noqa: F401 - a fixture

SIZES = {"big": 300, "small": 70}
CROP = [T.CenterCrop(8)]


@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two npz datasets of 8x8 PNGs: 'big' (300 samples, 5 shards), 'small' (70 samples, 2 shards)."""
    root = tmp_path_factory.mktemp("mix")
    rng = np.random.default_rng(0)
    out = {}
    for name, size in SIZES.items():
        np.savez(root / f"{name}.npz", images=rng.integers(0, 256, (size, 8, 8, 3), dtype=np.uint8), labels=np.arange(size) % 5)
        convert(str(root / f"{name}.npz"), str(root / name), ConvertOptions(source="npz", samples_per_shard=64))
        out[name] = root / name
    return out


@pytest.fixture(params=["one leaf", "leaves of 64"])
def schedule(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mixture's schedule in one leaf (these small epochs), or halved down to leaves of 64
    positions, as an epoch of more than LEAF positions is."""
    if request.param == "leaves of 64":
        monkeypatch.setattr(mixture_order, "LEAF", 64)


def own_keys(path: Path) -> list[str]:
    ds = fastload.open(path)
    return [ds.raw(i)[0] for i in range(len(ds))]


def keys_of(loader: fastload.DataLoader, epochs: int = 1) -> list[str]:
    keys: list[str] = []
    for _ in range(epochs):
        for batch in loader:
            keys += batch[2]
    return keys


@pytest.mark.usefixtures("schedule")
def test_proportions_are_exact_per_epoch_and_within_binomial_bounds_in_every_batch(members: dict[str, Path]) -> None:
    mixture = fastload.mix({members["big"]: 3, members["small"]: 1}, samples_per_epoch=400)
    assert mixture.counts == (300, 100)
    p, batch, z = 0.75, 40, 4.5  # z: a two-sided normal bound passed by chance with probability ~7e-6
    for seed in range(5):
        loader = fastload.DataLoader(mixture, batch_size=batch, shuffle=True, seed=seed, return_keys=True, transform=CROP)
        for epoch in range(2):
            per_batch = [[mixture.member_key(k)[0] for k in b[2]] for b in loader]
            assert Counter(itertools.chain(*per_batch)) == {0: 300, 1: 100}, f"seed {seed} epoch {epoch}"
            for members_of_batch in per_batch:  # hypergeometric: its spread is within the binomial one
                assert abs(members_of_batch.count(0) - batch * p) <= z * math.sqrt(batch * p * (1 - p))


@pytest.mark.usefixtures("schedule")
def test_each_member_epoch_holds_each_of_its_samples_once_and_is_reshuffled(members: dict[str, Path]) -> None:
    mixture = fastload.mix({members["big"]: 1, members["small"]: 1})  # small runs through ~5 epochs per mixture epoch
    loader = fastload.DataLoader(mixture, batch_size=32, shuffle=True, seed=3, return_keys=True, transform=CROP)
    keys = keys_of(loader, epochs=2)
    for number, name in enumerate(SIZES):
        stream = [own for member, own in map(mixture.member_key, keys) if member == number]
        size = SIZES[name]
        chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
        assert len(chunks) >= 2
        for chunk in chunks[:-1]:
            assert sorted(chunk) == own_keys(members[name])
        assert len(set(chunks[-1])) == len(chunks[-1])  # the epoch under way: no sample twice
        assert chunks[0] != chunks[1]  # the next epoch is its own shuffle


@pytest.mark.usefixtures("schedule")
def test_order_is_the_same_for_any_number_of_workers(members: dict[str, Path]) -> None:
    mixture = fastload.mix({members["big"]: 2, members["small"]: 1}, samples_per_epoch=150)
    runs = []
    for workers in (0, 2):
        loader = fastload.DataLoader(mixture, batch_size=16, shuffle=True, seed=7, num_workers=workers, return_keys=True,
                                     transform=[T.RandomResizedCrop(6), T.RandomHorizontalFlip()])
        runs.append([(b[0].clone(), b[1].clone(), b[2]) for b in loader])
        loader.close()
    assert [keys for *_, keys in runs[0]] == [keys for *_, keys in runs[1]]
    for (images, labels, _), (other_images, other_labels, _) in zip(*runs):
        assert torch.equal(images, other_images) and torch.equal(labels, other_labels)


@pytest.mark.usefixtures("schedule")
def test_any_positions_evaluate_alone_as_in_the_whole_order(members: dict[str, Path]) -> None:
    mixture = fastload.mix({members["big"]: 2, members["small"]: 1}, samples_per_epoch=500)
    orders = fastload.DataLoader(mixture, batch_size=8, shuffle=True, seed=9, transform=CROP).kind.orders.spec()
    assert isinstance(orders, mixture_order.MixtureOrder)
    order = orders.order(2)
    whole = order.indices(np.arange(len(order)))  # every position at once
    positions = np.random.default_rng(0).integers(0, len(whole), 100)
    assert np.array_equal(orders.indices(2, positions), whole[positions])
    members_before = np.cumsum([[mixture.member_of(int(i))[0] == m for m in range(2)] for i in whole], axis=0)
    for consumed in (1, 37, 250, 499):
        positions_now = orders.member_positions(2, consumed)
        for m, size in enumerate(SIZES.values()):
            assert positions_now[m].epoch * size + positions_now[m].consumed == 2 * mixture.counts[m] + members_before[consumed - 1, m]


def label_plus_100(sample: dict, rng: np.random.Generator) -> dict:
    sample["cls"] = sample["cls"] + 100
    return sample


def test_fields_map_and_collate_fn_see_the_mixtures_samples(members: dict[str, Path]) -> None:
    mixture = fastload.mix({members["big"]: 1, members["small"]: 1}, samples_per_epoch=60)
    common = dict(batch_size=8, shuffle=True, seed=2, num_workers=2, return_keys=True, transform=CROP)
    classic = [(b[0].clone(), b[1].clone(), b[2]) for b in fastload.DataLoader(mixture, **common)]
    mapped = list(fastload.DataLoader(mixture, fields=["png", "cls"], map=label_plus_100, **common))
    collated = list(fastload.DataLoader(mixture, collate_fn=torch.utils.data.default_collate, **common))
    assert len(classic) == len(mapped) == len(collated) == 8
    for (images, labels, keys), (m_images, m_labels, m_keys), (c_images, c_labels, c_keys) in zip(classic, mapped, collated):
        assert keys == m_keys == list(c_keys) and {k[0] for k in keys} <= {"0", "1"}
        assert torch.equal(images, m_images) and torch.equal(images, c_images)
        assert torch.equal(m_labels, labels + 100) and torch.equal(c_labels, labels)


def test_loader_batch_sampler_yields_the_loaders_batches(members: dict[str, Path]) -> None:
    mixture = fastload.mix({members["big"]: 1, members["small"]: 1}, samples_per_epoch=96)
    loader = fastload.DataLoader(mixture, batch_size=8, shuffle=True, return_keys=True, transform=CROP, rank=1, world_size=2)
    torch_loader = torch.utils.data.DataLoader(mixture, batch_sampler=loader.batch_sampler, collate_fn=loader.collate_fn, num_workers=2)
    assert [b[2] for b in torch_loader] == [b[2] for b in loader]


@pytest.mark.parametrize("taken", [1, 3])
@pytest.mark.parametrize("path", ["cpu workers", "cpu inline", "dali on the cpu"])
def test_resume_equals_an_uninterrupted_run(clean: Path, path: str, taken: int) -> None:
    if path.startswith("dali") and not dali_installed():
        pytest.skip("needs NVIDIA DALI")
    kwargs = dict(batch_size=BATCH, shuffle=True, seed=5, transform=T.train(16), return_keys=True, **LOCAL_PATHS[path])
    run_resume_contract(lambda: fastload.DataLoader(fastload.mix({clean: 2, fastload.open(clean): 1}), **kwargs), taken)


def test_resume_with_a_remote_member_equals_an_uninterrupted_run(clean: Path, served: str, tmp_path: Path) -> None:  # noqa: F811
    def make_loader() -> fastload.DataLoader:
        remote = fastload.open(served, cache_dir=tmp_path / "cache")
        return fastload.DataLoader(fastload.mix({clean: 1, remote: 1}, samples_per_epoch=40), batch_size=BATCH, shuffle=True,
                                   seed=5, transform=T.train(16), return_keys=True, num_workers=2)

    run_resume_contract(make_loader, 3)


def rank_keys(mixture: fastload.MixedDataset, world: int, state: dict | None, stop_after: int | None, **kwargs: object
              ) -> tuple[list[str], list[dict]]:
    """The keys every rank of ``world`` delivers (from ``state``, for ``stop_after`` batches) and their states."""
    keys, states = [], []
    for rank in range(world):
        loader = fastload.DataLoader(mixture, rank=rank, world_size=world, return_keys=True, transform=CROP, **kwargs)
        if state is not None:
            loader.load_state_dict(state)
        for batch in itertools.islice(loader, stop_after):
            keys += batch[2]
        states.append(loader.state_dict())
    return keys, states


@pytest.mark.usefixtures("schedule")
@pytest.mark.parametrize("world_after", [1, 3])
def test_resume_at_another_world_size_delivers_every_remaining_sample_once(members: dict[str, Path], world_after: int) -> None:
    mixture = fastload.mix({members["big"]: 1, members["small"]: 2}, samples_per_epoch=420)
    kwargs = dict(batch_size=5, shuffle=True, seed=11)
    whole, _ = rank_keys(mixture, 1, None, None, **kwargs)
    before, states = rank_keys(mixture, 2, None, 6, **kwargs)
    assert all(state == states[0] for state in states) and states[0]["samples_consumed"] == 60
    member_counts = Counter(mixture.member_key(k)[0] for k in before)
    for number, recorded in enumerate(states[0]["members"]):  # the state says where each member is
        assert recorded["epoch"] * len(mixture.members[number]) + recorded["samples_consumed"] == member_counts[number]
    after, finished = rank_keys(mixture, world_after, states[0], None, **kwargs)
    assert Counter(before) + Counter(after) == Counter(whole)
    assert sorted(after) == sorted((Counter(whole) - Counter(before)).elements())
    assert finished[0]["epoch"] == 1 and finished[0]["samples_consumed"] == 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_resume_of_gloo_ranks_at_another_world_size_delivers_every_remaining_sample_once(members: dict[str, Path],
                                                                                        tmp_path: Path) -> None:
    recipe = {str(members["big"]): 1.0, str(members["small"]): 2.0}  # 370 samples an epoch
    kwargs = dict(batch_size=5, shuffle=True, seed=4)
    whole, _ = rank_keys(fastload.mix(recipe), 1, None, None, **kwargs)
    first = run_ranks(tmp_path, 2, recipe, kwargs, stop_after=7)
    state = first[0]["states"][0]
    assert first[0]["states"] == first[1]["states"] and state["samples_consumed"] == 70
    second = run_ranks(tmp_path, 3, recipe, kwargs, state=state)
    assert all(r["batches"] == 20 for r in second)  # equal batches on every rank
    assert Counter(k for r in first + second for k in r["keys"]) == Counter(whole)


def test_incompatible_members_and_options_are_refused_by_name(members: dict[str, Path], clean: Path) -> None:
    with pytest.raises(ValueError, match=rf"member 1 \({clean}\) has fields \['cls', 'jpg'\].*same fields"):
        fastload.mix({members["big"]: 1, clean: 1})
    for weight in (0, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="weight of .*small must be a positive number"):
            fastload.mix({members["big"]: 1, members["small"]: weight})
    mixture = fastload.mix({members["big"]: 1, members["small"]: 1})
    with pytest.raises(ValueError, match="is a mixture itself"):
        fastload.mix({mixture: 1, members["small"]: 1})
    with pytest.raises(ValueError, match="samples_per_epoch must be a positive integer"):
        fastload.mix({members["big"]: 1}, samples_per_epoch=0)
    with pytest.raises(ValueError, match="Subset .* of a mixture"):
        fastload.DataLoader(torch.utils.data.Subset(mixture, [1, 2]), batch_size=2, transform=CROP)
    with pytest.raises(ValueError, match="evaluation= reads every sample once"):
        fastload.DataLoader(mixture, batch_size=2, transform=CROP, evaluation=True)
    with pytest.raises(ValueError, match="shuffle_buffer= .* with a mixture"):
        fastload.DataLoader(mixture, batch_size=2, shuffle=True, transform=CROP, shuffle_buffer=8)
    state = fastload.DataLoader(mixture, batch_size=2, transform=CROP).state_dict()
    reweighted = fastload.mix({members["big"]: 2, members["small"]: 1})
    with pytest.raises(ValueError, match="another dataset"):
        fastload.DataLoader(reweighted, batch_size=2, transform=CROP).load_state_dict(state)


def test_a_skipped_sample_is_replaced_from_its_own_member(tmp_path: Path) -> None:
    """on_error="skip" replaces an unreadable sample by the next one in dataset order: within its
    member (wrapping there), never the next member's first, so each member keeps its share."""
    from tests.conftest import jpeg_bytes, run_cli, small_photo
    from tests.test_fields import write_tars

    pytest.importorskip("webdataset")
    roots = []
    for m in range(2):
        samples = [{"__key__": f"m{m}s{i}", "jpg": jpeg_bytes(small_photo(i + 10 * m)), "cls": str(i % 2)} for i in range(6)]
        if m == 0:
            samples[-1]["jpg"] = b"\xff\xd8 not a jpeg"  # the member's last sample in dataset order
        roots.append(write_tars(tmp_path / f"member{m}", samples, per_tar=3))
        run_cli("index", str(roots[-1]))
    mixture = fastload.mix({roots[0]: 1, roots[1]: 1})
    loader = fastload.DataLoader(mixture, batch_size=12, shuffle=True, on_error="skip", return_keys=True, transform=CROP)
    keys = keys_of(loader)
    assert Counter(mixture.member_key(k)[0] for k in keys) == {0: 6, 1: 6}
    assert "0/m0s5" not in keys and [e["key"] for e in loader.stats.skipped.entries] == ["0/m0s5"]


def test_epochs_past_numpys_hypergeometric_limit_split_exactly() -> None:
    """A mixture epoch of 1.2 billion positions (numpy's multivariate draw refuses 10^9): every split
    takes exactly its size within each member's count, the same for the same seed, centred on the
    proportional share; a batch's indices fall in the right members."""
    from fastload.orders.mixture_order import MixtureOrder, hypergeometric_split
    from fastload.orders.spec import OrderSpec

    counts = np.array([700_000_000, 400_000_000, 100_000_000], dtype=np.int64)
    draws = np.array([hypergeometric_split(np.random.default_rng(seed), counts, 600_000_000) for seed in range(200)])
    assert (draws.sum(axis=1) == 600_000_000).all() and (draws <= counts).all() and (draws >= 0).all()
    assert np.array_equal(draws[3], hypergeometric_split(np.random.default_rng(3), counts, 600_000_000))
    assert np.abs(draws.mean(axis=0) - counts / 2).max() < 5 * np.sqrt(counts.max() / 8 / 200)
    assert len({tuple(d) for d in draws}) > 150  # drawn, not fixed
    shards = ((10_000,) * 70_000, (10_000,) * 40_000, (10_000,) * 10_000)
    mixture = MixtureOrder(OrderSpec((10_000,) * 120_000, 0, True, 256, 0, 8, False), shards, tuple(counts.tolist()), (0,) * 3)
    order = mixture.order(0)
    plan = mixture.batches(len(order), 0)
    for batch in (0, len(plan) // 2, len(plan) - 1):
        indices = order.indices(plan.positions(batch))
        assert len(indices) == (256 if batch < len(plan) - 1 else 1_200_000_000 // 8 % 256)
        assert indices.min() >= 0 and indices.max() < 1_200_000_000
    last = mixture.leaf(0, int(counts.sum()) - 1)
    assert (last.before + np.bincount(last.members, minlength=3) == counts).all()


def test_a_remote_members_shards_are_downloaded_ahead_of_use(clean: Path, served: str, tmp_path: Path) -> None:  # noqa: F811
    """The loader's download-ahead thread covers a mixture's remote member: after one batch, more of
    its shards are in the cache than that batch read (inline decoding fetches only what it reads)."""
    import time

    remote = fastload.open(served, cache_dir=tmp_path / "cache")
    assert len(remote.index.shards) >= 4
    mixture = fastload.mix({clean: 1, remote: 1})
    loader = fastload.DataLoader(mixture, batch_size=4, shuffle=True, seed=5, transform=T.train(16), return_keys=True, num_workers=0)
    iterator = iter(loader)
    _, _, keys = next(iterator)
    remote_keys = [mixture.member_key(k)[1] for k in keys if mixture.member_key(k)[0] == 1]
    read = {remote.locate(int(i))[0] for i in remote.indices_of(remote_keys)}
    deadline = time.monotonic() + 20
    while len(list((tmp_path / "cache").rglob("*.tar"))) <= len(read) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(list((tmp_path / "cache").rglob("*.tar"))) > len(read)
    assert sum(1 for _ in iterator) == len(loader) - 1


def test_huge_weights_and_a_negative_seed_mix_as_ordinary_ones(members: dict[str, Path]) -> None:
    """Weights whose sum overflows a float split as their ratios do; seed=-1 (fine for one dataset)
    seeds a mixture too (numpy's seeds are unsigned: taken mod 2**64)."""
    huge = fastload.mix({members["big"]: 1e308, members["small"]: 1e308}, samples_per_epoch=100)
    assert huge.counts == (50, 50) == fastload.mix({members["big"]: 1, members["small"]: 1}, samples_per_epoch=100).counts
    loader = fastload.DataLoader(huge, batch_size=25, shuffle=True, seed=-1, return_keys=True, transform=CROP)
    keys = keys_of(loader)
    assert Counter(huge.member_key(k)[0] for k in keys) == {0: 50, 1: 50}
    assert keys != keys_of(fastload.DataLoader(huge, batch_size=25, shuffle=True, seed=1, return_keys=True, transform=CROP))


def test_a_mixtures_keys_labels_and_tables_are_its_members_with_the_prefix(members: dict[str, Path]) -> None:
    big, small = fastload.open(members["big"]), fastload.open(members["small"])
    mixture = fastload.mix({big: 1, small: 1})
    keys = list(mixture.sample_keys())
    assert keys == [f"0/{k}" for k in big.sample_keys()] + [f"1/{k}" for k in small.sample_keys()]
    assert mixture.sample_keys()[300] == keys[300] == mixture.raw(300)[0] and mixture.sample_keys()[-1] == keys[-1]
    assert np.array_equal(mixture.sample_labels(), np.concatenate([big.sample_labels(), small.sample_labels()]))
    assert mixture.indices_of([keys[301], keys[7]]).tolist() == [301, 7]
    with pytest.raises(KeyError, match="'2/x': not a key of mix"):
        mixture.indices_of(["2/x"])
    with pytest.raises(ValueError, match="exclude= with a mixture: not yet"):  # its own refusal, not a table error
        fastload.DataLoader(mixture, batch_size=4, exclude=[keys[0]], transform=CROP)
