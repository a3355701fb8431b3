"""The sample orders as pure functions: permutations, locality of the streaming order, lanes of
whole shards, equal batch counts, and the unseen set a resume at another world size deals anew."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fastload.orders.epoch_order import EpochOrder, Selection, shards_of
from fastload.orders.global_order import global_order
from fastload.orders.rank_batches import rank_batches
from fastload.orders.spec import OrderSpec
from fastload.orders.streaming import Group, deal, shard_groups, streaming_order, unseen_groups

SIZES = [50, 50, 50, 30, 41, 7]
STARTS = np.concatenate([[0], np.cumsum(SIZES)])
EVERY = Selection(sum(SIZES))


def shard_of(samples: np.ndarray) -> np.ndarray:
    return np.searchsorted(STARTS, samples, side="right") - 1


def whole(order: EpochOrder) -> tuple[np.ndarray, np.ndarray]:
    """(sample at every position, which are real) of an order."""
    positions = np.arange(len(order))
    valid = order.valid(positions)
    return order.indices(positions), np.ones(len(order), bool) if valid is None else valid


def ranges(sizes: list[int]) -> list[Group]:
    starts = np.cumsum([0, *sizes])
    return [Group(int(a), int(b)) for a, b in itertools.pairwise(starts.tolist())]


def lane(order: EpochOrder, world: int, batch: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s samples and validity, as rank_batches would hand them out."""
    plan = rank_batches(len(order), 0, batch, rank, world, drop_last=False)
    positions = np.concatenate([plan.positions(b) for b in range(len(plan))])
    samples, valid = whole(order)
    return samples[positions], valid[positions]


def streamed(sizes: list[int], world: int, batch: int, buffer: int, drop_last: bool, seed: int, epoch: int) -> EpochOrder:
    groups = shard_groups(np.cumsum([0, *sizes]), seed, epoch, True)
    return streaming_order(groups, world, batch, buffer, drop_last, seed, epoch, Selection(sum(sizes)))


def test_one_rank_streams_a_deterministic_permutation_with_local_windows() -> None:
    order = streamed(SIZES, 1, 4, 20, False, 1, 0)
    samples, valid = whole(order)
    assert sorted(samples[valid].tolist()) == list(range(sum(SIZES)))
    assert np.array_equal(samples, whole(streamed(SIZES, 1, 4, 20, False, 1, 0))[0])
    assert not np.array_equal(samples, whole(streamed(SIZES, 1, 4, 20, False, 1, 1))[0])
    # a 20-sample window over 50-sample shards: 20 consecutive samples span ~1.4 shards on average
    # (a global permutation: ~4 of the 4)
    big = whole(streamed([50, 50, 50, 30], 1, 4, 20, False, 1, 0))[0]
    big_shard = np.searchsorted([50, 100, 150], big, side="right")
    spans = [len(set(big_shard[i : i + 20].tolist())) for i in range(len(big) - 20)]
    assert np.mean(spans) < 2.7 and max(spans) <= 4
    # and within a shard the order is shuffled, not the shard's own
    assert sorted(big[:50].tolist()) != big[:50].tolist()


def test_a_window_spans_shards_until_it_holds_the_buffer() -> None:
    """A buffer of 120 over 50-sample shards: windows of three shards, each permuted as a whole."""
    order = streamed([50] * 6, 1, 10, 120, False, 2, 0)
    samples = whole(order)[0]
    assert sorted(samples.tolist()) == list(range(300))
    shard = samples // 50
    first_window = set(shard[:150].tolist())
    assert len(first_window) == 3 and first_window.isdisjoint(shard[150:].tolist())
    assert len(set(shard[:10].tolist())) > 1  # a batch mixes the window's shards


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_read_disjoint_whole_shards_in_equal_batches(drop_last: bool) -> None:
    world, batch = 3, 8
    order = streamed(SIZES, world, batch, 16, drop_last, 5, 2)
    assert len(order) % world == 0
    lanes = [lane(order, world, batch, r) for r in range(world)]
    shards = [set(shard_of(samples[valid]).tolist()) for samples, valid in lanes]
    assert all(not (shards[a] & shards[b]) for a in range(world) for b in range(a + 1, world))
    real = np.concatenate([samples[valid] for samples, valid in lanes])
    assert len(set(real.tolist())) == len(real)  # nothing real twice
    if drop_last:
        assert all(valid.all() for _, valid in lanes)
        assert len(order) % (world * batch) == 0  # full batches only
    else:
        assert sorted(real.tolist()) == list(range(sum(SIZES)))
        for samples, valid in lanes:  # padding repeats the lane's own samples
            assert set(samples[~valid].tolist()) <= set(samples[valid].tolist())


def dealt_ranks(dealt: list[list[Group]]) -> list[list[list[int]]]:
    return [[g.ranks().tolist() for g in d] for d in dealt]


