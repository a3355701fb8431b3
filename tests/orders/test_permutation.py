"""The seeded bijection behind every order, and the orders built on it, as pure functions: a
permutation for any size, not visibly structured, exact to resume at any position and world
size, exclusions left out, classes drawn in their shares."""

from __future__ import annotations

import numpy as np
import pytest

from fastload.orders.balanced import class_members, class_shares, class_weight_vector
from fastload.orders.epoch_order import EpochOrder, Selection
from fastload.orders.global_order import global_order
from fastload.orders.permutation import Permutation, mix_key, permute
from fastload.orders.rank_batches import rank_batches
from fastload.orders.spec import OrderSpec

PRIMES = [3, 5, 7, 11, 13, 101, 1009, 7919, 65521]
SIZES = sorted({1, 2, *PRIMES, *(2**k + d for k in range(1, 17) for d in (-1, 0, 1))} - {0})


@pytest.mark.parametrize("n", SIZES)
def test_the_bijection_is_a_permutation_of_any_size(n: int) -> None:
    for seed in range(3):
        values = Permutation(n, mix_key(seed, n))(np.arange(n))
        assert np.array_equal(np.sort(values), np.arange(n))


def test_sizes_and_keys_may_differ_position_by_position() -> None:
    """One vectorised call over several permutations equals each on its own (the balanced order's use)."""
    rng = np.random.default_rng(1)
    sizes = rng.choice([1, 2, 3, 17, 1000, 65537], size=5000)
    keys = rng.integers(0, 2**63, size=5000).astype(np.uint64)
    positions = (rng.random(5000) * sizes).astype(np.int64)
    together = permute(positions, sizes, keys)
    alone = [int(Permutation(int(n), int(k))(np.array([p]))[0]) for p, n, k in zip(positions, sizes, keys)]
    assert together.tolist() == alone and (together < sizes).all()


def test_the_order_is_a_pure_function_of_seed_and_epoch() -> None:
    n = 100_003
    order = global_order(Selection(n), 7, 3, True)
    again = global_order(Selection(n), 7, 3, True)
    positions = np.random.default_rng(0).integers(0, n, 1000)
    assert np.array_equal(order.indices(positions), again.indices(positions))
    assert not np.array_equal(order.indices(positions), global_order(Selection(n), 7, 4, True).indices(positions))
    assert not np.array_equal(order.indices(positions), global_order(Selection(n), 8, 3, True).indices(positions))
    assert global_order(Selection(n), 7, 3, False).indices(positions).tolist() == positions.tolist()


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


