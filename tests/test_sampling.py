"""The sample orders as pure functions: permutations, locality of the streaming order, lanes of
whole shards, equal batch counts, and the unseen set a resume at another world size deals anew."""

from __future__ import annotations

import numpy as np
import pytest

from fastload.sampling import (
    OrderSpec,
    buffer_shuffle,
    deal,
    epoch_order,
    rank_batches,
    shard_groups,
    shards_of,
    streaming_order,
    unseen_groups,
)

SIZES = [50, 50, 50, 30, 41, 7]
STARTS = np.concatenate([[0], np.cumsum(SIZES)])


def shard_of(samples: np.ndarray) -> np.ndarray:
    return np.searchsorted(STARTS, samples, side="right") - 1


def lane(order, world: int, batch: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s samples and validity, as rank_batches would hand them out."""
    plan = rank_batches(len(order), 0, batch, rank, world, drop_last=False)
    positions = np.concatenate(plan.batches)
    return order.order[positions], order.valid[positions]


def test_one_rank_streams_a_deterministic_permutation_with_local_windows() -> None:
    groups = shard_groups(SIZES, seed=1, epoch=0, shuffle=True)
    order = streaming_order(groups, 1, 4, buffer_size=20, drop_last=False, seed=1, epoch=0)
    real = order.order[order.valid]
    assert sorted(real.tolist()) == list(range(sum(SIZES)))
    again = streaming_order(shard_groups(SIZES, 1, 0, True), 1, 4, 20, False, 1, 0)
    assert np.array_equal(order.order, again.order)
    other = streaming_order(shard_groups(SIZES, 1, 1, True), 1, 4, 20, False, 1, 1)
    assert not np.array_equal(order.order, other.order)
    # a 20-sample buffer over 50-sample shards: 20 consecutive samples span ~2 shards on average
    # (a global permutation: ~4 of the 4)
    big = streaming_order(shard_groups([50, 50, 50, 30], 1, 0, True), 1, 4, 20, False, 1, 0).order
    big_shard = np.searchsorted([50, 100, 150], big, side="right")
    spans = [len(set(big_shard[i : i + 20].tolist())) for i in range(len(big) - 20)]
    assert np.mean(spans) < 2.7 and max(spans) <= 4


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_read_disjoint_whole_shards_in_equal_batches(drop_last: bool) -> None:
    world, batch = 3, 8
    order = streaming_order(shard_groups(SIZES, 5, 2, True), world, batch, 16, drop_last, 5, 2)
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


def test_fewer_shards_than_ranks_splits_shards_so_no_rank_idles() -> None:
    dealt = deal([np.arange(10), np.arange(10, 13)], 4)
    assert all(len(d) for d in dealt)
    assert sorted(np.concatenate([np.concatenate(d) for d in dealt]).tolist()) == list(range(13))
    # one shard of 2 for 2 ranks: a sample each; one of 9 for 2: halves of 4 and 5, in order
    assert [[g.tolist() for g in d] for d in deal([np.arange(2)], 2)] == [[[0]], [[1]]]
    assert [[g.tolist() for g in d] for d in deal([np.arange(9)], 2)] == [[list(range(4))], [list(range(4, 9))]]
    # single samples cannot be split: ranks beyond them get nothing rather than empty halves
    assert [len(d) for d in deal([np.arange(1), np.arange(1, 2)], 3)] == [1, 1, 0]


def test_as_many_shards_as_ranks_deals_each_rank_one_whole_shard() -> None:
    dealt = deal([np.arange(5), np.arange(5, 13), np.arange(13, 16)], 3)
    assert [[g.tolist() for g in d] for d in dealt] == [[list(range(5))], [list(range(5, 13))], [list(range(13, 16))]]
    # more shards: each goes to the lane holding fewest samples so far (the first such on a tie)
    sizes = [[len(g) for g in d] for d in deal([np.arange(s) for s in (5, 8, 3, 4, 1)], 2)]
    assert sizes == [[5, 3, 4], [8, 1]]
    assert deal([], 2) == [[], []]


def test_unseen_groups_are_exactly_the_samples_not_consumed() -> None:
    world, batch = 3, 5
    order = streaming_order(shard_groups(SIZES, 3, 0, True), world, batch, 10, False, 3, 0)
    consumed = 4 * world * batch
    seen = set(order.order[:consumed][order.valid[:consumed]].tolist())
    groups = unseen_groups(order, consumed, shard_of)
    rest = np.concatenate(groups)
    assert sorted(rest.tolist()) == sorted(set(range(sum(SIZES))) - seen)
    assert all(len(set(shard_of(g).tolist())) == 1 for g in groups)  # grouped by shard


def sequential_buffer_shuffle(stream: np.ndarray, buffer_size: int, rng: np.random.Generator) -> np.ndarray:
    """The shuffle buffer as it is usually written, one step at a time: the reference."""
    buffer = list(stream[:buffer_size])
    out = []
    picks = rng.integers(0, len(buffer), size=max(len(stream) - len(buffer), 0))
    for incoming, pick in zip(stream[len(buffer):], picks):
        out.append(buffer[pick])
        buffer[pick] = incoming
    tail = np.array(buffer, dtype=stream.dtype)
    rng.shuffle(tail)
    return np.concatenate([np.array(out, dtype=stream.dtype), tail])


@pytest.mark.parametrize(("length", "buffer_size"), [(1000, 64), (1000, 1), (1000, 2), (37, 100), (500, 500), (5000, 3), (2, 2), (150000, 70000)])
def test_buffer_shuffle_equals_the_step_by_step_buffer(length: int, buffer_size: int) -> None:
    """Computed for all steps at once, the output is exactly the sequential buffer's."""
    stream = np.random.default_rng(length).permutation(length * 3)[:length].astype(np.int64)
    for seed in range(3 if length > 1000 else 8):  # 8: two samples stay in order in 1 of 2 seeds
        fast = buffer_shuffle(stream, buffer_size, np.random.default_rng(seed))
        reference = sequential_buffer_shuffle(stream, buffer_size, np.random.default_rng(seed)) if buffer_size > 1 else stream
        assert fast.tolist() == reference.tolist()


def test_sample_streams_are_splitmix64() -> None:
    """The per-sample generator is SplitMix64 (Steele, Lea and Flood 2014): from state 0 it gives the
    published sequence, which statistical tests alone cannot tell from a weakened mix."""
    from fastload.sampling import SampleRandom

    stream = SampleRandom(0, 0, 0)
    stream._state = 0
    published = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert [stream.random() for _ in published] == [(v >> 11) * 2.0**-53 for v in published]


def test_a_buffer_of_one_streams_each_lane_in_shard_order() -> None:
    groups = shard_groups(SIZES, 0, 0, False)
    order = streaming_order(groups, 1, 1, buffer_size=1, drop_last=False, seed=0, epoch=0)
    assert order.order.tolist() == list(range(sum(SIZES))) and order.valid.all()
    with pytest.raises(ValueError, match="buffer_size must be >= 1"):
        streaming_order(groups, 1, 1, buffer_size=0, drop_last=False, seed=0, epoch=0)


def test_a_rank_without_shards_repeats_others_as_padding_only() -> None:
    """Two one-sample shards for three ranks: the third lane holds no sample of its own."""
    order = streaming_order([np.arange(1), np.arange(1, 2)], 3, 1, 4, False, 0, 0)
    assert sorted(order.order[order.valid].tolist()) == [0, 1] and order.valid.tolist() == [True, True, False]


def test_shards_of_maps_each_index_to_its_shard() -> None:
    assert shards_of([0, 50, 100, 150], np.array([0, 49, 50, 99, 100, 149])).tolist() == [0, 0, 1, 1, 2, 2]


def test_rank_batches_of_one_sample_and_the_position_after_the_last() -> None:
    plan = rank_batches(10, 0, 1, rank=1, world_size=3, drop_last=False)
    assert [b.tolist() for b in plan.batches] == [[1], [4], [7], [1]]  # padding: a position from the order's start
    assert plan.valid(3).tolist() == [False]
    assert [plan.consumed_after(k) for k in range(5)] == [0, 3, 6, 9, 10]
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
    assert order_spec(shuffle=False, take=take).order(0).order.tolist() == list(take)
    shuffled = order_spec(take=take).order(4).order
    assert shuffled.tolist() == np.asarray(take)[epoch_order(len(take), 3, 4, True)].tolist()
    assert sorted(shuffled.tolist()) == sorted(take) and shuffled.tolist() != list(take)
    assert order_spec().order(4).order.tolist() == epoch_order(30, 3, 4, True).tolist()


def test_drop_remainder_cuts_the_order_to_a_multiple_of_the_world_size() -> None:
    """As DistributedSampler(drop_last=True): 30 samples on 4 ranks use 28, the first 28 of the
    order; a Subset of 7 on 4 ranks uses 4."""
    full = order_spec(world_size=4).order(1).order
    assert len(full) == 30
    assert order_spec(world_size=4, drop_remainder=True).order(1).order.tolist() == full[:28].tolist()
    assert order_spec(world_size=5, drop_remainder=True).order(1).order.tolist() == order_spec(world_size=5).order(1).order.tolist()
    take = (29, 3, 17, 5, 11, 0, 24)
    cut = order_spec(world_size=4, drop_remainder=True, take=take).order(1).order
    assert cut.tolist() == order_spec(world_size=4, take=take).order(1).order[:4].tolist()


@pytest.mark.parametrize("consumed", [0, 6, 12, 18])
def test_a_streaming_resume_at_another_world_size_reads_the_unseen_samples_once(consumed: int) -> None:
    """Two ranks stream ``consumed`` positions of the epoch; one rank resumes: the samples it reads
    are exactly those not read before, each once, shard by shard."""
    before = order_spec(streaming=True, shuffle_buffer=4, world_size=2).order(2)
    seen = before.order[:consumed][before.valid[:consumed]].tolist()
    after = order_spec(streaming=True, shuffle_buffer=4, generations=((2, 3, consumed),)).order(2)
    rest = after.order[after.valid].tolist()
    assert sorted(seen + rest) == list(range(30))
    assert after.order.tolist() != before.order.tolist()
    assert order_spec(streaming=True, shuffle_buffer=4, world_size=2, rank=1).batches(len(before), 6).batches[0].tolist() == [9, 10, 11]


@pytest.mark.parametrize("consumed", [3, 9, 15])
def test_after_a_streaming_resume_at_more_ranks_each_shard_is_read_by_one_rank(consumed: int) -> None:
    """The unseen samples are re-dealt as whole shards: no shard is split between the two ranks
    (a shard's first sample counted with its neighbour would be)."""
    sizes = (8, 8, 8, 6)
    starts = np.cumsum([0, *sizes])
    resumed = order_spec(streaming=True, shuffle_buffer=4, world_size=2, generations=((1, 3, consumed),)).order(1)
    shards_read = []
    for rank in range(2):
        samples, valid = lane(resumed, 2, 3, rank)
        shards_read.append(set(shards_of(starts, samples[valid]).tolist()))
    assert shards_read[0] and shards_read[1] and not shards_read[0] & shards_read[1]