def test_fewer_shards_than_ranks_splits_shards_so_no_rank_idles() -> None:
    dealt = deal(ranges([10, 3]), 4)
    assert all(len(d) for d in dealt)
    assert sorted(r for d in dealt_ranks(dealt) for g in d for r in g) == list(range(13))
    # one shard of 2 for 2 ranks: a sample each; one of 9 for 2: halves of 4 and 5, in order
    assert dealt_ranks(deal(ranges([2]), 2)) == [[[0]], [[1]]]
    assert dealt_ranks(deal(ranges([9]), 2)) == [[list(range(4))], [list(range(4, 9))]]
    # single samples cannot be split: ranks beyond them get nothing rather than empty halves
    assert [len(d) for d in deal(ranges([1, 1]), 3)] == [1, 1, 0]
    explicit = Group(0, 4, np.array([7, 3, 9, 1]))  # a resume's leftovers halve alike
    assert dealt_ranks(deal([explicit], 2)) == [[[7, 3]], [[9, 1]]]


def test_as_many_shards_as_ranks_deals_each_rank_one_whole_shard() -> None:
    assert dealt_ranks(deal(ranges([5, 8, 3]), 3)) == [[list(range(5))], [list(range(5, 13))], [list(range(13, 16))]]
    # more shards: each goes to the lane holding fewest samples so far (the first such on a tie)
    sizes = [[len(g) for g in d] for d in deal(ranges([5, 8, 3, 4, 1]), 2)]
    assert sizes == [[5, 3, 4], [8, 1]]
    assert deal([], 2) == [[], []]


@pytest.mark.parametrize("consumed", [0, 15, 60, 61, 150])
def test_unseen_groups_are_exactly_the_samples_not_consumed(consumed: int) -> None:
    world, batch = 3, 5
    order = streamed(SIZES, world, batch, 60, False, 3, 0)
    samples, valid = whole(order)
    seen = set(samples[:consumed][valid[:consumed]].tolist())
    groups = unseen_groups(order, consumed, STARTS)
    rest = np.concatenate([g.ranks() for g in groups])
    assert sorted(rest.tolist()) == sorted(set(range(sum(SIZES))) - seen)
    shard_lists = [shard_of(g.ranks()).tolist() for g in groups]
    assert all(len(set(shards)) == 1 for shards in shard_lists)  # one shard each,
    assert len({shards[0] for shards in shard_lists}) == len(groups)  # each shard once


def test_a_buffer_of_one_streams_each_lane_in_shard_order() -> None:
    groups = shard_groups(STARTS, 0, 0, False)
    order = streaming_order(groups, 1, 1, 1, False, 0, 0, EVERY)
    samples, valid = whole(order)
    assert samples.tolist() == list(range(sum(SIZES))) and valid.all()
    with pytest.raises(ValueError, match="buffer_size must be >= 1"):
        streaming_order(groups, 1, 1, 0, False, 0, 0, EVERY)


def test_a_rank_without_shards_repeats_others_as_padding_only() -> None:
    """Two one-sample shards for three ranks: the third lane holds no sample of its own."""
    samples, valid = whole(streaming_order(ranges([1, 1]), 3, 1, 4, False, 0, 0, Selection(2)))
    assert sorted(samples[valid].tolist()) == [0, 1] and valid.tolist() == [True, True, False]


def test_streaming_over_exclusions_reads_each_kept_sample_once_by_shard() -> None:
    excluded = [0, 1, 49, 50, 120, 227]
    spec = order_spec(shard_sizes=tuple(SIZES), streaming=True, shuffle_buffer=16, world_size=2, excluded=tuple(excluded))
    order = spec.order(1)
    samples, valid = whole(order)
    assert sorted(samples[valid].tolist()) == sorted(set(range(sum(SIZES))) - set(excluded))
    for rank in range(2):
        mine, real = lane(order, 2, 3, rank)
        other, other_real = lane(order, 2, 3, 1 - rank)
        assert set(shard_of(mine[real]).tolist()).isdisjoint(shard_of(other[other_real]).tolist())


def test_shards_of_maps_each_index_to_its_shard() -> None:
    assert shards_of([0, 50, 100, 150], np.array([0, 49, 50, 99, 100, 149])).tolist() == [0, 0, 1, 1, 2, 2]


def test_rank_batches_of_one_sample_and_the_position_after_the_last() -> None:
    plan = rank_batches(10, 0, 1, rank=1, world_size=3, drop_last=False)
    assert [plan.positions(b).tolist() for b in range(len(plan))] == [[1], [4], [7], [1]]  # padding: from the order's start
    assert plan.valid(3).tolist() == [False] and plan.valid(0).tolist() == [True]
    assert [plan.consumed_after(k) for k in range(5)] == [0, 3, 6, 9, 10]
    dropped = rank_batches(10, 3, 2, rank=0, world_size=2, drop_last=True)
    assert [dropped.positions(b).tolist() for b in range(len(dropped))] == [[3, 4]] and dropped.end == 7
    with pytest.raises(IndexError):
        plan.positions(4)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        rank_batches(10, 0, 0, 0, 1, False)
    with pytest.raises(ValueError, match="rank 3 is outside world size 3"):
        rank_batches(10, 0, 1, 3, 3, False)