@pytest.mark.parametrize("n", [1000, 4099, 65537, 1 << 18])
def test_the_permutation_is_not_visibly_structured(n: int) -> None:
    """Against a uniformly random permutation: position and value uncorrelated (|rho| < 4 sd), a
    grid of (position, value) cells filled evenly (chi-square below its 99.99th percentile), the
    positions of consecutive indices as far apart as random ones (mean gap ~ n/3, few close), and
    two epochs' permutations unrelated."""
    values = Permutation(n, mix_key(11, 0, 0x5EED))(np.arange(n))
    assert abs(spearman(np.arange(n), values)) < 4 / np.sqrt(n)
    cells = 8
    grid = np.zeros((cells, cells))
    np.add.at(grid, (np.arange(n) * cells // n, values * cells // n), 1)
    expected = grid.sum(1, keepdims=True) * grid.sum(0, keepdims=True) / n
    chi2 = float(((grid - expected) ** 2 / expected).sum())
    assert chi2 < 100  # 49 degrees of freedom: P(chi2 > 100) ~ 2e-5
    position_of = np.argsort(values)
    gaps = np.abs(np.diff(position_of))
    assert abs(gaps.mean() / (n / 3) - 1) < 0.1
    assert (gaps < n // 100).mean() < 0.03  # random: ~0.02
    other = Permutation(n, mix_key(11, 1, 0x5EED))(np.arange(n))
    assert abs(spearman(values, other)) < 4 / np.sqrt(n)


def test_small_permutations_are_uniform_over_all_orders() -> None:
    """Over many keys every order of 4 and of 5 values comes about equally often (chi-square below
    its 99.99th percentile), odd permutations of 16 values as often as even ones (each round of a
    Feistel network over 16 values is even: it reached only half of them and favoured some orders
    of 5 by 2.3x), and the gap between two consecutive values of 5 is uniform."""
    from collections import Counter
    from math import factorial

    keys = np.random.default_rng(3).integers(0, 2**63, size=24_000, dtype=np.uint64)
    for n, bound in ((4, 23 + 4.5 * np.sqrt(2 * 23)), (5, 119 + 4.5 * np.sqrt(2 * 119))):
        counts = Counter(tuple(permute(np.arange(n), n, key).tolist()) for key in keys)
        expected = len(keys) / factorial(n)
        assert len(counts) == factorial(n)
        assert sum((c - expected) ** 2 / expected for c in counts.values()) < bound, n

    def odd(values: list[int]) -> bool:
        return sum(a > b for i, a in enumerate(values) for b in values[i + 1:]) % 2 == 1

    odd_share = np.mean([odd(permute(np.arange(16), 16, key).tolist()) for key in keys[:4000]])
    assert abs(odd_share - 0.5) < 0.04
    gaps = (permute(np.ones(len(keys), dtype=np.int64), 5, keys) - permute(np.zeros(len(keys), dtype=np.int64), 5, keys)) % 5
    counts = np.bincount(gaps, minlength=5)[1:]
    assert counts.min() > 0.9 * len(keys) / 4


def test_a_billion_samples_start_at_once_and_stay_in_range() -> None:
    n = 1_000_000_007
    order = global_order(Selection(n), 0, 0, True)
    positions = np.random.default_rng(2).integers(0, n, 200_000)
    values = order.indices(np.unique(positions))
    assert values.min() >= 0 and values.max() < n and len(np.unique(values)) == len(values)


def every(order: EpochOrder) -> np.ndarray:
    return order.indices(np.arange(len(order)))


def spec(**changes: object) -> OrderSpec:
    values: dict = dict(shard_sizes=(40, 33, 40, 17), seed=5, shuffle=True, batch_size=4, rank=0, world_size=1, drop_last=False)
    return OrderSpec(**{**values, **changes})


def delivered(order: EpochOrder, spec_: OrderSpec, world: int, start: int) -> list[int]:
    """The samples all ``world`` ranks are handed from ``start``, padding left out."""
    out = []
    for rank in range(world):
        plan = rank_batches(len(order), start, spec_.batch_size, rank, world, spec_.drop_last)
        for b in range(len(plan)):
            out += order.indices(plan.positions(b))[plan.valid(b)].tolist()
    return out


@pytest.mark.parametrize("world_before, world_after", [(1, 3), (2, 1), (3, 2), (4, 5)])
def test_a_resume_at_any_step_and_another_world_size_delivers_the_rest_exactly_once(world_before: int, world_after: int) -> None:
    excluded = (0, 1, 2, 57, 129)
    s = spec(excluded=excluded)
    order = s.order(2)
    everything = every(order)
    step = s.batch_size * world_before
    for consumed in range(0, len(order) + 1, step):
        seen = everything[:consumed].tolist()
        rest = delivered(order, s, world_after, consumed)
        assert sorted(seen + rest) == sorted(set(range(130)) - set(excluded))


def test_exclusions_are_never_in_an_order_and_every_other_sample_is_once() -> None:
    rng = np.random.default_rng(4)
    for n in (1, 2, 10, 1000):
        excluded = np.unique(np.concatenate([[0, n - 1], rng.integers(0, n, n // 3)]))
        selection = Selection(n, excluded=excluded)
        kept = sorted(set(range(n)) - set(excluded.tolist()))
        assert selection.indices(np.arange(len(selection))).tolist() == kept
        assert sorted(every(global_order(selection, 1, 0, True)).tolist()) == kept


def labels_of(counts: list[int]) -> np.ndarray:
    return np.random.default_rng(9).permutation(np.repeat(np.arange(len(counts)), counts))


def test_balanced_epochs_give_each_class_its_share_and_reuse_samples_evenly() -> None:
    counts = [600, 250, 100, 40, 10]
    labels = labels_of(counts)
    classes = class_members(labels, Selection(len(labels)), len(counts))
    weights = class_weight_vector(None, classes.counts, None)
    s = spec(shard_sizes=(len(labels),), class_weights=weights)
    for epoch in range(2):
        drawn = every(s.order(epoch, classes))
        assert len(drawn) == len(labels)
        per_class = np.bincount(labels[drawn], minlength=len(counts))
        assert per_class.tolist() == [200] * 5  # 1000 positions, 5 classes: exactly 200 each
        for c, n in enumerate(counts):
            uses = np.bincount(drawn[labels[drawn] == c], minlength=len(labels))[labels == c]
            assert uses.min() == 200 // n and uses.max() == -(-200 // n)  # without replacement while they last
    assert not np.array_equal(every(s.order(0, classes)), every(s.order(1, classes)))
    # within a batch the classes mix at random: each batch of 50 near 10 per class
    batches = labels[every(s.order(0, classes))].reshape(20, 50)
    assert all(abs(np.bincount(b, minlength=5) - 10).max() <= 9 for b in batches)


def test_class_weights_by_name_or_label_and_unnamed_classes_weigh_one() -> None:
    counts = np.array([50, 30, 20, 0])
    names = ["cat", "dog", "eel", "fox"]
    assert class_weight_vector({"cat": 3, 2: 0.5}, counts, names) == (3.0, 1.0, 0.5, 0.0)
    assert class_shares((3.0, 1.0, 0.5, 0.0), 100).tolist() == [67, 22, 11, 0]
    with pytest.raises(ValueError, match="'gnu'"):
        class_weight_vector({"gnu": 1}, counts, names)
    with pytest.raises(ValueError, match="no sample"):
        class_weight_vector({"fox": 1}, counts, names)
    with pytest.raises(ValueError, match=">= 0"):
        class_weight_vector({"cat": -1}, counts, names)


def test_a_balanced_order_resumes_exactly_at_another_world_size() -> None:
    labels = labels_of([90, 30])
    classes = class_members(labels, Selection(len(labels), excluded=[3, 4]), 2)
    s = spec(shard_sizes=(len(labels),), class_weights=(1.0, 1.0), world_size=2)
    order = s.order(1, classes)
    everything = every(order)
    assert 3 not in everything and 4 not in everything and len(order) == 118
    for consumed in range(0, len(order), 8):
        rest = delivered(order, s, 3, consumed)
        assert sorted(everything[:consumed].tolist() + rest) == sorted(everything.tolist())


def test_class_weights_must_be_finite_and_huge_ones_do_not_overflow() -> None:
    counts = np.array([5, 3, 2])
    with pytest.raises(ValueError, match="weight inf: weights are finite numbers >= 0"):
        class_weight_vector({0: float("inf")}, counts, None)
    with pytest.raises(ValueError, match="weight nan"):
        class_weight_vector({1: float("nan")}, counts, None)
    huge = class_weight_vector({0: 1e308, 1: 1e308, 2: 5e307}, counts, None)
    assert class_shares(huge, 10).tolist() == [4, 4, 2]


def test_sparse_labels_are_classes_by_what_is_present() -> None:
    labels = np.array([5, 10**12, 5, 5, -1, 10**12, 5, 5])
    classes = class_members(labels, Selection(len(labels)))
    assert classes.labels.tolist() == [5, 10**12] and classes.counts.tolist() == [5, 2]
    weights = class_weight_vector({10**12: 3, 7: 0}, classes.counts, None, classes.labels)
    assert weights == (1.0, 3.0)
    with pytest.raises(ValueError, match="no sample"):
        class_weight_vector({7: 1}, classes.counts, None, classes.labels)
    drawn = every(spec(shard_sizes=(len(labels),), class_weights=weights).order(0, classes))
    assert np.bincount(labels[drawn] == 10**12).tolist() == [2, 5]  # the 7 labelled positions shared 1:3 (1.75, 5.25)



def test_class_members_and_weights_refuse_what_is_not_a_class_and_keep_one_sample_classes() -> None:
    labels = np.array([0, 1, 1, 2, 2, 2])
    with pytest.raises(ValueError, match="a sample has label 2, beyond the dataset's 2 classes"):
        class_members(labels, Selection(len(labels)), 2)
    classes = class_members(labels, Selection(len(labels)), 3)
    assert classes.counts.tolist() == [1, 2, 3]
    assert class_weight_vector(None, classes.counts, ["a", "b", "c"], classes.labels) == (1.0, 1.0, 1.0)  # one sample: a class
    with pytest.raises(ValueError, match="names class 3, which this dataset does not have"):
        class_weight_vector({3: 1}, classes.counts, ["a", "b", "c"], classes.labels)
    with pytest.raises(ValueError, match="leaves no class to sample"):
        class_weight_vector({"a": 0, "b": 0, "c": 0}, classes.counts, ["a", "b", "c"], classes.labels)