def order_spec(**changes: object) -> OrderSpec:
    """The orders of a 30-sample dataset in shards of 8, 8, 8 and 6, one rank, batches of 3."""
    values: dict = dict(shard_sizes=(8, 8, 8, 6), seed=3, shuffle=True, batch_size=3, rank=0, world_size=1, drop_last=False)
    return OrderSpec(**{**values, **changes})


def test_a_subsets_order_permutes_its_own_indices() -> None:
    take = (29, 3, 17, 5, 11, 0, 24)
    assert whole(order_spec(shuffle=False, take=take).order(0))[0].tolist() == list(take)
    shuffled = whole(order_spec(take=take).order(4))[0]
    assert shuffled.tolist() == np.asarray(take)[whole(global_order(Selection(7), 3, 4, True))[0]].tolist()
    assert sorted(shuffled.tolist()) == sorted(take) and shuffled.tolist() != list(take)
    assert whole(order_spec().order(4))[0].tolist() == whole(global_order(Selection(30), 3, 4, True))[0].tolist()
    # exclusions leave a Subset's other samples in their shuffled places relative to each other
    kept = whole(order_spec(take=take, excluded=(3, 24)).order(4))[0]
    assert sorted(kept.tolist()) == sorted(set(take) - {3, 24})


def test_drop_remainder_cuts_the_order_to_a_multiple_of_the_world_size() -> None:
    """As DistributedSampler(drop_last=True): 30 samples on 4 ranks use 28, the first 28 of the
    order; a Subset of 7 on 4 ranks uses 4."""
    full = whole(order_spec(world_size=4).order(1))[0]
    assert len(full) == 30
    assert whole(order_spec(world_size=4, drop_remainder=True).order(1))[0].tolist() == full[:28].tolist()
    assert whole(order_spec(world_size=5, drop_remainder=True).order(1))[0].tolist() == whole(order_spec(world_size=5).order(1))[0].tolist()
    take = (29, 3, 17, 5, 11, 0, 24)
    cut = whole(order_spec(world_size=4, drop_remainder=True, take=take).order(1))[0]
    assert cut.tolist() == whole(order_spec(world_size=4, take=take).order(1))[0][:4].tolist()


def test_drop_remainder_resumed_past_a_wider_topologys_cut_finds_the_epoch_over() -> None:
    """30 samples saved at 29 consumed by one rank: on 4 ranks the cut epoch holds 28, so nothing is left
    (was: a ValueError naming the position), and at 24 consumed each of the 4 ranks gets one sample."""
    wide = order_spec(world_size=4, drop_remainder=True)
    assert len(wide.batches(len(wide.order(0)), 29)) == 0
    rest = [wide.at_topology(4, 4, (), rank=r).batches(28, 24) for r in range(4)]
    assert [sum(len(plan.positions(b)) for b in range(len(plan))) for plan in rest] == [1, 1, 1, 1]


@pytest.mark.parametrize("consumed", [0, 6, 12, 18])
def test_a_streaming_resume_at_another_world_size_reads_the_unseen_samples_once(consumed: int) -> None:
    """Two ranks stream ``consumed`` positions of the epoch; one rank resumes: the samples it reads
    are exactly those not read before, each once, shard by shard."""
    before = order_spec(streaming=True, shuffle_buffer=4, world_size=2).order(2)
    samples, valid = whole(before)
    seen = samples[:consumed][valid[:consumed]].tolist()
    after = order_spec(streaming=True, shuffle_buffer=4, resumed_from=((2, 3, consumed),)).order(2)
    rest, rest_valid = whole(after)
    assert sorted(seen + rest[rest_valid].tolist()) == list(range(30))
    assert rest.tolist() != samples.tolist()
    plan = order_spec(streaming=True, shuffle_buffer=4, world_size=2, rank=1).batches(len(before), 6)
    assert plan.positions(0).tolist() == [9, 10, 11]


@pytest.mark.parametrize("consumed", [3, 9, 15])
def test_after_a_streaming_resume_at_more_ranks_each_shard_is_read_by_one_rank(consumed: int) -> None:
    """The unseen samples are re-dealt as whole shards: no shard is split between the two ranks
    (a shard's first sample counted with its neighbour would be)."""
    sizes = (8, 8, 8, 6)
    starts = np.cumsum([0, *sizes])
    resumed = order_spec(streaming=True, shuffle_buffer=4, world_size=2, resumed_from=((1, 3, consumed),)).order(1)
    shards_read = []
    for rank in range(2):
        samples, valid = lane(resumed, 2, 3, rank)
        shards_read.append(set(shards_of(starts, samples[valid]).tolist()))
    assert shards_read[0] and shards_read[1] and not shards_read[0] & shards_read[1]
